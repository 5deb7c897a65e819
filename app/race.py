"""The race: SkipDecode and the full model advanced side by side on one device.

They cannot both run flat out at once without slowing each other, so they are interleaved step by
step, and the stream that has used LESS measured compute time goes next. The race on screen
therefore shows each at its own measured speed (the faster one pulls ahead), and the tokens/s
figures are measured per stream. Step mode alternates them instead (``lockstep``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

from app.settings import PlaygroundSettings
from model.generation import GenerationResult, LensReading, TextGenerator
from model.skipdecode.decoder import StepEvent
from model.skipdecode.schedule import SolvedSchedule


@dataclass
class StreamProgress:
    """How far one stream (SkipDecode or full) has come: its tokens, depths and time."""

    name: str
    rows: int
    tokens: list[list[int]] = field(default_factory=list)  # generated ids per row (EOS excluded)
    finished: list[bool] = field(default_factory=list)  # per row: ended (EOS, stop string or length)
    depths: list[int] = field(default_factory=list)  # layers that produced each generated token
    step_layers: list[tuple[int, ...]] = field(default_factory=list)  # decode step k -> layers
    prefill_layers: tuple[int, ...] = ()
    prefill_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)  # decode step k -> seconds
    seconds: float = 0.0  # prefill + decode steps
    done: bool = False
    result: GenerationResult | None = None
    lens: list[list[LensReading]] = field(default_factory=list)  # per generated token of row 0 (lens on)
    traces: list[tuple] = field(default_factory=list)  # per generated token of row 0: (layer, hidden) pairs

    def __post_init__(self) -> None:
        self.tokens = [[] for _ in range(self.rows)]
        self.finished = [False] * self.rows

    def apply(self, event: StepEvent, eos_ids: tuple[int, ...]) -> None:
        self.seconds += event.seconds
        if event.step < 0:
            self.prefill_layers, self.prefill_seconds = event.layers, event.seconds
        else:
            self.step_layers.append(event.layers)
            self.step_seconds.append(event.seconds)
        self.depths.append(len(event.layers))
        # The decoder says which rows are finished (EOS or a stop string); a finished row repeats
        # the pad id. The token that ends a row is kept unless it is EOS, as in DecodeResult.
        for row, token in enumerate(event.token_ids):
            if self.finished[row]:
                continue
            if not (event.finished[row] and token in eos_ids):
                self.tokens[row].append(token)
            self.finished[row] = event.finished[row]

    def ids(self, row: int) -> list[int]:
        return list(self.tokens[row])

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


@dataclass
class RaceUpdate:
    skip: StreamProgress
    full: StreamProgress
    solved: SolvedSchedule
    moved: str  # which stream advanced ("skip" or "full")


def race(generator: TextGenerator, settings: PlaygroundSettings,
         should_cancel: Callable[[], bool] | None = None, *, lockstep: bool = False,
         compute_lock=None) -> Iterator[RaceUpdate]:
    """Advance SkipDecode and the full model step by step, the one with less compute time first
    (``lockstep``: the one that has taken fewer steps first, so they alternate: step mode)."""
    skip_request = settings.request(full=False, num_layers=generator.num_layers)
    skip_run = generator.prepare(skip_request)  # ValueError on bad settings; tokenized and solved once
    full_run = generator.with_schedule(skip_run, settings.request(full=True, num_layers=generator.num_layers).schedule)
    solved = skip_run.schedule
    rows = len(skip_request.prompts)
    views = {"skip": StreamProgress("SkipDecode", rows), "full": StreamProgress("full model", rows)}
    streams = {"skip": generator.stream(skip_run, should_cancel, trace_row=0 if settings.lens else None),
               "full": generator.stream(full_run, should_cancel)}
    eos = generator.loaded.eos_token_ids
    while not all(v.done for v in views.values()):
        if should_cancel is not None and should_cancel():
            for stream in streams.values():
                stream.close()
            return
        progress = (lambda k: len(views[k].depths)) if lockstep else (lambda k: views[k].seconds)
        key = min((k for k, v in views.items() if not v.done), key=lambda k: (progress(k), k != "skip"))
        try:
            with compute_lock or contextlib.nullcontext():  # one model step at a time per lane
                event = next(streams[key])
            views[key].apply(event, eos)
            if event.trace:  # the lens runs here, outside the decoder's timed step
                views[key].lens.append(generator.lens(event.trace, skip_request.schedule))
                views[key].traces.append(event.trace)
        except StopIteration as stop:
            views[key].done, views[key].result = True, stop.value
            if stop.value is not None and stop.value.decode.cancelled:
                return  # cancelled inside a step (a long prefill): nothing more to show
        yield RaceUpdate(views["skip"], views["full"], solved, key)
