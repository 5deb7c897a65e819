"""The lean layer's decode step as one C++ call (model/lowbit/lean_step.cpp, built and loaded by
model/lowbit/native_kernels.py): each low-bit projection described to the C++ step
(``projection_spec``) and the step itself (``NativeDecode``), which the lean layer
(model/skipdecode/lean_layer.py) reaches through the hook model/lowbit/__init__.py plugs in.
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import TYPE_CHECKING

import torch
from torch import nn

from model.lowbit.native_kernels import (
    Q4Blocks,
    loaded_native_module,
    lora_b_layout,
    native_module,
    q4_kernel_selected,
    q4_scan,
)
from model.lowbit.quantization import Int4LoraLinear, Int4WeightLinear, Int8WeightLinear
from model.skipdecode.lean_layer import step_rotation

if TYPE_CHECKING:  # pragma: no cover
    from model.skipdecode.kv_cache import LayerInputs, PrefixKVCache
    from model.skipdecode.lean_layer import LeanLlamaLayer


_stacked: "weakref.WeakKeyDictionary[nn.Module, Q4Blocks | None]" = weakref.WeakKeyDictionary()


_windows: "weakref.WeakKeyDictionary[nn.Module, tuple[torch.Tensor, tuple[torch.Tensor, ...]]]" = weakref.WeakKeyDictionary()


def _lora_b_windows_of(b: nn.Module) -> tuple[torch.Tensor, ...]:
    """lora_b_layout of an int8 B module (windows and tiles), kept while its rows stay the same tensor."""
    known = _windows.get(b)
    if known is None or known[0] is not b.weight_int8:
        known = _windows[b] = (b.weight_int8, lora_b_layout(b.weight_int8, b.scales))
    return known[1]


def projection_spec(module: nn.Module) -> tuple[int, list[torch.Tensor], int] | None:
    """(kind, tensors, out_features) of a low-bit projection as lean_step.cpp computes it, or None
    for anything it does not know (float weights, a bias, a LoRA with a float B)."""
    if getattr(module, "bias", None) is not None:
        return None
    if isinstance(module, Int4WeightLinear):
        blocks = q4_scan(module)
        if blocks is not None:
            blocks.place()  # the step streams them every call
            return 3, blocks.tensors() + blocks.layouts(), module.out_features
        return 0, [module.weight_int4pack, module.scales_and_zeros], module.out_features
    if isinstance(module, Int4LoraLinear) and module.lora_b_int8 is not None:
        b = module.lora_b_int8
        blocks = None
        if q4_kernel_selected():
            if module not in _stacked:
                _stacked[module] = Q4Blocks.stacked([module.base, module.side])
            blocks = _stacked[module]
        if blocks is not None:
            return 4, blocks.tensors() + list(_lora_b_windows_of(b)) + blocks.layouts(), module.out_features
        return 1, [module.stacked.weight_int4pack, module.stacked.scales_and_zeros, b.weight_int8, b.scales], \
            module.out_features
    if isinstance(module, Int8WeightLinear):
        kept = module.weight_bf16 if module.weight_bf16 is not None else module.weight_int8.new_empty(0, dtype=torch.bfloat16)
        return 2, [module.weight_int8, module.scales, kept], module.out_features
    return None


class NativeDecode:
    """One lean layer's decode step through lean_step.cpp: float32 rows on the CPU only (anything
    else goes back to the Python step). Where every projection is a q4 one (``q4_kernel_selected``)
    the whole layer is one call of the project's own kernels (``fused``: norms, q4 matmuls, rotary,
    the cache writes, attention over the cached prefix, SiLU gate, residuals:
    model/lowbit/decode_kernels.h); otherwise it makes torch's ATen calls in the Python step's
    order (bit for bit that step).

    The C++ step holds the tensors it was built with; like the projections' own decode calls
    (quantization.py, ``kernel_decode_call``) it must follow a weight re-pointed later (the skip
    policy's LoRA re-points a shared base at its stacked rows), so each call checks the few
    tensors a module can have re-pointed (identity checks, well under a microsecond) and rebuilds
    on a change."""

    def __init__(self, module: ModuleType, lean: "LeanLlamaLayer", projections: list[nn.Module],
                 specs: list[tuple[int, list[torch.Tensor], int]]) -> None:
        self._module, self._projections = module, projections
        self._norms = (lean.input_norm.norm, lean.post_norm.norm)
        self._shape = (float(lean.scaling), lean.num_heads, lean.num_kv_heads, lean.head_dim)
        self.layer_idx, self.num_kv_heads, self.head_dim = lean.layer_idx, lean.num_kv_heads, lean.head_dim
        self._build(specs)

    @classmethod
    def of(cls, lean: "LeanLlamaLayer", projections: list[nn.Module | None]) -> "NativeDecode | None":
        """The native step of ``lean`` (its q/k/v, o, gate/up and down modules), or None."""
        norms = [getattr(lean.input_norm, "norm", None), getattr(lean.post_norm, "norm", None)]
        if any(n is None or n.weight.dtype != torch.float32 or n.weight.device.type != "cpu" for n in norms):
            return None  # FusedRMSNorm's float32 rows only (quantization never touches the norms)
        if any(p is None for p in projections):
            return None
        specs = [projection_spec(p) for p in projections]
        module = native_module() if all(s is not None for s in specs) else None
        return None if module is None else cls(module, lean, projections, specs)

    def _build(self, specs: list[tuple[int, list[torch.Tensor], int]] | None = None) -> None:
        """The C++ step over ``specs`` (the projections' current ones when None: a rebuild)."""
        specs = specs or [projection_spec(p) for p in self._projections]
        first, second = self._norms
        self._step = self._module.DecodeLayer(first.weight, float(first.variance_epsilon), second.weight,
                                              float(second.variance_epsilon), specs, *self._shape)
        self.fused = bool(self._step.fused)
        # (the dict a module keeps the tensor in, its name there, the tensor built with)
        self._watched = [(n._parameters, "weight", n.weight) for n in self._norms]
        for projection in self._projections:
            if not hasattr(projection, "stacked"):  # Int4LoraLinear's own rows are never re-pointed
                self._watched += [(projection._buffers, name, tensor) for name, tensor in projection._buffers.items()]

    def runs(self, hidden: torch.Tensor) -> bool:
        """True where this step applies: float32 rows on the CPU."""
        return hidden.dtype == torch.float32 and hidden.device.type == "cpu"

    def refresh(self) -> None:
        """Rebuild the C++ step where a module's tensor was re-pointed since it was built."""
        for holder, name, tensor in self._watched:
            if holder[name] is not tensor:
                self._build()
                return

    def __call__(self, hidden: torch.Tensor, inputs: "LayerInputs", cache: "PrefixKVCache") -> torch.Tensor:
        self.refresh()
        batch = hidden.shape[0]
        keys, values, start = cache.next_slot(self.layer_idx, batch, self.num_kv_heads, self.head_dim, hidden)
        if self.fused:
            cos, sin = inputs.extra["position_embeddings"]  # (B, 1, D) each
            out = self._step.decode(hidden.view(batch, -1), cos, sin, keys, values, start, inputs.mask)
        else:
            out = self._step(hidden.view(batch, -1), step_rotation(inputs), keys, values, start, inputs.mask)
        return out.view(batch, 1, -1)


def native_argmax(logits: torch.Tensor) -> torch.Tensor | None:
    """(B, V) float32 CPU logits -> (B,) int64 argmax through lean_step.cpp (torch's semantics), or None
    for anything else (another dtype or device, an extension not built by a low-bit model)."""
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.device.type != "cpu" or logits.shape[1] == 0:
        return None
    module = loaded_native_module()
    return None if module is None else module.argmax_rows(logits)


def run_native_layers(leans: list["LeanLlamaLayer"], hidden: torch.Tensor, extra: dict, cache: "PrefixKVCache",
                      key_valid: torch.Tensor | None) -> torch.Tensor | None:
    """A decode step's run of consecutive lean layers as ONE native call (``decode_layers``: no
    interpreter between the layers; at one thread the Python around each layer's call was ~20 us,
    a tenth of a layer), or None where any of them is not a fused native step (the caller then runs
    them one by one). ``key_valid``: the decoder's (B, capacity) bool, None where nothing is padded."""
    natives = [lean.native for lean in leans]
    if (not natives or any(native is None for native in natives) or not natives[0].runs(hidden)
            or cache.writes_in_place):  # a static step, or buffers padded to a batch bucket: the Python step
        return None
    for native in natives:
        native.refresh()
        if not native.fused:
            return None
    batch = hidden.shape[0]
    slots = [cache.next_slot(n.layer_idx, batch, n.num_kv_heads, n.head_dim, hidden) for n in natives]
    cos, sin = extra["position_embeddings"]  # (B, 1, D) each
    out = natives[0]._module.decode_layers([n._step for n in natives], hidden.view(batch, -1), cos, sin,
                                           [slot[0] for slot in slots], [slot[1] for slot in slots],
                                           [slot[2] for slot in slots], key_valid)
    return out.view(batch, 1, -1)
