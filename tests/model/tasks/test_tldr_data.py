"""The TL;DR distillation posts (model/tasks/tldr_data.py): seeded titles apart from the test set, and a
post writer that appends as it goes and resumes where it stopped."""

from __future__ import annotations

import json

import pytest

from model.tasks.tldr import read_posts
from model.tasks.tldr_data import PostTitle, assert_no_test_post, synthetic_titles


def test_titles_are_seeded_distinct_and_never_a_test_posts():
    titles = synthetic_titles(300, seed=1)
    assert titles == synthetic_titles(300, seed=1) and titles != synthetic_titles(300, seed=2)
    assert len({t.title for t in titles}) == 300 and len({t.post_id for t in titles}) == 300
    assert_no_test_post(titles)
    test = read_posts()[0]
    with pytest.raises(ValueError, match="never train on the test set"):
        assert_no_test_post([*titles[:3], PostTitle("synthetic-x", test.subreddit, test.title)])


def test_varied_titles_spread_over_the_test_sets_subreddits_and_shapes():
    composed, varied = synthetic_titles(300, seed=1), synthetic_titles(300, seed=1, varied=True)
    assert varied == synthetic_titles(300, seed=1, varied=True) and len({t.title for t in varied}) == 300
    assert all(t.post_id.startswith("varied-") for t in varied)  # never a composed title's id: both can be written
    assert_no_test_post(varied)
    subreddits = [t.subreddit for t in varied]
    assert subreddits.count("relationships") > 0.35 * len(varied)  # the test set's first subreddit, as there
    assert len(set(subreddits)) >= 8

    def word_pairs(titles):  # adjacent words, the ages left out: how many ways the titles are put
        pairs = set()
        for title in titles:
            words = [w.lower() for w in title.title.split() if not any(c.isdigit() for c in w)]
            pairs |= set(zip(words, words[1:]))
        return pairs

    assert len(word_pairs(varied)) > 1.6 * len(word_pairs(composed))  # 1,084 against 518


@pytest.mark.slow
def test_posts_are_appended_per_batch_and_a_second_run_writes_only_what_is_missing(tiny_folder, tmp_path):
    from model.generation.generator import TextGenerator
    from model.loading import load_model
    from model.tasks.tldr_data import read_synthetic_posts, write_posts

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    titles = synthetic_titles(5)
    path = tmp_path / "posts.jsonl"
    first = write_posts(generator, titles[:3], path, batch_size=2, max_new_tokens=6, min_words=1)
    again = write_posts(generator, titles, path, batch_size=2, max_new_tokens=6, min_words=1)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    skipped = path.with_suffix(".skipped").read_text().split() if path.with_suffix(".skipped").exists() else []
    assert first + again == len(rows) and sorted([r["post_id"] for r in rows] + skipped) == sorted(t.post_id for t in titles)
    assert write_posts(generator, titles, path, batch_size=2, max_new_tokens=6, min_words=1) == 0  # all drawn
    assert [post.post_id for post in read_synthetic_posts(path)] == [r["post_id"] for r in rows]
