"""Facts on the page: each pane's E2E facts (model/tasks/e2e_facts.py) in the line under the panes,
wrong and made-up ones first, and marked in the finished panes' text (the whole words that state
each, one mark however many tokens spell them, with a hover line, and a legend for the marks); for a
TL;DR, whether each pane's summary names the post's main subject (model/tasks/tldr.py); in chat,
whether each pane states a known answer (a lesson's or an example's); in any pane, a sentence it
repeats. Formatting only: the facts' checks are the library's.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Sequence

from app.page.token_html import Mark
from model.tasks.e2e_facts import Fact, check_facts, worst_first
from model.tasks.tldr import PostSubject, SubjectVerdict

PANES = ("SkipDecode", "full model")
# Classes the page's CSS (app/page/style.py) draws: a wrong fact boxed in red, a made-up one underlined in
# brown, a stated one underlined in blue; the text stays #111 on its background (contrast kept).
MARK_CLASS = {"wrong": "fact-wrong", "made up": "fact-made-up", "stated": "fact-stated"}

# What the marks mean, beside the panes (the headline draws it once a run's marks are drawn), worst
# first as the facts line lists them: each sample is drawn with the mark it names, and says its colour
# in words for a reader who cannot tell the colours apart.
FACT_LEGEND = (
    '<div class="legend fact-legend">Marks in the text: '
    '<span><span class="fact fact-wrong">red box</span> a WRONG fact (the MR says otherwise)</span>'
    '<span><span class="fact fact-made-up">dashed brown</span> a made-up fact (the MR gives none)</span>'
    '<span><span class="fact fact-stated">blue underline</span> a fact of the MR, stated</span>'
    '<span>hover a mark for the MR\'s value</span></div>')


@dataclass(frozen=True)
class KnownAnswer:
    """A prompt with one right answer: ``label`` names it, ``pattern`` finds it in a text."""

    label: str
    pattern: str


# Lessons' and example prompts' questions with one answer (app/settings.py EXAMPLE_PROMPTS, app/page/lessons.py).
KNOWN_ANSWERS = {
    "What is the capital of France?": KnownAnswer("Paris", r"\bParis\b"),
    "Who wrote Romeo and Juliet?": KnownAnswer("Shakespeare", r"\bShakespeare\b"),
    "What is the capital of Australia?": KnownAnswer("Canberra", r"\bCanberra\b"),
}


def pane_facts(mr: str, texts: dict[str, str]) -> dict[str, list[Fact]] | None:
    """Each pane's facts for row 0's ``mr`` (as the visitor wrote it); None for an MR the task cannot read."""
    try:
        return {pane: check_facts(mr, text) for pane, text in texts.items()}
    except ValueError:
        return None


def _said(fact: Fact) -> str:
    if fact.state == "wrong":
        return f'{fact.attribute}: "{fact.said}", the MR says {fact.value}'
    return fact.attribute + (f' ("{fact.said}")' if fact.said else "")


def pane_facts_phrase(pane: str, checked: Sequence[Fact]) -> str:
    """'SkipDecode: 1 WRONG (area: "city centre", the MR says riverside), 1 made up (customer rating
    ("5 out of 5")), 5 of 7 stated, missing: familyFriendly' (wrong and made up first)."""
    given = [fact for fact in checked if fact.state != "made up"]
    parts = []
    for state, word in (("wrong", "WRONG"), ("made up", "made up")):
        found = [fact for fact in checked if fact.state == state]
        if found:
            parts.append(f"<b>{len(found)} {word}</b> ({html.escape('; '.join(map(_said, found)), quote=False)})")
    parts.append(f"{sum(fact.state == 'stated' for fact in given)} of {len(given)} stated")
    missing = [fact.attribute for fact in given if fact.state == "missing"]
    if missing:
        parts.append("missing: " + html.escape(", ".join(missing), quote=False))
    if len(parts) == 1 and given:
        parts.append("none wrong or made up")
    return f"{pane}: " + ", ".join(parts)


def facts_line(facts: dict[str, list[Fact]] | None) -> str:
    """' Facts of the MR: SkipDecode: <b>1 WRONG</b> (...), 6 of 7 stated · full model: 7 of 7 stated,
    none wrong or made up.' ("" without facts)."""
    if not facts:
        return ""
    return " Facts of the MR: " + " · ".join(pane_facts_phrase(pane, checked) for pane, checked in facts.items()) + "."


def fact_title(fact: Fact) -> str:
    """The hover line of a marked span."""
    if fact.state == "wrong":
        return f"WRONG {fact.attribute}: the MR says {fact.value}"
    if fact.state == "made up":
        return f"made up: the MR gives no {fact.attribute}"
    return f"{fact.attribute} stated ({fact.value})"


def whole_word_span(text: str, span: tuple[int, int]) -> tuple[int, int]:
    """``span`` widened to the whole words it touches and trimmed of space at its ends: a cue that
    matches the start of a word ("cheap" in "cheaply") marks the word, never a part of it."""
    start, end = span
    while start < end and text[start].isspace():  # trimmed first: a space is no part of the word beside it
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    while start > 0 and text[start - 1].isalnum():
        start -= 1
    while end < len(text) and text[end].isalnum():
        end += 1
    return start, end


