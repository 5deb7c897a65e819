"""Per-session bookkeeping: run handles (Stop, restart, closed tab) and step-mode sessions (bounded in
sessions, KV-cache positions and idle time)."""

from __future__ import annotations

import collections
import ctypes
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

import gradio as gr

from model.common.settings import settings

M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


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

    # A Generate click that waits longer than this for its run to start no longer remembers a Stop.
    ARMED_FOR_S = 3600.0

    def __init__(self, step_positions: int = 32768, step_bytes: int = 1 << 30, step_per_address: int = 4) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RunHandle] = {}
        # session -> (time of its Generate click, Stop pressed since): a run still waiting in the
        # queue (or between the queue and its start) has no handle for Stop to cancel yet.
        self._armed: dict[str, tuple[float, bool]] = {}
        self.steppers = StepSessions(max_positions=step_positions, max_bytes=step_bytes, per_owner=step_per_address)
        self.recent_seconds: collections.deque[float] = collections.deque(maxlen=20)  # finished runs' durations

    def arm(self, session: str) -> None:
        """A Generate click, before its run waits in the queue: a Stop from now until the run
        starts ends that run as it starts (``start`` returns it cancelled)."""
        now = time.monotonic()
        with self._lock:
            for key in [key for key, (at, _) in self._armed.items() if now - at > self.ARMED_FOR_S]:
                del self._armed[key]  # clicks whose run never started (dropped from the queue)
            self._armed[session] = (now, False)

    def start(self, session: str) -> RunHandle:
        """The session's new run (cancelling its previous one); already cancelled when Stop was
        pressed after the Generate click that queued it."""
        handle = RunHandle()
        with self._lock:
            previous = self._runs.get(session)
            if previous is not None:
                previous.cancel()
            _, stopped = self._armed.pop(session, (0.0, False))
            if stopped:
                handle.cancel("stop")
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
        """End the session's run; with none running yet, a Stop ends the run its last Generate
        click queued (``arm``) as soon as it starts."""
        with self._lock:
            handle = self._runs.pop(session, None)
            self.steppers.pop(session, None)
            if handle is None and reason == "stop" and session in self._armed:
                self._armed[session] = (self._armed[session][0], True)
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
    ``max_sessions``, at most ``per_owner`` of one owner (a client's network address), at most
    ``max_positions`` KV-cache positions and ``max_bytes`` of memory over all of them (a session costs
    what ``put`` is told: both streams' batch x (prompt + new tokens), and its estimated bytes), and
    none idle for over ``idle_s``. An owner over its share loses its OWN least recently used session
    first, so one script cannot evict the class; over a global bound the least recently used go.
    API clients never press Reset or close a tab, so nothing else would ever free them. An evicted
    session's iterator is closed at once, so its KV caches are freed now, not at the next garbage
    collection."""

    def __init__(self, max_sessions: int = 16, idle_s: float = 600.0, max_positions: int = 32768,
                 max_bytes: int = 2 << 30, per_owner: int = 4) -> None:
        self.max_sessions, self.idle_s, self.max_positions = max_sessions, idle_s, max_positions
        self.max_bytes, self.per_owner = max_bytes, per_owner
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, StepEntry] = OrderedDict()

    def get(self, session: str) -> tuple | None:
        with self._lock:
            evicted = self._expire()
            entry = self._sessions.get(session)
            if entry is not None:
                entry.seen = time.monotonic()
                self._sessions.move_to_end(session)
        _free(evicted)
        return entry.value if entry is not None else None

    def put(self, session: str, value: tuple, positions: int = 0, owner: str = "", nbytes: int = 0) -> None:
        """Keep ``value`` for ``session`` of ``owner``; ``positions`` is its KV-cache size and ``nbytes``
        its memory. One session over the whole budget is refused with a ValueError naming the limit."""
        if positions > self.max_positions:
            raise ValueError(f"step mode would keep {positions} KV-cache positions for this request; the limit is "
                             f"{self.max_positions}: shorten the prompt, the batch or max new tokens")
        if nbytes > self.max_bytes:
            raise ValueError(f"step mode would keep about {nbytes / 2**20:.0f} MB for this request; the limit is "
                             f"{self.max_bytes / 2**20:.0f} MB: shorten the prompt, the batch or max new tokens, or "
                             "turn the lens off")
        with self._lock:
            evicted = [entry.value for entry in [self._sessions.pop(session, None)] if entry is not None]
            self._sessions[session] = StepEntry(time.monotonic(), positions, value, owner, nbytes)
            own = [key for key, entry in self._sessions.items() if entry.owner == owner]
            for key in own[: max(0, len(own) - self.per_owner)]:  # the owner's least recently used first
                evicted.append(self._sessions.pop(key).value)
            while len(self._sessions) > self.max_sessions or self.positions() > self.max_positions or \
                    self.nbytes() > self.max_bytes:
                evicted.append(self._sessions.popitem(last=False)[1].value)
        _free(evicted)

    def pop(self, session: str, default=None):
        with self._lock:
            entry = self._sessions.pop(session, None)
        if entry is None:
            return default
        _free([entry.value])
        return entry.value

    def positions(self) -> int:
        """KV-cache positions held by all sessions (the caller may hold the lock)."""
        return sum(entry.positions for entry in self._sessions.values())

    def nbytes(self) -> int:
        """Estimated bytes held by all sessions (the caller may hold the lock)."""
        return sum(entry.nbytes for entry in self._sessions.values())

    def __len__(self) -> int:
        with self._lock:
            evicted = self._expire()
            count = len(self._sessions)
        _free(evicted)
        return count

    def _expire(self) -> list[tuple]:
        deadline = time.monotonic() - self.idle_s
        return [self._sessions.pop(key).value for key in [k for k, e in self._sessions.items() if e.seen < deadline]]


@dataclass
class StepEntry:
    seen: float
    positions: int
    value: tuple
    owner: str = ""
    nbytes: int = 0


def _free(values: list[tuple]) -> None:
    """Close evicted sessions' iterators (their generator frames hold the KV caches)."""
    for value in values:
        iterator = value[1] if len(value) > 1 else None
        try:
            getattr(iterator, "close", lambda: None)()
        except ValueError:  # stepping right now in another thread: it is freed when that step returns
            pass
    if values:
        release_free_memory()


def session_key(request: gr.Request | None) -> str:
    """The browser/API session's key. Without one, a key of its own: never share a run handle."""
    return getattr(request, "session_hash", None) or f"no-session-{uuid.uuid4().hex}"


def limit_malloc_arenas(arenas: int | None = None) -> bool:
    """glibc gives every thread that allocates its own malloc arena; a server with many request
    threads then keeps many arenas' free memory and its RSS climbs with each burst. Cap them at
    start-up (``arenas``; None: the MALLOC_ARENA_MAX setting, 2 unless the deployer set it): a Space
    runs app.py directly, where scripts/start.sh's environment variable is not set. False off glibc."""
    if arenas is None:
        arenas = settings().malloc_arena_max
    try:
        return ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, arenas) == 1
    except (OSError, AttributeError):
        return False


def release_free_memory() -> None:
    """Hand memory the allocator keeps after a long prompt back to the system (glibc's
    malloc_trim; a no-op elsewhere), so the server's RSS returns towards its baseline when idle."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
