"""Per-session bookkeeping: run handles (Stop, restart, closed tab) and step-mode sessions."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections import OrderedDict
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
        self.steppers = StepSessions()
        self.recent_seconds: collections.deque[float] = collections.deque(maxlen=20)  # finished runs' durations

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
            if not handle.cancelled:
                self.recent_seconds.append(time.monotonic() - handle.started)
            idle = not self._runs
        if idle:
            release_free_memory()

    def typical_seconds(self) -> float | None:
        """Median duration of recent finished runs (None before the first)."""
        with self._lock:
            recent = sorted(self.recent_seconds)
        return recent[len(recent) // 2] if recent else None

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


class StepSessions:
    """Step mode's live sessions (settings, lockstep iterator, renderer), BOUNDED: at most
    ``max_sessions`` (the least recently used is dropped) and none idle for over ``idle_s``.
    API clients never press Reset or close a tab, so nothing else would ever free them."""

    def __init__(self, max_sessions: int = 16, idle_s: float = 600.0) -> None:
        self.max_sessions, self.idle_s = max_sessions, idle_s
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, tuple[float, tuple]] = OrderedDict()

    def get(self, session: str) -> tuple | None:
        with self._lock:
            self._expire()
            entry = self._sessions.get(session)
            if entry is None:
                return None
            self._sessions[session] = (time.monotonic(), entry[1])
            self._sessions.move_to_end(session)
            return entry[1]

    def put(self, session: str, value: tuple) -> None:
        with self._lock:
            self._sessions[session] = (time.monotonic(), value)
            self._sessions.move_to_end(session)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)

    def pop(self, session: str, default=None):
        with self._lock:
            entry = self._sessions.pop(session, None)
        return entry[1] if entry is not None else default

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._sessions)

    def _expire(self) -> None:
        deadline = time.monotonic() - self.idle_s
        for key in [k for k, (seen, _) in self._sessions.items() if seen < deadline]:
            del self._sessions[key]


def session_key(request: gr.Request | None) -> str:
    """The browser/API session's key. Without one, a key of its own: never share a run handle."""
    return getattr(request, "session_hash", None) or f"no-session-{uuid.uuid4().hex}"


def cap_queued_per_session(queue, cap: int) -> None:
    """Refuse a new job from a session that already has ``cap`` jobs waiting in gradio's queue
    (one client must not fill the queue and lock everyone else out). Wraps the queue's ``push``
    of this app instance; the refusal is gradio's "queue full" answer (HTTP 503) with a message
    naming the limit."""
    push = queue.push

    async def capped_push(body, request, username):
        session = getattr(body, "session_hash", None)
        if session is not None:
            waiting = sum(event.session_hash == session for event in _waiting_events(queue))
            if waiting >= cap:
                return (False, f"this session already has {waiting} requests waiting (the limit per session is "
                               f"{cap}); wait for one to finish", "queue_full")
        return await push(body, request, username)

    queue.push = capped_push


def waiting_jobs(queue) -> int:
    """Jobs waiting in gradio's queue (all sessions), not yet running."""
    return sum(1 for _ in _waiting_events(queue))


def _waiting_events(queue):
    """Every event waiting in this app's gradio queue (all lanes), not yet running."""
    for event_queue in queue.event_queue_per_concurrency_id.values():
        yield from event_queue.queue


def release_free_memory() -> None:
    """Hand memory the allocator keeps after a long prompt back to the system (glibc's
    malloc_trim; a no-op elsewhere), so the server's RSS returns towards its baseline when idle."""
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
