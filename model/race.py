"""The race: SkipDecode and the full model advanced side by side on one device, and everything the
playground shows of it as one result per step (``RaceUpdate``).

They cannot both run flat out at once without slowing each other, so they are interleaved step by
step, and the stream that has used LESS measured compute time goes next. The race on screen
therefore shows each at its own measured speed (the faster one pulls ahead), and the tokens/s
figures are measured per stream. Step mode alternates them instead (``lockstep``).

The race takes PreparedRun objects (tokenized and solved once: ``TextGenerator.prepare``) and
produces, between the decoder's timed steps: each stream's tokens, layers and timings (read from
the decoder's own record, ``StepEvent.record``), their texts, the prompt's tokens as text, the
logit lens, and the full model's judgement of SkipDecode's text with the lens's KL. Whatever shows
an update (app/page/views.py: HTML, figures, API messages) only formats it and never calls the model.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ContextManager, Generator, Iterator

from model.generation.generator import TextGenerator
from model.generation.lens import LensReading
from model.generation.runs import GenerationResult, PreparedRun
from model.generation.schedules import ScheduleRequest
from model.skipdecode.decoder import Cancelled, DecodeResult, Prefill, StepEvent
from model.skipdecode.schedule import CostModel, SolvedSchedule

INCOMPLETE = "\ufffd"  # what decoding shows for a character whose bytes have not all arrived yet


class TokenTexts:
    """Each token's text as it reads inside the whole output (byte-level BPE needs context),
    extended incrementally: one decode per new token. A character split over several tokens (a
    CJK character is often 2-3 byte tokens) belongs to the token that completes it; the tokens
    carrying its first bytes get "" (decoding them alone would show replacement marks). ``text``
    is the whole output decoded as it is (the last decode, incomplete characters included)."""

    def __init__(self, codec: Any) -> None:  # a TextCodec, or anything with decode_text(ids) -> str
        self.codec = codec
        self.texts: list[str] = []
        self.decoded = ""
        self.text = ""

    def update(self, ids: list[int]) -> list[str]:
        for end in range(len(self.texts) + 1, len(ids) + 1):
            self.text = self.codec.decode_text(ids[:end])
            stable = self.text.rstrip(INCOMPLETE)
            common = len(os.path.commonprefix([stable, self.decoded]))
            self.texts.append(stable[common:])
            self.decoded = stable
        return self.texts[: len(ids)]


@dataclass(frozen=True)
class Judged:
    """One generated token judged by the full model on the same prefix: would it pick it too?"""

    same: bool
    full_choice: str  # the full model's own top next token there


@dataclass(frozen=True)
class PromptTokens:
    """Row 0's prompt, token by token as text (``TextGenerator.prompt_tokens``), and how many of
    them lead the user's text (the chat template's system turn and user header)."""

    texts: tuple[str, ...] = ()
    hidden: int = 0


@dataclass
class StreamProgress:
    """How far one stream (SkipDecode or full) has come. Tokens, layers and timings are the
    decoder's own record (``DecodeResult``, extended in place as the stream steps); the race adds
    each row's token texts and, with the lens, row 0's lens readings."""

    name: str
    rows: int
    record: DecodeResult | None = None  # None until the stream's first step (the prefill) has run
    texts: list[TokenTexts] = field(default_factory=list)  # per row
    done: bool = False
    result: GenerationResult | None = None
    lens: list[list[LensReading]] = field(default_factory=list)  # per generated token of row 0 (lens on)
    traces: list[tuple] = field(default_factory=list)  # per generated token of row 0: (layer, hidden) pairs

    def ids(self, row: int) -> list[int]:
        """Row ``row``'s generated ids (EOS excluded; a stop string's last token kept)."""
        return list(self.record.tokens[row]) if self.record is not None else []

    def token_texts(self, row: int) -> list[str]:
        return self.texts[row].texts[: len(self.ids(row))] if row < len(self.texts) else []

    def text(self, row: int) -> str:
        return self.texts[row].text if row < len(self.texts) else ""

    @property
    def prefill_layers(self) -> tuple[int, ...]:
        return self.record.prefill_layers if self.record is not None else ()

    @property
    def step_layers(self) -> list[tuple[int, ...]]:
        """Decode step k -> the layers it ran."""
        return self.record.step_layers if self.record is not None else []

    @property
    def depths(self) -> list[int]:
        """The layers that produced each generated token: the prefill's, then each decode step's."""
        return [len(self.prefill_layers), *self.record.layers_per_step] if self.record is not None else []

    @property
    def prefill_seconds(self) -> float:
        return self.record.prefill_seconds if self.record is not None else 0.0

    @property
    def step_seconds(self) -> list[float]:
        return self.record.step_seconds if self.record is not None else []

    @property
    def seconds(self) -> float:
        """Prefill + decode steps."""
        return self.record.total_seconds if self.record is not None else 0.0

    @property
    def generated(self) -> int:
        return sum(len(self.ids(r)) for r in range(self.rows))

    @property
    def tokens_per_second(self) -> float:
        """All generated tokens over all time, prefill included (what a user waits for)."""
        return self.generated / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens of the decode steps over their time: the prefill (one token, however long the
        prompt) is left out, so a long prompt does not make the figure meaningless."""
        decoded = sum(max(0, len(self.ids(r)) - 1) for r in range(self.rows))
        seconds = sum(self.step_seconds)
        return decoded / seconds if seconds > 0 else 0.0


