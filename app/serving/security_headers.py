"""Response headers that keep a page element from anywhere but this app: a Content-Security-Policy
with a fresh nonce per page, ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``.

An ASGI middleware in front of the gradio app (with the request guard, app/serving/request_guard.py).
gradio's page has inline scripts of its own (its config, its loader) and runs ``js=`` event
handlers and ``js_on_load`` with ``new Function``: each inline ``<script>`` of an HTML response
gets this response's nonce; the app's own ``head`` scripts, which gradio re-creates from its config
at run time (no nonce reaches them), are allowed by their SHA-256 hashes; ``'unsafe-eval'`` stays (gradio's own event code; the app sends
no visitor text to it). Styles: gradio, Svelte and plotly.js write style elements and attributes
at run time, which no nonce or hash can name, so inline styles stay allowed; what a visitor or a
link writes is escaped before it is shown (app/page/shown_text.py), so none of it becomes a styled
element. Scripts, styles, fonts, images, fetches and form targets come from this origin only
(plus data:/blob: images and fonts, which plotly and gradio draw with); no plugin, no <base>
change. The page may still be framed (a HuggingFace Space shows the app in an iframe).
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets

NONCE_BYTES = 18
_OPENING_TAG = re.compile(rb"<script(?=[\s>])", re.IGNORECASE)
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.IGNORECASE | re.DOTALL)
STATIC_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))


def script_hashes(head: str) -> tuple[str, ...]:
    """The CSP sources (``'sha256-...'``) of the inline scripts in a page ``head`` snippet."""
    return tuple(f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
                 for body in _INLINE_SCRIPT.findall(head))


def content_security_policy(nonce: str, hashes: tuple[str, ...] = ()) -> str:
    """The policy of one HTML response whose inline scripts carry ``nonce``; ``hashes``: the app's
    own scripts that gradio inserts without it."""
    return "; ".join((
        "default-src 'self'",
        " ".join(("script-src 'self'", f"'nonce-{nonce}'", *hashes, "'unsafe-eval'")),
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "worker-src 'self' blob:",
        "form-action 'self'",
        "base-uri 'self'",
        "object-src 'none'",
    ))


def with_nonce(body: bytes, nonce: str) -> bytes:
    """Every ``<script`` tag of an HTML page with ``nonce`` (a script with ``src`` from this origin
    is allowed anyway; the attribute is harmless there)."""
    return _OPENING_TAG.sub(b'<script nonce="' + nonce.encode() + b'"', body)


class SecurityHeaders:
    """Adds the static headers to every HTTP response, and the policy (with the page's scripts
    nonced) to every HTML response. An HTML body is buffered to be rewritten: gradio's pages are
    a few hundred kilobytes at most."""

    def __init__(self, app, head: str = "") -> None:
        self.app = app
        self.hashes = script_hashes(head)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(NONCE_BYTES)
        held: dict = {}
        chunks: list[bytes] = []

        async def secured_send(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in dict(STATIC_HEADERS)]
                headers += list(STATIC_HEADERS)
                if not _is_html(headers):
                    await send({**message, "headers": headers})
                    return
                headers.append((b"content-security-policy", content_security_policy(nonce, self.hashes).encode()))
                held["start"] = {**message, "headers": headers}
                return
            if message["type"] != "http.response.body" or "start" not in held:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = with_nonce(b"".join(chunks), nonce)
            start = held.pop("start")
            start["headers"] = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            start["headers"].append((b"content-length", str(len(body)).encode()))
            await send(start)
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, secured_send)


def _is_html(headers: list[tuple[bytes, bytes]]) -> bool:
    content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    encoding = next((v for k, v in headers if k.lower() == b"content-encoding"), b"identity")
    return content_type.lower().startswith(b"text/html") and encoding.lower() in (b"identity", b"")
