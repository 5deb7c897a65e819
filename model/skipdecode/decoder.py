"""Batched, KV-cached SkipDecode (docs/DESIGN.md, "The method"), as small named steps:

    prefill      prompt positions through the prefill layer set, filling each layer's cache
    read_prompt  a timed prefill that several streams continue (``Prefill``: SkipDecode and the full
                 model read a prompt alike at full depth, so a race reads it once)
    decode_step  one new position through the layer set of step k (one exit for the whole batch)
    stream       prefill + decode steps, yielding one StepEvent per step, returning a DecodeResult
    extend       every layer over more positions after a prompt read at full depth, in one forward
                 (the full model judged on SkipDecode's continuation)

plus ``masked_forward``, the teacher-forced twin used by training and by the tests that tie
training to inference. The full model is the same code with n_k = L, so comparisons are fair.

This module knows token ids and tensors only: no tokenizer, no UI.
Shapes: B = batch, P = padded prompt length, V = vocab, L = layers.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Sequence, cast

import torch
from torch import nn

from model.common.checks import check_int, check_number
from model.skipdecode.architectures import ArchitectureAdapter, adapter_for
from model.skipdecode.kv_cache import LayerInputs, PrefixKVCache, PromptKVCache, position_ids_from_mask
from model.skipdecode.lean_layer import greedy_ids
from model.skipdecode.schedule import ScheduleConfig
from model.skipdecode.skip_policy import EntryBridge, entry_layers

GREEDY_BELOW = 1e-4  # temperatures this small sample the argmax anyway


class Trace:
    """Hidden states of one row at its newest position, after each layer that ran: what a logit
    lens reads. Recording is a copy of one (C,) vector per layer; the lens itself runs elsewhere,
    outside the decoder's timed step."""

    def __init__(self, row: int) -> None:
        self.row = row
        self.records: list[tuple[int, torch.Tensor]] = []

    def record(self, layer: int, hidden: torch.Tensor) -> None:
        self.records.append((layer, hidden[self.row, -1].detach().clone()))  # hidden: (B, T, C)

    def take(self) -> tuple[tuple[int, torch.Tensor], ...]:
        records, self.records = tuple(self.records), []
        return records


class Cancelled(Exception):
    """Raised inside a step when the caller asked to stop (checked between layers)."""


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 = greedy (so is any temperature below GREEDY_BELOW: dividing logits by a
    subnormal overflows to inf). top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    # A batch of several requests (several visitors sharing one schedule): (rows, seed) per request, in
    # row order, each request's rows drawn from its own generator, as they would be run alone. Empty:
    # every row from one generator of ``seed``.
    row_seeds: tuple[tuple[int, int | None], ...] = ()

    def __post_init__(self) -> None:
        check_number("temperature", self.temperature, low=0)
        check_int("top_k", self.top_k, low=0)
        check_number("top_p", self.top_p, above=0, high=1)
        for rows, _ in self.row_seeds:
            check_int("rows of a seed group", rows, low=1)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass
class StepEvent:
    """One step of generation. step -1 is the prefill (it produces generated token 0);
    step k >= 0 feeds generated token k and produces token k + 1."""

    step: int
    token_ids: list[int]  # the new token of every row; rows already finished repeat the pad id
    finished: list[bool]  # per row, after this step
    layers: tuple[int, ...]  # layer indices this step executed (the same for every row)
    seconds: float  # wall time of this step, device work included
    # With stream(trace_row=r): (layer, hidden (C,)) after each executed layer, for row r at the
    # position that produced this step's token (a logit lens reads these; see LogitLens.read).
    trace: tuple[tuple[int, torch.Tensor], ...] = ()
    # The stream's own record so far: the DecodeResult it returns at the end, the same object,
    # extended in place by later steps (a caller that shows progress reads it, keeping no twin).
    record: DecodeResult | None = None


