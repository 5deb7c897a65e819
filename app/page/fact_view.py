"""Facts on the page: each pane's E2E facts (model/tasks/e2e_facts.py) in the line under the panes,
wrong and made-up ones first, and marked in the finished panes' text (the words that state each,
with a hover line); in chat, whether each pane states a known answer (a lesson's or an example's).
Formatting only: the checks are the library's.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Sequence

from model.tasks.e2e_facts import Fact, check_facts, worst_first

PANES = ("SkipDecode", "full model")
# Classes the page's CSS (app/page/style.py) draws: a wrong fact boxed in red, a made-up one underlined in
# brown, a stated one underlined in blue; the text stays #111 on its background (contrast kept).
MARK_CLASS = {"wrong": "fact-wrong", "made up": "fact-made-up", "stated": "fact-stated"}


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


def _marked_facts(facts: Sequence[Fact]) -> list[Fact]:
    """Facts with a span, worst first, so a span that states two keeps the worse mark."""
    return [fact for fact in worst_first(facts) if fact.span is not None and fact.state in MARK_CLASS]


def token_marks(pieces: Sequence[str], facts: Sequence[Fact]) -> list[tuple[str, str] | None]:
    """Per token of a pane (its text is "".join(pieces)): (class, hover line) of the worst fact whose
    span it overlaps, or None."""
    marked = _marked_facts(facts)
    marks: list[tuple[str, str] | None] = []
    start = 0
    for piece in pieces:
        end = start + len(piece)
        fact = next((f for f in marked if f.span and f.span[0] < end and start < f.span[1]), None)
        marks.append(None if fact is None or not piece.strip() else (f"fact {MARK_CLASS[fact.state]}",
                                                                    fact_title(fact)))
        start = end
    return marks


def marked_text(text: str, facts: Sequence[Fact]) -> list[tuple[str, tuple[str, str] | None]]:
    """``text`` cut into (piece, mark) at the facts' spans (a span overlapping a worse one is left out)."""
    spans: list[tuple[int, int, Fact]] = []
    for fact in _marked_facts(facts):
        start, end = fact.span or (0, 0)
        if all(end <= s or e <= start for s, e, _ in spans):
            spans.append((start, end, fact))
    pieces: list[tuple[str, tuple[str, str] | None]] = []
    position = 0
    for start, end, fact in sorted(spans, key=lambda span: span[0]):
        pieces += [(text[position:start], None), (text[start:end], (f"fact {MARK_CLASS[fact.state]}", fact_title(fact)))]
        position = end
    return [piece for piece in pieces + [(text[position:], None)] if piece[0]]


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
