"""One compiled decode step per layer KIND and batch bucket, reused by every layer of a model and
every layer set (docs/DESIGN.md, "Compiled layers inside the CUDA graphs").

``torch.compile`` of a whole static step compiles again for every layer set (the set is a Python
list dynamo guards on; a 2x run meets about twenty, 35-43 s each on an H200). Here the compiled
unit is ONE layer's decode step written as a pure function of tensors: the layer's weights, its
cache slots, the write column and the step's mask are arguments, so every layer of the same kind
(family, head layout, dtype) runs the same compiled code, whichever layer set it belongs to. The
key columns (the capacity) are marked dynamic, so runs of any length share it too; the batch is a
bucket (model/skipdecode/cuda_graphs.py pads a batch up to one). A CUDA graph per layer set then
captures the compiled kernels as it captured the eager ones.

    LayerKind       what makes two layers share compiled code: the family's step, its constants
                    (heads, head size, norms' epsilon, scaling, activation), dtype and device
    layer_kind      a layer's kind, or None where it has no pure step (low-bit or LoRA-wrapped
                    projections, an unusual variant): that layer runs eagerly
    CompiledStep    a static step (static_decoder.static_step's contract) whose layers run their
                    kind's compiled function; a kind that fails to compile runs eagerly from then on

Shapes: B = batch (a bucket), C = hidden size, H = heads, K = capacity (key columns), D = head size.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.activations import ACT2FN

from model.common.progress import say
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.lean_layer import STANDARD_ROTARY_MODULES, step_rotation
from model.skipdecode.skip_policy import EntryBridge
from model.skipdecode.static_decoder import StepBuffers

# compiled entries a family's step may hold: 7 batch buckets x a few kinds (a model, its task models'
# other shapes) with room to spare
RECOMPILE_LIMIT = 64

# (hidden (B, C), keys, values (B, H_kv, K, D), position (1,), allowed (B, 1, 1, K), rotation or None,
#  *weights) -> hidden (B, C); writes the new column of keys and values in place
LayerStepFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LayerKind:
    """Layers of one kind run one compiled function: the same family step, constants and weight
    shapes (every layer of a model, the skip policy's merged copy included)."""

    family: str  # "llama", "opt", "gpt2"
    constants: tuple[Any, ...]  # the family step's fixed arguments (see its _*_constants)
    shapes: tuple[tuple[int, ...] | None, ...]  # the weights' shapes (None: an absent bias or norm)
    dtype: torch.dtype
    device_type: str


@dataclass
class KindLayer:
    """One layer as its kind's function takes it: the kind and the layer's weights, in order."""

    kind: LayerKind
    weights: tuple[torch.Tensor | None, ...]


# --- the families' steps: one layer, one new position per row, the static cache ------------------------


def _write_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      position: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """Write the new column (B, H_kv, 1, D) at ``position``, attend over the whole capacity through
    ``allowed`` (the unwritten columns are masked): (B, H_q * D)."""
    keys.index_copy_(2, position, k)
    values.index_copy_(2, position, v)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, scale=scale,
                                         enable_gqa=q.shape[1] != keys.shape[1])  # (B, H_q, 1, D)
    return out.reshape(q.shape[0], -1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama-family RMSNorm as transformers computes it (in float32, cast back before the weight)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _llama_step(constants: tuple[Any, ...]) -> LayerStepFn:
    heads, kv_heads, head_dim, eps, scale = constants

    def step(hidden: Tensor, keys: Tensor, values: Tensor, position: Tensor, allowed: Tensor, rotation: Tensor,
             *weights: Any) -> Tensor:
        in_norm, q_w, q_b, k_w, k_b, v_w, v_b, q_norm, k_norm, o_w, post_norm, gate_w, up_w, down_w = weights
        batch = hidden.shape[0]
        x = _rms_norm(hidden, in_norm, eps)
        q = F.linear(x, q_w, q_b).view(batch, heads, 1, head_dim)
        k = F.linear(x, k_w, k_b).view(batch, kv_heads, 1, head_dim)
        v = F.linear(x, v_w, v_b).view(batch, kv_heads, 1, head_dim)
        if q_norm is not None:  # Qwen3: per-head norms before the rotary
            q, k = _rms_norm(q, q_norm, eps), _rms_norm(k, k_norm, eps)
        q, k = torch.matmul(q, rotation), torch.matmul(k, rotation)  # the rotary as one matmul (lean_layer)
        hidden = hidden + F.linear(_write_and_attend(q, k, v, keys, values, position, allowed, scale), o_w)
        x = _rms_norm(hidden, post_norm, eps)
        return hidden + F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)

    return step


