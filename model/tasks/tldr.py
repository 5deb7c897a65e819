"""The Reddit TL;DR task (the SkipDecode paper's second task): a Reddit post in, its one-sentence
TL;DR out. Long prompts (~330 tokens), short outputs: where the prompt's depth starts to matter.

Data: assets/data/tldr/test.jsonl holds 500 test posts with a reference TL;DR each (README beside it:
source, license). No training split exists here, so nothing in this file is ever trained on:
``split_posts`` holds a fixed slice out for choosing between checkpoints and reports on the rest.

The playground's side (app/ runs the task through these): a visitor's post box holds the title on its
first line and the post under it (``post_text``, ``parse_post``); ``example_posts`` are a few reported
test posts; ``task_schedule`` is the schedule the task's policies train on; ``post_subject`` is the main
subject the page checks each summary for (a test post's from its reference, a visitor's from the title).

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

from model.generation.schedules import ScheduleRequest
from model.generation.text import truncate_at_stop
from model.skipdecode.schedule import depth_share_floor
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
SPEEDUPS = (2.0, 3.0, 4.0, 5.0)  # the speedups the task reports and trains policies for


@dataclass(frozen=True)
class TaskShape:
    """A TL;DR schedule's shape: its decay over ``decay_length`` tokens, floored at ``floor_share`` of the
    average depth; the target speedup holds over DECAY_LENGTH tokens whatever the shape."""

    name: str
    decay: str
    decay_length: int
    floor_share: float


# "linear": the task's first shape (above). "front": a step decay over 16 tokens, floored at 0.6 of the average
# depth: a summary's first 8 tokens, where it names the post's subject (restating the title), run deep (3x on 30
# layers: 22 layers, then 6; linear: 13 -> 7), the rest pays for them. A policy runs under the shape it was
# trained in (its training_info.json: ``shape_of``).
SHAPES = {shape.name: shape for shape in (TaskShape("linear", "linear", DECAY_LENGTH, FLOOR_SHARE),
                                          TaskShape("front", "step", 16, 0.6))}
LINEAR = SHAPES["linear"]


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


# --- the playground: the task's schedule, a visitor's post, the examples, the subject a page checks ---
TASK = "tldr"  # the playground's and the CLI's name of the task
# Reported test posts the playground offers as examples: 150-250 words, a subject the title and the
# reference both name (main_subject has people and event words), nothing a class should not read.
EXAMPLE_POST_IDS = ("t3_34p07j", "t3_1caw4d", "t3_1txu9s", "t3_q2crn", "t3_24xg7m", "t3_3bvq12", "t3_1wfkr1")
TITLE_MAX_CHARS = 300  # a longer first line is a post pasted without its title (the test titles: 238 at most)


def task_schedule(speedup: float, num_layers: int, *, full: bool = False, skip_policy: bool = True,
                  prompt_at_full_depth: bool = True, shape: TaskShape = LINEAR) -> ScheduleRequest:
    """The schedule the task's policies train on (tldr_training.train_config) and its evaluation runs
    (tldr_eval.schedule_request): ``shape``'s decay (by default linear over DECAY_LENGTH steps, floored at
    FLOOR_SHARE of the average depth), the speedup held over DECAY_LENGTH steps; the prompt at full depth
    unless asked."""
    if full or speedup <= 1:
        return ScheduleRequest(target_speedup=1.0, full=True, skip_policy=skip_policy)
    return ScheduleRequest(target_speedup=speedup, decay=shape.decay, decay_length=shape.decay_length,
                           speedup_steps=DECAY_LENGTH,
                           min_layers_floor=depth_share_floor(num_layers, speedup, shape.floor_share),
                           prompt_at_full_depth=prompt_at_full_depth, skip_policy=skip_policy)


def shape_of(adapter: str | Path | None) -> TaskShape:
    """The shape a TL;DR policy was trained in (the schedule its training_info.json records); LINEAR where
    there is no policy, or one trained on another schedule (the general policy: many; a test's)."""
    info = Path(adapter) / "training_info.json" if adapter else None
    if info is None or not info.is_file():
        return LINEAR
    config = json.loads(info.read_text()).get("config", {})
    trained = (config.get("fixed_speedup") is not None, config.get("fixed_decay"), config.get("fixed_decay_length"))
    if config.get("fixed_speedup_steps") not in (None, DECAY_LENGTH):  # None: before the field, the decay length
        return LINEAR
    for shape in SHAPES.values():
        if trained == (True, shape.decay, shape.decay_length) and abs((config.get("floor_share") or 0)
                                                                      - shape.floor_share) < 1e-6:
            return shape
    return LINEAR


def post_text(post: TldrPost) -> str:
    """What the playground's post box holds for ``post``: the title on the first line, a blank line, the post
    (the prompt's own layout: ``parse_post`` gives back the same title and post, so the same prompt)."""
    return f"{post.title}\n\n{post.post}"


def parse_post(text: str) -> TldrPost:
    """A post as a visitor writes it: the title on the first line, the post under it. A test post (the
    same title and text, spacing aside) comes back as itself, with its reference; a ValueError says
    what is missing."""
    title, _, body = text.strip().partition("\n")
    title, body = title.strip(), body.strip()
    if not title:
        raise ValueError("it is empty: write its title on the first line, the post under it")
    if len(title) > TITLE_MAX_CHARS:
        raise ValueError(f"its first line is read as the title and is {len(title)} characters long (at most "
                         f"{TITLE_MAX_CHARS}): put the title on a line of its own, the post under it")
    if not body:
        raise ValueError("it has a title but no text: the first line is the title, write the post under it")
    return _test_posts().get(_key(title, body)) or TldrPost("", "", title, body, "")


def _key(title: str, post: str) -> tuple[str, str]:
    return " ".join(title.split()), " ".join(post.split())


@lru_cache(maxsize=1)
def _test_posts() -> dict[tuple[str, str], TldrPost]:
    """Every test post by its title and text (none without the data)."""
    try:
        return {_key(post.title, post.post): post for post in read_posts()}
    except (OSError, ValueError):
        return {}


def example_posts(folder: Path = TLDR_DATA) -> list[TldrPost]:
    """The playground's examples (EXAMPLE_POST_IDS), from the reported split, in that order."""
    posts = {post.post_id: post for post in reported_posts(folder)}
    return [posts[post_id] for post_id in EXAMPLE_POST_IDS if post_id in posts]


def summary_text(text: str) -> str:
    """A generated TL;DR as the task scores it: cut at its first line break (STOP), "TL;DR:" removed."""
    return clean_summary(truncate_at_stop(text, STOP))


def title_subject(post: TldrPost) -> MainSubject:
    """The main subject of a post without a reference, from its title alone: the PEOPLE words the title
    names, and the title's content words the post also uses (main_subject's two kinds)."""
    people = frozenset(set(stems(post.title)) & _people_stems())
    event = frozenset((content_stems(post.title) & content_stems(post.post)) - _people_stems())
    return MainSubject(people, event)


def spellings(text: str) -> dict[str, str]:
    """Each stem of ``text`` -> the first word that spells it (lower-cased), in the order they come."""
    words = re.findall(r"[a-z]+", text.lower().replace("'s", "").replace("'", ""))
    found: dict[str, str] = {}
    for word in words:
        found.setdefault(_stemmer().stem(word), word)
    return found


@dataclass(frozen=True)
class PostSubject:
    """A post's main subject as the page checks it, and where it came from."""

    subject: MainSubject
    source: str  # "reference": main_subject (a test post); "title": title_subject (a visitor's post)
    words: tuple[tuple[str, str], ...]  # (stem, a word that spells it) for the subject's stems, as the source spells them

    def spelled(self, stems_: frozenset[str]) -> list[str]:
        """The words of ``stems_`` in the order the source text has them."""
        return [word for stem, word in self.words if stem in stems_]


@lru_cache(maxsize=64)
def post_subject(post: TldrPost) -> PostSubject:
    """``main_subject`` where the post has a reference (a test post), else ``title_subject``."""
    if post.reference:
        subject, source, text = main_subject(post), "reference", f"{post.reference} {post.title}"
    else:
        subject, source, text = title_subject(post), "title", f"{post.title} {post.post}"
    wanted = subject.people | subject.event
    return PostSubject(subject, source, tuple((stem, word) for stem, word in spellings(text).items() if stem in wanted))


@dataclass(frozen=True)
class SubjectVerdict:
    """Whether a summary names its post's main subject (names_main_subject), and by which words."""

    names_subject: bool
    summary: str  # the summary as checked (summary_text)
    named: tuple[tuple[str, ...], tuple[str, ...]]  # (people, event): the subject's words it uses, as it spells them
    missing: tuple[tuple[str, ...], ...]  # per kind it names none of (people first): that kind's words, as the source spells them


def subject_verdict(summary: str, subject: PostSubject) -> SubjectVerdict:
    """``summary`` (as generated: summary_text cuts and cleans it) checked against ``subject``."""
    text = summary_text(summary)
    said = spellings(text)
    people, event = subject.subject.people, subject.subject.event
    named = tuple(tuple(said[stem] for stem, _ in subject.words if stem in kind and stem in said) for kind in (people, event))
    missing = tuple(tuple(subject.spelled(kind)) for kind in (people, event) if kind and not kind & said.keys())
    return SubjectVerdict(names_main_subject(text, subject.subject), text, (named[0], named[1]), missing)
