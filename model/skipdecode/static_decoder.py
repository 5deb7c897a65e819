"""SkipDecode with a static KV cache: every decode step has FIXED shapes per (layer set, batch size),
so one CUDA graph per layer set can replay a whole run (docs/DESIGN.md, "The static KV cache and
one CUDA graph per layer set").

    StepBuffers         the run's static KV cache plus the step's inputs (tokens, positions, the
                        valid columns), preallocated at the run's capacity: what a graph reads
    static_step         one decode step over those buffers: embed, the layer set (bridges at the
                        entries, the skip policy's merged weights when it skips), the LM head
    EagerStep           runs static_step as it is (any device; the CPU tests' reference for graphs)
    StaticSkipDecoder   SkipDecoder with the prefill filling StepBuffers and decode_step running
                        static_step through a step runner (EagerStep, or the CUDA graphs of
                        model/skipdecode/cuda_graphs.py)

The prefill is the eager decoder's own (its shapes change with the prompt); only decode steps are
static. Shapes: B = batch, K = capacity (the run's key columns), V = vocab.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Protocol, Sequence, cast

import torch
from torch import nn

from model.skipdecode.decoder import DecodeState, SkipDecoder, Trace
from model.skipdecode.kv_cache import PrefixKVCache, StaticKVCache
from model.skipdecode.schedule import ScheduleConfig
from model.skipdecode.skip_policy import EntryBridge


class StepBuffers(StaticKVCache):
    """A static KV cache with the decode step's inputs beside it, all of fixed shape for one
    (batch, capacity): ``token_ids`` (B,), ``positions`` (B, 1) (each row's position id, padding
    not counted), ``key_valid`` (B, K) bool (False at left padding) and ``columns`` (K,) 0..K-1.
    A captured graph holds these addresses, so a step copies its values IN, never rebinds them.

    ``batch`` is the buffers' rows, ``rows`` the run's: a run of 5 rows in buffers of a batch
    bucket of 8 (model/skipdecode/cuda_graphs.py) fills rows 0..4; the prefill and the host see
    those alone (``update``, ``layer``, ``copy``), a step computes all 8 (the padding rows attend
    to what their columns hold, always finite) and the decoder keeps the first 5 rows' logits."""

    def __init__(self, num_layers: int, batch: int, capacity: int, device: torch.device | str) -> None:
        super().__init__(num_layers, capacity, device)
        self.batch = batch
        self.rows = batch
        self.token_ids = torch.zeros(batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.key_valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.columns = torch.arange(capacity, device=device)
        self._owner: weakref.ref | None = None  # the DecodeState of the run using these buffers

    def hold_rows(self, rows: int) -> None:
        """This run's first ``rows`` rows; the rest are padding (their inputs zero, every column valid)."""
        if not 1 <= rows <= self.batch:
            raise ValueError(f"{rows} rows do not fit buffers of {self.batch}")
        self.rows = rows
        self.token_ids[rows:] = 0
        self.positions[rows:] = 0
        self.key_valid[rows:] = True

    @property
    def padded(self) -> bool:
        return self.rows < self.batch

    @property
    def writes_in_place(self) -> bool:
        # the native step reserves its slot for the rows it is given: padded buffers hold more
        return self.static_writes or self.padded

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.static_writes or not self.padded:
            return super().update(key_states, value_states, layer_idx)
        # the prefill of a padded run: its rows' columns, its rows' views
        count = key_states.shape[2]
        keys, values, start = self._reserve(layer_idx, self.batch, key_states.shape[1], key_states.shape[3],
                                            key_states, count)
        end = start + count
        keys[: self.rows, :, start:end] = key_states
        values[: self.rows, :, start:end] = value_states
        return keys[: self.rows, :, :end], values[: self.rows, :, :end]

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().layer(layer_idx)
        return keys[: self.rows], values[: self.rows]

    def copy(self, rows: list[int] | None = None) -> PrefixKVCache:
        return super().copy(list(range(self.rows)) if rows is None and self.padded else rows)

    def claim(self, state: DecodeState) -> None:
        """Hold these buffers for ``state``'s run; they are free again once that state is gone."""
        self._owner = weakref.ref(state)

    @property
    def free(self) -> bool:
        return self._owner is None or self._owner() is None


def static_step(decoder: SkipDecoder, buffers: StepBuffers, layers: Sequence[int]) -> torch.Tensor:
    """One decode step over ``buffers`` (their inputs already copied in, ``buffers.position`` the
    column every running layer writes): the next-token logits (B, V). Every op reads device
    tensors only, so a CUDA graph captures it; the layers, the weights (original at full depth,
    the skip policy's merged copy when skipping) and the bridge's entries are fixed by ``layers``."""
    adapter = decoder.adapter
    positions = buffers.positions  # (B, 1)
    hidden = adapter.embed(buffers.token_ids[:, None], positions)  # (B, 1, C)
    allowed = buffers.key_valid & (buffers.columns <= buffers.position)  # (B, K): the prefix and the new column
    inputs = adapter.static_step_inputs(hidden, allowed, positions)
    weights, entries = decoder._weights_for(layers)
    buffers.static_writes = True
    try:
        for index in layers:
            if index in entries:  # entries only where there is a bridge
                hidden = cast(EntryBridge, decoder.bridge)(index, hidden)
            hidden = weights.run_layer(index, hidden, inputs, buffers)
    finally:
        buffers.static_writes = False
    return adapter.logits(hidden)[:, -1]


class StepRunner(Protocol):
    """How a StaticSkipDecoder gets its buffers and runs a step (eagerly, or by graph replay)."""

    def capacity_for(self, capacity: int, max_context: int) -> int: ...

    def lease(self, decoder: SkipDecoder, batch: int, capacity: int, device: torch.device) -> StepBuffers: ...

    def run(self, decoder: SkipDecoder, buffers: StepBuffers, layers: tuple[int, ...]) -> torch.Tensor: ...


# The batch buckets of the graphs: a batch runs in buffers of the smallest bucket that holds it, so a
# class's batches of 1..64 rows meet seven shapes (graphs, compiled layers), not 64.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def batch_bucket(batch: int, buckets: Sequence[int] | None = BATCH_BUCKETS) -> int:
    """The smallest of ``buckets`` that holds ``batch`` rows (``batch`` itself past the largest, or
    where there are no buckets)."""
    return min((bucket for bucket in buckets or () if bucket >= batch), default=batch)


class EagerStep:
    """static_step as it is (or ``step``: a compiled form of it), on any device: fresh buffers per run at
    the run's exact capacity, their batch the run's or (``batch_buckets``) its bucket."""

    def __init__(self, step: Callable[..., torch.Tensor] = static_step,
                 batch_buckets: Sequence[int] | None = None) -> None:
        self.step = step
        self.batch_buckets = batch_buckets

    def capacity_for(self, capacity: int, max_context: int) -> int:
        return capacity

    def lease(self, decoder: SkipDecoder, batch: int, capacity: int, device: torch.device) -> StepBuffers:
        buffers = StepBuffers(decoder.num_layers, batch_bucket(batch, self.batch_buckets), capacity, device)
        buffers.hold_rows(batch)
        return buffers

    def run(self, decoder: SkipDecoder, buffers: StepBuffers, layers: tuple[int, ...]) -> torch.Tensor:
        return self.step(decoder, buffers, layers)


class StaticSkipDecoder(SkipDecoder):
    """SkipDecoder whose decode steps run ``static_step`` over preallocated buffers: the same
    tokens as the eager decoder (tests/model/skipdecode/test_static_decoder.py), with shapes fixed
    per (layer set, batch) for a step runner that replays CUDA graphs. A step that records the
    logit lens's trace runs the eager decoder's step on the same buffers (one layer at a time)."""

    def __init__(self, model: nn.Module, *, runner: StepRunner | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.runner: StepRunner = runner if runner is not None else EagerStep()

    def _new_cache(self, batch: int, capacity: int, device: torch.device) -> PrefixKVCache:
        return self.runner.lease(self, batch, capacity, device)

    @torch.inference_mode()
    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: Sequence[int], capacity: int,
        should_cancel: Any = None, trace: Trace | None = None, shared_prefix: int = 0,
    ) -> tuple[DecodeState, torch.Tensor]:
        """The eager prefill into the runner's buffers (capacity as the runner rounds it); the
        state's ``key_valid`` becomes the buffers' own, so the step reads it in place."""
        capacity = self.runner.capacity_for(capacity, self.adapter.max_context)
        state, logits = super().prefill(input_ids, attention_mask, layers, capacity, should_cancel, trace, shared_prefix)
        buffers = cast(StepBuffers, state.cache)
        rows = buffers.rows
        buffers.key_valid[:rows].copy_(state.key_valid)
        state.key_valid = buffers.key_valid[:rows]  # a view: the step reads it in place
        buffers.claim(state)
        return state, logits

    @torch.inference_mode()
    def decode_step(self, state: DecodeState, token_ids: torch.Tensor, layers: Sequence[int],
                    trace: Trace | None = None) -> torch.Tensor:
        """Feed one token per row (B,) through ``layers``: copy the step's inputs into the buffers,
        run the step (its one host-visible value, the write column, is a fill, not a sync), then
        advance the host's bookkeeping. Returns next-token logits (B, V)."""
        if trace is not None:
            return super().decode_step(state, token_ids, layers, trace)
        buffers = cast(StepBuffers, state.cache)
        if state.length >= buffers.capacity:
            raise RuntimeError(f"KV cache capacity {buffers.capacity} exceeded")
        stale = [index for index in layers if buffers.lengths[index] != state.length]
        if stale:  # a layer that runs must have run at every earlier position (docs/DESIGN.md)
            raise RuntimeError(f"layers {stale} did not run at every earlier step: the layer sets are not nested")
        rows = buffers.rows
        buffers.token_ids[:rows].copy_(token_ids)
        buffers.positions[:rows].copy_(state.next_position[:, None])
        buffers.position.fill_(state.length)
        logits = self.runner.run(self, buffers, tuple(layers))
        if buffers.padded:  # the padding rows are never shown
            logits = logits[:rows]
        for index in layers:
            buffers.lengths[index] += 1
        state.next_position += 1
        state.length += 1
        return logits


def static_decoder(decoder: SkipDecoder, runner: StepRunner | None = None) -> StaticSkipDecoder:
    """``decoder``'s models, skip policy, bridge and token ids behind the static step."""
    static = StaticSkipDecoder(decoder.model, runner=runner, bridge=decoder.bridge,
                               eos_token_ids=decoder.eos_token_ids, pad_token_id=decoder.pad_token_id)
    static.skip_adapter = decoder.skip_adapter
    return static


def layer_sets_needed(schedule: ScheduleConfig, max_new_tokens: int) -> list[tuple[int, ...]]:
    """The distinct layer sets a run's decode steps execute, in order of first use: what a graph
    runner captures. n_k only falls, so there are at most max_layers - min_layers + 1."""
    seen: dict[tuple[int, ...], None] = {}
    for step in range(max_new_tokens - 1):
        seen.setdefault(tuple(schedule.step_layers(step)), None)
    return list(seen)