def _opt_step(constants: tuple[Any, ...]) -> LayerStepFn:
    heads, head_dim, eps, scale, norm_before, activation = constants
    act = _activation(activation)

    def step(hidden: Tensor, keys: Tensor, values: Tensor, position: Tensor, allowed: Tensor, rotation: None,
             *weights: Any) -> Tensor:
        (attn_norm_w, attn_norm_b, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, final_norm_w, final_norm_b,
         fc1_w, fc1_b, fc2_w, fc2_b) = weights
        batch, width = hidden.shape
        x = F.layer_norm(hidden, (width,), attn_norm_w, attn_norm_b, eps) if norm_before else hidden
        q = (F.linear(x, q_w, q_b) * scale).view(batch, heads, 1, head_dim)  # OPT scales q, then attends at 1.0
        k = F.linear(x, k_w, k_b).view(batch, heads, 1, head_dim)
        v = F.linear(x, v_w, v_b).view(batch, heads, 1, head_dim)
        hidden = hidden + F.linear(_write_and_attend(q, k, v, keys, values, position, allowed, 1.0), o_w, o_b)
        if not norm_before:
            hidden = F.layer_norm(hidden, (width,), attn_norm_w, attn_norm_b, eps)
        x = F.layer_norm(hidden, (width,), final_norm_w, final_norm_b, eps) if norm_before else hidden
        hidden = hidden + F.linear(act(F.linear(x, fc1_w, fc1_b)), fc2_w, fc2_b)
        return hidden if norm_before else F.layer_norm(hidden, (width,), final_norm_w, final_norm_b, eps)

    return step


def _gpt2_step(constants: tuple[Any, ...]) -> LayerStepFn:
    heads, head_dim, eps, scale, activation = constants
    act = _activation(activation)

    def step(hidden: Tensor, keys: Tensor, values: Tensor, position: Tensor, allowed: Tensor, rotation: None,
             *weights: Any) -> Tensor:
        ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mlp_proj_w, mlp_proj_b = weights
        batch, width = hidden.shape
        x = F.layer_norm(hidden, (width,), ln1_w, ln1_b, eps)
        q, k, v = torch.addmm(attn_b, x, attn_w).split(width, dim=-1)  # Conv1D: x @ W + b, W (C, 3C)
        q, k, v = (t.view(batch, heads, 1, head_dim) for t in (q, k, v))
        hidden = hidden + torch.addmm(proj_b, _write_and_attend(q, k, v, keys, values, position, allowed, scale), proj_w)
        x = F.layer_norm(hidden, (width,), ln2_w, ln2_b, eps)
        return hidden + torch.addmm(mlp_proj_b, act(torch.addmm(fc_b, x, fc_w)), mlp_proj_w)

    return step


FAMILY_STEPS: dict[str, Callable[[tuple[Any, ...]], LayerStepFn]] = {
    "llama": _llama_step, "opt": _opt_step, "gpt2": _gpt2_step}


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return ACT2FN[name]  # the families' own activations, by their config names


# --- a layer's kind and weights ----------------------------------------------------------------------


def _plain_linear(*modules: Any) -> bool:
    """Projections the pure step can read: torch's own Linear (a LoRA wrapper or a low-bit module is not)."""
    return all(type(module) is nn.Linear for module in modules)


def _weight(module: nn.Module | None, name: str = "weight") -> torch.Tensor | None:
    return None if module is None else getattr(module, name, None)