@dataclass(frozen=True)
class BatchShare:
    """A run that shared its batch with other requests (other visitors): how many, and the batch's own
    speed (all its rows' tokens over its time, prefill included), beside the row's."""

    requests: int
    rows: int
    skip_tokens_per_second: float
    full_tokens_per_second: float


@dataclass
class RaceUpdate:
    """Everything shown after one step of either stream."""

    skip: StreamProgress
    full: StreamProgress
    solved: SolvedSchedule  # SkipDecode's schedule
    moved: str  # which stream advanced ("skip" or "full")
    cost: CostModel  # the model's per-step cost (the cost-model speedups)
    prompts: tuple[str, ...] = ()  # what the rows answer
    prompt: PromptTokens = PromptTokens()
    # The full model's verdict on SkipDecode's row 0, once SkipDecode has finished (every step in
    # lockstep); None before. With the lens's KL asked for: per token {layer: KL(full || lens)}.
    judged: list[Judged] | None = None
    lens_kl: list[dict[int, float]] | None = None
    batch: BatchShare | None = None  # set when these rows shared their batch with other requests (row_update)

    @property
    def num_layers(self) -> int:
        return self.solved.config.num_layers

    @property
    def done(self) -> bool:
        return self.skip.done and self.full.done


class Judge:
    """The full model's verdict on SkipDecode's row 0: one full-depth forward over the prompt and
    SkipDecode's own tokens (``FullModelJudge.log_probs``), again only when they changed;
    the same pass gives the lens's KL when asked for."""

    def __init__(self, generator: TextGenerator, run: PreparedRun, with_kl: bool) -> None:
        self.generator, self.run, self.with_kl = generator, run, with_kl
        self.judged_ids: list[int] | None = None
        self.judged: list[Judged] | None = None
        self.kl: list[dict[int, float]] | None = None

    def update(self, skip: StreamProgress) -> None:
        ids = skip.ids(0)
        if not ids or ids == self.judged_ids:
            return
        generator = self.generator
        full = generator.judge.log_probs(self.run.prompt_ids(), ids)
        self.chose(ids, generator.judge.choices(full))
        if self.with_kl and skip.traces:
            self.kl = generator.lens.kl(skip.traces, full, self.run.request.schedule)

    def chose(self, ids: list[int], choices: list[int]) -> None:
        """The verdict from the full model's choices at SkipDecode's tokens ``ids`` (``update``, or many
        rows judged in one forward: ``FullModelJudge.choices_of``)."""
        self.judged_ids = ids
        self.judged = [Judged(choice == token, self.generator.text.token_text(choice)) for choice, token in zip(choices, ids)]


Stream = Generator[StepEvent, None, GenerationResult]


def advance(generator: TextGenerator, stream: Stream, progress: StreamProgress, lock: ContextManager,
            lens_request: ScheduleRequest) -> bool:
    """One step of one stream (under ``lock``: one model step at a time per lane), then its texts and
    lens readings, outside the decoder's timed step. False when the stream was cancelled inside a
    step (a long prefill): nothing more to show."""
    try:
        with lock:
            event = next(stream)
    except StopIteration as stop:
        progress.done, progress.result = True, stop.value
        if stop.value is None:
            return True
        progress.record = stop.value.decode
        return not stop.value.decode.cancelled
    progress.record = event.record
    for row, texts in enumerate(progress.texts):
        texts.update(progress.ids(row))
    if event.trace:  # the lens runs here, outside the decoder's timed step
        progress.lens.append(generator.lens.read(event.trace, lens_request))
        progress.traces.append(event.trace)
    return True


