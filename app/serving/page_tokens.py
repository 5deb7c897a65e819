"""Page tokens: a session counts as a page session only after a page load it cannot skip.

A script once invented 16 session ids, held each one's heartbeat open and was counted as 16
visitors. Now every page (an HTML response) sets a cookie with a signed, single-use token; the
first heartbeat of a session that carries an unused, unexpired token makes that session a page
session (later heartbeats of it need none: gradio reconnects them). A session without one (a
script, a gradio_client ``Client`` that did not load the page) is pooled with its address's API
client. A script can still load the page many times, so the fair queue also caps the places one
address takes in a round (app/serving/fair_queue.py: ServingLimits.places_per_address).

Tokens are HMAC-signed with a key made at start-up, so an issued token costs no memory; a claimed
one is remembered until it expires (a claim within ``ttl_s`` of its page load).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie

COOKIE = "skipdecode_page"


@dataclass
class PageTokens:
    ttl_s: float = 600.0  # gradio opens the heartbeat at page load; a page kept for longer reconnects
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    _claimed: dict[str, float] = field(default_factory=dict, repr=False)  # nonce -> issue time
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def issue(self, now: float | None = None) -> str:
        body = f"{int(time.time() if now is None else now)}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._signature(body)}"

    def claim(self, token: str | None, now: float | None = None) -> bool:
        """True once for a token this server issued within ``ttl_s``; False for anything else."""
        now = time.time() if now is None else now
        parts = (token or "").split(".")
        if len(parts) != 3 or not parts[0].isdigit():
            return False
        body = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(parts[2], self._signature(body)) or not 0 <= now - int(parts[0]) <= self.ttl_s:
            return False
        with self._lock:
            for nonce in [n for n, issued in self._claimed.items() if now - issued > self.ttl_s]:
                del self._claimed[nonce]  # expired tokens are refused by their time anyway
            if parts[1] in self._claimed:
                return False
            self._claimed[parts[1]] = int(parts[0])
        return True

    def _signature(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()[:32]


def cookie_header(token: str, secure: bool) -> bytes:
    """The Set-Cookie value for a page. Over HTTPS (a Space shows the app in an iframe of another
    site) a third-party, partitioned cookie; over plain HTTP (loopback) a first-party one."""
    attributes = "Path=/; HttpOnly; Max-Age=600; " + ("SameSite=None; Secure; Partitioned" if secure else "SameSite=Lax")
    return f"{COOKIE}={token}; {attributes}".encode()


def token_in(cookie_header_value: str) -> str | None:
    try:
        cookies = SimpleCookie(cookie_header_value)
    except CookieError:
        return None
    morsel = cookies.get(COOKIE)
    return morsel.value if morsel is not None else None
