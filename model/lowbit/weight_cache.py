"""Start-up cache of the default model's PREPARED low-bit weights.

A start on the CPU default (int8) or int4 used to redo the same work every time: quantise every
Linear (int8) or read and pack the GGUF's 4-bit blocks (int4). The result depends only on the
model file, the mode, torch's version and the CPU's instruction set (which picks int4's packed
layout), so it is cached once under the cache folder, keyed by all four (the file by CONTENT:
sha256 of its size, first and last MiB), and a warm start restores the low-bit modules from one
safetensors file instead. Where the skip policy is MERGED into its own low-bit copy (int8), that
set is cached in a second file whose key adds the adapter's content; where its LoRA runs beside
the low-bit weights (int4: model/lowbit/quantization.py, LowBitLoraLinear) it is read from the adapter at
every start (10 MB).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from torch import nn

from model.lowbit.quantization import Int4WeightLinear, Int8WeightLinear, PackedInt4, TwoStageHead

CACHE_FORMAT = "lowbit-v4"  # bump when the stored layout or a quantiser changes
LOW_BIT_MODULES = (Int8WeightLinear, Int4WeightLinear, TwoStageHead)


def file_key(path: Path) -> str:
    """A key for a file's CONTENT (not its path): sha256 of its size, first and last MiB."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(2**20))
        handle.seek(max(0, size - 2**20))
        digest.update(handle.read(2**20))
    return digest.hexdigest()[:16]


def cache_file(folder: Path, model_key: str, mode: str, dtype: torch.dtype = torch.float32,
               adapter: Path | None = None) -> Path:
    """Where the prepared ``mode`` weights of the model with content ``model_key``, quantised from
    ``dtype`` weights (with ``adapter`` merged: the skip policy's set), live on this torch and CPU."""
    parts = [model_key, mode, str(dtype), torch.__version__.split("+")[0], torch.backends.cpu.get_cpu_capability(),
             CACHE_FORMAT, adapter_key(adapter) if adapter is not None else "original"]
    return folder / f"{mode}-{hashlib.sha256('-'.join(parts).encode()).hexdigest()[:20]}.safetensors"


def adapter_key(adapter: Path) -> str:
    """An adapter folder's content key: its config and the content keys of its weight files."""
    digest = hashlib.sha256()
    for path in sorted(Path(adapter).iterdir()):
        if path.suffix in (".json", ".safetensors", ".bin", ".pt"):
            digest.update(path.name.encode())
            digest.update(path.read_bytes() if path.suffix == ".json" else file_key(path).encode())
    return digest.hexdigest()[:16]


def save_low_bit(path: Path, weight_sets: dict[str, nn.Module | None]) -> None:
    """Every low-bit module's buffers of each named weight set ("original", "skip"), atomically."""
    from safetensors.torch import save_file  # noqa: PLC0415

    tensors, exact = {}, []
    for set_name, model in weight_sets.items():
        for name, module in _low_bit_modules(model):
            prefix = f"{set_name}/{name}"
            for buffer_name, buffer in module.named_buffers():
                if not buffer_name.endswith("weight_bf16"):  # made again at load (Int8WeightLinear.keep_bfloat16_copy)
                    tensors[f"{prefix}/{buffer_name}"] = buffer.contiguous()
            if module.bias is not None:
                tensors[f"{prefix}/bias"] = module.bias.detach().contiguous()
            exact += [prefix] if getattr(module, "exact", False) else []
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")  # two first starts at once write apart
    save_file(tensors, str(partial), metadata={"format": CACHE_FORMAT, "exact": ",".join(exact)})
    partial.replace(path)  # a killed first start never leaves half a cache


def restore_low_bit(path: Path, weight_sets: dict[str, nn.Module | None]) -> int:
    """Replace the Linears of each weight set by the cached low-bit modules; returns how many."""
    from safetensors import safe_open  # noqa: PLC0415

    restored = 0
    with safe_open(str(path), "pt") as handle:
        exact = set((handle.metadata() or {}).get("exact", "").split(","))
        by_module: dict[str, dict[str, torch.Tensor]] = {}
        for key in handle.keys():
            prefix, part = key.rsplit("/", 1)
            # A fresh allocation: a tensor read from the file may sit at any byte offset, and
            # torch's int8 kernel faults on weights that are not aligned for its vector loads.
            by_module.setdefault(prefix, {})[part] = handle.get_tensor(key).clone()
    for prefix, parts in by_module.items():
        set_name, name = prefix.split("/", 1)
        model = weight_sets.get(set_name)
        if model is None:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _low_bit_module(parts, exact=prefix in exact, model=model))
        restored += 1
    return restored


def _low_bit_module(parts: dict[str, torch.Tensor], exact: bool, model: nn.Module) -> nn.Module:
    bias = parts.get("bias")
    if "scan.weight_int4pack" in parts:  # a two-stage head: its int8 rows stored, or tied to the embedding
        scan = Int4WeightLinear(PackedInt4(parts["scan.weight_int4pack"], parts["scan.scales_and_zeros"]))
        if "exact_int8" in parts:
            return TwoStageHead(scan, parts["exact_int8"], parts["exact_scales"])
        return TwoStageHead(scan, tied_rows=model.get_input_embeddings().weight)
    if "weight_int8" in parts:
        return Int8WeightLinear.from_tensors(parts["weight_int8"], parts["scales"], bias)
    return Int4WeightLinear(PackedInt4(parts["weight_int4pack"], parts["scales_and_zeros"], exact), bias)


def _low_bit_modules(model: nn.Module | None):
    if model is None:
        return []
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, LOW_BIT_MODULES)]
    heads = [name for name, module in found if isinstance(module, TwoStageHead)]
    return [(name, module) for name, module in found if not any(name.startswith(head + ".") for head in heads)]
