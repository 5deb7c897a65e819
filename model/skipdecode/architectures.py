"""The ONE module that touches transformers internals.

Each supported family gets a small adapter that exposes the pieces SkipDecode needs:
embed tokens at explicit positions, run decoder layer i (with or without the KV cache),
final norm + LM head, and parameter counts for the cost model. Everything else in model/
talks to these adapters, never to `model.model.layers` & co. transformers is pinned in
requirements.txt because these internals move between releases.

Shapes: B = batch, T = new positions this call, K = key positions, C = hidden size, V = vocab.
"""

from __future__ import annotations

import sys
import threading
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from model.common.huge_pages import HugePageArena
from model.skipdecode.schedule import CostModel

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_MODEL_TYPES = LLAMA_FAMILY + ("opt", "gpt2")


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

    def next_slot(self, layer_idx: int, batch: int, heads: int, head_dim: int,
                  like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(keys, values, start) for ONE new position that the caller writes at ``start`` itself
        (the native decode step, model/lowbit/native_step.py), the layer's length advanced by one."""
        return self._reserve(layer_idx, batch, heads, head_dim, like, 1)

    def _reserve(self, layer_idx: int, batch: int, heads: int, head_dim: int, like: torch.Tensor,
                 count: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The layer's full-capacity buffers (allocated like ``like`` on first use) and the start of
        ``count`` new positions, the layer's length advanced past them."""
        if self._keys[layer_idx] is None:
            shape = (batch, heads, self.capacity, head_dim)
            self._keys[layer_idx], self._values[layer_idx] = self._buffer(shape, like), self._buffer(shape, like)
        start = self.lengths[layer_idx]
        if start + count > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded at layer {layer_idx}")
        self.lengths[layer_idx] = start + count
        return self._keys[layer_idx], self._values[layer_idx], start

    def _buffer(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        placed = self._arena.empty(shape, like.dtype) if like.device.type == "cpu" else None
        return placed if placed is not None else like.new_empty(shape)

    @property
    def writes_in_place(self) -> bool:
        """True while a static decode step writes (StaticKVCache): the native step, which reserves
        its slot by a host length, must step aside."""
        return False


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


class ArchitectureAdapter(ABC):
    """Base class: one subclass per architecture family."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.config = model.config

    # --- structure -------------------------------------------------------------------------
    @property
    @abstractmethod
    def layers(self) -> nn.ModuleList: ...

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def max_context(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 2048) or 2048)

    @property
    def hidden_size(self) -> int:
        """The residual stream's width (GPT-2's config maps hidden_size to n_embd)."""
        return int(self.config.hidden_size)

    # --- compute ---------------------------------------------------------------------------
    @abstractmethod
    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, C) hidden states entering layer 0."""

    def layer_extras(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
        """Per-step inputs shared by all layers (rotary cos/sin for the Llama family)."""
        return {}

    @abstractmethod
    def run_layer(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: PrefixKVCache | None) -> torch.Tensor:
        """Decoder layer ``index`` on (B, T, C); appends its keys/values to ``cache`` when given."""

    def run_layers(self, indices: list[int], hidden: torch.Tensor, inputs_for: Callable[[int], LayerInputs],
                   cache: PrefixKVCache, key_valid: torch.Tensor | None, extra: dict[str, Any]) -> torch.Tensor:
        """A decode step's layers ``indices`` in order (a run with no bridge between them): one
        ``run_layer`` each, with ``inputs_for(index)`` taken just before that layer runs. A family
        may run them in fewer calls; ``key_valid`` is the decoder's (B, capacity) bool of the
        positions a row may attend to, None where nothing is padded (what ``inputs_for``'s masks
        say), and ``extra`` the step's ``layer_extras`` (every ``inputs_for`` carries the same), so
        that a call which reads the rows' validity from ``key_valid`` builds no mask."""
        for index in indices:
            hidden = self.run_layer(index, hidden, inputs_for(index), cache)
        return hidden

    @abstractmethod
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm (and output projection where the family has one)."""

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, C) last-layer hidden -> (B, T, V) logits."""
        return self.lm_head(self.final_norm(hidden))

    def layer_inputs(self, hidden: torch.Tensor, key_valid: torch.Tensor, position_ids: torch.Tensor,
                     after_cache: bool = False) -> LayerInputs:
        return LayerInputs(mask=self.layer_mask(hidden, key_valid, after_cache), position_ids=position_ids,
                           extra=self.layer_extras(hidden, position_ids))

    def layer_mask(self, hidden: torch.Tensor, key_valid: torch.Tensor, after_cache: bool = False
                   ) -> torch.Tensor | None:
        """The layers' attention mask for ``hidden``'s (B, T) queries, the last T of ``key_valid``'s keys.
        ``after_cache``: the keys begin with cached positions, so even an unpadded batch needs the mask
        (SDPA's own causal mask aligns the queries with the FIRST keys)."""
        # Eager attention applies no causal mask of its own, so it always needs ours for T > 1.
        eager = self.config._attn_implementation == "eager"
        num_queries = hidden.shape[1]
        return attention_mask(key_valid, num_queries, hidden.dtype if eager else None,
                              always=(eager or after_cache) and num_queries > 1)

    def static_step_inputs(self, hidden: torch.Tensor, allowed: torch.Tensor, position_ids: torch.Tensor
                           ) -> LayerInputs:
        """A static decode step's inputs: ``allowed`` (B, capacity) bool, the columns each row may
        attend to (its valid prompt and the steps so far), as a (B, 1, 1, capacity) mask — bool for
        SDPA, additive for eager attention — always given, since the unwritten columns must be hidden."""
        mask = allowed[:, None, None, :]
        if self.config._attn_implementation == "eager":
            mask = torch.zeros(mask.shape, dtype=hidden.dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(hidden.dtype).min)
        return LayerInputs(mask=mask, position_ids=position_ids, extra=self.layer_extras(hidden, position_ids))

    def prepare_layers(self) -> None:
        """Build whatever the layers' fast path needs now, not inside a visitor's first request
        (nothing for families without one)."""

    # --- cost model ------------------------------------------------------------------------
    def fixed_modules(self) -> list[nn.Module]:
        """Modules every step runs whatever its depth (besides the LM head)."""
        return []

    def cost_model(self) -> CostModel:
        """Parameter counts touched per token (the embedding is a lookup: C, not V * C)."""
        layer_cost = _weight_count(self.layers[0])
        head_cost = _weight_count(self.lm_head)
        fixed = sum(_weight_count(m) for m in self.fixed_modules())
        embed_cost = self.config.hidden_size
        return CostModel(layer_cost=float(layer_cost), fixed_cost=float(head_cost + fixed + embed_cost))


def _weight_count(module: nn.Module) -> int:
    """Weights a step touches: parameters, plus low-bit weights held as buffers and a LoRA's A and B
    kept beside them (model/lowbit/quantization.py)."""
    return (sum(p.numel() for p in module.parameters())
            + sum(int(getattr(m, "quantized_weight_count", 0)) + int(getattr(m, "side_weight_count", 0))
                  for m in module.modules()))


def mean_layer_weight_count(adapter: "ArchitectureAdapter") -> float:
    """The weights a step touches per decoder layer, averaged over the layers (a skip policy's LoRA
    may leave some layers out)."""
    return sum(_weight_count(layer) for layer in adapter.layers) / adapter.num_layers


class LlamaFamilyAdapter(ArchitectureAdapter):
    """Llama, SmolLM2, Mistral, Qwen2, Qwen3: pre-norm blocks, rotary embeddings at model level."""

    @property
    def _backbone(self) -> nn.Module:
        return self.model.model

    @property
    def layers(self) -> nn.ModuleList:
        return self._backbone.layers

    @property
    def max_context(self) -> int:
        window = getattr(self.config, "sliding_window", None)
        use_window = getattr(self.config, "use_sliding_window", window is not None)
        limit = super().max_context
        # Our masks are full-causal: stay inside the sliding window where a model has one.
        return min(limit, window) if window and use_window else limit

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self._backbone.embed_tokens(input_ids)

    def layer_extras(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
        return {"position_embeddings": self._backbone.rotary_emb(hidden, position_ids=position_ids)}

    def run_layer(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: PrefixKVCache | None) -> torch.Tensor:
        lean = LeanLlamaLayer.of(self.layers[index], self.config)
        if lean is not None:
            return lean(hidden, inputs, cache)
        return self.layers[index](
            hidden,
            attention_mask=inputs.mask,
            position_ids=inputs.position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=inputs.extra["position_embeddings"],
        )

    def run_layers(self, indices: list[int], hidden: torch.Tensor, inputs_for: Callable[[int], LayerInputs],
                   cache: PrefixKVCache, key_valid: torch.Tensor | None, extra: dict[str, Any]) -> torch.Tensor:
        """Several decode layers whose lean layers all take the native step run as one native call
        (the low-bit engine's ``native_run``: it reads ``key_valid``, so no mask is built; at batch 8
        with padding the mask had cost ~0.3 ms a step); anything else one by one."""
        if len(indices) > 1 and hidden.shape[1] == 1:
            layers = list(self.layers)  # (ModuleList's indexing checks and converts each index)
            leans = [lean for lean in [LeanLlamaLayer.of(layers[index], self.config) for index in indices]
                     if lean is not None]
            if len(leans) == len(indices):
                out = _low_bit_parts.native_run(leans, hidden, extra, cache, key_valid)
                if out is not None:
                    return out
        return super().run_layers(indices, hidden, inputs_for, cache, key_valid, extra)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return fused_rms_norm(self._backbone.norm)(hidden)  # torch's one call where it is the plain RMSNorm

    def prepare_layers(self) -> None:
        """The lean layers, built at load: fusing and stacking a low-bit model's projections
        (probes included) inside the first request cost the first visitor's SkipDecode ~2.5x its
        step time on int4 (the app's race read 0.42x 'faster' on a fresh start)."""
        for layer in self.layers:
            LeanLlamaLayer.of(layer, self.config)

    def fixed_modules(self) -> list[nn.Module]:
        return [self._backbone.norm]


@dataclass(frozen=True)
class LowBitParts:
    """What the lean layer asks of a low-bit engine: fuse q/k/v and gate/up into one call each, a
    LoRA beside int4 weights in its lean form, the native decode step, and which modules are the
    engine's own projections (called directly). The defaults are float weights' answers (nothing
    to fuse, nothing native); model/lowbit plugs in its own when it is imported (use_low_bit), so
    this package never imports the engine, and low-bit modules (which only the engine makes)
    always find it plugged in."""

    fuse: Callable[[list[nn.Module]], nn.Module | None] = lambda modules: None
    lean_lora: Callable[[nn.Module], nn.Module] = lambda module: module
    native: Callable[["LeanLlamaLayer", list[nn.Module | None]], Any] = lambda lean, projections: None
    projections: tuple[type[nn.Module], ...] = ()
    # a decode step's run of lean layers as one native call, or None (then one by one)
    native_run: Callable[[list["LeanLlamaLayer"], torch.Tensor, dict[str, Any], "PrefixKVCache", torch.Tensor | None],
                         torch.Tensor | None] = lambda leans, hidden, extra, cache, key_valid: None
    # (B, V) logits -> (B,) argmax ids as torch's, natively, or None (then torch's own)
    argmax: Callable[[torch.Tensor], torch.Tensor | None] = lambda logits: None


_low_bit_parts = LowBitParts()


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """(B, V) logits -> (B,) each row's argmax: the low-bit engine's native one where it takes these
    logits (a CPU's float32 rows: torch's took ~120 us a row of SmolLM2's vocabulary, 2-3% of a
    step), else torch's. The same ids either way (ties: the first; NaN: the first NaN)."""
    ids = _low_bit_parts.argmax(logits)
    return ids if ids is not None else logits.argmax(dim=-1)


def use_low_bit(parts: LowBitParts) -> None:
    """Plug a low-bit engine's parts into the lean layer (model/lowbit/__init__.py calls this)."""
    global _low_bit_parts
    _low_bit_parts = parts


class LeanLlamaLayer:
    """A Llama-family decoder layer computed from its own modules without transformers' layer
    code: the same math (pre-norm attention with rotary embeddings and GQA, SwiGLU MLP), fewer
    ops per call, and low-bit q/k/v and gate/up projections fused into one kernel call each
    (model/lowbit/quantization.py). Decoding a small model on a CPU is a few hundred small matmuls per
    token, so the per-op overhead of the module code is a large share of a step (measured in
    docs/RESULTS.md, "Speed"). The parity tests hold it to transformers' generate for every family.

    Built once per layer module (weakly keyed, shared by every decoder over the same weights);
    ``of`` returns None for a layer it does not know how to run (other activations, extra
    modules), which then runs transformers' own forward.
    """

    # layer -> (the modules it was built from, the lean layer or None). The value must not hold
    # the layer itself (a weak key its own value refers to is never freed); it holds the layer's
    # children, so a projection replaced later (quantising, restoring) rebuilds it.
    _built: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple[nn.Module, ...], LeanLlamaLayer | None]]" = (
        weakref.WeakKeyDictionary())
    _lock = threading.Lock()

    def __init__(self, layer: nn.Module, config: Any) -> None:
        parts = _low_bit_parts
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = fused_rms_norm(layer.input_layernorm), fused_rms_norm(layer.post_attention_layernorm)
        self.attn, self.mlp = attn, mlp
        # Read once: a replaced projection rebuilds this layer (``of`` checks the parts).
        self.o_proj, self.down_proj = attn.o_proj, mlp.down_proj
        self.layer_idx, self.scaling = attn.layer_idx, attn.scaling
        self.head_dim = attn.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        # Qwen3 has both norms, other families neither (Any: both are tested by q_norm alone)
        self.q_norm: Any = getattr(attn, "q_norm", None)
        self.k_norm: Any = getattr(attn, "k_norm", None)
        self.rotate: Callable = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        # The Llama-family rotary (x * cos + rotate_half(x) * sin over the whole head), which
        # rotate_together repeats for q and k at once; any other variant keeps the family's own.
        self.standard_rotary = type(attn).__module__.rsplit(".", 1)[-1] in STANDARD_ROTARY_MODULES
        # Built on the first call, often inside a request's inference_mode: the fused weights
        # must be ordinary tensors all the same (the originals become views of them).
        with torch.inference_mode(False), torch.no_grad():
            # Any: a fused module, then (direct_call) a plain call, or None; rotates_fused says which.
            self.qkv: Any = parts.fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            self.gate_up: Any = parts.fuse([mlp.gate_proj, mlp.up_proj])
            # A LoRA beside int4 weights: its A rides in the base's kernel call (quantization.py).
            self.o_proj, self.down_proj = parts.lean_lora(attn.o_proj), parts.lean_lora(mlp.down_proj)
        # One fused q/k/v output with the plain Llama rotary: q and k rotate together (and a
        # decode step takes _decode_one); otherwise the family's own per-projection path.
        self.rotates_fused = self.qkv is not None and self.q_norm is None and self.standard_rotary
        # That decode step as one C++ call where the four projections are low-bit (CPU, float32).
        self.native = (parts.native(self, [self.qkv, self.o_proj, self.gate_up, self.down_proj])
                       if self.rotates_fused else None)
        self.qkv, self.gate_up, self.o_proj, self.down_proj = (
            direct_call(m) for m in (self.qkv, self.gate_up, self.o_proj, self.down_proj))

    @classmethod
    def of(cls, layer: nn.Module, config: Any) -> "LeanLlamaLayer | None":
        """The lean layer of ``layer`` (built once, shared by every decoder on it), or None."""
        parts = _layer_parts(layer)
        entry = cls._built.get(layer)
        if entry is None or not _same(entry[0], parts):
            with cls._lock:  # concurrent first requests: build (and fuse) once
                entry = cls._built.get(layer)
                if entry is None or not _same(entry[0], parts):
                    entry = cls._built[layer] = (parts, cls(layer, config) if cls.fits(layer, config) else None)
        return entry[1]

    @staticmethod
    def fits(layer: nn.Module, config: Any) -> bool:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        expected = ("q_proj", "k_proj", "v_proj", "o_proj")
        return (attn is not None and mlp is not None and all(hasattr(attn, name) for name in expected)
                and all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj"))
                and getattr(config, "hidden_act", None) == "silu" and config._attn_implementation == "sdpa"
                and hasattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb")
                and getattr(config, "attn_logit_softcapping", None) is None)

    def __call__(self, hidden: torch.Tensor, inputs: LayerInputs, cache: PrefixKVCache | None) -> torch.Tensor:
        batch, length, _ = hidden.shape
        if length == 1 and cache is not None and self.rotates_fused:
            return self._decode_one(hidden, inputs, cache)
        attn = self.attn
        x = self.input_norm(hidden)
        cos, sin = inputs.extra["position_embeddings"]
        if self.rotates_fused:  # rotate q and k together (half the rotary ops), then split
            heads = self.qkv(x).view(batch, length, -1, self.head_dim).transpose(1, 2)  # (B, Hq + 2 Hkv, T, D)
            rotated = rotate_together(heads[:, : self.num_heads + self.num_kv_heads], cos, sin)
            q, k = rotated.split([self.num_heads, self.num_kv_heads], dim=1)
            v = heads[:, self.num_heads + self.num_kv_heads:]
        else:
            if self.qkv is not None:
                q, k, v = self.qkv(x).split([attn.q_proj.out_features, attn.k_proj.out_features,
                                             attn.v_proj.out_features], dim=-1)
            else:
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            q, k, v = (t.view(batch, length, -1, self.head_dim) for t in (q, k, v))
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rotate(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # (B, H, T, D)
            v = v.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        mask = inputs.mask
        if mask is None and 1 < length < k.shape[2]:  # new queries after cached keys: causal, bottom-aligned
            mask = attention_mask(torch.ones(batch, k.shape[2], dtype=torch.bool, device=k.device), length, always=True)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.scaling, is_causal=mask is None and length > 1,
            enable_gqa=self.num_kv_heads != self.num_heads)
        hidden = hidden + self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))
        x = self.post_norm(hidden)
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.mlp.gate_proj(x), self.mlp.up_proj(x)
        return hidden + self.down_proj(F.silu(gate) * up)

    def _decode_one(self, hidden: torch.Tensor, inputs: LayerInputs, cache: PrefixKVCache) -> torch.Tensor:
        """One new position per row (a decode step): the same math as ``__call__`` with fewer
        ops, the per-op cost being most of a small model's step on a CPU — rows kept 2-D (B, C),
        so the projections need no reshapes, and q and k rotated by one matmul with the step's
        rotation matrices (built once per step, shared by every layer)."""
        if self.native is not None and self.native.runs(hidden) and not cache.writes_in_place:
            return self.native(hidden, inputs, cache)
        batch = hidden.shape[0]
        flat = hidden.view(batch, -1)  # (B, C)
        heads = self.qkv(self.input_norm(flat)).view(batch, -1, 1, self.head_dim)  # (B, Hq + 2 Hkv, 1, D)
        rotating = self.num_heads + self.num_kv_heads
        q, k = torch.matmul(heads[:, :rotating], step_rotation(inputs)).split([self.num_heads, self.num_kv_heads], dim=1)
        k, v = cache.update(k, heads[:, rotating:], self.layer_idx)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.mask, scale=self.scaling,
                                             enable_gqa=self.num_kv_heads != self.num_heads)  # (B, Hq, 1, D)
        flat = flat + self.o_proj(out.reshape(batch, -1))
        gate, up = self.gate_up(self.post_norm(flat)).chunk(2, dim=-1)
        return (flat + self.down_proj(F.silu(gate) * up)).view(batch, 1, -1)


