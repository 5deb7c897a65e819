"""The Reddit TL;DR task's data and measures (model/tasks/tldr.py): the fixed slices, the prompt, ROUGE,
the main-subject check and the share's interval."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from model.tasks.tldr import (
    HELDOUT_POSTS,
    TldrPost,
    clean_summary,
    main_subject,
    names_main_subject,
    read_posts,
    rouge_scores,
    share_interval,
    split_posts,
    task_prompt,
)


@pytest.fixture(scope="module")
def posts() -> list[TldrPost]:
    return read_posts()


def test_the_test_posts_are_read_whole(posts):
    assert len(posts) == 500 and len({post.post_id for post in posts}) == 500
    assert all(post.title and post.post and post.reference and post.subreddit for post in posts)


def test_the_held_out_slice_is_fixed_by_id_alone_and_apart_from_the_reported_posts(posts):
    heldout, reported = split_posts(posts)
    assert len(heldout) == HELDOUT_POSTS and len(reported) == len(posts) - HELDOUT_POSTS
    assert not {p.post_id for p in heldout} & {p.post_id for p in reported}
    # the same slice whatever the order the posts come in, and whatever their texts say
    shuffled = list(reversed(posts))
    assert {p.post_id for p in split_posts(shuffled)[0]} == {p.post_id for p in heldout}
    blanked = [TldrPost(p.post_id, "", "", "", "") for p in posts]
    assert {p.post_id for p in split_posts(blanked)[0]} == {p.post_id for p in heldout}


def test_the_prompt_holds_the_post_and_its_title_and_asks_for_one_sentence(posts):
    prompt = task_prompt(posts[0])
    assert prompt.startswith(posts[0].title) and posts[0].post in prompt
    assert prompt.endswith("TL;DR of the post above in one sentence:")


def test_rouge_is_one_for_the_reference_and_low_for_another_posts(posts):
    assert rouge_scores(posts[0].reference, posts[0].reference) == pytest.approx(
        {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0})
    other = rouge_scores(posts[1].reference, posts[0].reference)
    assert other["rouge1"] < 0.5 and other["rouge2"] < 0.2
    assert clean_summary(" TL;DR: my cat left.") == "my cat left." and clean_summary("tldr my cat") == "my cat"


def test_the_main_subject_is_the_references_people_and_the_event_it_shares_with_the_title():
    post = TldrPost("t3_x", "relationships", "My [30 F] husband [31 M] forgot our anniversary again",
                    "Long story about a dinner.", "Husband forgot our anniversary for the third time, how do I talk to him?")
    subject = main_subject(post)
    assert "husband" in subject.people and {"forgot", "anniversari"} <= subject.event
    assert names_main_subject("My husband forgot our anniversaries.", subject)  # stems: plural and tense
    assert not names_main_subject("My husband is great.", subject)  # the people, not the event
    assert not names_main_subject("He forgot the anniversary.", subject)  # the event, not the people
    assert not names_main_subject("I need advice.", subject)


def test_the_check_sees_a_subject_in_most_reported_posts_and_tells_them_apart(posts):
    _, reported = split_posts(posts)
    subjects = [main_subject(post) for post in reported]
    known = [(post, subject) for post, subject in zip(reported, subjects) if subject.known]
    assert len(known) > 0.8 * len(reported)
    assert all(names_main_subject(post.reference, subject) for post, subject in known)
    # another post's reference names this post's subject rarely: the check is about THIS post
    borrowed = sum(names_main_subject(known[i - 1][0].reference, subject) for i, (_, subject) in enumerate(known))
    assert borrowed < 0.1 * len(known)


def test_the_share_interval_is_paired_over_posts_and_brackets_the_share():
    full = [0.2, 0.4, 0.3, 0.5, 0.1, 0.6, 0.35, 0.45]
    same = share_interval(full, full)
    assert same.share == same.low == same.high == 1.0  # paired: an arm equal to 1x has no spread
    lower = [score * 0.9 for score in full]
    assert share_interval(lower, full).share == pytest.approx(0.9)
    noisy = [score + (0.1 if i % 2 else -0.1) for i, score in enumerate(full)]
    interval = share_interval(noisy, full)
    assert interval.low < interval.share < interval.high
    with pytest.raises(ValueError, match="same posts"):
        share_interval([0.1], full)


# --- the playground's side: the post box, the examples, the schedule, the subject a page checks ----------


def test_a_post_box_is_the_title_then_the_post_and_a_test_post_comes_back_with_its_reference(posts):
    from model.tasks.tldr import parse_post, post_text

    post = posts[3]
    assert parse_post(post_text(post)) == post  # the same title and text: the test post itself
    assert parse_post("  " + post.title + "\n\n\n" + "  ".join(post.post.split()) + "\n") == post  # spacing aside
    assert task_prompt(parse_post(post_text(post))) == task_prompt(post)  # so the eval's very prompt
    own = parse_post("My cat ignores me\nShe sleeps on my chair.\n\nAnd she bites.")
    assert own == TldrPost("", "", "My cat ignores me", "She sleeps on my chair.\n\nAnd she bites.", "")
    for text, words in (("", "it is empty"), ("Only a title", "a title but no text"),
                        ("x" * 301 + "\n\nbody", "is 301 characters long (at most 300)")):
        with pytest.raises(ValueError, match=re.escape(words)):
            parse_post(text)


def test_the_examples_are_short_reported_posts_with_a_subject_on_both_sides(posts):
    from model.tasks.tldr import EXAMPLE_POST_IDS, example_posts, post_subject

    examples = example_posts()
    reported = {post.post_id for post in split_posts(posts)[1]}
    assert [post.post_id for post in examples] == list(EXAMPLE_POST_IDS) and 6 <= len(examples) <= 8
    for post in examples:
        assert post.post_id in reported and 150 <= len(post.post.split()) <= 250, post.post_id
        subject = post_subject(post).subject
        assert subject.people and subject.event, post.post_id


def test_the_playgrounds_schedule_is_the_one_the_policies_train_on_and_the_eval_runs():
    from model.tasks.tldr import DECAY_LENGTH, task_schedule
    from model.tasks.tldr_eval import TldrEvalConfig, schedule_request

    for speedup in (2.0, 3.0, 5.0):
        for depth in (True, False):
            assert task_schedule(speedup, 30, prompt_at_full_depth=depth) == schedule_request(
                TldrEvalConfig(), speedup, 30, prompt_at_full_depth=depth)
    request = task_schedule(3.0, 30)
    assert (request.decay, request.decay_length, request.speedup_steps, request.min_layers_floor) == (
        "linear", DECAY_LENGTH, DECAY_LENGTH, 7)  # 2/3 of 30 / 3
    assert task_schedule(1.0, 30).full and task_schedule(3.0, 30, full=True).full
    assert not task_schedule(3.0, 30, skip_policy=False).skip_policy


def test_a_policy_runs_under_the_shape_it_was_trained_in_in_training_eval_and_the_playground(tmp_path):
    """A policy's shape is read from its training_info.json; the schedule the eval (and the pick) runs it
    under is the one its training drew, and the playground's for that shape; the front shape keeps a
    summary's first tokens deep at the same average depth over the decay length."""
    import dataclasses
    import json
    import random

    from model.skipdecode.schedule import solve_schedule
    from model.tasks.tldr import DECAY_LENGTH, LINEAR, SHAPES, shape_of, task_schedule
    from model.tasks.tldr_eval import TldrEvalConfig, schedule_request
    from model.tasks.tldr_training import TldrRun, train_config
    from model.training.training import draw_schedule

    def policy(name: str, run: TldrRun | None) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        if run is not None:
            config = dataclasses.asdict(train_config(run, tmp_path / "targets.jsonl"))
            (folder / "training_info.json").write_text(json.dumps({"config": config}))
        return folder

    assert shape_of(None) == LINEAR and shape_of(policy("bare", None)) == LINEAR
    for name, shape in SHAPES.items():
        run = TldrRun(speedup=3.0, shape=name)
        assert shape_of(policy(name, run)) == shape
        trained = draw_schedule(30, 40, train_config(run, tmp_path / "targets.jsonl"), random.Random(0))
        request = schedule_request(TldrEvalConfig(), 3.0, 30, shape=shape)
        assert request == task_schedule(3.0, 30, shape=shape) and request.speedup_steps == DECAY_LENGTH
        solved = solve_schedule(30, 3.0, decay=request.decay, warmup=trained.warmup, decay_length=request.decay_length,
                                num_steps=request.speedup_steps, min_layers_floor=request.min_layers_floor)
        assert solved.config.budgets(48) == trained.budgets(48)
    front = draw_schedule(30, 40, train_config(TldrRun(speedup=3.0, shape="front"), tmp_path / "t"), random.Random(0))
    linear = draw_schedule(30, 40, train_config(TldrRun(speedup=3.0), tmp_path / "t"), random.Random(0))
    assert front.budgets(8) == [22] * 8 and max(linear.budgets(8)) == 13  # the first 8 tokens: 22 layers, not 13
    assert sum(front.budgets(DECAY_LENGTH)) == 320 <= sum(linear.budgets(DECAY_LENGTH))  # no more layers in all: 3x
    general = dataclasses.asdict(train_config(TldrRun(speedup=3.0, shape="front"), tmp_path / "t")) | {"fixed_speedup": None}
    (policy("general", None) / "training_info.json").write_text(json.dumps({"config": general}))
    assert shape_of(tmp_path / "general") == LINEAR  # drawn schedules: not a task shape
    with pytest.raises(ValueError, match="--shape"):
        TldrRun(shape="cosine")


