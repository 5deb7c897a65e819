"""The Reddit TL;DR task (the SkipDecode paper's second task): a Reddit post in, its one-sentence
TL;DR out. Long prompts (~330 tokens), short outputs: where the prompt's depth starts to matter.

Data: assets/data/tldr/test.jsonl holds 500 test posts with a reference TL;DR each (README beside it:
source, license). No training split exists here, so nothing in this file is ever trained on:
``split_posts`` holds a fixed slice out for choosing between checkpoints and reports on the rest.

The measures a reader of a summary cares about:
    rouge_scores      ROUGE-1, ROUGE-2 and ROUGE-L F1 against the reference (rouge-score, Porter
                      stemming: the field's usual setting for TL;DR)
    main_subject      the post's main subject as its own reader and the reference's writer both name
                      it: the PEOPLE words the reference names, and the EVENT words the title and the
                      reference share (content words, stemmed); ``names_main_subject`` checks that a
                      summary names at least one of each kind the post has
    share_interval    an arm's mean score as a share of the 1x arm's, with a 95% paired bootstrap
                      interval over posts
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from model.tasks.task_intervals import draw_weights, ratio_interval

TLDR_DATA = Path(__file__).resolve().parents[2] / "assets" / "data" / "tldr"
TEST_FILE = "test.jsonl"
HELDOUT_POSTS = 100  # the slice for choosing checkpoints; the rest (400) is what reports use
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")

# Who a relationship-advice post is about, as posters and summarisers name them. Matched by stem, so
# "boyfriend's" and "friends" count; gendered-age tags like "[19 F]" are not words and do not count.
PEOPLE = frozenset("""
boyfriend girlfriend husband wife fiance fiancee partner spouse ex bf gf
friend bestfriend roommate flatmate housemate neighbor neighbour
mom mum mother dad father parent son daughter brother sister sibling child kid baby
grandma grandmother grandpa grandfather aunt uncle cousin niece nephew family
boss coworker colleague manager employer landlord teacher professor classmate student
guy girl man woman boy crush
""".split())
# Words too common in these posts to say what a post is about (beside the usual stop words).
STOP_WORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further get got had has
have having he her here hers herself him himself his how i if in into is it its itself just know like
me more most my myself no nor not now of off on once only or other our ours ourselves out over own
really same she should so some such than that the their theirs them themselves then there these they
this those through to too under until up very was we were what when where which while who whom why
will with would you your yours yourself yourselves im ive dont didnt cant wont thing things want
need think feel going go make made one two time still even much way back since ago lot something
anyone someone everyone help advice question tldr need needs anything else year years old month
months week weeks day days told tell said say says may might must shall ok okay alright done
""".split())


@dataclass(frozen=True)
class TldrPost:
    post_id: str  # the Reddit id, e.g. "t3_1wbdsh"
    subreddit: str
    title: str
    post: str
    reference: str  # the human TL;DR


def read_posts(folder: Path = TLDR_DATA) -> list[TldrPost]:
    """Every test post, in the file's order."""
    posts = []
    for line in (folder / TEST_FILE).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            posts.append(TldrPost(row["instruction_id"], row["subreddit"], row["title"].strip(),
                                  row["instruction"].strip(), row["gold_response"].strip()))
    return posts


def _slice_key(post: TldrPost) -> str:
    return hashlib.sha256(post.post_id.encode()).hexdigest()


def split_posts(posts: Sequence[TldrPost], heldout: int = HELDOUT_POSTS) -> tuple[list[TldrPost], list[TldrPost]]:
    """(held out for choosing checkpoints, reported): the ``heldout`` posts whose SHA-256 of their id sorts
    first, then the rest, each in the file's order. The rule reads no text, so it was fixed before any was."""
    chosen = {post.post_id for post in sorted(posts, key=_slice_key)[:heldout]}
    return [p for p in posts if p.post_id in chosen], [p for p in posts if p.post_id not in chosen]


def reported_posts(folder: Path = TLDR_DATA) -> list[TldrPost]:
    return split_posts(read_posts(folder))[1]


