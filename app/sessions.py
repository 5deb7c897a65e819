"""Per-session bookkeeping: run handles (Stop, restart, closed tab) and step-mode sessions."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import gradio as gr


@dataclass
class RunHandle:
    """One session's running generation; ``cancelled`` makes the decoder stop at its next step."""

    cancelled: bool = False
    reason: str = ""
    started: float = field(default_factory=time.monotonic)

    def cancel(self, reason: str = "stop") -> None:
        self.cancelled, self.reason = True, reason


class SessionRuns:
    """Per-browser-session run handles: a new run, Stop, a settings restart or a closed tab
    cancels that session's previous run, never another session's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RunHandle] = {}
        self.steppers: dict[str, tuple] = {}  # session -> (settings, lockstep iterator, RaceRenderer)

    def start(self, session: str) -> RunHandle:
        handle = RunHandle()
        with self._lock:
            previous = self._runs.get(session)
            if previous is not None:
                previous.cancel()
            self._runs[session] = handle
        return handle

    def is_running(self, session: str) -> bool:
        with self._lock:
            handle = self._runs.get(session)
            return handle is not None and not handle.cancelled

    def finish(self, session: str, handle: RunHandle) -> None:
        with self._lock:
            if self._runs.get(session) is handle:
                del self._runs[session]

    def cancel(self, session: str, reason: str = "stop") -> None:
        with self._lock:
            handle = self._runs.pop(session, None)
            self.steppers.pop(session, None)
        if handle is not None:
            handle.cancel(reason)

    def sessions(self) -> list[str]:
        with self._lock:
            return list(self._runs)

    def active_count(self) -> int:
        with self._lock:
            return sum(not h.cancelled for h in self._runs.values())


def session_key(request: gr.Request | None) -> str:
    """The browser/API session's key. Without one, a key of its own: never share a run handle."""
    return getattr(request, "session_hash", None) or f"no-session-{uuid.uuid4().hex}"
