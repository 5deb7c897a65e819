"""Settings carried in a link: read back with range checks, written with only what differs from
the page's defaults, and drawn as a QR code for a projector (segno, no network).

A link names settings exactly as the public API's parameters (``/?target_speedup=3&decay=cosine``).
"""

from __future__ import annotations

from urllib.parse import urlencode

import segno

from app.page.shown_text import capped
from app.settings import Limits, PlaygroundSettings

IGNORED_QUERY = {"__theme", "view"}  # gradio's own query parameters
LESSON_QUERY = ("lesson", "run")  # a lesson's link: its number in the list, and whether it starts on open
QR_PIXELS = 340  # a QR code's side: large enough to scan from the back of a room when projected
# A link is written by anyone: what it names is echoed capped (plain text here; the page escapes it).
MAX_NAME_CHARS = 40
MAX_NAMES_SHOWN = 5
MAX_PROBLEM_CHARS = 160
MAX_MESSAGE_CHARS = 600


def settings_from_query(query: dict[str, str], limits: Limits, defaults: dict,
                        ranges: dict[str, tuple[float, float]] | None = None) -> tuple[dict, str]:
    """(values to set, message) from a URL query: known API parameter names only, each checked
    by the settings schema and against the page's control ranges; a bad value is named in the
    message (with the value the page keeps) and left out. The message is PLAIN text, capped: each
    unknown name, each problem and the whole; the caller escapes it for where it shows it."""
    names = PlaygroundSettings.api_names()
    values, problems = {}, []
    for name in names:
        if name not in query:
            continue
        try:
            checked = PlaygroundSettings.from_values(limits, **(defaults | {"prompt": "x", name: query[name]}))
        except ValueError as error:
            problems.append(f"{capped(error, MAX_PROBLEM_CHARS)} (kept {_show(defaults.get(name))})")
            continue
        value = getattr(checked, name)
        low, high = (ranges or {}).get(name, (None, None))
        if low is not None and not low <= value <= high:
            problems.append(f"{name}={capped(query[name], MAX_NAME_CHARS)} is outside this page's range {_show(low)}-{_show(high)} "
                            f"(kept {_show(defaults.get(name))})")
            continue
        values[name] = value
    unknown = sorted(set(query) - set(names) - IGNORED_QUERY - set(LESSON_QUERY))
    if unknown:
        problems.append(f"unknown link parameter(s): {unknown_names(unknown)}")
    return values, capped("; ".join(problems), MAX_MESSAGE_CHARS)


def unknown_names(names: list[str]) -> str:
    """The first few unknown names, each capped, and how many more (a link may carry thousands)."""
    shown = ", ".join(capped(name, MAX_NAME_CHARS) for name in names[:MAX_NAMES_SHOWN])
    more = len(names) - MAX_NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def share_query(values: dict, defaults: dict, limits: Limits) -> str:
    """The URL query of the settings that differ from the page's defaults (API names, schema
    order); a value the schema rejects raises ValueError naming it."""
    current = PlaygroundSettings.from_values(limits, **(defaults | values))
    base = PlaygroundSettings.from_values(limits, **defaults)
    changed = [(name, getattr(current, name)) for name in PlaygroundSettings.api_names()
               if getattr(current, name) != getattr(base, name)]
    return urlencode([(name, _show(value)) for name, value in changed])


def share_link(page: str, values: dict, defaults: dict, limits: Limits) -> str:
    query = share_query(values, defaults, limits)
    return page + ("?" + query if query else "")


def lesson_link(page: str, number: int, start: bool) -> str:
    """A link that opens lesson ``number`` (1-based, as the list shows them) and, with ``start``, runs it."""
    return page + "?" + urlencode([("lesson", number)] + ([("run", 1)] if start else []))


def lesson_in_query(query: dict[str, str], count: int) -> tuple[int | None, bool, str]:
    """(the 0-based lesson a link names or None, whether it starts it, a problem in plain text or "")."""
    if "lesson" not in query:
        return None, False, ""
    number = query["lesson"].strip()
    if not number.isdigit() or not 1 <= int(number) <= count:
        return None, False, f"lesson={capped(number, MAX_NAME_CHARS)} names no lesson (1-{count})"
    return int(number) - 1, query.get("run", "").strip().lower() in ("1", "true", "yes"), ""


def qr_html(link: str, caption: str = "Scan to open these settings") -> str:
    """An inline SVG QR code of ``link`` (black on white, quiet zone kept), about QR_PIXELS wide so a
    projector shows it to a room; a link too long for any QR code (a long non-ASCII prompt: each
    character is 9 bytes escaped) gets a line that says so instead (the link itself still works)."""
    try:
        code = segno.make(link, error="m")
    except segno.DataOverflowError:
        return (f'<div class="qr">This link is {len(link)} characters: too long for a QR code. Copy it from '
                "the box above, or shorten the prompt.</div>")
    # a viewBox and no fixed size: the page's style draws it QR_PIXELS wide, or the column's width on a phone
    svg = code.svg_inline(dark="#000000", light="#ffffff", border=4, omitsize=True)
    return (f'<div class="qr" title="{len(link)} characters" style="--qr-size: {QR_PIXELS}px">{svg}'
            f'<div>{caption}</div></div>')


def _show(value) -> str:
    """A setting as a link writes it: true/false, 3 rather than 3.0."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) < 1e15 else repr(value)
    return str(value)
