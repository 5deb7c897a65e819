"""Text in, text out: prompts -> schedule -> SkipDecoder -> texts.

This is the layer the CLI and the UI call. ``TextGenerator`` only orchestrates a run: prepare
(check, tokenize, solve, size), stream and generate; the parts it runs are each a class of their
own, found by name — the chat template and encoding (text.py), the schedules and their cache
(schedules.py), the logit lens (lens.py) and the full model's judgement (judge.py). The decoder
below only sees token ids.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, ContextManager, Generator, Sequence

import torch

from model.generation.judge import FullModelJudge
from model.generation.lens import LogitLens
from model.generation.runs import GenerationRequest, GenerationResult, PreparedRun, validate_request
from model.generation.schedules import SchedulePlanner, ScheduleRequest
from model.generation.text import TextCodec
from model.loading import LoadedModel
from model.skipdecode.decoder import (
    DecodeResult,
    Prefill,
    SkipDecoder,
    StepEvent,
    run_to_end,
    shared_prefix_padded,
)
from model.skipdecode.schedule import SolvedSchedule, speedup_summary


class TextGenerator:
    """SkipDecode over a LoadedModel, speaking text.

    It only orchestrates a run; a caller uses its parts directly for what is not one: ``text``
    (TextCodec: the chat template, ``encode``, ``decode_text``, token texts), ``schedules``
    (SchedulePlanner: the skip policy's trained defaults, ``schedule_for``, the cache), ``lens``
    (LogitLens) and ``judge`` (FullModelJudge)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        # The full model is always the ORIGINAL weights; SkipDecode runs the skip policy.
        self.full_decoder = loaded.full_decoder()
        self.skip_decoder = loaded.skip_decoder()
        self.cost = loaded.cost_model()
        self.text = TextCodec(loaded)
        self.schedules = SchedulePlanner(loaded.skip_policy, self.full_decoder.num_layers, self.cost)
        # The lens and the judge ask for the decoders at each use: the CLI's --static-cache swaps them.
        self.lens = LogitLens(loaded, self.decoder_for, self.text.token_text)
        self.judge = FullModelJudge(loaded, lambda: self.full_decoder)

    @property
    def num_layers(self) -> int:
        return self.full_decoder.num_layers

    @property
    def max_context(self) -> int:
        return self.full_decoder.adapter.max_context

    def decoder_for(self, request: ScheduleRequest) -> SkipDecoder:
        """The original weights for the full model and for skipping without the skip policy;
        the skip policy's weights (merged adapter, bridge) for SkipDecode."""
        return self.full_decoder if request.full or not request.skip_policy else self.skip_decoder

    # --- a run ----------------------------------------------------------------------------
    def prepare(self, request: GenerationRequest, solve: bool = True,
                limits: Callable[[PreparedRun], None] | None = None, share_prefix: bool = False) -> PreparedRun:
        """Check the request, solve its schedule, tokenize and check the context, once (ValueError
        names what is wrong). ``solve=False`` (an admission check, in milliseconds): the schedule
        is only checked (``SchedulePlanner.check``), not solved for the run, and the PreparedRun has
        none. ``limits``: a caller's own limits on the tokenized run (a server's sizes), checked before
        the model's context, so a prompt over both is refused by the caller's limit.
        ``share_prefix``: the tokens every prompt begins with (the chat template's system turn, for a
        class's prompts) are laid out once and read once (``shared_prefix_padded``); a row's text is
        the same up to the float rounding of a differently shaped prefill."""
        validate_request(request)
        if solve:
            schedule: SolvedSchedule | None = self.schedules.schedule_for(request.schedule, request.max_new_tokens)
        else:
            self.schedules.check(request.schedule, request.max_new_tokens)
            schedule = None
        return self.sized(request, limits, schedule, share_prefix)

    def sized(self, request: GenerationRequest, limits: Callable[[PreparedRun], None] | None = None,
              schedule: SolvedSchedule | None = None, share_prefix: bool = False) -> PreparedRun:
        """The request tokenized and checked against ``limits`` and the model's context, its schedule
        not looked at: what a server needs to know of a job's size, from any model that shares this
        one's tokenizer (a task's model that is not loaded yet: ``TextCodec.shares_tokenizer``)."""
        if share_prefix:
            ids, mask, prefix = shared_prefix_padded(self.text.token_rows(request.prompts, request.raw),
                                                     self.loaded.pad_token_id)
        else:
            (ids, mask), prefix = self.text.padded(request.prompts, request.raw), 0
        run = PreparedRun(request=request, ids=ids, mask=mask, schedule=schedule, shared_prefix=prefix)
        if limits is not None:
            limits(run)
        if ids.shape[1] + request.max_new_tokens > self.max_context:
            raise ValueError(
                f"the prompt is {ids.shape[1]} tokens; with max_new_tokens {request.max_new_tokens} that exceeds "
                f"the model's context of {self.max_context} tokens"
            )
        return run

    def with_schedule(self, run: PreparedRun, schedule: ScheduleRequest) -> PreparedRun:
        """The same prompts (no second tokenization) under another schedule: the full model beside SkipDecode."""
        request = replace(run.request, schedule=schedule)
        return replace(run, request=request, schedule=self.schedules.schedule_for(schedule, request.max_new_tokens))

    def stream(
        self, request: GenerationRequest | PreparedRun, should_cancel: Callable[[], bool] | None = None,
        trace_row: int | None = None, prefilled: Prefill | None = None,
    ) -> Generator[StepEvent, None, GenerationResult]:
        """One StepEvent per step (with ``trace_row``: that row's hidden states after each layer
        that ran, for ``LogitLens.read``); returns the GenerationResult. A PreparedRun is not checked
        again. ``prefilled``: its prompts already read (``shared_prefill``; this stream's own copy)."""
        run = request if isinstance(request, PreparedRun) else self.prepare(request)
        request, schedule = run.request, run.schedule
        if schedule is None:
            raise ValueError("this PreparedRun was only checked (prepare(solve=False)): prepare it to run it")
        decode = yield from self.decoder_for(request.schedule).stream(
            run.ids,
            run.mask,
            schedule.config,
            max_new_tokens=request.max_new_tokens,
            sampling=request.sampling,
            stop_check=self.text.stop_check(request.stop),
            should_cancel=should_cancel,
            trace_row=trace_row,
            prefilled=prefilled,
            shared_prefix=run.shared_prefix,
        )
        return self._result(request, schedule, decode)

    def _result(self, request: GenerationRequest, schedule: SolvedSchedule, decode: DecodeResult) -> GenerationResult:
        loaded = self.loaded
        return GenerationResult(
            model=loaded.name,
            device=str(loaded.device),
            dtype=str(loaded.dtype).replace("torch.", ""),
            weights=loaded.weights,
            adapter=loaded.adapter_path if not request.schedule.full and request.schedule.skip_policy else None,
            num_layers=self.num_layers,
            prompts=list(request.prompts),
            outputs=[self.text.decode_text(row, request.stop) for row in decode.tokens],
            schedule=schedule,
            decode=decode,
            speedups=speedup_summary(schedule, decode.layers_per_step, self.cost),
        )

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return run_to_end(self.stream(request))

    def warm_up(self, runs: Sequence[PreparedRun], batch_sizes: Sequence[int], lock: ContextManager) -> int:
        """Each of ``runs`` (prepared: SkipDecode's and the full model's of a page's default settings)
        with its first prompt repeated to each of ``batch_sizes`` rows, run to the end, each step under
        ``lock`` (one model step at a time: a visitor's run takes its steps between these). On a
        GPU this compiles each layer kind per batch bucket and captures the schedules' graphs before any
        visitor's run needs them. Returns the runs made."""
        made = 0
        for rows in batch_sizes:
            for run in runs:
                request = replace(run.request, prompts=list(run.request.prompts[:1]) * rows)
                events = self.stream(self.sized(request, schedule=run.schedule))
                while _next_step(events, lock):
                    pass
                made += 1
        return made

    def shared_prefill(self, first: PreparedRun, second: PreparedRun,
                       should_cancel: Callable[[], bool] | None = None, parts: Sequence[range] = (),
                       on_part: Callable[[range, torch.Tensor], None] | None = None) -> Prefill | None:
        """The prompts of two runs of the same tokens (``with_schedule``: SkipDecode and the full model)
        read ONCE, where both read them alike: at full depth (the default: the prompt at full depth)
        with the same original weights. None where they read them differently (the prompt at the
        first step's budget, a static decoder's own buffers). Raises Cancelled as a prefill does.
        ``parts``, ``on_part``: the rows read in parts, each part told as it is read (``read_prompt``)."""
        if first.schedule is None or second.schedule is None or first.ids is not second.ids:
            return None
        layers = first.schedule.config.prefill_layers()
        if layers != second.schedule.config.prefill_layers() or len(layers) != self.num_layers:
            return None
        decoder = self.decoder_for(first.request.schedule)
        if not decoder.reads_prompts_as(self.decoder_for(second.request.schedule)):
            return None
        return decoder.read_prompt(first.ids, first.mask, first.schedule.config, first.request.max_new_tokens,
                                   should_cancel, first.shared_prefix, parts, on_part)

    def first_tokens(self, run: PreparedRun, rows: range, logits: torch.Tensor) -> tuple[list[list[int]], list[str]]:
        """A greedy run's first token of each of ``rows`` from their part of its prompt read (``shared_prefill``'s
        ``on_part``), as its stream will record it, stop strings included (``SkipDecoder.first_tokens``)."""
        stop_check = self.text.stop_check(run.request.stop)
        return self.decoder_for(run.request.schedule).first_tokens(logits, stop_check, rows)


def _next_step(events: Generator[StepEvent, None, GenerationResult], lock: ContextManager) -> bool:
    """One step of ``events`` under ``lock`` (the prefill is the first); False once the run has ended."""
    with lock:
        try:
            next(events)
        except StopIteration:
            return False
    return True