def race(generator: TextGenerator, skip_run: PreparedRun, full_run: PreparedRun, *, lens: bool = False,
         lens_kl: bool = False, lockstep: bool = False, should_cancel: Callable[[], bool] | None = None,
         compute_lock: ContextManager | None = None, judge_first_row: bool = True,
         prefill: Prefill | None = None) -> Iterator[RaceUpdate]:
    """Advance SkipDecode (``skip_run``) and the full model (``full_run``: the same tokens under the
    full schedule, ``TextGenerator.with_schedule``) step by step, the one with less compute time
    first (``lockstep``: the one that has taken fewer steps first, so they alternate: step mode).
    ``lens``: row 0's logit lens; ``lens_kl``: with it, each lens reading's KL to the full model.
    ``judge_first_row=False``: no verdict on row 0 (a shared batch judges each job's rows itself).

    Where both read the prompt alike (at full depth: ``TextGenerator.shared_prefill``) it is read ONCE
    and each stream continues its own copy, recording that read's time as its prefill: the two
    prefills computed the same thing. ``prefill``: that read, done by the caller, who keeps it (both
    streams continue copies); without the lens only (the lens traces its own prompt's read)."""
    rows = skip_run.batch
    views = {key: StreamProgress(name, rows, texts=[TokenTexts(generator.text) for _ in range(rows)])
             for key, name in (("skip", "SkipDecode"), ("full", "full model"))}
    lock = compute_lock or contextlib.nullcontext()
    try:
        starts = _prompt_reads(generator, skip_run, full_run, lens, lock, should_cancel, prefill)
    except Cancelled:
        return
    streams = {"skip": generator.stream(skip_run, should_cancel, trace_row=0 if lens else None, prefilled=starts[0]),
               "full": generator.stream(full_run, should_cancel, prefilled=starts[1])}
    texts, hidden = generator.text.prompt_tokens(skip_run.prompt_ids(), skip_run.request.raw)
    prompt = PromptTokens(tuple(texts), hidden)
    judge = Judge(generator, skip_run, with_kl=lens and lens_kl)
    while not all(v.done for v in views.values()):
        if should_cancel is not None and should_cancel():
            for stream in streams.values():
                stream.close()
            return
        progress = (lambda k: len(views[k].depths)) if lockstep else (lambda k: views[k].seconds)
        key = min((k for k, v in views.items() if not v.done), key=lambda k: (progress(k), k != "skip"))
        if not advance(generator, streams[key], views[key], lock, skip_run.request.schedule):
            return
        if judge_first_row and key == "skip" and (lockstep or views["skip"].done):  # once SkipDecode has finished
            with lock:
                judge.update(views["skip"])
        yield RaceUpdate(views["skip"], views["full"], skip_run.schedule, key, generator.cost,
                         skip_run.request.prompts, prompt, judge.judged, judge.kl)


def _prompt_reads(generator: TextGenerator, skip_run: PreparedRun, full_run: PreparedRun, lens: bool,
                  lock: ContextManager, should_cancel: Callable[[], bool] | None,
                  prefill: Prefill | None) -> tuple[Prefill | None, Prefill | None]:
    """What each stream continues: copies of the caller's read; else one read of the prompt (under
    ``lock``: a model step), the original for SkipDecode and a copy for the full model; else nothing:
    each reads its own (the lens, or the prompt at the first step's budget)."""
    if lens:
        return None, None
    if prefill is not None:
        return prefill.copy(), prefill.copy()
    with lock:
        read = generator.shared_prefill(skip_run, full_run, should_cancel)
    return (read, read.copy()) if read is not None else (None, None)


# --- one request's rows of a shared batch ----------------------------------------------------------


@dataclass
class FrozenTexts:
    """A TokenTexts as it stood (``rows_of`` copies it: the batch's race goes on extending the original)."""

    texts: list[str]
    text: str


def rows_of(progress: StreamProgress, rows: range) -> StreamProgress:
    """The rows ``rows`` of a stream, copied as they stand: their tokens, texts and finish reasons, and
    the batch's layers and timings (every row ran the same layers). Done when the stream is, or when
    every one of these rows has ended (an end of text or a stop string: the batch goes on for others)."""
    record = progress.record
    copy = None
    if record is not None:
        copy = replace(record, prompt_lengths=record.prompt_lengths[rows.start:rows.stop],
                       tokens=[list(record.tokens[row]) for row in rows],
                       finish_reasons=record.finish_reasons[rows.start:rows.stop],
                       step_layers=list(record.step_layers), step_seconds=list(record.step_seconds))
    texts: list[Any] = [FrozenTexts(list(progress.texts[row].texts), progress.texts[row].text) for row in rows]
    ended = copy is not None and all(reason != "length" for reason in copy.finish_reasons)
    return StreamProgress(progress.name, len(rows), copy, texts, progress.done or ended)


def row_update(update: RaceUpdate, rows: range, prompts: tuple[str, ...], prompt: PromptTokens,
               judged: list[Judged] | None, requests: int) -> RaceUpdate:
    """One request's view of a shared batch's race: its own rows only (no other request's text), its
    prompt, the full model's verdict on its first row, and the batch's share (``BatchShare``)."""
    share = BatchShare(requests, update.skip.rows, update.skip.tokens_per_second, update.full.tokens_per_second)
    return RaceUpdate(rows_of(update.skip, rows), rows_of(update.full, rows), update.solved, update.moved,
                      update.cost, prompts, prompt, judged, None, share)
