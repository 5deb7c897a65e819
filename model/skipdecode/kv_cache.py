"""The KV caches and what attention reads besides the weights: the masks, the positions, and the
inputs every layer of one step shares.

SkipDecode's caches are per layer and of DIFFERENT lengths (a bypassed layer writes nothing), so
they live here, named for what they are, rather than inside transformers' DynamicCache; the masks
and positions are built from the decoder's own record of valid keys, never from a cache length.

Shapes: B = batch, H = heads, T = new positions this call, K = key positions, C = hidden size,
D = head size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch

from model.common.huge_pages import HugePageArena


class PrefixKVCache:
    """A preallocated KV cache whose layers may hold DIFFERENT lengths.

    SkipDecode bypasses some layers at some steps, so layer i holds keys for a prefix of the
    sequence whose length is its own (docs/DESIGN.md, "The method"). Buffers are allocated once at full
    capacity (B, H, capacity, D) on first use, so a step writes in place instead of
    re-allocating with torch.cat as transformers' DynamicCache does. Duck-types the one
    method the attention modules call: ``update(keys, values, layer_idx)``.
    """

    def __init__(self, num_layers: int, capacity: int) -> None:
        self.capacity = capacity
        self.lengths = [0] * num_layers
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers
        # A CPU cache's buffers on huge pages where the OS gives them: a batch's decode step reads every
        # row's whole prefix in every layer (model/common/huge_pages.py: TLB misses in a virtual machine).
        # Chunks of 64 MiB keep a large batch's buffers (~10 MB a layer at batch 64) packed: a buffer in
        # its own region would leave up to a huge page resident past its end. Untouched pages cost nothing.
        self._arena = HugePageArena(chunk_bytes=64 << 20)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states: (B, H_kv, T, D)
        batch, heads, count, head_dim = key_states.shape
        keys, values, start = self._reserve(layer_idx, batch, heads, head_dim, key_states, count)
        end = start + count
        keys[:, :, start:end] = key_states
        values[:, :, start:end] = value_states
        return keys[:, :, :end], values[:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx]

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_idx``'s keys and values so far: (B, H, length, D) views."""
        keys, values, length = self._keys[layer_idx], self._values[layer_idx], self.lengths[layer_idx]
        if keys is None or values is None:
            raise RuntimeError(f"KV cache: layer {layer_idx} holds nothing")
        return keys[:, :, :length], values[:, :, :length]

    def copy(self, rows: list[int] | None = None) -> "PrefixKVCache":
        """A cache holding the same positions (of ``rows`` only, in that order, where given) in buffers of
        its own (two streams continuing one prefill; the full model judging a few rows of a batch)."""
        twin = PrefixKVCache(len(self.lengths), self.capacity)
        for layer, (keys, values) in enumerate(zip(self._keys, self._values)):
            if keys is None or values is None:
                continue
            length = self.lengths[layer]
            kept_keys, kept_values = keys[:, :, :length], values[:, :, :length]
            if rows is not None:
                index = torch.tensor(rows, dtype=torch.long, device=keys.device)
                kept_keys, kept_values = kept_keys.index_select(0, index), kept_values.index_select(0, index)
            shape = (kept_keys.shape[0], *keys.shape[1:])
            new_keys, new_values = twin._buffer(shape, keys), twin._buffer(shape, values)
            new_keys[:, :, :length] = kept_keys
            new_values[:, :, :length] = kept_values
            twin._keys[layer], twin._values[layer] = new_keys, new_values
        twin.lengths = list(self.lengths)
        return twin

    def of_rows(self, rows: range, batch: int) -> "PrefixKVCache":
        """Rows ``rows`` of this cache of ``batch`` rows as a cache of their own, its writes landing in this
        cache's buffers (a batch's prompts read part by part, ``SkipDecoder.prefill``). It starts at this
        cache's lengths; this cache's own lengths are the caller's to advance once every part is written."""
        if type(self) is not PrefixKVCache:
            raise ValueError("only a plain cache is read part by part")
        return _RowsOf(self, rows, batch)

    def next_slot(self, layer_idx: int, batch: int, heads: int, head_dim: int,
                  like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(keys, values, start) for ONE new position that the caller writes at ``start`` itself
        (the native decode step, model/lowbit/native_step.py), the layer's length advanced by one."""
        return self._reserve(layer_idx, batch, heads, head_dim, like, 1)

    def _reserve(self, layer_idx: int, batch: int, heads: int, head_dim: int, like: torch.Tensor,
                 count: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The layer's full-capacity buffers (allocated like ``like`` on first use) and the start of
        ``count`` new positions, the layer's length advanced past them."""
        self._allocate(layer_idx, batch, heads, head_dim, like)
        start = self.lengths[layer_idx]
        if start + count > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded at layer {layer_idx}")
        self.lengths[layer_idx] = start + count
        return self._keys[layer_idx], self._values[layer_idx], start

    def _allocate(self, layer_idx: int, batch: int, heads: int, head_dim: int, like: torch.Tensor) -> None:
        if self._keys[layer_idx] is None:
            shape = (batch, heads, self.capacity, head_dim)
            self._keys[layer_idx], self._values[layer_idx] = self._buffer(shape, like), self._buffer(shape, like)

    def _buffer(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        placed = self._arena.empty(shape, like.dtype) if like.device.type == "cpu" else None
        return placed if placed is not None else like.new_empty(shape)

    @property
    def writes_in_place(self) -> bool:
        """True while a static decode step writes (StaticKVCache): the native step, which reserves
        its slot by a host length, must step aside."""
        return False


class _RowsOf(PrefixKVCache):
    """Some rows of a batch's cache (``PrefixKVCache.of_rows``): a layer's buffers are views of the batch's."""

    def __init__(self, batch_cache: PrefixKVCache, rows: range, batch: int) -> None:
        super().__init__(len(batch_cache.lengths), batch_cache.capacity)
        self.batch_cache, self.row_range, self.batch = batch_cache, rows, batch
        self.lengths = list(batch_cache.lengths)

    def _allocate(self, layer_idx: int, batch: int, heads: int, head_dim: int, like: torch.Tensor) -> None:
        if self._keys[layer_idx] is None:
            self.batch_cache._allocate(layer_idx, self.batch, heads, head_dim, like)
            keys, values = self.batch_cache._keys[layer_idx], self.batch_cache._values[layer_idx]
            rows = slice(self.row_range.start, self.row_range.stop)
            self._keys[layer_idx], self._values[layer_idx] = cast(torch.Tensor, keys)[rows], cast(torch.Tensor, values)[rows]


class PromptKVCache:
    """A prompt's keys and values in every layer (fixed, no gradients), and the one chunk of new positions
    each layer adds in a teacher-forced pass after it: ``update`` returns the prompt's keys followed by the
    chunk's, by concatenation, so the chunk's keys keep their gradients (a preallocated buffer written in
    place cannot: it was made without them). Stores nothing: every layer takes one chunk per pass.
    Duck-types what the attention modules call (``update``, ``get_seq_length``)."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.layers = layers  # per layer: (B, H_kv, P, D) keys and values

    @classmethod
    def of(cls, cache: PrefixKVCache) -> "PromptKVCache":
        return cls([cache.layer(index) for index in range(len(cache.lengths))])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.layers[layer_idx]
        return torch.cat([keys, key_states], dim=2), torch.cat([values, value_states], dim=2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx][0].shape[2]

    @property
    def writes_in_place(self) -> bool:
        return False


LayerCache = PrefixKVCache | PromptKVCache  # what a layer call appends its keys and values to


class StaticKVCache(PrefixKVCache):
    """A PrefixKVCache whose decode steps have FIXED shapes (docs/DESIGN.md, "The static KV cache").

    Every layer that runs at step k has run at every earlier position (the prefix property), so
    all of a step's layers write the same column, the sequence's length. While ``static_writes``
    is on, ``update`` writes that ONE column at ``position`` (a (1,) long tensor on the device, set
    before the step) with ``index_copy_`` and returns the layer's whole (B, H, capacity, D)
    buffers; the step's mask hides the columns not yet written. No host value enters the ops, so
    a CUDA graph captured once replays every later step of the same layer set. Buffers start as
    zeros (a masked column must be finite: 0 x NaN would leak into attention). The prefill writes
    as PrefixKVCache does; the host ``lengths`` are the decoder's bookkeeping in static steps.
    """

    def __init__(self, num_layers: int, capacity: int, device: torch.device | str) -> None:
        super().__init__(num_layers, capacity)
        self.position = torch.zeros(1, dtype=torch.long, device=device)  # the column a static step writes
        self.static_writes = False

    @property
    def writes_in_place(self) -> bool:
        return self.static_writes

    def reset(self) -> None:
        """Empty for a new run; the buffers stay (a captured graph holds their addresses)."""
        self.lengths = [0] * len(self.lengths)
        self.static_writes = False

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values) if t is not None)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.static_writes:
            return super().update(key_states, value_states, layer_idx)
        keys, values = self._keys[layer_idx], self._values[layer_idx]
        if keys is None or values is None:  # the prefix property: a decode layer ran in the prefill
            raise RuntimeError(f"static KV cache: layer {layer_idx} decodes but never ran in the prefill")
        keys.index_copy_(2, self.position, key_states)  # key_states: (B, H_kv, 1, D)
        values.index_copy_(2, self.position, value_states)
        return keys, values

    def _reserve(self, layer_idx: int, batch: int, heads: int, head_dim: int, like: torch.Tensor,
                 count: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        if self._keys[layer_idx] is None:
            shape = (batch, heads, self.capacity, head_dim)
            self._keys[layer_idx], self._values[layer_idx] = like.new_zeros(shape), like.new_zeros(shape)
        return super()._reserve(layer_idx, batch, heads, head_dim, like, count)


def attention_mask(
    key_valid: torch.Tensor, num_queries: int, dtype: torch.dtype | None = None, *, always: bool = False
) -> torch.Tensor | None:
    """4D mask (B, 1, Q, K) for queries that are the LAST Q of K key positions.

    key_valid: (B, K) bool, False at left padding. Returns None when nothing is padded (unless
    ``always``), which lets SDPA use its fused causal path. A bool mask (True = attend) suits SDPA; pass ``dtype``
    for an additive float mask (eager attention). Every query may attend to itself, so a
    padding query never has an all-masked row (that would put NaN into the cache).
    """
    if not always and bool(key_valid.all()):
        return None
    num_keys = key_valid.shape[1]
    query_pos = torch.arange(num_keys - num_queries, num_keys, device=key_valid.device)[:, None]  # (Q, 1)
    key_pos = torch.arange(num_keys, device=key_valid.device)[None, :]  # (1, K)
    allowed = (key_pos <= query_pos) & key_valid[:, None, :]  # (B, Q, K)
    allowed = allowed | (key_pos == query_pos)
    allowed = allowed[:, None]  # (B, 1, Q, K)
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Explicit positions (B, T) from a left-padded 0/1 mask: real tokens count from 0.

    Never derive positions from a cache length: bypassed layers have shorter caches.
    """
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class LayerInputs:
    """What every layer call of one forward shares (computed once per step, not per layer)."""

    mask: torch.Tensor | None
    position_ids: torch.Tensor  # (B, T)
    extra: dict[str, Any]

    def prefix(self, length: int) -> "LayerInputs":
        """The inputs of the first ``length`` positions (a causal prefix needs nothing later)."""
        mask = None if self.mask is None else self.mask[:, :, :length, :length]
        return LayerInputs(mask=mask, position_ids=self.position_ids[:, :length], extra=_slice_time(self.extra, length))


def _slice_time(value: Any, length: int) -> Any:
    """Cut every (B, T, ...) tensor in a nested structure to its first ``length`` positions."""
    if isinstance(value, torch.Tensor):
        return value[:, :length]
    if isinstance(value, (tuple, list)):
        return type(value)(_slice_time(v, length) for v in value)
    if isinstance(value, dict):
        return {k: _slice_time(v, length) for k, v in value.items()}
    return value
