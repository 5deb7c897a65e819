"""The class as one batch: concurrent jobs that can share a schedule run as ONE SkipDecode batch.

SkipDecode's point over token-level early exit is that a whole batch shares one exit depth per
position, so batching and the KV cache keep working. The batcher is where the playground uses it:
every page or API run of the model lane hands its job here (a ``Ticket``), and one runner thread
forms batches in the order the jobs came (the fair queue's order: it started them).

* A batch is the oldest waiting job plus every waiting job that can share its schedule
  (``Ticket.key``: the same model and skip policy, and the same request but for its prompts and seed:
  schedule, token budget, sampler, stop strings, chat template), up to ``BatchLimits.rows`` rows and
  ``BatchLimits.cost``: the batch's own cost as one job of all its rows (app/serving/job_cost.py), so a
  class's 30 short jobs share one batch where their summed costs would have split it.
* Up to ``BatchLimits.batches`` batches run at once, their model steps taking turns on the compute
  lock: a job that arrives just after a batch started (a straggler of the class, a visitor alone)
  starts its own batch at once instead of waiting the whole of the first one for its first token.
* Once a job arrives the runner waits a moment for a class's other clicks of the same moment
  (``BatchLimits.gather_s``, or the pace of the pushes still coming: ``_quiet_window``).
* A job that shares with nothing, or cannot share (the logit lens: one row's readings per step), runs
  alone through its own race, exactly as before the batcher (``Ticket.alone``): the runner gives the
  job its turn and its handler drives its own race, reading the race's live updates in its own thread
  (another thread reading them would see them move on under it), until it ends or its client leaves.
* A shared batch's rows share their common start (read once: ``prepare(share_prefix=True)``), the rest
  left padded; the prompts are read once for both streams (``TextGenerator.shared_prefill``), then
  SkipDecode's rows step as one batch and the full model's as another, raced as one job is. Each job reads only its own rows (``model.race.row_update``), with the
  full model's verdict on its first row and the batch's share; no job sees another's text.
* Rows come and go: a job whose client leaves (or presses Stop) stops being fed, the batch goes on for
  the others, and a batch whose jobs have all left ends within a layer (the decoder's cancel check).
  A job whose rows have all ended gets its last update at once; the batch ends when every row has.
  A job refused at its checks never reaches the batcher (the handler checks first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, cast

import torch

from app.serving.job_cost import job_cost
from model.common.checks import check_int, check_number
from model.generation.generator import TextGenerator
from model.generation.runs import PreparedRun, merged_request, shared_part
from model.generation.schedules import ScheduleRequest
from model.race import Judge, PromptTokens, RaceUpdate, StreamProgress, TokenTexts, race, row_update
from model.skipdecode.decoder import Cancelled, DecodeResult, Prefill
from model.skipdecode.schedule import SolvedSchedule

LANE = "batch"  # the gradio concurrency id of the jobs the batcher takes (app/ui.py wires them)
# A batch's rows by default: a class of 30 in one batch (every first token after ONE prefill; a 2-core CPU's
# step grows with rows, so the cost cap bounds it too); a GPU's step barely grows with rows.
CPU_ROWS, GPU_ROWS = 32, 64
END = object()  # a ticket's queue: nothing more comes
TURN_CHECK_S = 0.05  # while a job runs alone, how often the runner looks whether its client has left


@dataclass(eq=False)
class _Turn:
    """A ticket's turn to run alone: its handler races it and sets ``over`` when its race has ended."""

    over: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class BatchLimits:
    """How large a shared batch grows (app.py reads them from the environment)."""

    rows: int = CPU_ROWS  # rows in one batch, all jobs together
    cost: int = 1200  # the batch's cost as one job of all its rows (app/serving/job_cost.py units: ~17 s of the lane)
    gather_s: float = 0.03  # once a job arrives, how long the runner waits for no further arrival
    # ...or twice the gap between the last two pushes, while the class's clicks keep coming at their pace (on
    # a loaded 2-core server a push takes ~30 ms, more than ``gather_s``), up to ``gather_max_s`` in all
    gather_max_s: float = 1.5
    batches: int = 3  # batches running at once (their steps interleave on the compute lock)
    # a shared batch's prompts on a CPU: read in up to ``prompt_parts`` parts (whole jobs) of at least
    # ``part_tokens`` prompt tokens each, so the first jobs see their first token while the rest is read
    prompt_parts: int = 4
    part_tokens: int = 256

    def __post_init__(self) -> None:
        check_int("rows", self.rows, low=1)
        check_int("cost", self.cost, low=1)
        check_number("gather_s", self.gather_s, low=0)
        check_number("gather_max_s", self.gather_max_s, low=0)
        check_int("batches", self.batches, low=1)
        check_int("prompt_parts", self.prompt_parts, low=1)
        check_int("part_tokens", self.part_tokens, low=1)


