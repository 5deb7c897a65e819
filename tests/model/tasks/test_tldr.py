"""The Reddit TL;DR task's data and measures (model/tasks/tldr.py): the fixed slices, the prompt, ROUGE,
the main-subject check and the share's interval."""

from __future__ import annotations

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