# The prompts the task model was chosen among (lab/studies/tldr_prompts.py: the 1x arm's ROUGE-L on the
# held-out slice, the rule fixed before it ran); PROMPT names the chosen one. The chat template wraps it.
PROMPTS = {
    "instruction first": ("Summarise this Reddit post in one sentence, as its TL;DR.\n\nSubreddit: r/{subreddit}\n"
                          "Title: {title}\n\n{post}\n\nTL;DR:"),
    "post first": ("SUBREDDIT: r/{subreddit}\nTITLE: {title}\nPOST: {post}\n\n"
                   "Write a one-sentence TL;DR of the post above, in the poster's own voice."),
    "post first, short": "{title}\n\n{post}\n\nTL;DR of the post above in one sentence:",
}
PROMPT = "post first, short"
STOP = ("\n",)  # a TL;DR is one line: the text ends at its first line break
# The task's schedule, the same in training and evaluation: the decay reaches its floor as a typical TL;DR
# ends (references are 27.5 words on average, ~36 tokens), and the floor keeps 2/3 of the average depth
# (as E2E's), so a summary's last words are never written by one to three layers.
DECAY_LENGTH = 32
FLOOR_SHARE = 2 / 3
MAX_NEW_TOKENS = 48


def task_prompt(post: TldrPost, template: str | None = None) -> str:
    """The prompt the default (instruction-tuned) model summarises from (``template``: one of PROMPTS)."""
    return (template or PROMPTS[PROMPT]).format(subreddit=post.subreddit, title=post.title, post=post.post)


def clean_summary(text: str) -> str:
    """The summary as scored: a leading "TL;DR:" the model repeated and surrounding space removed."""
    return re.sub(r"^\s*(tl\s*;?\s*dr\s*:?)\s*", "", text, flags=re.IGNORECASE).strip()


@lru_cache(maxsize=1)
def _scorer() -> Any:
    from rouge_score import rouge_scorer  # noqa: PLC0415 (nltk's stemmer loads only where ROUGE is scored)

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def rouge_scores(summary: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L F1 of one summary against its reference, in [0, 1]."""
    scores = _scorer().score(reference, clean_summary(summary))
    return {name: scores[name].fmeasure for name in ROUGE_TYPES}


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    from nltk.stem.porter import PorterStemmer  # noqa: PLC0415

    return PorterStemmer()


def stems(text: str) -> list[str]:
    """The text's words, lower-cased, apostrophes and tags dropped, Porter-stemmed."""
    words = re.findall(r"[a-z]+", text.lower().replace("'s", "").replace("'", ""))
    return [_stemmer().stem(word) for word in words]


@lru_cache(maxsize=1)
def _people_stems() -> frozenset[str]:
    return frozenset(_stemmer().stem(word) for word in PEOPLE)


@lru_cache(maxsize=1)
def _stop_stems() -> frozenset[str]:
    return frozenset(_stemmer().stem(word) for word in STOP_WORDS)


def content_stems(text: str) -> set[str]:
    return {stem for stem in stems(text) if len(stem) >= 3 and stem not in _stop_stems()}


@dataclass(frozen=True)
class MainSubject:
    people: frozenset[str]  # stems of the people the reference names
    event: frozenset[str]  # stems of the content words the title and the reference share

    @property
    def known(self) -> bool:
        """Whether the post has a subject this check can see (otherwise it is left out of the share)."""
        return bool(self.people or self.event)


def main_subject(post: TldrPost) -> MainSubject:
    people = frozenset(set(stems(post.reference)) & _people_stems())  # "ex", "bf": too short for content words
    event = frozenset((content_stems(post.reference) & content_stems(post.title)) - _people_stems())
    return MainSubject(people, event)


def names_main_subject(summary: str, subject: MainSubject) -> bool:
    """At least one of the post's people (where the reference names any) and one of its event words
    (where the title and the reference share any) in the summary."""
    said = set(stems(clean_summary(summary)))
    return (not subject.people or bool(said & subject.people)) and (not subject.event or bool(said & subject.event))


@dataclass(frozen=True)
class ShareInterval:
    share: float  # the arm's mean over the posts / the 1x arm's mean
    low: float
    high: float


def share_interval(arm: Sequence[float], full: Sequence[float], resamples: int = 2000, seed: int = 0) -> ShareInterval:
    """The arm's mean score as a share of the 1x arm's on the same posts, with the 2.5th and 97.5th
    percentiles of the same share over ``resamples`` paired draws of the posts (E2E's bootstrap:
    task_intervals.draw_weights, one draw picks a post for both arms)."""
    if len(arm) != len(full) or not arm:
        raise ValueError(f"an interval needs the same posts in both arms; got {len(arm)} and {len(full)}")
    ours, theirs = torch.tensor(arm, dtype=torch.float64), torch.tensor(full, dtype=torch.float64)
    base = float(theirs.sum())
    if not base:  # the 1x arm scored nothing on any post: there is no share to take, so call it whole
        return ShareInterval(share=1.0, low=1.0, high=1.0)
    weights = draw_weights(len(arm), resamples, seed)
    low, high = ratio_interval(weights @ ours, weights @ theirs)
    return ShareInterval(share=float(ours.sum()) / base, low=low, high=high)


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