def direct_call(module: nn.Module | None) -> Callable | nn.Module | None:
    """One of the project's own low-bit projections as a plain call — its ``decode_call`` where it
    has one, else its bound ``forward``: nn.Module's call machinery (hook checks) costs ~3 us a
    call, four calls a layer, and the project registers no hooks on these modules (a module from
    elsewhere keeps its full call)."""
    if isinstance(module, _low_bit_parts.projections) and not (module._forward_hooks or module._forward_pre_hooks):
        return module.decode_call() if hasattr(module, "decode_call") else module.forward
    return module


def step_rotation(inputs: LayerInputs) -> torch.Tensor:
    """(B, 1, D, D) matrices R with x @ R == x * cos + rotate_half(x) * sin for a decode step's
    one position per row (the Llama rotary as a matmul: one op for q and k instead of nine), built
    on first use and kept in the step's shared extras."""
    rotation = inputs.extra.get("rotation")
    if rotation is None:
        cos, sin = inputs.extra["position_embeddings"]  # (B, 1, D)
        size = cos.shape[-1]
        half = size // 2
        eye = torch.eye(size, dtype=cos.dtype, device=cos.device)
        # rotate_half(x) = x @ swap: column j < D/2 takes -x[j + D/2], column j >= D/2 takes x[j - D/2]
        swap = torch.cat([torch.cat([eye.new_zeros(half, half), eye[:half, :half]], 1),
                          torch.cat([-eye[:half, :half], eye.new_zeros(half, half)], 1)], 0)
        rotation = inputs.extra["rotation"] = eye * cos.unsqueeze(-2) + swap * sin.unsqueeze(-2)
    return rotation


