"""Generated text as HTML: tokens coloured by the depth that produced them, newline marks.

Readable on a projector: token text is near-black (#111) on backgrounds no darker than a mid
green, so every token keeps a contrast of at least 7:1 (WCAG AA asks 4.5:1), in light and dark
page themes alike (the colours are set on the spans, not inherited).
"""

from __future__ import annotations

import html
from itertools import groupby
from typing import Sequence

TOKEN_TEXT = "#111111"
LIGHTEST = (240, 247, 242)  # a token produced by very few layers
DEEPEST = (118, 189, 140)  # a token produced by every layer
Mark = tuple[str, str]  # (classes, hover line) of a fact a piece states (app/page/fact_view.py)
Entry = tuple[str, int, int, int]  # _merge_newline_runs: (text, depth, token count, index of its first token)


def depth_colour(layers: int, num_layers: int) -> str:
    """Background for a token produced with ``layers`` of ``num_layers``: deeper = greener."""
    share = max(0.0, min(1.0, layers / max(1, num_layers)))
    red, green, blue = (round(a + (b - a) * share) for a, b in zip(LIGHTEST, DEEPEST))
    return f"rgb({red},{green},{blue})"


NEWLINE_MARK = "↵"


def _newline_mark(count: int) -> str:
    """A visible mark for a run of newlines, then ONE line break (a run of 30 newlines must not
    push the pane down by 30 lines)."""
    label = NEWLINE_MARK if count == 1 else f"{NEWLINE_MARK}×{count}"
    return f'<span class="nl" title="{count} newline(s)">{label}</span><br>'


def _text_html(text: str) -> str:
    """Escaped text with each run of newlines drawn as one mark + one break."""
    parts, index = [], 0
    while index < len(text):
        if text[index] == "\n":
            end = index
            while end < len(text) and text[end] == "\n":
                end += 1
            parts.append(_newline_mark(end - index))
            index = end
            continue
        end = text.find("\n", index)
        end = len(text) if end < 0 else end
        parts.append(html.escape(text[index:end]))
        index = end
    return "".join(parts)


def _merge_newline_runs(tokens: Sequence[str], depths: Sequence[int]) -> list[Entry]:
    """(text, depth, token count, index of its first token): consecutive newline-only tokens become one entry."""
    merged: list[Entry] = []
    for index, (token, depth) in enumerate(zip(tokens, depths)):
        newline_only = token != "" and set(token) == {"\n"}
        if newline_only and merged and merged[-1][0] and set(merged[-1][0]) == {"\n"}:
            text, first_depth, count, first = merged[-1]
            merged[-1] = (text + token, first_depth, count + 1, first)
        else:
            merged.append((token, depth, 1, index))
    return merged


def _token_span(text: str, depth: int, count: int, num_layers: int, fact_title: str = "") -> str:
    """One token (or one run of newline tokens) coloured by its depth; the hover says the depth,
    after the fact it states when it states one."""
    title = f"{depth}/{num_layers} layers" + (f" (first of {count} tokens)" if count > 1 else "")
    title = f"{fact_title} · {title}" if fact_title else title
    return (f'<span class="tok" title="{html.escape(title)}" '
            f'style="background:{depth_colour(depth, num_layers)};color:{TOKEN_TEXT}">{_text_html(text)}</span>')


def _marked_run_html(run: list[Entry], mark: Mark, num_layers: int) -> str:
    """The tokens that spell one fact inside ONE mark (a word split "rivers|ide" is one box, not two),
    each keeping its depth colour; the space before the first word and after the last stays outside
    the mark, so the box or underline frames the words alone."""
    texts = [text for text, *_ in run]
    lead = texts[0][: len(texts[0]) - len(texts[0].lstrip())]
    texts[0] = texts[0][len(lead):]
    trail = texts[-1][len(texts[-1].rstrip()):]
    texts[-1] = texts[-1][: len(texts[-1]) - len(trail)]
    (_, first_depth, first_count, _), (_, last_depth, last_count, _) = run[0], run[-1]
    inner = "".join(_token_span(text, depth, count, num_layers, mark[1])
                    for text, (_, depth, count, _) in zip(texts, run) if text)
    parts = [_token_span(lead, first_depth, first_count, num_layers) if lead else "",
             f'<span class="{html.escape(mark[0])}" title="{html.escape(mark[1])}">{inner}</span>' if inner else "",
             _token_span(trail, last_depth, last_count, num_layers) if trail else ""]
    return "".join(parts)


def tokens_by_depth_html(tokens: Sequence[str], depths: Sequence[int], num_layers: int,
                         marks: Sequence[Mark | None] = ()) -> str:
    """Generated tokens as spans coloured by the depth that produced them (hover: the count).
    Newlines are drawn as marks; runs of them collapse into one mark. ``marks``: per token, the
    fact it states (its classes and hover line) or None; consecutive tokens of one fact are drawn
    inside one mark (app/page/fact_view.py token_marks gives them the same one)."""
    def mark_of(entry: Entry) -> Mark | None:
        return marks[entry[3]] if entry[3] < len(marks) else None

    spans = []
    for mark, run in groupby(_merge_newline_runs(tokens, depths), key=mark_of):
        entries = list(run)
        if mark is None:
            spans += [_token_span(text, depth, count, num_layers) for text, depth, count, _ in entries]
        else:
            spans.append(_marked_run_html(entries, mark, num_layers))
    return '<div class="tokens">' + "".join(spans) + "</div>"


def plain_text_html(text: str) -> str:
    """The full model's output in the same box style, newlines drawn like SkipDecode's."""
    return '<div class="tokens">' + _text_html(text) + "</div>"


def marked_text_html(pieces: Sequence[tuple[str, Mark | None]]) -> str:
    """Plain text in pieces, each marked piece a span with its class and hover line (a fact it
    states: app/page/fact_view.py), in the same box style."""
    parts = [_text_html(text) if mark is None else
             f'<span class="{html.escape(mark[0])}" title="{html.escape(mark[1])}">{_text_html(text)}</span>'
             for text, mark in pieces]
    return '<div class="tokens">' + "".join(parts) + "</div>"