@dataclass
class DecodeResult:
    num_layers: int
    prompt_lengths: list[int]
    # Generated ids per row. EOS is not in them; the token that completed a stop string is (a stop
    # string can end inside a token, so the text is cut at the string: truncate_at_stop in model/generation/text.py).
    tokens: list[list[int]]
    finish_reasons: list[str]  # "eos", "stop" or "length"
    prefill_layers: tuple[int, ...]
    step_layers: list[tuple[int, ...]] = field(default_factory=list)
    prefill_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    cancelled: bool = False

    @property
    def layers_per_step(self) -> list[int]:
        """n_k for every decode step that ran."""
        return [len(layers) for layers in self.step_layers]

    @property
    def total_seconds(self) -> float:
        return self.prefill_seconds + sum(self.step_seconds)

    @property
    def num_generated(self) -> int:
        return sum(len(row) for row in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens of all rows over wall time, prefill included."""
        return self.num_generated / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def layer_speedup(self) -> float:
        steps = self.layers_per_step
        return self.num_layers * len(steps) / sum(steps) if steps else 1.0


@dataclass
class DecodeState:
    """Everything a decode step needs from the steps before it."""

    cache: PrefixKVCache
    key_valid: torch.Tensor  # (B, capacity) bool: False at left padding
    next_position: torch.Tensor  # (B,) position id of the next token (padding not counted)
    length: int  # positions written so far (padded prompt + fed tokens)
    has_padding: bool  # False lets every step skip mask building entirely


@dataclass
class Prefill:
    """A prompt read once (``SkipDecoder.read_prompt``) that streams continue (``stream(prefilled=)``).
    A stream mutates the state it continues, so each stream is given its own ``copy``."""

    state: DecodeState
    logits: torch.Tensor  # (B, V): the last prompt position's next-token logits
    layers: tuple[int, ...]  # the layers the prompt ran
    seconds: float  # the prefill's wall time (what each stream that continues it records)
    capacity: int  # positions the cache holds: prompt + new tokens

    @property
    def batch(self) -> int:
        return int(self.logits.shape[0])

    def copy(self, rows: list[int] | None = None) -> "Prefill":
        """Its own copy (of ``rows`` only, in that order, where given)."""
        state = self.state
        pick = (lambda tensor: tensor.clone()) if rows is None else (lambda tensor: tensor[rows].clone())
        return Prefill(DecodeState(state.cache.copy(rows), pick(state.key_valid), pick(state.next_position),
                                   state.length, state.has_padding),
                       pick(self.logits), self.layers, self.seconds, self.capacity)


def _checked_parts(parts: Sequence[range], batch: int) -> list[range]:
    """A prefill's parts (consecutive, non-empty row ranges covering the batch); none given: one part."""
    parts = list(parts) or [range(batch)]
    if [part.start for part in parts] != [0, *(part.stop for part in parts[:-1])] or parts[-1].stop != batch \
            or any(part.step != 1 or len(part) == 0 for part in parts):
        raise ValueError(f"the parts must be consecutive, non-empty row ranges covering the batch of {batch}")
    return parts


# Stop check for a row: (row index, generated ids so far) -> True to finish the row.
StopCheck = Callable[[int, list[int]], bool]


@dataclass
class _StreamRun:
    """One ``stream`` call's working parts, shared by its prefill and decode steps."""

    result: DecodeResult
    finished: list[bool]  # per row
    sampling: SamplingConfig
    generator: torch.Generator | list[tuple[int, torch.Generator]] | None  # one, or (rows, generator) per group
    stop_check: StopCheck | None
    trace: Trace | None

    def event(self, step: int, new_tokens: list[int], layers: tuple[int, ...], seconds: float) -> StepEvent:
        return StepEvent(step, new_tokens, list(self.finished), layers, seconds,
                         self.trace.take() if self.trace else (), self.result)


class SkipDecoder:
    """SkipDecode for one loaded causal LM (any family that architectures.py adapts).

    ``model`` runs every step that executes ALL layers (and a full-depth prefill), so a full
    schedule is exactly the original model. ``skip_model`` (the same architecture with the
    skip-policy LoRA merged in; default ``model``) runs the steps that bypass layers, and
    ``bridge`` maps the hidden state where it jumps a gap. Both weight sets share one KV cache:
    what each step writes equals the gated teacher-forced forward (model/skipdecode/skip_policy.py).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        skip_model: nn.Module | None = None,
        bridge: EntryBridge | None = None,
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int = 0,
    ) -> None:
        self.model = model
        self.adapter: ArchitectureAdapter = adapter_for(model)
        self.skip_adapter: ArchitectureAdapter = adapter_for(skip_model) if skip_model is not None else self.adapter
        self.bridge = bridge
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)

    def _weights_for(self, layers: Sequence[int]) -> tuple[ArchitectureAdapter, frozenset[int]]:
        """(the adapter whose layers run this layer set, the layers entered after a gap)."""
        if len(layers) == self.num_layers:
            return self.adapter, frozenset()
        return self.skip_adapter, entry_layers(layers) if self.bridge is not None else frozenset()

    @property
    def num_layers(self) -> int:
        return self.adapter.num_layers

    def _new_cache(self, batch: int, capacity: int, device: torch.device) -> PrefixKVCache:
        """The KV cache a prefill fills (the static decoder's is preallocated and fixed in shape)."""
        return PrefixKVCache(self.num_layers, capacity)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- steps ----------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: Sequence[int], capacity: int,
        should_cancel: Callable[[], bool] | None = None, trace: Trace | None = None, shared_prefix: int = 0,
        parts: Sequence[range] = (), on_part: Callable[[range, torch.Tensor], None] | None = None,
    ) -> tuple[DecodeState, torch.Tensor]:
        """Run the (B, P) prompt through ``layers``; return the state and last-position logits (B, V).

        A long prompt's prefill is the longest step: ``should_cancel`` is checked between layers
        (raises Cancelled), so Stop frees the CPU within one layer's time. ``shared_prefix``: the
        first k columns are the same tokens in every row (``shared_prefix_padded``: a class's common
        system turn): they run once, as one row, and every row's cache gets a copy of their keys
        and values; the rest of the prompt continues after them.

        ``parts``: consecutive row ranges covering the batch whose rest (after the common start) is read
        one part after another, straight into the batch's cache (``PrefixKVCache.of_rows``), the same read
        up to the float rounding of smaller matrix products; ``on_part`` is given each part's rows and
        last-position logits (rows, V) as soon as they are read. Not with ``trace`` (one row's read)."""
        batch, prompt_len = input_ids.shape
        parts = _checked_parts(parts, batch)
        if trace is not None and len(parts) > 1:
            raise ValueError("a traced read runs in one part")
        valid = attention_mask.bool()
        key_valid = torch.ones(batch, capacity, dtype=torch.bool, device=input_ids.device)
        key_valid[:, :prompt_len] = valid
        positions = position_ids_from_mask(attention_mask)  # (B, P)
        cache = self._new_cache(batch, capacity, input_ids.device)
        start = shared_prefix if batch > 1 and 0 < shared_prefix < prompt_len else 0
        if start:
            self._read_shared_prefix(input_ids[:1, :start], positions[:1, :start], layers, cache, batch, should_cancel)
        all_logits = []
        for part in parts:
            rows = slice(part.start, part.stop)
            hidden = self.adapter.embed(input_ids[rows, start:], positions[rows, start:])  # (b, P - start, C)
            inputs = self.adapter.layer_inputs(hidden, valid[rows], positions[rows, start:], after_cache=start > 0)
            part_cache = cache if len(parts) == 1 else cache.of_rows(part, batch)
            hidden = self._prompt_layers(hidden, inputs, part_cache, layers, should_cancel, trace)
            all_logits.append(self.adapter.logits(hidden[:, -1:])[:, -1])  # only the last position: (b, V)
            if on_part is not None:
                on_part(part, all_logits[-1])
        if len(parts) > 1:
            cache.lengths = list(part_cache.lengths)
        logits = all_logits[0] if len(parts) == 1 else torch.cat(all_logits)
        state = DecodeState(
            cache=cache,
            key_valid=key_valid,
            next_position=positions[:, -1] + 1,
            length=prompt_len,
            has_padding=not bool(valid.all()),
        )
        return state, logits

    def _prompt_layers(self, hidden: torch.Tensor, inputs: LayerInputs, cache: PrefixKVCache, layers: Sequence[int],
                       should_cancel: Callable[[], bool] | None, trace: Trace | None) -> torch.Tensor:
        """Prompt positions (B, T, C) through ``layers``, appending to ``cache`` (a prefill's layer loop)."""
        weights, entries = self._weights_for(layers)
        for index in layers:
            if should_cancel is not None and should_cancel():
                raise Cancelled
            if index in entries:  # entries only where there is a bridge
                hidden = cast(EntryBridge, self.bridge)(index, hidden)
            hidden = weights.run_layer(index, hidden, inputs, cache)
            if trace is not None:
                trace.record(index, hidden)
        return hidden

    def _read_shared_prefix(self, prefix_ids: torch.Tensor, positions: torch.Tensor, layers: Sequence[int],
                            cache: PrefixKVCache, batch: int, should_cancel: Callable[[], bool] | None) -> None:
        """The (1, k) prefix every row shares through ``layers`` once, its keys and values copied into
        each of ``batch`` rows of ``cache`` (columns 0..k-1)."""
        count = prefix_ids.shape[1]
        once = PrefixKVCache(self.num_layers, count)
        hidden = self.adapter.embed(prefix_ids, positions)  # (1, k, C)
        inputs = self.adapter.layer_inputs(hidden, torch.ones_like(prefix_ids, dtype=torch.bool), positions)
        self._prompt_layers(hidden, inputs, once, layers, should_cancel, None)
        for index in layers:
            keys, values = once.layer(index)
            cache.update(keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1), index)

    def read_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, schedule: ScheduleConfig,
                    max_new_tokens: int, should_cancel: Callable[[], bool] | None = None,
                    shared_prefix: int = 0, parts: Sequence[range] = (),
                    on_part: Callable[[range, torch.Tensor], None] | None = None) -> Prefill:
        """The prompt's prefill under ``schedule``, timed, for the streams that continue it (raises
        Cancelled as ``prefill`` does). ``parts``, ``on_part``: the rows read part by part, each part told
        as soon as it is read (``prefill``), so a class's first visitors can see their first token before
        the last visitor's prompt is read."""
        capacity = self._checked_capacity(input_ids, schedule, max_new_tokens)
        start = time.perf_counter()
        layers = schedule.prefill_layers()
        state, logits = self.prefill(input_ids.to(self.device), attention_mask.to(self.device), layers, capacity,
                                     should_cancel, shared_prefix=shared_prefix, parts=parts, on_part=on_part)
        return Prefill(state, logits, tuple(layers), time.perf_counter() - start, capacity)

    def first_tokens(self, logits: torch.Tensor, stop_check: StopCheck | None, rows: range
                     ) -> tuple[list[list[int]], list[str]]:
        """What a GREEDY stream continuing a prompt read records at its first event, for the batch's
        ``rows`` whose last-position logits (len(rows), V) are given: each row's first token (none where
        it is an end of text) and its finish reason so far (``read_prompt``'s ``on_part`` shows them)."""
        result = DecodeResult(self.num_layers, [0] * len(rows), [[] for _ in rows], ["length"] * len(rows), ())
        check = None if stop_check is None else (lambda row, ids: stop_check(rows.start + row, ids))
        self._record(greedy_ids(logits), result, [False] * len(rows), check)
        return result.tokens, result.finish_reasons

    def reads_prompts_as(self, other: "SkipDecoder") -> bool:
        """Whether a full-depth prefill of this decoder is ``other``'s, bit for bit: the same original
        weights run it (a gated skip policy runs the original weights at full depth) into the same
        kind of cache. A static decoder's buffers are leased per run (its graphs hold their
        addresses), so it reads its own prompts."""
        return type(self) is SkipDecoder and type(other) is SkipDecoder and self.model is other.model

    @torch.inference_mode()
    def extend(self, prefill: Prefill, token_ids: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        """Every layer over ``token_ids`` (B, T), the positions after a prompt read at FULL depth,
        in one forward into a copy of its cache: the last layer's hidden states (B, T, C). T may be
        at most the prefill's new-token capacity. ``rows``: the prefill's rows these B are (in that
        order; default all). The prefill itself is left as it was."""
        if list(prefill.layers) != list(range(self.num_layers)):
            raise ValueError("extend continues a prompt read at full depth")
        state = prefill.copy(rows).state
        batch, count = token_ids.shape
        if state.length + count > prefill.capacity:
            raise ValueError(f"{count} positions after the prompt exceed the cache's {prefill.capacity}")
        token_ids = token_ids.to(state.key_valid.device)
        positions = state.next_position[:, None] + torch.arange(count, device=token_ids.device)  # (B, T)
        key_valid = torch.cat([state.key_valid[:, :state.length], state.key_valid.new_ones(batch, count)], dim=1)
        hidden = self.adapter.embed(token_ids, positions)  # (B, T, C)
        inputs = self.adapter.layer_inputs(hidden, key_valid, positions, after_cache=True)
        for index in range(self.num_layers):
            hidden = self.adapter.run_layer(index, hidden, inputs, state.cache)
        return hidden

    @torch.inference_mode()
    def decode_step(self, state: DecodeState, token_ids: torch.Tensor, layers: Sequence[int],
                    trace: Trace | None = None) -> torch.Tensor:
        """Feed one token per row (B,) through ``layers``; return next-token logits (B, V).

        A bypassed layer keeps its shorter cache; a layer that runs attends to its own cached
        prefix plus the new position (its keys are exactly the positions that ran it).
        """
        positions = state.next_position[:, None]  # (B, 1)
        hidden = self.adapter.embed(token_ids[:, None], positions)  # (B, 1, C)
        extras = self.adapter.layer_extras(hidden, positions)
        inputs_by_length: dict[int, LayerInputs] = {}

        def inputs_for(index: int) -> LayerInputs:  # a layer attends to its own cached prefix plus the new position
            cached = state.cache.lengths[index]
            inputs = inputs_by_length.get(cached)
            if inputs is None:
                mask = None
                if state.has_padding:
                    key_valid = torch.cat([state.key_valid[:, :cached], state.key_valid.new_ones(len(token_ids), 1)], dim=1)
                    mask = self.adapter.layer_mask(hidden, key_valid)
                inputs = inputs_by_length[cached] = LayerInputs(mask=mask, position_ids=positions, extra=extras)
            return inputs

        weights, entries = self._weights_for(layers)
        for run in layer_runs(layers, entries, one_by_one=trace is not None):
            if run[0] in entries:  # entries only where there is a bridge
                hidden = cast(EntryBridge, self.bridge)(run[0], hidden)
            hidden = weights.run_layers(run, hidden, inputs_for, state.cache,
                                        state.key_valid if state.has_padding else None, extras)
            if trace is not None:
                trace.record(run[0], hidden)
        state.next_position += 1
        state.length += 1
        return self.adapter.logits(hidden)[:, -1]

    # --- the loop -------------------------------------------------------------------------
    def stream(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        schedule: ScheduleConfig,
        *,
        max_new_tokens: int,
        sampling: SamplingConfig = SamplingConfig(),
        stop_check: StopCheck | None = None,
        should_cancel: Callable[[], bool] | None = None,
        trace_row: int | None = None,
        prefilled: Prefill | None = None,
        shared_prefix: int = 0,
    ) -> Generator[StepEvent, None, DecodeResult]:
        """Generate up to ``max_new_tokens`` per row, yielding one StepEvent per step.

        input_ids/attention_mask: (B, P), LEFT padded. Returns the DecodeResult (the
        generator's return value; ``generate`` collects it). ``prefilled``: these prompts already
        read (``read_prompt``, under this schedule's prefill layers; this stream's own copy): the
        stream continues it and records its time as its prefill's. ``shared_prefix``: the prompts'
        first k columns are the same in every row (``prefill``).
        """
        capacity = self._checked_capacity(input_ids, schedule, max_new_tokens)
        device = self.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        run = self._start_run(attention_mask, schedule, sampling, stop_check, trace_row)
        result = run.result
        start = time.perf_counter()
        try:
            state, logits = self._prompt_state(input_ids, attention_mask, result.prefill_layers, capacity,
                                               should_cancel, run.trace, prefilled, shared_prefix)
        except Cancelled:
            result.cancelled = True
            return result
        next_ids, new_tokens = self._sample_and_record(logits, run)
        result.prefill_seconds = prefilled.seconds if prefilled is not None else time.perf_counter() - start
        yield run.event(-1, new_tokens, result.prefill_layers, result.prefill_seconds)
        yield from self._decode_steps(state, next_ids, schedule, max_new_tokens, should_cancel, run)
        result.cancelled = should_cancel is not None and not all(run.finished) and should_cancel()
        return result

    def _prompt_state(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: tuple[int, ...],
                      capacity: int, should_cancel: Callable[[], bool] | None, trace: Trace | None,
                      prefilled: Prefill | None, shared_prefix: int) -> tuple[DecodeState, torch.Tensor]:
        """The state after the prompt: the prefill, or the given one (checked to be these prompts' read)."""
        if prefilled is None:
            return self.prefill(input_ids, attention_mask, layers, capacity, should_cancel, trace, shared_prefix)
        if trace is not None:
            raise ValueError("a traced row (the lens) reads its own prompt")
        if prefilled.layers != tuple(layers) or prefilled.batch != input_ids.shape[0] \
                or prefilled.state.length != input_ids.shape[1] or prefilled.capacity < capacity:
            raise ValueError("the prefilled state is not these prompts' read under this schedule")
        return prefilled.state, prefilled.logits

    def _checked_capacity(self, input_ids: torch.Tensor, schedule: ScheduleConfig, max_new_tokens: int) -> int:
        """The KV cache's capacity for this call (prompt + new tokens); ValueError on a bad call."""
        if schedule.num_layers != self.num_layers:
            raise ValueError(f"schedule is for {schedule.num_layers} layers; the model has {self.num_layers}")
        check_int("max_new_tokens", max_new_tokens, low=1)
        if input_ids.ndim != 2 or input_ids.shape[1] == 0:
            raise ValueError("every prompt needs at least one token")
        capacity = input_ids.shape[1] + max_new_tokens
        if capacity > self.adapter.max_context:
            raise ValueError(
                f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                f"the model's context of {self.adapter.max_context} tokens"
            )
        return capacity

    def _start_run(self, attention_mask: torch.Tensor, schedule: ScheduleConfig, sampling: SamplingConfig,
                   stop_check: StopCheck | None, trace_row: int | None) -> _StreamRun:
        """A stream call's working parts: its empty result, every row unfinished, the sampler's
        generator and the trace of ``trace_row`` (ValueError when that is not a row)."""
        batch = attention_mask.shape[0]
        generator = _make_generator(sampling, self.device)
        result = DecodeResult(
            num_layers=self.num_layers,
            prompt_lengths=attention_mask.sum(-1).tolist(),
            tokens=[[] for _ in range(batch)],
            finish_reasons=["length"] * batch,
            prefill_layers=schedule.prefill_layers(),
        )
        if trace_row is not None and not 0 <= trace_row < batch:
            raise ValueError(f"trace_row must be a row of the batch (0..{batch - 1}); got {trace_row}")
        trace = Trace(trace_row) if trace_row is not None else None
        return _StreamRun(result, [False] * batch, sampling, generator, stop_check, trace)

    def _decode_steps(
        self, state: DecodeState, next_ids: torch.Tensor, schedule: ScheduleConfig, max_new_tokens: int,
        should_cancel: Callable[[], bool] | None, run: _StreamRun,
    ) -> Generator[StepEvent, None, None]:
        """The decode steps after the prefill, one StepEvent each, until every row is finished, the
        token budget is spent or the caller cancels (checked before each step)."""
        for step in range(max_new_tokens - 1):
            if all(run.finished) or (should_cancel is not None and should_cancel()):
                break
            layers = schedule.step_layers(step)
            start = time.perf_counter()
            logits = self.decode_step(state, next_ids, layers, run.trace)
            next_ids, new_tokens = self._sample_and_record(logits, run)
            seconds = time.perf_counter() - start
            run.result.step_layers.append(layers)
            run.result.step_seconds.append(seconds)
            yield run.event(step, new_tokens, layers, seconds)

    def _sample_and_record(self, logits: torch.Tensor, run: _StreamRun) -> tuple[torch.Tensor, list[int]]:
        """(the sampled (B,) ids the next step feeds, every row's new token as recorded)."""
        next_ids = sample_next(logits, run.sampling, run.generator)
        return next_ids, self._record(next_ids, run.result, run.finished, run.stop_check)

    def generate(self, *args: Any, **kwargs: Any) -> DecodeResult:
        """``stream`` run to the end; returns its DecodeResult."""
        return run_to_end(self.stream(*args, **kwargs))

    @torch.inference_mode()
    def forced_predictions(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, continuation: torch.Tensor,
                           schedule: ScheduleConfig, shared_prefix: int = 0) -> torch.Tensor:
        """Teacher forcing through the CACHED path: the (B, P) prompt, then the (B, N) given tokens
        fed one step at a time under ``schedule``. Returns the argmax (B, N): at the prompt's last
        position, then after each fed token but the last. Compares two weight sets (int4 vs float),
        or a batch against its rows alone, on the same inputs, whatever either would have generated.
        ``shared_prefix``: as ``prefill``'s."""
        steps = continuation.shape[1]
        state, logits = self.prefill(input_ids, attention_mask, schedule.prefill_layers(), input_ids.shape[1] + steps,
                                     shared_prefix=shared_prefix)
        predictions = [logits.argmax(-1)]
        for step in range(steps - 1):
            logits = self.decode_step(state, continuation[:, step].to(self.device), schedule.step_layers(step))
            predictions.append(logits.argmax(-1))
        return torch.stack(predictions, dim=1)

    def _record(
        self, next_ids: torch.Tensor, result: DecodeResult, finished: list[bool], stop_check: StopCheck | None
    ) -> list[int]:
        """Append each unfinished row's new token (not EOS: it ends the row unrecorded; a token
        that completes a stop string is recorded, then ends the row); finished rows feed padding."""
        ids = next_ids.tolist()  # the one host sync per step: EOS and streaming need the ids
        new_tokens = []
        for row, token in enumerate(ids):
            if finished[row]:
                new_tokens.append(self.pad_token_id)
                continue
            new_tokens.append(token)
            if token in self.eos_token_ids:
                finished[row], result.finish_reasons[row] = True, "eos"
                continue
            result.tokens[row].append(token)
            if stop_check is not None and stop_check(row, result.tokens[row]):
                finished[row], result.finish_reasons[row] = True, "stop"
        return new_tokens


def layer_runs(layers: Sequence[int], entries: frozenset[int], one_by_one: bool = False) -> list[list[int]]:
    """A step's layers cut into runs an adapter may run in one call: a new run at every entry layer
    (its bridge runs first), and one layer a run where each layer's output is recorded (the trace)."""
    runs: list[list[int]] = []
    for index in layers:
        if one_by_one or not runs or index in entries:
            runs.append([index])
        else:
            runs[-1].append(index)
    return runs


MIN_SHARED_PREFIX = 8  # fewer common tokens than this are not worth a prefill of their own


def shared_prefix_padded(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
                         ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``left_padded`` for rows that begin alike (a class's prompts share the chat template's system
    turn): (ids, mask, k), where the first k columns hold the tokens every row begins with, once per
    row and unpadded, and each row's rest follows them left padded (the padding sits between the
    prefix and the rest; positions and attention follow the mask). ``prefill(shared_prefix=k)`` then
    runs the prefix once for the whole batch. k is 0 (plain ``left_padded``) for one row, or where
    the rows share fewer than MIN_SHARED_PREFIX tokens; every row keeps at least one token of its own."""
    common = len(os.path.commonprefix([list(row) for row in rows])) if len(rows) > 1 else 0
    common = min(common, min(len(row) for row in rows) - 1)
    if common < MIN_SHARED_PREFIX:
        ids, mask = left_padded(rows, pad_id, device)
        return ids, mask, 0
    rest_ids, rest_mask = left_padded([row[common:] for row in rows], pad_id)
    prefix = torch.tensor(list(rows[0][:common]), dtype=torch.long).expand(len(rows), -1)
    ids = torch.cat([prefix, rest_ids], dim=1)
    mask = torch.cat([torch.ones_like(prefix), rest_mask], dim=1)
    return ids.to(device), mask.to(device), common


def left_padded(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as the decoder takes them: ids and mask (B, P), padded on the LEFT so that
    every row's next token lands in the same column."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
        mask[index, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def run_to_end(events: Generator[Any, Any, Any]) -> Any:
    """Drain a step generator and return its return value (the result object)."""
    while True:
        try:
            next(events)
        except StopIteration as stop:
            return stop.value


def _make_generator(sampling: SamplingConfig, device: torch.device
                    ) -> torch.Generator | list[tuple[int, torch.Generator]] | None:
    if sampling.greedy:
        return None
    if sampling.row_seeds:
        return [(rows, _seeded(seed, device)) for rows, seed in sampling.row_seeds]
    return _seeded(sampling.seed, device)


def _seeded(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(int(seed))
    else:
        generator.seed()
    return generator


def sample_next(logits: torch.Tensor, sampling: SamplingConfig,
                generator: torch.Generator | list[tuple[int, torch.Generator]] | None) -> torch.Tensor:
    """(B, V) logits -> (B,) next token ids: argmax, or temperature / top-k / top-p sampling (a list of
    (rows, generator): each group of rows, in order, drawn from its own generator)."""
    if sampling.greedy:
        return greedy_ids(logits)
    if isinstance(generator, list):
        groups, start = [], 0
        for rows, own in generator:
            groups.append(sample_next(logits[start:start + rows], sampling, own))
            start += rows
        return torch.cat(groups)
    scores = logits.float() / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - sorted_scores.softmax(dim=-1) >= sampling.top_p  # keeps the top token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


# --- the teacher-forced twin ------------------------------------------------------------------


def execution_mask(schedule: ScheduleConfig, prompt_length: int, total_length: int) -> torch.Tensor:
    """(T, L) bool: which layers each position of a left-padded sequence executes.

    Positions < prompt_length are prompt (prefill layers); position prompt_length + k holds
    generated token k, fed at decode step k (step_layers(k)).
    """
    mask = torch.zeros(total_length, schedule.num_layers, dtype=torch.bool)
    mask[:prompt_length, list(schedule.prefill_layers())] = True
    for step in range(total_length - prompt_length):
        mask[prompt_length + step, list(schedule.step_layers(step))] = True
    return mask


def masked_forward(
    model_or_adapter: nn.Module | ArchitectureAdapter,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    executes: torch.Tensor,
    *,
    logits_from: int = 0,
    bridge: EntryBridge | None = None,
    hidden_states: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Teacher-forced SkipDecode: h = where(executes[pos, i], layer_i(h), h) for every layer.

    With ``bridge``, a position entering layer j after bypassing layer j - 1 gets
    h = bridge(j, h) first (as the decoder does). The gated LoRA of a skip-policy model is
    switched by the caller (skip_policy.gated). ``hidden_states``, when given, receives the
    hidden state entering every layer (L tensors (B, T, C)) and then the final one (pre-norm).

    input_ids/attention_mask: (B, T). executes: (T, L) shared by the batch, or (B, T, L).
    Returns logits (B, T - logits_from, V) for positions >= ``logits_from`` (the LM head is a
    big share of a small model's compute; training needs only the generated positions).
    Because the positions that execute a layer form a causal prefix, these equal the cached
    decoder's logits (tests/model/skipdecode/test_decoder.py proves it). Differentiable: training runs through
    this. When a layer's executing positions are a prefix shared by the batch, the layer runs
    on that prefix only (same result, less compute: causal attention never looks ahead).
    """
    adapter = model_or_adapter if isinstance(model_or_adapter, ArchitectureAdapter) else adapter_for(model_or_adapter)
    executes = executes.to(input_ids.device)
    positions = position_ids_from_mask(attention_mask)
    hidden = adapter.embed(input_ids, positions)  # (B, T, C)
    inputs = adapter.layer_inputs(hidden, attention_mask.bool(), positions)
    for index in range(adapter.num_layers):
        keep = executes[..., index]  # (T,) or (B, T)
        if bridge is not None and index >= 1:
            entering = keep & ~executes[..., index - 1]
            if bool(entering.any()):
                entering = entering if entering.ndim == 2 else entering[None]
                hidden = torch.where(entering[..., None], bridge(index, hidden), hidden)
        if hidden_states is not None:
            hidden_states.append(hidden)
        prefix = _prefix_length(keep) if keep.ndim == 1 else None
        if prefix == 0:
            continue  # nobody runs this layer
        if prefix is not None:
            out = adapter.run_layer(index, hidden[:, :prefix], inputs.prefix(prefix), None)
            hidden = out if prefix == hidden.shape[1] else torch.cat([out, hidden[:, prefix:]], dim=1)
        else:
            keep = keep if keep.ndim == 2 else keep[None]
            out = adapter.run_layer(index, hidden, inputs, None)
            hidden = torch.where(keep[..., None], out, hidden)
    if hidden_states is not None:
        hidden_states.append(hidden)
    return adapter.logits(hidden[:, logits_from:])


@torch.no_grad()
def prompt_prefill(model_or_adapter: nn.Module | ArchitectureAdapter, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, prompt_length: int) -> tuple[PromptKVCache, torch.Tensor]:
    """The prompt ``input_ids[:, :prompt_length]`` at full depth, without gradients: (a KV cache holding
    its keys and values in every layer, with room for the rest of the sequence; the logits of its last
    position (B, 1, V), which predict the first generated token)."""
    adapter = model_or_adapter if isinstance(model_or_adapter, ArchitectureAdapter) else adapter_for(model_or_adapter)
    ids, mask = input_ids[:, :prompt_length], attention_mask[:, :prompt_length]
    positions = position_ids_from_mask(mask)
    hidden = adapter.embed(ids, positions)  # (B, P, C)
    inputs = adapter.layer_inputs(hidden, mask.bool(), positions)
    cache = PrefixKVCache(adapter.num_layers, prompt_length)
    for index in range(adapter.num_layers):
        hidden = adapter.run_layer(index, hidden, inputs, cache)
    return PromptKVCache.of(cache), adapter.logits(hidden[:, -1:])


def masked_forward_after_prompt(
    model_or_adapter: nn.Module | ArchitectureAdapter,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    executes: torch.Tensor,
    cache: PromptKVCache,
    *,
    prompt_length: int,
    bridge: EntryBridge | None = None,
) -> torch.Tensor:
    """``masked_forward``'s generated positions alone, after ``prompt_prefill`` cached the prompt: logits
    (B, T - prompt_length, V) of positions prompt_length .. T - 1, each layer run only on the generated
    positions that execute it (a causal prefix of them), attending to the cached prompt and to each other.

    Equal to masked_forward's logits there when the prompt runs every layer; training calls it so that
    a ~330-token prompt, which no trainable part touches (a gated LoRA acts only where a position
    bypasses layers), runs once without gradients instead of forward and backward at every step.
    executes: (T, L) shared by the batch; its first prompt_length rows are not read."""
    adapter = model_or_adapter if isinstance(model_or_adapter, ArchitectureAdapter) else adapter_for(model_or_adapter)
    executes = executes[prompt_length:].to(input_ids.device)  # (N, L)
    positions = position_ids_from_mask(attention_mask)[:, prompt_length:]  # (B, N)
    hidden = adapter.embed(input_ids[:, prompt_length:], positions)  # (B, N, C)
    key_valid = attention_mask.bool()
    inputs_for: dict[int, LayerInputs] = {}  # by the number of generated positions a layer runs
    for index in range(adapter.num_layers):
        keep = executes[:, index]
        if bridge is not None and index >= 1:
            entering = keep & ~executes[:, index - 1]
            if bool(entering.any()):
                hidden = torch.where(entering[None, :, None], bridge(index, hidden), hidden)
        count = _prefix_length(keep)
        if count is None:
            raise ValueError("masked_forward_after_prompt: a layer's generated positions must be a causal prefix")
        if count == 0:
            continue
        if count not in inputs_for:
            inputs_for[count] = adapter.layer_inputs(hidden[:, :count], key_valid[:, :prompt_length + count],
                                                     positions[:, :count], after_cache=True)
        out = adapter.run_layer(index, hidden[:, :count], inputs_for[count], cache)
        hidden = out if count == hidden.shape[1] else torch.cat([out, hidden[:, count:]], dim=1)
    return adapter.logits(hidden)


def _prefix_length(keep: torch.Tensor) -> int | None:
    """n if keep == [True] * n + [False] * (T - n), else None. keep: (T,) bool."""
    count = int(keep.sum())
    return count if bool(keep[:count].all()) else None