def _llama_layer(layer: nn.Module, config: Any) -> tuple[tuple[Any, ...], tuple[torch.Tensor | None, ...]] | None:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or type(attn).__module__.rsplit(".", 1)[-1] not in STANDARD_ROTARY_MODULES:
        return None
    found = [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    found_mlps = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not _plain_linear(*found, *found_mlps) or getattr(config, "hidden_act", None) != "silu":
        return None
    projections, mlps = cast(list[nn.Linear], found), cast(list[nn.Linear], found_mlps)
    if any(p.bias is not None for p in (projections[3], *mlps)):
        return None
    eps = layer.input_layernorm.variance_epsilon
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    heads = config.num_attention_heads
    constants = (heads, getattr(config, "num_key_value_heads", None) or heads, attn.head_dim, eps, attn.scaling)
    q, k, v, o = projections
    weights = (layer.input_layernorm.weight, q.weight, q.bias, k.weight, k.bias, v.weight, v.bias,
               _weight(q_norm), _weight(k_norm), o.weight, layer.post_attention_layernorm.weight,
               *(m.weight for m in mlps))
    return constants, weights


def _opt_layer(layer: nn.Module, config: Any) -> tuple[tuple[Any, ...], tuple[torch.Tensor | None, ...]] | None:
    attn = getattr(layer, "self_attn", None)
    if attn is None or not _plain_linear(attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj, layer.fc1, layer.fc2):
        return None
    norm = layer.self_attn_layer_norm
    constants = (attn.num_heads, attn.head_dim, norm.eps, attn.scaling, bool(layer.do_layer_norm_before),
                 config.activation_function)
    weights = (norm.weight, norm.bias, *(t for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj)
                                         for t in (p.weight, p.bias)),
               layer.final_layer_norm.weight, layer.final_layer_norm.bias,
               layer.fc1.weight, layer.fc1.bias, layer.fc2.weight, layer.fc2.bias)
    return constants, weights