def test_a_summary_is_checked_for_the_subject_with_the_words_it_used_and_the_ones_it_missed():
    from model.tasks.tldr import post_subject, subject_verdict, summary_text

    post = TldrPost("t3_x", "relationships", "My boyfriend forgot my birthday", "He forgot my birthday again.",
                    "Boyfriend forgot my birthday party, what do I do?")
    subject = post_subject(post)
    assert subject.source == "reference" and subject.spelled(subject.subject.people) == ["boyfriend"]
    assert subject.spelled(subject.subject.event) == ["forgot", "birthday"]
    said = subject_verdict("TL;DR: my boyfriend forgot my birthday.\nAnd then more", subject)
    assert said.names_subject and said.named == (("boyfriend",), ("forgot", "birthday")) and said.missing == ()
    assert said.summary == "my boyfriend forgot my birthday." == summary_text(" TL;DR: my boyfriend forgot my birthday.\nx")
    half = subject_verdict("My boyfriend is great.", subject)
    assert not half.names_subject and half.named == (("boyfriend",), ()) and half.missing == (("forgot", "birthday"),)
    none = subject_verdict("", subject)
    assert none.missing == (("boyfriend",), ("forgot", "birthday"))


def test_a_visitors_post_has_its_subject_from_the_title_alone():
    from model.tasks.tldr import parse_post, post_subject, title_subject

    post = parse_post("My sister keeps borrowing my car\nEvery weekend my sister takes the car and returns it empty.")
    subject = post_subject(post)
    assert subject.source == "title" and subject.subject == title_subject(post)
    assert subject.spelled(subject.subject.people) == ["sister"]
    assert subject.spelled(subject.subject.event) == ["car"]  # "borrowing": a title word the post never uses
    assert not post_subject(parse_post("Help!\nWhat do I do?")).subject.known
