"""A fair queue: one client's script cannot lock the class out of the model.

Who is a client: a page session, known by its session id, while it holds the page's heartbeat
connection open AND it earned its place with a page load (its first heartbeat carried the signed,
single-use token the page set: app/serving/page_tokens.py); everything else (REST ``/call/`` jobs, which
carry no session, made-up session ids with or without a heartbeat, a gradio_client ``Client`` that
did not load the page) is pooled per network address into ONE client, ``api@<address>``. A
classroom behind one NAT is one address but many page sessions, so it is not lumped together; a
script inventing session ids is. A script that loads the page for each session still takes at most
``places_per_address`` places in a round for its address.

Admission (when a job is pushed, in milliseconds):
  * a page session may have ``per_session`` jobs waiting (default 2);
  * an address's pooled API client ``per_address_api`` (default 10% of the queue);
  * all clients of one address together ``per_address`` (default: no cap; a class of 30 behind one
    NAT clicking together needs 30 places, measured by scripts/classroom_test.py);
  * when the queue is full, a job from an address with at least two fewer waiting jobs than the
    heaviest address takes the place of that address's newest job (of its heaviest client); else a
    client with at least two fewer than the heaviest client takes that client's newest job's place
    (the job dropped ends with a message saying why); otherwise the newcomer is told the queue is
    full. So one address (a class, or a script that loads the page per session: the two look
    alike and are treated alike) may use a queue nobody else wants, and gives places back as soon
    as other addresses come.
Place: round-robin by client, with places that stay put. A job's round is fixed when it is pushed:
one past its client's previous job, and never before the round now being served, and no round
holds more than ``places_per_address`` jobs of one address; the queue runs by (round, arrival). Each client has at most one job per round, so a newcomer's first job waits for
the jobs already running plus at most one job per other client, and a flood's later jobs never
overtake it.
Abandoned jobs: a job whose result stream is not opened within ``stream_grace_s`` is dropped while
waiting, and cancelled (within a layer) if it already runs.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from app.serving import gradio_internals as gi
from app.serving.page_tokens import PageTokens
from model.common.checks import check_int, check_number

API_CLIENT = "api@"
HEARTBEAT_WAIT_S = 0.5
EARNED_S = 600.0  # a page session stays earned this long after its last heartbeat (reconnects)
MAX_EARNED = 4096  # page sessions remembered at most (memory bounded; the oldest go first)
SESSION_CLIENT = "session:"


@dataclass(frozen=True)
class ServingLimits:
    """The fair queue's limits (app.py reads them from the environment)."""

    queue_size: int = 32
    per_session: int = 2
    per_address_api: int = 0  # 0: 10% of the queue (at least 1)
    per_address: int = 0  # 0: no cap while the queue has room (a full queue makes the heaviest address give way)
    stream_grace_s: float = 5.0
    places_per_address: int = 8  # jobs of one address in one round (a class behind one NAT: 8 at a time)
    trust_forwarded_for: bool = False  # behind a proxy that appends the client's address (a Space)

    def __post_init__(self) -> None:
        for name in ("queue_size", "per_session", "places_per_address"):
            check_int(name, getattr(self, name), low=1)
        check_number("stream_grace_s", self.stream_grace_s, above=0)

    def sized(self, queue_size: int, per_session: int) -> ServingLimits:
        """These limits for a queue of ``queue_size`` with ``per_session`` jobs per page session."""
        return dataclasses.replace(self, queue_size=queue_size, per_session=per_session)

    @property
    def api_share(self) -> int:
        return self.per_address_api or max(1, self.queue_size // 10)


@dataclass
class Job:
    event_id: str
    client: str
    address: str
    session: str
    seq: int
    round: int = 0
    pushed: float = field(default_factory=time.monotonic)
    stream_seen: bool = False
    started: bool = False


# --- the policy (pure: no gradio) ----------------------------------------------------------------


def client_key(session: str | None, address: str, page_session: bool) -> str:
    return f"{SESSION_CLIENT}{session}" if session and page_session else f"{API_CLIENT}{address}"


def admission(waiting: list[Job], client: str, address: str, limits: ServingLimits,
              total: int | None = None, running: list[Job] | None = None) -> tuple[str, Job | None]:
    """("admit", None), ("displace", the job to drop to make room) or ("refuse: <message>", None).
    ``total``: every job waiting in the queue (default: ``waiting``, the ones this policy knows).
    ``running``: jobs that left the queue and have not finished; a client's beyond its first count as
    waiting (the batch lane starts many jobs at once, and they wait for their batch there, app/serving/batcher.py).

    One address may fill a queue nobody else wants (a class of 30 behind one NAT clicks together);
    when the queue is full, a job from an address with fewer waiting jobs takes the place of the
    newest job of the address with the most, then of the client with the most."""
    per_client = collections.Counter(job.client for job in waiting)
    started = collections.Counter(job.client for job in running or [])
    mine = per_client[client] + max(0, started[client] - 1)
    own_cap = limits.api_share if client.startswith(API_CLIENT) else limits.per_session
    if mine >= own_cap:
        who = (f"this address's API clients (REST calls and sessions without the page's heartbeat) share "
               f"{own_cap} waiting jobs" if client.startswith(API_CLIENT)
               else f"the limit per session is {own_cap} waiting jobs")
        return f"refuse: {mine} of your jobs are already waiting; {who}. Wait for one to finish.", None
    per_address = collections.Counter(job.address for job in waiting)
    if limits.per_address and per_address[address] >= limits.per_address:
        return (f"refuse: {per_address[address]} jobs from your network address are already waiting; the limit per "
                f"address is {limits.per_address}. Wait for one to finish.", None)
    total = len(waiting) if total is None else total
    if total < limits.queue_size:
        return "admit", None
    victim = heaviest_newest(waiting, per_address, address, lambda job: job.address)
    victim = victim or heaviest_newest(waiting, per_client, client, lambda job: job.client)
    if victim is not None and total <= limits.queue_size:
        return "displace", victim
    return (f"refuse: the queue is full ({total} waiting, the limit is {limits.queue_size}) and no client "
            f"holds more than its share; try again in a minute.", None)


def heaviest_newest(waiting: list[Job], counts: collections.Counter, mine: str,
                    key: Callable[[Job], str]) -> Job | None:
    """The newest job of the heaviest holder (an address or a client) when it holds at least two
    more waiting jobs than ``mine`` does (one more would just swap who is ahead); else None. Within
    an address, the newest job of its heaviest clients."""
    if not counts:
        return None
    heaviest, most = counts.most_common(1)[0]
    if most <= counts[mine] + 1:
        return None
    theirs = [job for job in waiting if key(job) == heaviest]
    clients = collections.Counter(job.client for job in theirs)
    top = max(clients.values())
    return max((job for job in theirs if clients[job.client] == top), key=lambda job: job.seq)


class Rounds:
    """Round numbers of the round-robin: a client's next job goes one round after its previous one,
    but never before the round being served now (an idle client does not bank rounds), and one
    address has at most ``places_per_address`` jobs in a round (its later ones go to later rounds)."""

    def __init__(self, places_per_address: int = 0) -> None:
        self.current = 0
        self.places_per_address = places_per_address  # 0: no cap
        self._next: dict[str, int] = {}
        self._taken: collections.Counter[tuple[str, int]] = collections.Counter()  # (address, round) -> jobs

    def assign(self, client: str, address: str | None = None) -> int:
        round_ = max(self._next.get(client, 0), self.current)
        if address is not None and self.places_per_address:
            while self._taken[(address, round_)] >= self.places_per_address:
                round_ += 1
            self._taken[(address, round_)] += 1
        self._next[client] = round_ + 1
        return round_

    def started(self, round_: int) -> None:
        """A job of ``round_`` left the queue to run: that round is being served."""
        if round_ > self.current:
            self.current = round_
            for client in [c for c, n in self._next.items() if n <= self.current]:
                del self._next[client]  # its next job would get the current round anyway
            for key in [key for key in self._taken if key[1] < self.current]:
                del self._taken[key]  # rounds already served take no more jobs


def fair_key(job: Job) -> tuple[int, int]:
    """The queue's order: by round, then by arrival."""
    return job.round, job.seq


# --- the queue of one app ------------------------------------------------------------------------


class FairQueue:
    """Admission, order and abandoned-job dropping for one app's gradio queue (through
    app/serving/gradio_internals.py), plus the connection facts the request guard reports: which result
    streams and page heartbeats are open."""

    def __init__(self, limits: ServingLimits,
                 validate: Callable[[str, dict], tuple[str, str] | None] = lambda name, values: None,
                 held: Callable[[], int] = lambda: 0) -> None:
        self.limits = limits
        self.validate = validate  # (api_name, settings by name) -> (parameter, message) to refuse at push
        # Jobs that left gradio's queue and still wait for their turn elsewhere (the batcher's: the batch
        # lane starts many jobs at once): they count against the queue's size as waiting jobs.
        self.held = held
        # told each admitted job's lane, session (the page's, or gradio's name for a /call/ job) and API name
        self.admitted: Callable[[str | None, str | None, str | None], None] = lambda lane, session, name: None
        self.queue = None
        self.blocks = None
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._seq = itertools.count()
        self._rounds = Rounds(limits.places_per_address)
        self.tokens = PageTokens()
        self._earned: collections.OrderedDict[str, float] = collections.OrderedDict()  # page sessions, by last seen
        self._streams: collections.Counter[str] = collections.Counter()  # open result streams by session/event id
        self._heartbeats: collections.Counter[str] = collections.Counter()  # open page heartbeats by session
        self.dropped_abandoned = 0
        self.displaced = 0

    def install(self, blocks) -> FairQueue:
        gi.check_version()
        self.blocks, self.queue = blocks, gi.queue_of(blocks)
        gi.wrap_push(self.queue, self._before_push, self._after_push)
        blocks.fair_queue = self  # the request guard finds it here
        return self

    # --- what the request guard reports -----------------------------------------------------
    def stream_opened(self, key: str) -> None:
        with self._lock:
            self._streams[key] += 1
            for job in self._jobs.values():
                if key in (job.event_id, job.session):
                    job.stream_seen = True

    def stream_closed(self, key: str) -> None:
        with self._lock:
            self._streams[key] -= 1
            if self._streams[key] <= 0:
                del self._streams[key]

    def heartbeat(self, session: str, is_open: bool, token: str | None = None) -> None:
        """A heartbeat opened or closed; an opening one with an unused page token makes its session a
        page session (for ``EARNED_S`` after its last heartbeat: gradio reconnects heartbeats)."""
        earned = is_open and session not in self._earned and self.tokens.claim(token)
        with self._lock:
            self._heartbeats[session] += 1 if is_open else -1
            if self._heartbeats[session] <= 0:
                del self._heartbeats[session]
            if earned or session in self._earned:
                self._earned[session] = time.monotonic()
                self._earned.move_to_end(session)
            self._forget_earned()

    def _forget_earned(self) -> None:
        """Bounded: sessions with no heartbeat for EARNED_S go, and past MAX_EARNED the least recently
        seen (a page session so forgotten is pooled with its address). Caller holds the lock."""
        deadline = time.monotonic() - EARNED_S
        for session in [s for s, seen in self._earned.items() if seen < deadline and s not in self._heartbeats]:
            del self._earned[session]
        while len(self._earned) > MAX_EARNED:
            self._earned.popitem(last=False)

    def page_sessions(self) -> int:
        """Page sessions open now (an earned place and an open heartbeat)."""
        with self._lock:
            return sum(self._heartbeats.get(session, 0) > 0 for session in self._earned)

    def heartbeat_open(self, session: str) -> bool:
        with self._lock:
            return self._heartbeats.get(session, 0) > 0

    def page_session(self, session: str | None) -> bool:
        with self._lock:
            return bool(session) and self._heartbeats.get(session, 0) > 0 and session in self._earned

    async def _heartbeat_of(self, session: str) -> None:
        """Wait up to HEARTBEAT_WAIT_S for a session's heartbeat: gradio_client opens it in a thread
        when the Client is made, so a script's first submit can race it (a page opens it at load)."""
        deadline = time.monotonic() + HEARTBEAT_WAIT_S
        while not self.heartbeat_open(session) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    # --- push -------------------------------------------------------------------------------
    async def _before_push(self, body, request) -> tuple[tuple | None, tuple[str, str] | None]:
        """(refusal or None, the job's (client, address)) for a job being pushed."""
        session = gi.body_session(body)
        address = self.address_of(request)
        if session and not self.page_session(session):
            await self._heartbeat_of(session)
        client = client_key(session, address, self.page_session(session))
        fn = gi.body_function(self.blocks, body)
        if fn is None:
            return None, (client, address)  # gradio answers an unknown fn_index itself (the guard already did)
        self.drop_abandoned()
        # The share first: refusing a flood's surplus costs microseconds, not a settings check.
        verdict, victim = self._admission(client, address)
        if verdict.startswith("refuse"):
            return gi.queue_full(verdict.removeprefix("refuse: ")), None
        refusal = self._invalid(fn, body)
        if refusal is not None:
            return refusal, None
        if victim is not None:
            self._drop(victim, "dropped to make room: the queue was full and your network address (or your session) "
                               "had the most jobs waiting, so a visitor with fewer took this place; try again in a "
                               "minute")
            self.displaced += 1
        return None, (client, address)

    def refusal_for(self, request) -> str | None:
        """What pushing this client's next job would be refused with now (its share of the queue, or a
        full queue), or None: the page asks before it pushes, so the visitor reads the reason on the
        page instead of a refused push the page does not show. (The push still decides.)"""
        session = getattr(request, "session_hash", None)
        address = self.address_of(request)
        verdict, _ = self._admission(client_key(session, address, self.page_session(session)), address)
        return verdict.removeprefix("refuse: ") if verdict.startswith("refuse") else None

    def _admission(self, client: str, address: str) -> tuple[str, Job | None]:
        """``admission`` of a job of ``client`` now: the jobs waiting in gradio's queue and elsewhere
        (``held``), and the running ones."""
        with self._lock:
            waiting = self._waiting_jobs()
            running = self._running_jobs()
        total = (gi.waiting_count(self.queue) if self.queue is not None else len(waiting)) + self.held()
        return admission(waiting, client, address, self.limits, total=total, running=running)

    def _invalid(self, fn, body) -> tuple | None:
        """Settings and sizes checked at push: a request over a limit is refused at once, not after
        waiting for the model."""
        specs = gi.input_specs(fn)
        values = {name: value for (name, _), value in zip(specs, gi.body_data(body)) if name is not None}
        problem = self.validate(gi.api_name_of(fn) or "", values)
        return gi.invalid_value(*problem) if problem is not None else None

    def _after_push(self, event_id: str, body, context: tuple[str, str]) -> None:
        client, address = context
        fn = gi.body_function(self.blocks, body)
        session = gi.body_session(body) or event_id  # gradio names a /call/ job's session by its event id
        if fn is not None:
            self.admitted(gi.lane_of(fn), session, gi.api_name_of(fn))
        with self._lock:
            job = Job(event_id, client, address, session, next(self._seq), self._rounds.assign(client, address))
            job.stream_seen = self._streams[session] > 0 or self._streams[event_id] > 0
            self._jobs[event_id] = job
        self._reorder()

    def _reorder(self) -> None:
        with self._lock:
            keys = {job.event_id: fair_key(job) for job in self._waiting_jobs()}
        gi.reorder(self.queue, lambda event: keys.get(gi.event_id(event), (-1, -1)))

    # --- waiting and running jobs ----------------------------------------------------------
    def _waiting_jobs(self) -> list[Job]:
        """Our records of the jobs still waiting (forgetting finished ones). Caller holds the lock."""
        waiting_ids = {gi.event_id(event) for event in gi.waiting_events(self.queue)}
        for job in [job for job in self._jobs.values() if job.event_id not in waiting_ids and not job.started]:
            job.started = True  # it left the queue to run (dropped jobs are forgotten when dropped)
            self._rounds.started(job.round)
        for event_id in [e for e, job in self._jobs.items() if job.started and gi.known_event(self.queue, e) is None]:
            del self._jobs[event_id]
        return [self._jobs[e] for e in waiting_ids if e in self._jobs]

    def _running_jobs(self) -> list[Job]:
        """Our records of the jobs that left the queue and have not finished (after ``_waiting_jobs``,
        which forgets the finished ones). Caller holds the lock."""
        return [job for job in self._jobs.values() if job.started]

    def waiting(self) -> int:
        """Jobs waiting in the queue (all clients), not yet running."""
        return gi.waiting_count(self.queue) if self.queue is not None else 0

    def waiting_by_client(self) -> dict[str, int]:
        with self._lock:
            return dict(collections.Counter(job.client for job in self._waiting_jobs()))

    def _abandoned(self, job: Job, now: float) -> bool:
        return not job.stream_seen and now - job.pushed > self.limits.stream_grace_s

    def drop_abandoned(self) -> int:
        """Drop waiting jobs whose result stream was never opened within the grace time."""
        now = time.monotonic()
        with self._lock:
            stale = [job for job in self._waiting_jobs() if self._abandoned(job, now)]
        for job in stale:
            self._drop(job, f"dropped: its result stream was not opened within {self.limits.stream_grace_s:g} s")
        self.dropped_abandoned += len(stale)
        return len(stale)

    def _drop(self, job: Job, message: str) -> None:
        event = gi.known_event(self.queue, job.event_id)
        if event is not None:
            gi.drop_waiting(self.queue, event, message)
        with self._lock:
            self._jobs.pop(job.event_id, None)

    def client_gone_check(self) -> Callable[[], bool]:
        """For the handler running now: a function that says when its client is gone (the result
        stream closed, or never opened within the grace time), read by the decoder's cancel check
        between prefill layers and steps."""
        event = gi.current_event(self.queue) if self.queue is not None else None
        if event is None:
            return lambda: False
        event_id = gi.event_id(event)

        def gone() -> bool:
            if not gi.event_alive(event):
                return True
            with self._lock:
                job = self._jobs.get(event_id)
                return job is not None and self._abandoned(job, time.monotonic())
        return gone

    def address_of(self, request) -> str:
        """The client's network address: the socket's peer, or behind a trusted proxy the last
        address the proxy appended to X-Forwarded-For."""
        if self.limits.trust_forwarded_for and request is not None:
            forwarded = request.headers.get("x-forwarded-for", "")
            if forwarded.strip():
                return forwarded.split(",")[-1].strip()
        client = getattr(request, "client", None)
        return getattr(client, "host", None) or "unknown"
