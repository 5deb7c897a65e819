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
    unknown = sorted(set(query) - set(names) - IGNORED_QUERY)
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


def qr_html(link: str) -> str:
    """An inline SVG QR code of ``link`` (black on white, quiet zone kept) for a projector; a link
    too long for any QR code (a long non-ASCII prompt: each character is 9 bytes escaped) gets a
    line that says so instead (the link itself still works)."""
    try:
        svg = segno.make(link, error="m").svg_inline(scale=3, dark="#000000", light="#ffffff", border=4)
    except segno.DataOverflowError:
        return (f'<div class="qr">This link is {len(link)} characters: too long for a QR code. Copy it from '
                "the box above, or shorten the prompt.</div>")
    return f'<div class="qr" title="{len(link)} characters">{svg}<div>Scan to open these settings</div></div>'


def _show(value) -> str:
    """A setting as a link writes it: true/false, 3 rather than 3.0."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) < 1e15 else repr(value)
    return str(value)