@dataclass(eq=False)
class Ticket:
    """One job's place in the batcher: its prepared run (checked, tokenized, solved), the model it
    runs on, the full model's schedule, how to race it alone, and whether its client still reads."""

    generator: TextGenerator
    run: PreparedRun
    full_schedule: ScheduleRequest
    alone: Callable[..., Iterator[RaceUpdate]]  # its own race: alone(should_cancel=, compute_lock=)
    shareable: bool = True  # False: the lens and anything else that must run alone
    should_cancel: Callable[[], bool] = lambda: False
    updates: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    left: bool = False  # the handler stopped reading (its client left or the run was replaced)
    arrived: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> tuple | None:
        """Jobs with equal keys can share one batch; None: this one runs alone."""
        if not self.shareable:
            return None
        return id(self.generator), shared_part(self.run.request), self.full_schedule

    @property
    def rows(self) -> int:
        return self.run.batch

    def gone(self) -> bool:
        return self.left or self.should_cancel()


class Batcher:
    """The runner thread and its waiting tickets (see the module's docstring)."""

    def __init__(self, limits: BatchLimits | None = None, compute_lock: ContextManager | None = None) -> None:
        self.limits = limits or BatchLimits()
        self.compute = compute_lock or contextlib.nullcontext()
        self._waiting: list[Ticket] = []
        self._arrival = threading.Condition()
        self._runner: threading.Thread | None = None
        self._coming = 0  # jobs clicked or pushed to the queue and not here yet (``announce``, ``expect``)
        self._announced: dict[str, float] = {}  # page sessions whose click was counted before its push
        self._expected_at = 0.0
        self._push_gap = float("inf")  # seconds between the last two pushes
        self._slots = threading.BoundedSemaphore(self.limits.batches)  # batches that may run at once
        self.batches = itertools.count()  # batches run so far (tests and the load script read it)
        self.largest = 0  # the most jobs one batch has held
        self._running = 0  # batches formed and not yet ended

    def running_count(self) -> int:
        """Batches formed and not yet ended (a batch of one included): at most ``BatchLimits.batches``."""
        return self._running

    def waiting_count(self) -> int:
        """Jobs waiting for a batch (not the ones running): the fair queue counts them as waiting."""
        return len(self._waiting)

    # --- a handler's side ---------------------------------------------------------------------
    def announce(self, session: str) -> None:
        """A page's click passed its checks (outside the queue): its job is pushed ~0.3 s later (the page's
        next call), so a batch being gathered waits for it from now. Four pages clicking together pushed
        over 0.7 s, and the first ran alone. Counted once per session until its push (a double click
        counts once); its push (``expect`` with the same session) is not counted again. At most a batch's
        rows are announced at once: a script calling the checks with made-up sessions holds a gather no
        longer than its pushes could (``gather_max_s``), and its announcements cost no more than a class's."""
        with self._arrival:
            now = time.monotonic()
            self._announced = {key: at for key, at in self._announced.items() if now - at <= self.limits.gather_max_s}
            if session not in self._announced and len(self._announced) < self.limits.rows:
                self._announced[session] = now
                self._count_coming(now)

    def expect(self, session: str | None = None) -> None:
        """A job for the batcher was just pushed to the queue (the fair queue says so, with its session): a
        batch being gathered waits for it a moment. A class's clicks arrive together, but each job's push and
        checks take milliseconds one after another, so they reach the batcher spread over a second."""
        with self._arrival:
            if session is not None and self._announced.pop(session, None) is not None:
                return  # counted when its page's checks passed
            self._count_coming(time.monotonic())

    def came_without_job(self) -> None:
        """A counted click or push whose handler ended without a job for the batcher (a restart with nothing
        running, a run stopped while it waited, settings refused at the run): nothing more to wait for.
        Uncounted, every slider release on a page held the gathers of the next 1.5 s to their deadline."""
        with self._arrival:
            self._coming = max(0, self._coming - 1)
            self._arrival.notify_all()

    def _count_coming(self, now: float) -> None:
        self._coming += 1
        self._push_gap, self._expected_at = now - self._expected_at, now
        self._arrival.notify_all()

    def _expecting(self, now: float) -> bool:
        """Jobs clicked or pushed and not here yet; forgotten ``gather_max_s`` after the last one counted (a
        counted job may never come: dropped while it waited, its page closed). A pushed job reaches the
        batcher once its client has opened its stream and its run is prepared: on a loaded 2-core server the
        last of a class's 30 came 0.8 s after the last push (a shorter wait split that burst into batches of
        26 and 4); the head's own deadline (``gather_max_s`` after it came) bounds the wait either way."""
        if self._coming and now - self._expected_at > self.limits.gather_max_s:
            self._coming = 0
            self._announced.clear()
        return self._coming > 0

    def race(self, ticket: Ticket) -> Iterator[RaceUpdate]:
        """The job's updates as its batch races (a ValueError of the batch's preparation is raised here)."""
        self._submit(ticket)
        try:
            while True:
                item = ticket.updates.get()
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, _Turn):
                    yield from self._alone(ticket, item)
                    return
                yield item
        finally:
            ticket.left = True  # a closed stream (Stop, a closed tab, a restart) loses only its own rows

    def _alone(self, ticket: Ticket, turn: _Turn) -> Iterator[RaceUpdate]:
        """The job's own race, driven by its handler (the runner waits for ``turn.over``)."""
        try:
            yield from ticket.alone(should_cancel=ticket.gone, compute_lock=self.compute)
        finally:
            turn.over.set()

    def _submit(self, ticket: Ticket) -> None:
        with self._arrival:
            self._coming = max(0, self._coming - 1)
            self._waiting.append(ticket)
            self._arrival.notify_all()
            if self._runner is None or not self._runner.is_alive():
                self._runner = threading.Thread(target=self._run_forever, name="batcher", daemon=True)
                self._runner.start()

    # --- the runner ---------------------------------------------------------------------------
    def _run_forever(self) -> None:
        while True:
            self._slots.acquire()  # a batch may start: fewer than ``batches`` run
            try:
                batch = self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            next(self.batches)
            self.largest = max(self.largest, len(batch))
            try:
                threading.Thread(target=self._run_batch, args=(batch,), name="batch", daemon=True).start()
            except BaseException:
                with self._arrival:
                    self._running -= 1
                self._slots.release()
                raise

    def _run_batch(self, batch: list[Ticket]) -> None:
        try:
            if len(batch) == 1:
                self._run_alone(batch[0])
            else:
                self._run_shared(batch)
        except Exception as error:  # noqa: BLE001 (every job of the batch is told; the runner goes on)
            for ticket in batch:
                ticket.updates.put(error)
                ticket.updates.put(END)
        finally:
            with self._arrival:
                self._running -= 1
            self._slots.release()

    def _next_batch(self) -> list[Ticket]:
        """Wait for a job; then the oldest job and the waiting jobs that share its key (see BatchLimits)."""
        with self._arrival:
            while True:
                self._drop_gone()
                if self._waiting:
                    break
                self._arrival.wait()
            head = self._waiting[0]
            if head.key is not None:
                self._gather(head)
            batch = self._companions(head)
            self._waiting = [ticket for ticket in self._waiting if ticket not in batch]
            self._running += 1  # under the same lock: a job is always counted waiting or running
            return batch

    def _drop_gone(self) -> None:
        """Jobs stopped or left while they waited end here (their handler reads the end and says so)."""
        for ticket in [ticket for ticket in self._waiting if ticket.gone()]:
            self._waiting.remove(ticket)
            ticket.updates.put(END)

    def _gather(self, head: Ticket) -> None:
        """Wait (holding nothing: the condition's wait releases it) while jobs keep arriving, a class's
        clicks of one moment: while pushed jobs are on their way (``expect``) or until none arrived for
        the quiet window (``_quiet_window``); at most ``gather_max_s`` after the head; never once the
        batch is full. A visitor alone waits ``gather_s``."""
        deadline = head.arrived + self.limits.gather_max_s
        seen, coming, changed = len(self._waiting), self._coming, time.monotonic()
        started = changed
        while not self._full(head):
            now = time.monotonic()
            quiet = self._quiet_window(now, changed - started)
            if now >= deadline or (not self._expecting(now) and now - changed >= quiet):
                return
            self._arrival.wait(min(deadline - now, quiet))
            if len(self._waiting) != seen or self._coming > coming:  # an arrival, or a click or push: its job comes next
                changed = time.monotonic()
            seen, coming = len(self._waiting), self._coming  # counts forgotten or given up are no arrival

    def _quiet_window(self, now: float, arriving_s: float) -> float:
        """How long no arrival ends a gather: ``gather_s``; twice the gap between the last two pushes while
        pushes keep coming at that pace (a class's clicks reach a loaded server ~30 ms apart); and as long
        as this gather has seen jobs arrive (``arriving_s``, from its start to the last arrival or push): a
        class's clicks come in clumps (30 API clients clicking together on a 2-core Zen 4 EPYC: 22 within
        0.2 s, then none for 0.15 s, then 8), and a clump that starts its own batch shares the cores with
        the first batch, its visitors' first tokens seconds later. A visitor alone still waits ``gather_s``."""
        pushing = now - self._expected_at < self.limits.gather_max_s
        paced = 2 * self._push_gap if pushing and self._push_gap < self.limits.gather_max_s / 4 else 0.0
        return max(self.limits.gather_s, paced, arriving_s)

    def _full(self, head: Ticket) -> bool:
        return sum(ticket.rows for ticket in self._companions(head)) >= self.limits.rows

    def _companions(self, head: Ticket) -> list[Ticket]:
        """The head and, in arrival order, the waiting jobs of its key that fit the batch's rows and cost
        (the cost of one job of all the batch's rows, over its longest prompt)."""
        batch, rows, width = [head], head.rows, head.run.prompt_width
        if head.key is None:
            return batch
        new_tokens = head.run.request.max_new_tokens  # one per key
        for ticket in self._waiting[1:]:
            if ticket.key != head.key or ticket.gone():
                continue
            grown_rows, grown_width = rows + ticket.rows, max(width, ticket.run.prompt_width)
            if grown_rows > self.limits.rows or job_cost(grown_rows, grown_width, new_tokens, False) > self.limits.cost:
                continue
            batch.append(ticket)
            rows, width = grown_rows, grown_width
        return batch

    def _run_alone(self, ticket: Ticket) -> None:
        """A batch of one: the job's own race, as it ran before the batcher (bit for bit), raced by its
        handler; the next batch starts when that race has ended, or once the job is gone (a handler
        that stopped reading ends its race at its next step, on the compute lock the next batch takes)."""
        turn = _Turn()
        ticket.updates.put(turn)
        while not turn.over.wait(TURN_CHECK_S):
            if ticket.gone():
                return

    def _run_shared(self, tickets: list[Ticket]) -> None:
        """Several jobs as one batch: one SkipDecode stream and one full-model stream over all their rows.
        The batch's prompts are read once for both streams (where both read them at full depth), and
        that read is kept: each job's first row is judged by continuing it (``_judge_together``)."""
        generator = tickets[0].generator
        gone = lambda: all(reader.ticket.gone() for reader in readers)  # noqa: E731
        with self.compute:
            skip = generator.prepare(merged_request([ticket.run.request for ticket in tickets]), share_prefix=True)
        full = generator.with_schedule(skip, tickets[0].full_schedule)
        readers = [_Reader(ticket, rows, len(tickets), generator)
                   for ticket, rows in zip(tickets, _row_ranges([ticket.rows for ticket in tickets]))]
        parts = prompt_parts(skip, [reader.rows for reader in readers], generator.loaded.device.type, self.limits)
        first_tokens = _FirstTokens(generator, skip, readers) if parts else None
        try:
            with self.compute:
                prefill = generator.shared_prefill(skip, full, gone, parts,
                                                   first_tokens.announce if first_tokens else None)
        except Cancelled:
            return
        last: RaceUpdate | None = None
        for last in race(generator, skip, full, should_cancel=gone, compute_lock=self.compute,
                         judge_first_row=False, prefill=prefill):
            ended = [reader for reader in readers if reader.unjudged_and_ended(last)]
            if ended:  # the jobs whose rows have just ended in both streams: judged together, at once
                with self.compute:
                    _judge_together(generator, ended, last, prefill)
            for reader in readers:
                reader.read(last, self.compute)
        for reader in readers:
            reader.finish(last, self.compute)