def _gpt2_layer(layer: nn.Module, config: Any) -> tuple[tuple[Any, ...], tuple[torch.Tensor | None, ...]] | None:
    attn, mlp = getattr(layer, "attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return None
    convs = (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)
    if (any(type(c).__name__ != "Conv1D" for c in convs) or attn.scale_attn_by_inverse_layer_idx
            or attn.reorder_and_upcast_attn or getattr(attn, "is_cross_attention", False)):
        return None  # a layer-dependent scale would make every layer its own kind
    constants = (attn.num_heads, attn.head_dim, layer.ln_1.eps, attn.scaling, config.activation_function)
    weights = (layer.ln_1.weight, layer.ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
               attn.c_proj.bias, layer.ln_2.weight, layer.ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias,
               mlp.c_proj.weight, mlp.c_proj.bias)
    return constants, weights


FAMILY_LAYERS = {"LlamaFamilyAdapter": ("llama", _llama_layer), "OPTAdapter": ("opt", _opt_layer),
                 "GPT2Adapter": ("gpt2", _gpt2_layer)}


def layer_kind(adapter: Any, index: int) -> KindLayer | None:
    """Layer ``index`` of ``adapter``'s model as its kind's function takes it, or None (it runs
    eagerly): another family, low-bit or LoRA-wrapped projections, eager attention's float mask."""
    family = FAMILY_LAYERS.get(type(adapter).__name__)
    if family is None or adapter.config._attn_implementation != "sdpa":
        return None
    name, read = family
    read_out = read(adapter.layers[index], adapter.config)
    if read_out is None:
        return None
    constants, weights = read_out
    first = next(w for w in weights if w is not None)
    shapes = tuple(None if w is None else tuple(w.shape) for w in weights)
    return KindLayer(LayerKind(name, constants, shapes, first.dtype, first.device.type), weights)


# --- the step -----------------------------------------------------------------------------------------


def compile_cache_folder(cache_root: str | os.PathLike) -> str:
    """Where inductor keeps compiled code across starts (torch's own FX graph cache, under ours)."""
    return os.path.join(os.fspath(cache_root), "inductor")


@dataclass
class CompileReport:
    compiled: int  # kind x bucket functions compiled since start (their first call)
    seconds: float  # those first calls' time (compile included)
    failed: int  # kinds that failed to compile and run eagerly


@dataclass
class CompiledStep:
    """A static step whose layers run their kind's compiled function (``torch.compile`` of the
    family step, one per kind and batch bucket, the capacity dynamic); embed, bridges, norm and
    head run as in ``static_step``. ``compile=False`` runs the same pure functions uncompiled
    (their parity with the eager decoder, tested without a compiler)."""

    compile: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # torch.compile's (mode, backend, ...)
    _functions: dict[tuple[LayerKind, int], LayerStepFn] = field(default_factory=dict)
    _warm: set[tuple[LayerKind, int]] = field(default_factory=set)
    _failed: set[LayerKind] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    compiled: int = 0
    compile_seconds: float = 0.0

    def __call__(self, decoder: SkipDecoder, buffers: StepBuffers, layers: Sequence[int]) -> torch.Tensor:
        """One decode step over ``buffers`` (static_step's contract): next-token logits (B, V)."""
        adapter = decoder.adapter
        positions = buffers.positions  # (B, 1)
        hidden = adapter.embed(buffers.token_ids[:, None], positions)  # (B, 1, C)
        allowed = buffers.key_valid & (buffers.columns <= buffers.position)  # (B, K)
        inputs = adapter.static_step_inputs(hidden, allowed, positions)
        weights, entries = decoder._weights_for(layers)
        mask = allowed[:, None, None, :]  # (B, 1, 1, K): SDPA's bool mask
        rotation = step_rotation(inputs) if "position_embeddings" in inputs.extra else None
        buffers.static_writes = True
        try:
            for index in layers:
                if index in entries:
                    hidden = cast(EntryBridge, decoder.bridge)(index, hidden)
                layer = layer_kind(weights, index)
                function = None if layer is None else self._function(layer.kind, buffers.batch)
                if function is None or layer is None:
                    hidden = weights.run_layer(index, hidden, inputs, buffers)
                    continue
                keys, values = buffers._keys[index], buffers._values[index]
                if keys is None or values is None:
                    raise RuntimeError(f"static KV cache: layer {index} decodes but never ran in the prefill")
                flat = self._run(function, layer, hidden[:, 0], keys, values, buffers.position, mask, rotation)
                if flat is None:  # its compile failed just now: this layer and its kind run eagerly
                    hidden = weights.run_layer(index, hidden, inputs, buffers)
                else:
                    hidden = flat[:, None]
        finally:
            buffers.static_writes = False
        return adapter.logits(hidden)[:, -1]

    def _function(self, kind: LayerKind, batch: int) -> LayerStepFn | None:
        if kind in self._failed:
            return None
        key = (kind, batch)
        function = self._functions.get(key)
        if function is None:
            with self._lock:
                function = self._functions.get(key)
                if function is None:
                    # dynamo keeps its entries per CODE object: every kind and bucket of a family is one family
                    # step's code (a kind's constants are guarded closure cells, a bucket a static batch), so its
                    # default limit (8) would send the ninth entry to eager
                    limit = torch._dynamo.config
                    limit.recompile_limit = max(limit.recompile_limit, RECOMPILE_LIMIT)
                    pure = FAMILY_STEPS[kind.family](kind.constants)
                    function = torch.compile(pure, dynamic=None, **self.options) if self.compile else pure
                    self._functions[key] = function
        return function

    def _run(self, function: LayerStepFn, layer: KindLayer, hidden: torch.Tensor, keys: torch.Tensor,
             values: torch.Tensor, position: torch.Tensor, mask: torch.Tensor,
             rotation: torch.Tensor | None) -> torch.Tensor | None:
        """The layer through its kind's function; the first call of a (kind, bucket) compiles (timed). A call
        that fails (any compile, first or later) marks the kind failed: it runs eagerly from then on, and
        this call returns None (its layer then runs eagerly: the same column written again, the same values).
        Running out of memory is not a compile failure: it is raised."""
        key = (layer.kind, hidden.shape[0])
        if not self.compile:
            return function(hidden, keys, values, position, mask, rotation, *layer.weights)
        first = key not in self._warm
        if first:
            for tensor, dim in ((keys, 2), (values, 2), (mask, 3)):  # any capacity: one compiled entry
                torch._dynamo.mark_dynamic(tensor, dim)
        start = time.perf_counter()
        try:
            # the batch stays static (a bucket's): without this, a family's second bucket would make it dynamic
            with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
                out = function(hidden, keys, values, position, mask, rotation, *layer.weights)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # noqa: BLE001 (inductor's failures have many types: each means "run eagerly")
            with self._lock:
                self._failed.add(layer.kind)
            say(f"compiling a {layer.kind.family} layer failed ({type(error).__name__}: {error}); it runs eagerly")
            return None
        if first:
            with self._lock:
                self._warm.add(key)
                self.compiled += 1
                self.compile_seconds += time.perf_counter() - start
        return out

    def report(self) -> CompileReport:
        return CompileReport(self.compiled, self.compile_seconds, len(self._failed))
