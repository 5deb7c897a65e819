"""Posts to distil the TL;DR skip policies from, made offline and never from the test posts.

No training split of Reddit TL;DR is available here, so the default model writes the posts itself: from
subreddit and title prompts this file composes (people, ages and an event, in the test set's subreddits),
sampled, one post per title. The distillation targets are then the task model's own greedy TL;DRs of
these posts (as E2E's policies were distilled from the task model's descriptions). ``assert_no_test_post``
guards that no title or post is a test post's.

    synthetic_titles   seeded titles in the shape of the test set's ("Me [24 F] with my boyfriend [26 M] ...")
    write_posts        the model's post for each title, appended to a JSONL file as they are written, so an
                       interrupted run resumes where it stopped
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from model.generation.generator import TextGenerator
from model.generation.runs import GenerationRequest
from model.generation.schedules import ScheduleRequest
from model.skipdecode.decoder import SamplingConfig
from model.tasks.tldr import TldrPost, read_posts

SUBREDDITS = ("relationships", "relationship_advice", "dating_advice", "AskReddit", "tifu", "legaladvice",
              "personalfinance", "Advice")
PEOPLE = ("boyfriend", "girlfriend", "husband", "wife", "best friend", "roommate", "mom", "dad", "sister",
          "brother", "boss", "coworker", "landlord", "ex", "fiance", "neighbour", "friend", "cousin")
EVENTS = ("forgot my birthday", "wants to move across the country", "read my messages", "lent money and never paid it back",
          "won't talk about the future", "got a job offer in another city", "keeps cancelling plans",
          "told everyone my secret", "wants to get a dog", "spends every weekend gaming", "lied about where they were",
          "invited their ex to the party", "wants us to split everything 50/50", "doesn't get along with my family",
          "broke my laptop", "is moving in next month", "kissed someone else at a party", "won't stop smoking",
          "asked me to lie for them", "stopped replying after our third date", "posted our fight online",
          "wants to quit their job", "forgot to pay the rent", "keeps borrowing my car", "is jealous of my friend")
ASKS = ("what should I do?", "am I overreacting?", "how do I bring it up?", "is this normal?",
        "should I end it?", "how do I move on?", "what are my options?")
TIFU_EVENTS = ("by locking myself out in a towel", "by sending a text to the wrong person", "by eating a whole chili",
               "by falling asleep on the train", "by cooking with the wrong salt", "by replying all at work",
               "by dyeing my hair green", "by losing my passport the day before a flight")


@dataclass(frozen=True)
class PostTitle:
    post_id: str  # "synthetic-<n>"
    subreddit: str
    title: str


def _age(rng: random.Random) -> str:
    return f"{rng.randint(17, 45)} {rng.choice('FM')}"


def synthetic_title(rng: random.Random, index: int) -> PostTitle:
    subreddit = rng.choice(SUBREDDITS)
    if subreddit == "tifu":
        return PostTitle(f"synthetic-{index}", subreddit, f"TIFU {rng.choice(TIFU_EVENTS)}")
    person, event, ask = rng.choice(PEOPLE), rng.choice(EVENTS), rng.choice(ASKS)
    title = f"My [{_age(rng)}] {person} [{_age(rng)}] {event}, {ask}"
    if subreddit in ("AskReddit", "personalfinance", "legaladvice", "Advice") and rng.random() < 0.5:
        title = f"My {person} {event}. {ask[0].upper()}{ask[1:]}"
    return PostTitle(f"synthetic-{index}", subreddit, title)


def synthetic_titles(count: int, seed: int = 0) -> list[PostTitle]:
    """``count`` distinct seeded titles (a repeat is drawn again)."""
    rng = random.Random(seed)
    titles: list[PostTitle] = []
    seen: set[str] = set()
    while len(titles) < count:
        title = synthetic_title(rng, len(titles))
        if title.title not in seen:
            seen.add(title.title)
            titles.append(title)
    return titles


def post_prompt(title: PostTitle) -> str:
    return (f"Write a Reddit post for r/{title.subreddit} with the title \"{title.title}\". Write it in the first "
            "person, about 200 words, telling what happened with names of places and times, and end with the "
            "question you want answered. Write only the post.")


def assert_no_test_post(posts: Iterable[TldrPost | PostTitle], test_posts: Sequence[TldrPost] | None = None) -> None:
    """Raise if any title (or post text) is a test post's: the test posts are never trained on."""
    test = list(test_posts) if test_posts is not None else read_posts()
    titles = {post.title.strip().lower() for post in test}
    texts = {post.post.strip().lower() for post in test}
    for post in posts:
        if post.title.strip().lower() in titles or (isinstance(post, TldrPost) and post.post.strip().lower() in texts):
            raise ValueError(f"{post.post_id} repeats a test post ({post.title[:60]!r}): never train on the test set")


def _written_ids(path: Path) -> set[str]:
    """The titles a run already drew: written to ``path``, or dropped as too short (beside it, .skipped)."""
    written = ({json.loads(line)["post_id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
               if path.is_file() else set())
    skipped = path.with_suffix(".skipped")
    return written | (set(skipped.read_text().split()) if skipped.is_file() else set())


def write_posts(generator: TextGenerator, titles: Sequence[PostTitle], path: Path, batch_size: int = 16,
                max_new_tokens: int = 320, min_words: int = 80, seed: int = 0) -> int:
    """The model's post for each title not yet in ``path`` (sampled: temperature 0.8, top-p 0.95, each batch its
    own seed), appended as JSONL rows as each batch ends; posts under ``min_words`` words are dropped. Returns the
    rows written by this call."""
    assert_no_test_post(titles)
    done = _written_ids(path)
    todo = [title for title in titles if title.post_id not in done]
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    for start in range(0, len(todo), batch_size):
        batch = todo[start:start + batch_size]
        result = generator.generate(GenerationRequest(
            prompts=tuple(post_prompt(title) for title in batch), max_new_tokens=max_new_tokens,
            schedule=ScheduleRequest(full=True), sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=seed + start)))
        rows = [{"post_id": title.post_id, "subreddit": title.subreddit, "title": title.title, "post": text.strip()}
                for title, text in zip(batch, result.outputs) if len(text.split()) >= min_words]
        with path.open("a", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        # a short post is marked written too, so a resumed run does not draw it again
        kept = {row["post_id"] for row in rows}
        with path.with_suffix(".skipped").open("a", encoding="utf-8") as handle:
            handle.writelines(title.post_id + "\n" for title in batch if title.post_id not in kept)
        written += len(rows)
    return written


def read_synthetic_posts(path: Path) -> list[TldrPost]:
    """The written posts as TldrPosts (no reference: their targets are the task model's own TL;DRs)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [TldrPost(row["post_id"], row["subreddit"], row["title"], row["post"], "") for row in rows]