def _judge_together(generator: TextGenerator, readers: list[_Reader], update: RaceUpdate,
                    prefill: Prefill | None) -> None:
    """The full model's verdict on each reader's first row, its rows having ended in both streams (so a
    job's last view comes with it, without waiting for the rest of the batch). A greedy row
    whose SkipDecode text is where the full model's own greedy text goes (its tokens a prefix of the
    full model's) needs no forward: the full model chose each of those tokens on that very prefix.
    The others come from batched forwards: continuing the batch's prompts as read
    (``FullModelJudge.choices_after``), or reading them again where the streams read them
    apart."""
    rows = [(reader, update.skip.ids(reader.rows.start)) for reader in readers if reader.judge.judged is None]
    forward: dict[tuple, list[tuple[_Reader, list[int]]]] = {}  # one forward per distinct (prompt, text)
    for reader, ids in rows:
        full_ids = update.full.ids(reader.rows.start)
        if ids and reader.ticket.run.request.sampling.greedy and full_ids[:len(ids)] == ids:
            reader.judge.chose(ids, ids)
        elif ids:  # a class on one link sends the same prompt many times: the same text is judged once
            forward.setdefault((tuple(reader.ticket.run.prompt_ids(0)), tuple(ids)), []).append((reader, ids))
    firsts = [same[0] for same in forward.values()]
    if prefill is not None:
        choices = generator.judge.choices_after(prefill, [(reader.rows.start, ids) for reader, ids in firsts])
    else:
        choices = generator.judge.choices_of([(reader.ticket.run.prompt_ids(0), ids) for reader, ids in firsts])
    for same, chosen in zip(forward.values(), choices):
        for reader, ids in same:
            reader.judge.chose(ids, chosen)