def marked_spans(text: str, facts: Sequence[Fact]) -> list[tuple[int, int, Fact]]:
    """(start, end, fact) of each fact with a span in ``text``, as whole words, worst first; a span
    that overlaps a worse one's is left out, so a word carries one mark, the worse."""
    spans: list[tuple[int, int, Fact]] = []
    for fact in worst_first(facts):
        if fact.span is None or fact.state not in MARK_CLASS:
            continue
        start, end = whole_word_span(text, fact.span)
        if start < end and all(end <= s or e <= start for s, e, _ in spans):
            spans.append((start, end, fact))
    return spans


def fact_mark(fact: Fact) -> Mark:
    return f"fact {MARK_CLASS[fact.state]}", fact_title(fact)


def token_marks(pieces: Sequence[str], facts: Sequence[Fact]) -> list[Mark | None]:
    """Per token of a pane (its text is "".join(pieces)): the mark of the fact whose words it
    overlaps, or None. The tokens of one fact share one mark, so the page draws them as one box
    (token_html.tokens_by_depth_html): "rivers|ide" is one wrong word, not two."""
    spans = marked_spans("".join(pieces), facts)
    marks: list[Mark | None] = []
    start = 0
    for piece in pieces:
        end = start + len(piece)
        fact = next((f for s, e, f in spans if s < end and start < e), None)
        marks.append(None if fact is None else fact_mark(fact))
        start = end
    return marks


def marked_text(text: str, facts: Sequence[Fact]) -> list[tuple[str, Mark | None]]:
    """``text`` cut into (piece, mark) at the facts' whole words (a span overlapping a worse one is left out)."""
    pieces: list[tuple[str, Mark | None]] = []
    position = 0
    for start, end, fact in sorted(marked_spans(text, facts), key=lambda span: span[0]):
        pieces += [(text[position:start], None), (text[start:end], fact_mark(fact))]
        position = end
    return [piece for piece in pieces + [(text[position:], None)] if piece[0]]


SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
MIN_REPEATED_WORDS = 3  # "Yes. Yes." is not the loop a decayed schedule falls into; "It is not kid friendly." twice is


def repeated_sentence(text: str) -> str | None:
    """The first sentence of ``text`` that it says again, word for word (case and spacing aside), or
    None: a skipping model at its schedule's floor often loops on one ("It is not kid friendly. It is
    not kid friendly."). Sentences of fewer than MIN_REPEATED_WORDS words are not counted."""
    seen: set[str] = set()
    for sentence in SENTENCE_END.split(text.strip()):
        words = sentence.strip().rstrip(".!?").lower().split()
        if len(words) < MIN_REPEATED_WORDS:
            continue
        key = " ".join(words)
        if key in seen:
            return " ".join(sentence.split())
        seen.add(key)
    return None


def known_answer(prompt: str) -> KnownAnswer | None:
    return KNOWN_ANSWERS.get(" ".join(prompt.split()))


def known_answer_line(prompt: str, texts: dict[str, str]) -> str:
    """' Known answer (Paris): SkipDecode states it · full model does not.' ("" for other prompts)."""
    answer = known_answer(prompt)
    if answer is None:
        return ""
    said = [f"{pane} {'<b>states it</b>' if re.search(answer.pattern, text) else '<b>does not</b>'}"
            for pane, text in texts.items()]
    return f" Known answer ({html.escape(answer.label)}): " + " · ".join(said) + "."


# Where a TL;DR's main subject comes from (model/tasks/tldr.py post_subject), in the line that names it.
SUBJECT_SOURCES = {
    "reference": "the people the test set's reference TL;DR names, the words it shares with the title",
    "title": "from the title alone, your post having no reference: the people it names, its words the post uses",
}


def _quoted(words: Sequence[str]) -> str:
    """'birthday' for one word; all of 'chocolate', 'milk' for several (any one of a kind would do)."""
    quoted = ", ".join(f"'{word}'" for word in words)
    return quoted if len(words) == 1 else f"all of {quoted}"


def subject_phrase(pane: str, verdict: SubjectVerdict | None) -> str:
    """'Full model: names the subject (boyfriend; birthday)', 'SkipDecode 3x: misses 'birthday' (names
    boyfriend)', or '...: still writing' (None: the pane has not finished)."""
    if verdict is None:
        return f"{pane}: still writing"
    named = "; ".join(", ".join(kind) for kind in verdict.named if kind)
    if verdict.names_subject:
        return f"{pane}: <b>names the subject</b>" + (f" ({html.escape(named, quote=False)})" if named else "")
    missing = " and ".join(_quoted(kind) for kind in verdict.missing)
    names = f" (names {html.escape(named, quote=False)})" if named else ""
    return f"{pane}: <b>misses</b> {html.escape(missing, quote=False)}{names}"


def subject_line(subject: PostSubject, verdicts: dict[str, SubjectVerdict | None]) -> str:
    """The headline's block on the post's main subject: '<b>Main subject:</b> brother, mum; chocolate, milk
    (from ...). Full model: names the subject (...) · SkipDecode 3x: misses ...'."""
    source = html.escape(SUBJECT_SOURCES.get(subject.source, subject.source), quote=False)
    people, event = subject.subject.people, subject.subject.event
    if not subject.subject.known:
        return f'<div class="subject-line"><b>Main subject:</b> none this check can see ({source}: none here).</div>'
    words = html.escape("; ".join(", ".join(subject.spelled(kind)) for kind in (people, event) if kind), quote=False)
    panes = " · ".join(subject_phrase(pane, verdict) for pane, verdict in verdicts.items())
    return f'<div class="subject-line"><b>Main subject:</b> {words} ({source}). {panes}.</div>'
