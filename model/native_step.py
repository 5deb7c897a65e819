"""The lean layer's decode step as one C++ call (model/lean_step.cpp), for low-bit weights on a CPU.

A decode step of the default model at 2x runs ~15 layers of ~25 small torch ops each; at one
thread the interpreter's cost per op call was a measured ~17% of those layers (README, "Speed").
lean_step.cpp makes the same ATen calls in the same order from C++, so its output is the Python
step's bit for bit (tests/test_quantization.py compares them with torch.equal).

Built once per machine and torch version with torch's own extension builder (a C++ compiler and
ninja, ~1 minute on 2 cores), cached under the project's cache folder; where it cannot be built
(no compiler) or ``SKIPDECODE_NATIVE=0``, every step runs the Python path and says so once.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover
    from model.architectures import LayerInputs, LeanLlamaLayer, PrefixKVCache

SOURCE = Path(__file__).with_name("lean_step.cpp")
_build_lock = threading.Lock()


def native_enabled() -> bool:
    """False when ``SKIPDECODE_NATIVE=0`` (the Python step everywhere: comparisons, debugging)."""
    return os.environ.get("SKIPDECODE_NATIVE", "1").strip() != "0"


@functools.cache
def native_module() -> ModuleType | None:
    """The compiled extension (built on first use, then loaded from the cache), or None."""
    if not native_enabled():
        return None
    from model.loading import cache_root, say  # noqa: PLC0415 (loading imports the decoder)

    if shutil.which(os.environ.get("CXX", "c++")) is None or shutil.which("ninja") is None:
        say("no C++ compiler or ninja here: decode steps run the Python path (a few % slower on a CPU)")
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + torch.__version__.encode()).hexdigest()[:16]
    folder = cache_root() / "native" / f"lean-step-{key}"
    with _build_lock:
        try:
            from torch.utils.cpp_extension import load  # noqa: PLC0415 (imports setuptools: only when used)

            folder.mkdir(parents=True, exist_ok=True)
            if not any(folder.glob("*.so")):
                say("one-time preparation: compiling the native decode step (C++, about a minute); "
                    f"cached in {folder.parent}")
            return load(name=f"skipdecode_lean_step_{key}", sources=[str(SOURCE)], build_directory=str(folder),
                        extra_cflags=["-O2"], verbose=False)
        except Exception as error:  # noqa: BLE001 (any build failure: the Python path still works)
            say(f"the native decode step could not be built ({type(error).__name__}: {str(error)[:200]}); "
                "decode steps run the Python path")
            return None


def projection_spec(module: nn.Module) -> tuple[int, list[torch.Tensor], int] | None:
    """(kind, tensors, out_features) of a low-bit projection as lean_step.cpp computes it, or None
    for anything it does not know (float weights, a bias, a LoRA with a float B)."""
    from model.quantization import Int4LoraLinear, Int4WeightLinear, Int8WeightLinear  # noqa: PLC0415

    if getattr(module, "bias", None) is not None:
        return None
    if isinstance(module, Int4WeightLinear):
        return 0, [module.weight_int4pack, module.scales_and_zeros], module.out_features
    if isinstance(module, Int4LoraLinear) and module.lora_b_int8 is not None:
        b = module.lora_b_int8
        return 1, [module.stacked.weight_int4pack, module.stacked.scales_and_zeros, b.weight_int8, b.scales], \
            module.out_features
    if isinstance(module, Int8WeightLinear):
        return 2, [module.weight_int8, module.scales], module.out_features
    return None


class NativeDecode:
    """One lean layer's decode step through lean_step.cpp: float32 rows on the CPU only (anything
    else goes back to the Python step).

    The C++ step holds the tensors it was built with; like the projections' own decode calls
    (quantization.py, ``kernel_decode_call``) it must follow a weight re-pointed later (the skip
    policy's LoRA re-points a shared base at its stacked rows), so each call checks the few
    tensors a module can have re-pointed (identity checks, well under a microsecond) and rebuilds
    on a change."""

    def __init__(self, module: ModuleType, lean: "LeanLlamaLayer", projections: list[nn.Module]) -> None:
        self._module, self._projections = module, projections
        self._norms = (lean.input_norm.norm, lean.post_norm.norm)
        self._shape = (float(lean.scaling), lean.num_heads, lean.num_kv_heads, lean.head_dim)
        self.layer_idx, self.num_kv_heads, self.head_dim = lean.layer_idx, lean.num_kv_heads, lean.head_dim
        self._build()

    @classmethod
    def of(cls, lean: "LeanLlamaLayer", projections: list[nn.Module | None]) -> "NativeDecode | None":
        """The native step of ``lean`` (its q/k/v, o, gate/up and down modules), or None."""
        if any(p is None or projection_spec(p) is None for p in projections):
            return None
        norms = [getattr(lean.input_norm, "norm", None), getattr(lean.post_norm, "norm", None)]
        if any(n is None or n.weight.dtype != torch.float32 or n.weight.device.type != "cpu" for n in norms):
            return None  # FusedRMSNorm's float32 rows only (quantization never touches the norms)
        module = native_module()
        return None if module is None else cls(module, lean, projections)

    def _build(self) -> None:
        specs = [projection_spec(p) for p in self._projections]
        first, second = self._norms
        self._step = self._module.DecodeLayer(first.weight, float(first.variance_epsilon), second.weight,
                                              float(second.variance_epsilon), specs, *self._shape)
        # (the dict a module keeps the tensor in, its name there, the tensor built with)
        self._watched = [(n._parameters, "weight", n.weight) for n in self._norms]
        for projection in self._projections:
            if not hasattr(projection, "stacked"):  # Int4LoraLinear's own rows are never re-pointed
                self._watched += [(projection._buffers, name, tensor) for name, tensor in projection._buffers.items()]

    def runs(self, hidden: torch.Tensor) -> bool:
        """True where this step applies: float32 rows on the CPU."""
        return hidden.dtype == torch.float32 and hidden.device.type == "cpu"

    def __call__(self, hidden: torch.Tensor, inputs: "LayerInputs", cache: "PrefixKVCache",
                 rotation: torch.Tensor) -> torch.Tensor:
        for holder, name, tensor in self._watched:
            if holder[name] is not tensor:
                self._build()
                break
        batch = hidden.shape[0]
        keys, values, start = cache.next_slot(self.layer_idx, batch, self.num_kv_heads, self.head_dim, hidden)
        out = self._step(hidden.view(batch, -1), rotation, keys, values, start, inputs.mask)
        return out.view(batch, 1, -1)