def prompt_parts(run: PreparedRun, jobs: list[range], device_type: str, limits: BatchLimits) -> list[range]:
    """How a shared batch's prompts are read: in parts of whole jobs, so the first jobs' first tokens
    show while the rest is read (``_FirstTokens``); none (one read) where that would not help. On a CPU
    a class's prompt read is most of the wait for its first token (30 E2E rows: ~1.8 s of ~2.6 s on 2
    cores) and grows with the rows, so up to ``limits.prompt_parts`` parts of at least
    ``limits.part_tokens`` prompt tokens each; a GPU reads them in one go in milliseconds; a sampled
    batch's first draws belong to its stream."""
    if device_type != "cpu" or not run.request.sampling.greedy or len(jobs) < 2:
        return []
    own_tokens = int(run.mask[:, run.shared_prefix:].sum())  # what the parts read besides the common start
    count = min(limits.prompt_parts, len(jobs), own_tokens // limits.part_tokens)
    if count < 2:
        return []
    rows, between_jobs = run.batch, [job.stop for job in jobs[:-1]]
    # parts of about equal rows: each cut at the boundary between jobs nearest its share of the rows
    cuts = sorted({min(between_jobs, key=lambda stop: abs(stop - share * rows / count)) for share in range(1, count)})
    return [range(start, stop) for start, stop in zip([0, *cuts], [*cuts, rows])]


@dataclass(eq=False)
class _FirstTokens:
    """A greedy batch's first tokens shown as its prompts are read part by part (``prompt_parts``): each
    job whose rows have all been read gets SkipDecode's first token at once, the view the race's first
    update gives it (the full model's pane still empty: ``full`` never steps here) after the whole read."""

    generator: TextGenerator
    run: PreparedRun
    readers: list[_Reader]
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        rows = self.run.batch
        self.record = DecodeResult(self.generator.num_layers, self.run.mask.sum(-1).tolist(), [[] for _ in range(rows)],
                                   ["length"] * rows, tuple(cast(SolvedSchedule, self.run.schedule).config.prefill_layers()))
        self.texts = [TokenTexts(self.generator.text) for _ in range(rows)]
        self.full = StreamProgress("full model", rows, texts=[TokenTexts(self.generator.text) for _ in range(rows)])

    def announce(self, rows: range, logits: torch.Tensor) -> None:
        """``rows`` were just read (their last-position logits (rows, V)): their jobs see their first token."""
        tokens, reasons = self.generator.first_tokens(self.run, rows, logits)
        for row, ids, reason in zip(rows, tokens, reasons):
            self.record.tokens[row], self.record.finish_reasons[row] = ids, reason
            self.texts[row].update(ids)
        self.record.prefill_seconds = time.perf_counter() - self.started
        skip = StreamProgress("SkipDecode", self.run.batch, self.record, list(self.texts))
        update = RaceUpdate(skip, self.full, cast(SolvedSchedule, self.run.schedule), "skip", self.generator.cost,
                            self.run.request.prompts)
        for reader in self.readers:
            if rows.start <= reader.rows.start and reader.rows.stop <= rows.stop:
                reader.announce(update)


def _row_ranges(sizes: list[int]) -> list[range]:
    """Consecutive row ranges of these sizes: each job's rows in the merged batch."""
    ends = list(itertools.accumulate(sizes))
    return [range(end - size, end) for size, end in zip(sizes, ends)]


@dataclass(eq=False)
class _Reader:
    """One job's reading of a shared batch: its rows' updates into its queue until its rows are done."""

    ticket: Ticket
    rows: range
    jobs: int
    generator: TextGenerator
    prompt: PromptTokens = field(init=False)
    judge: Judge = field(init=False)  # the full model's verdict on the job's first row
    done: bool = False

    def __post_init__(self) -> None:
        run = self.ticket.run
        texts, hidden = self.generator.text.prompt_tokens(run.prompt_ids(), run.request.raw)
        self.prompt = PromptTokens(tuple(texts), hidden)
        self.judge = Judge(self.generator, self.ticket.run, with_kl=False)

    def unjudged_and_ended(self, update: RaceUpdate) -> bool:
        """Whether this job's rows have all ended in both streams and its first row is not judged yet."""
        return (not self.done and self.judge.judged is None and _ended(update.skip, self.rows)
                and _ended(update.full, self.rows))

    def read(self, update: RaceUpdate, compute: ContextManager) -> None:
        if self.done:
            return
        if self.ticket.gone():
            self._end()
            return
        view = self._view(update)
        # The full model's verdict on the job's first row: judged with the batch's other rows that ended
        # at the same step (_judge_together, before this read); alone only for a batch cut short.
        if view.done and self.judge.judged is None:
            with compute:
                self.judge.update(view.skip)
            view = dataclasses.replace(view, judged=self.judge.judged)
        self.ticket.updates.put(view)
        if view.done:
            self._end()

    def announce(self, update: RaceUpdate) -> None:
        """SkipDecode's first token of this job's rows, read before the rest of the batch (``_FirstTokens``):
        never the last view (the full model has not stepped), so nothing is judged here."""
        if not self.done and not self.ticket.gone():
            self.ticket.updates.put(self._view(update))

    def finish(self, last: RaceUpdate | None, compute: ContextManager) -> None:
        """The batch ended (every row done, or every job gone): a job not told yet gets its last view
        (judged under the compute lock, as ``read`` judges)."""
        if not self.done and last is not None and not self.ticket.gone():
            self.read(dataclasses.replace(last, skip=_finished(last.skip), full=_finished(last.full)), compute)
        self._end()

    def _view(self, update: RaceUpdate) -> RaceUpdate:
        prompts = update.prompts[self.rows.start:self.rows.stop]
        return row_update(update, self.rows, tuple(prompts), self.prompt, self.judge.judged, self.jobs)

    def _end(self) -> None:
        if not self.done:
            self.done = True
            self.ticket.updates.put(END)


def _ended(progress: StreamProgress, rows: range) -> bool:
    """Whether every one of ``rows`` has ended in this stream (the stream done, or each row stopped)."""
    record = progress.record
    return progress.done or (record is not None and all(record.finish_reasons[row] != "length" for row in rows))


def _finished(progress: Any) -> Any:
    """A stream's progress marked done (the batch ended: its last step has run)."""
    return dataclasses.replace(progress, done=True)
