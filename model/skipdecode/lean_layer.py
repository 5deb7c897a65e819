"""The lean Llama-family layer the decoder runs (docs/DESIGN.md, "The lean layer"), and the hook
through which the low-bit engine lends it what only the engine knows.

A Llama, SmolLM2, Mistral, Qwen2 or Qwen3 layer computed from its own modules, not through
transformers' layer code: the same math with fewer ops per call, low-bit q/k/v and gate/up fused
into one kernel call each, a decode step's q and k rotated by one matmul, and (where the engine
has one) the whole decode step as one native call. The method never imports the engine
(docs/DESIGN.md, "Layers"): ``LowBitParts`` is the hook, float weights' answers by default, and
model/lowbit/__init__.py plugs the engine's parts in with ``use_low_bit``.

Shapes: B = batch, T = new positions this call, C = hidden size, D = head size.
"""

from __future__ import annotations

import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from model.skipdecode.kv_cache import LayerCache, LayerInputs, PrefixKVCache, attention_mask


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


def low_bit_parts() -> LowBitParts:
    """The parts plugged in now (read at each use: ``use_low_bit`` may replace them after import)."""
    return _low_bit_parts


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

    def __call__(self, hidden: torch.Tensor, inputs: LayerInputs, cache: LayerCache | None) -> torch.Tensor:
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

    def _decode_one(self, hidden: torch.Tensor, inputs: LayerInputs, cache: LayerCache) -> torch.Tensor:
        """One new position per row (a decode step): the same math as ``__call__`` with fewer
        ops, the per-op cost being most of a small model's step on a CPU — rows kept 2-D (B, C),
        so the projections need no reshapes, and q and k rotated by one matmul with the step's
        rotation matrices (built once per step, shared by every layer)."""
        if (self.native is not None and isinstance(cache, PrefixKVCache) and self.native.runs(hidden)
                and not cache.writes_in_place):
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
