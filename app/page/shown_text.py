"""Text from a visitor, a share link or the model, made safe to show: capped in length and escaped
so that neither HTML nor Markdown reads any of it as markup.

gradio's sanitiser removes scripts and event handlers but keeps forms, inputs, links and inline
styles, so a link whose parameter NAME is a ``<form>`` once drew a fake sign-in box in the status
line. Escaping, not sanitising, is the rule here: what a visitor typed is shown as the characters
they typed, never as a page element.
"""

from __future__ import annotations

import html
import string

MAX_SHOWN_CHARS = 200  # one value or name in a status line; a whole message is capped by its builder
ELLIPSIS = "…"
_MARKDOWN_SYNTAX = frozenset(string.punctuation)  # every ASCII punctuation character can start Markdown syntax


def capped(text: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` as a string of at most ``limit`` characters (an ellipsis marks a cut)."""
    text = str(text)
    return text if len(text) <= limit else text[: max(0, limit - 1)] + ELLIPSIS


def as_html(text: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """For an HTML context (a gr.HTML pane, a toast): capped, with & < > " ' as entities."""
    return html.escape(capped(text, limit), quote=True)


def as_markdown(text: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """For a Markdown context (a gr.Markdown status line): capped, on one line, and every ASCII
    punctuation character written as a numeric character reference. CommonMark reads a character
    reference as literal text, never as syntax, so no emphasis, link, ``[text](url)``, bare-URL or
    e-mail autolink (``:``, ``.`` and ``@`` are references), raw HTML, heading, list or table can
    come out of it. Line breaks and other control characters become spaces (a line break could
    start a block). The Markdown component must also have no LaTeX delimiters: KaTeX reads the
    rendered text, where ``$`` is a dollar again (the app's visitor-facing Markdown sets
    ``latex_delimiters=[]``)."""
    flat = "".join(ch if ch.isprintable() else " " for ch in capped(text, limit))
    return "".join(f"&#{ord(ch)};" if ch in _MARKDOWN_SYNTAX else ch for ch in flat)
