"""A deadline for reading each request: a half-sent request cannot hold a socket for ever.

uvicorn (which gradio builds itself, with no way to pass options) times out only an idle keep-alive
connection after a response; a client that connects and sends nothing, or sends a header byte every
few seconds (slowloris), or announces a body it never sends, keeps its socket and its buffers as
long as it likes. ``DeadlineH11Protocol`` gives every request ``REQUEST_READ_S`` seconds from the
connection (or from its first byte on a kept-alive connection) until its headers
AND body have arrived; after that the connection is closed. Responses are not limited: a generation
streamed for minutes is untouched, because its request was read in full long before.

``guard_slow_clients`` makes it uvicorn's "auto" HTTP protocol (what gradio's server asks for). It
is h11, the protocol uvicorn picks when httptools is not installed (requirements.txt does not
install it); this module refuses an untested uvicorn at start-up like app/serving/gradio_internals.py does
for gradio.
"""

from __future__ import annotations

import asyncio

import h11
import uvicorn
import uvicorn.config
from uvicorn.protocols.http.h11_impl import H11Protocol

from model.common.checks import check_number
from model.common.settings import settings

SUPPORTED_UVICORN = "0.54."  # requirements.txt pins uvicorn==0.54.0
# SKIPDECODE_REQUEST_READ_S's default (model/common/settings.py): a phone on a slow link sends a few KB of
# request well inside this (nginx: 60 s per phase)
DEFAULT_REQUEST_READ_S = 30.0


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request is not fully read in time."""

    read_seconds = DEFAULT_REQUEST_READ_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._arm_read_deadline()  # a connection that never sends a byte is closed too

    def data_received(self, data: bytes) -> None:
        if self._read_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm_read_deadline()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._cancel_read_deadline()  # between requests uvicorn's keep-alive timeout applies
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_deadline()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._cancel_read_deadline()  # the connection now belongs to the websocket protocol
        super().handle_websocket_upgrade(event)

    def _arm_read_deadline(self) -> None:
        self._read_deadline = self.loop.call_later(self.read_seconds, self._read_deadline_passed)

    def _cancel_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_deadline_passed(self) -> None:
        self._read_deadline = None
        # IDLE: not even the headers (or nothing at all); SEND_BODY: a body that stopped arriving.
        # DONE (the request is read and its response is being made or streamed) is left alone.
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.transport.close()


def guard_slow_clients(read_seconds: float | None = None) -> None:
    """Make the deadline protocol the one uvicorn's "auto" choice loads (idempotent), with a deadline of
    ``read_seconds`` (None: the SKIPDECODE_REQUEST_READ_S setting; the tests use a short one)."""
    if not uvicorn.__version__.startswith(SUPPORTED_UVICORN):
        raise RuntimeError(
            f"app/serving/slow_clients.py was written for uvicorn {SUPPORTED_UVICORN}x (its h11 protocol's hooks); the "
            f"installed uvicorn is {uvicorn.__version__}. Install the pinned one (requirements.txt) or re-check it.")
    if read_seconds is None:
        read_seconds = settings().request_read_s
    DeadlineH11Protocol.read_seconds = check_number("request read seconds", read_seconds, low=0.1, high=3600)
    uvicorn.config.HTTP_PROTOCOLS["auto"] = DeadlineH11Protocol  # type: ignore[assignment]