# transformers modules whose apply_rotary_pos_emb is the plain Llama one (no partial rotary, no
# interleaving); tests compare rotate_together with each.
STANDARD_ROTARY_MODULES = ("modeling_llama", "modeling_mistral", "modeling_qwen2", "modeling_qwen3")


def rotate_together(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (B, H, T, D) heads with (B, T, D) cos and sin: the Llama formula,
    applied to q's and k's heads in one pass."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = heads.shape[-1] // 2
    rotated_half = torch.cat((-heads[..., half:], heads[..., :half]), dim=-1)
    return heads * cos + rotated_half * sin


class FusedRMSNorm:
    """A Llama-family RMSNorm as one call of torch's fused ``rms_norm`` instead of the module's
    six ops (cast, pow, mean, add, rsqrt, two muls): the same float32 math, x * rsqrt(mean(x^2) +
    eps) * weight. Two norms a layer are a measurable share of a small model's decode step on a CPU
    (int8 at 2x, 2 threads: 5.99 -> 5.56 ms a step). Other dtypes run the module itself: its
    bfloat16 path rounds between the steps, and parity is kept bit for bit there too."""

    def __init__(self, norm: nn.Module) -> None:
        self.norm = norm  # its weight is read at each call: a weight loaded later is used

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.norm.weight
        if x.dtype != torch.float32 or weight.dtype != torch.float32:
            return self.norm(x)
        return F.rms_norm(x, weight.shape, weight, self.norm.variance_epsilon)


def fused_rms_norm(norm: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``norm`` as a FusedRMSNorm when it is the plain Llama-family RMSNorm, else the module."""
    plain = (type(norm).__name__.endswith("RMSNorm") and hasattr(norm, "variance_epsilon")
             and isinstance(getattr(norm, "weight", None), torch.Tensor) and norm.weight.dim() == 1
             and not type(norm).__name__.startswith("Gemma"))  # Gemma scales by (1 + weight)
    return FusedRMSNorm(norm) if plain else norm


def _layer_parts(layer: nn.Module) -> tuple[nn.Module | None, ...]:
    """The submodules a lean layer reads (their identity says whether it is still current).
    Read from the modules' own child dicts, written out: this runs for every layer of every step,
    and nn.Module's attribute lookup (or a generator a layer) costs more than the check itself."""
    children = layer._modules
    attn, mlp = children.get("self_attn"), children.get("mlp")
    a = attn._modules if attn is not None else {}
    m = mlp._modules if mlp is not None else {}
    return (attn, mlp, children.get("input_layernorm"), children.get("post_attention_layernorm"),
            a.get("q_proj"), a.get("k_proj"), a.get("v_proj"), a.get("o_proj"),
            m.get("gate_proj"), m.get("up_proj"), m.get("down_proj"))


def _same(built: tuple[nn.Module | None, ...], now: tuple[nn.Module | None, ...]) -> bool:
    """The same modules, one by one (a tuple's == compares its items by identity first, and modules
    have no other equality: one C call instead of a generator)."""
    return built == now


class OPTAdapter(ArchitectureAdapter):
    """OPT (the paper's family): learned positions with offset 2, optional in/out projections."""

    @property
    def _decoder(self) -> nn.Module:
        return self.model.model.decoder

    @property
    def layers(self) -> nn.ModuleList:
        return self._decoder.layers

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        decoder = self._decoder
        hidden = decoder.embed_tokens(input_ids)
        if decoder.project_in is not None:
            hidden = decoder.project_in(hidden)
        positions = decoder.embed_positions(None, 0, position_ids=position_ids)
        return hidden + positions

    def run_layer(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: PrefixKVCache | None) -> torch.Tensor:
        return self.layers[index](
            hidden,
            attention_mask=inputs.mask,
            past_key_values=cache,
            use_cache=cache is not None,
            position_ids=inputs.position_ids,
        )

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        decoder = self._decoder
        if decoder.final_layer_norm is not None:
            hidden = decoder.final_layer_norm(hidden)
        if decoder.project_out is not None:
            hidden = decoder.project_out(hidden)
        return hidden

    def fixed_modules(self) -> list[nn.Module]:
        decoder = self._decoder
        return [m for m in (decoder.final_layer_norm, decoder.project_out, decoder.project_in) if m is not None]


class GPT2Adapter(ArchitectureAdapter):
    """GPT-2: learned absolute positions (wpe), post-stack ln_f."""

    @property
    def _transformer(self) -> nn.Module:
        return self.model.transformer

    @property
    def layers(self) -> nn.ModuleList:
        return self._transformer.h

    @property
    def max_context(self) -> int:
        return int(self.config.n_positions)

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        t = self._transformer
        return t.drop(t.wte(input_ids) + t.wpe(position_ids))

    def run_layer(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: PrefixKVCache | None) -> torch.Tensor:
        return self.layers[index](hidden, past_key_values=cache, attention_mask=inputs.mask, use_cache=cache is not None)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._transformer.ln_f(hidden)

    def fixed_modules(self) -> list[nn.Module]:
        return [self._transformer.ln_f]


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (LoRA layers stay injected in its modules)."""
    base = getattr(model, "base_model", None)
    inner = getattr(base, "model", None)
    if base is not None and inner is not None and hasattr(inner, "config") and base is not model:
        return inner
    return model


def attention_implementation(model: nn.Module) -> str:
    """The attention kernel transformers chose for ``model`` ("sdpa", "eager", ...): a second copy
    of the model (a full fine-tune's weights) must be loaded with the same one to match it."""
    return unwrap_peft(model).config._attn_implementation


def forget_gguf_quantization(model: nn.Module) -> None:
    """A model loaded from a GGUF file holds plain float weights but still carries the GGUF
    quantizer's markers, which stop save_pretrained: drop them."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def adapter_for(model: nn.Module) -> ArchitectureAdapter:
    """Pick the adapter for a loaded causal LM; a clear error for unsupported families."""
    inner = unwrap_peft(model)
    model_type = getattr(inner.config, "model_type", None)
    if model_type in LLAMA_FAMILY:
        return LlamaFamilyAdapter(inner)
    if model_type == "opt":
        return OPTAdapter(inner)
    if model_type == "gpt2":
        return GPT2Adapter(inner)
    raise ValueError(
        f"model type {model_type!r} is not supported yet; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )
