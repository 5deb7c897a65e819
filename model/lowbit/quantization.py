"""Low-bit weight paths for CPU: int4 (group-wise, 32 weights a group) and int8 (per output
channel) weights, activations in bfloat16.

Why weight-only: batch-1 decoding on a CPU is bound by reading the weights (SmolLM2-135M moves
540 MB of float32 per token); int8 weights move a quarter of that. Quantising the ACTIVATIONS
as well (torch.ao's dynamic quantisation) was measured on SmolLM2-135M and loses half of the
full model's next-token agreement (0.43-0.51 teacher-forced against float32): its residual
stream has large outlier dimensions that one activation scale per tensor cannot hold. Weight-only
int8 keeps 0.96 agreement (docs/RESULTS.md, "Speed").

The matmul is torch's own CPU kernel for int8 weights with bfloat16 activations
(``torch._weight_int8pack_mm``, the kernel behind gpt-fast's and torchao's int8 weight-only CPU
path); everything else (norms, attention, the KV cache, the residual stream) stays in the model's
dtype. Quantising is in place: each nn.Linear of the model becomes an Int8WeightLinear.

int4 uses torch's group-wise 4-bit CPU kernel (``_weight_int4pack_mm_for_cpu``, the one gpt-fast
and torchao use): each group of 32 weights along the input dimension holds codes q in 0..15 and
w = (q - 8) * scale + zero, scale and zero in bfloat16. The default model's GGUF stores Q4_1
blocks (32 weights, w = d * q + m), which map onto this exactly (scale = d, zero = m + 8 d) up to
the bfloat16 rounding of scale and zero: ``Int4Blocks.from_q4_1``. Other weights (any other
model, the LoRA-merged skip-policy weights, the default model's tied Q8_0 embedding used as LM
head) are quantised group-wise from float (asymmetric min/max per group). Only the kernel's
bfloat16 path is fast (float32 and float16 activations are ~30x slower on torch 2.13), and the
kernel needs out_features % 16 == 0 and in_features % 32 == 0: a Linear that does not fit keeps
int8 weights, and ``quantize_weights`` says which and why.
"""

from __future__ import annotations

import functools
import logging
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from model.lowbit.native_kernels import int8_rows_mm, keeps_bfloat16_copy, q4_scan

log = logging.getLogger(__name__)

QUANTIZE_MODES = ("none", "int8", "int4")
INT4_GROUP = 32  # weights per (scale, zero): the GGUF Q4_1 block size


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float weights -> (out, in) int8 and (out,) bfloat16 scales, symmetric per row.
    The kernel takes bfloat16 scales: they are rounded FIRST and the weights quantised with the
    rounded value, so each weight is within half a step of what the kernel multiplies back (an
    all-zero row keeps a tiny scale)."""
    weight = weight.float()
    scales = (weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0).to(torch.bfloat16)
    return torch.round(weight / scales.float()[:, None]).clamp(-128, 127).to(torch.int8), scales


class Int8WeightLinear(nn.Module):
    """y = x W^T + b with W stored as int8 per output channel (symmetric, scale = max|w| / 127)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight_int8, scales = int8_rows(linear.weight.detach())
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scales", scales)
        self.keep_bfloat16_copy()
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @classmethod
    def from_tensors(cls, weight_int8: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None = None) -> "Int8WeightLinear":
        """An already quantised weight (the start-up cache, fused projections): no float weights needed."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.register_buffer("weight_int8", weight_int8)
        module.register_buffer("scales", scales)
        module.keep_bfloat16_copy()
        module.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        module.out_features, module.in_features = weight_int8.shape
        return module

    def keep_bfloat16_copy(self, copy: torch.Tensor | None = None) -> None:
        """The weights' integers as bfloat16 beside the int8 ones, where many rows multiply through them
        (native_kernels.int8_rows_mm): ``copy`` (a view of a fused module's), else made here; none where
        no rows do (``keeps_bfloat16_copy``). Not persistent: the start-up cache holds the int8 weights."""
        if copy is None and keeps_bfloat16_copy():
            copy = self.weight_int8.to(torch.bfloat16)
        self.register_buffer("weight_bf16", copy, persistent=False)

    def decode_call(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``forward`` for the lean layer (``kernel_decode_call``)."""
        return kernel_decode_call(self, lambda x, b: int8_rows_mm(x, b["weight_int8"], b["scales"], b["weight_bf16"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (N, in)
        y = int8_rows_mm(flat, self.weight_int8, self.scales, self.weight_bf16)  # (N, out), bfloat16
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    @property
    def quantized_weight_count(self) -> int:
        """Weights this module multiplies per token (the cost model counts them)."""
        return self.out_features * self.in_features

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight_int8.float() * self.scales.float()[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def kernel_decode_call(module: nn.Module, kernel: Callable[[torch.Tensor, dict], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A bias-free low-bit Linear's call for the lean layer: 2-D decode rows (N, in) go straight to
    ``kernel(rows in bfloat16, the module's buffer dict)`` — the dict is read at each call, so a
    buffer re-pointed by fusing or replaced by ``.to`` is the one used, without nn.Module's
    attribute lookups (~1 us a buffer) — anything else to the module's forward."""
    buffers, forward = module._buffers, module.forward
    if module.bias is not None:
        return forward

    def call(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return forward(x)
        return kernel(x.to(torch.bfloat16), buffers).to(x.dtype)
    call.module = module  # what it calls, for inspection
    return call


@functools.cache
def int8_supported() -> bool:
    """True where torch has the int8-weight kernel for this CPU (checked once, on a tiny matmul)."""
    try:
        probe = Int8WeightLinear(nn.Linear(8, 4))
        return probe(torch.ones(1, 8)).shape == (1, 4)
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


@dataclass
class Int4Blocks:
    """One weight matrix as group-wise 4-bit: w[n, g*32 + j] = (codes[n, g*32 + j] - 8) * scales[n, g] + zeros[n, g].

    codes: (N, K) uint8 in 0..15; scales, zeros: (N, K / 32) bfloat16 (what the kernel multiplies).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    exact: bool = False  # True: the model file's own 4-bit values (not re-quantised from float)

    @classmethod
    def from_q4_1(cls, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> "Int4Blocks":
        """GGUF Q4_1 blocks (w = d * q + m, d and m float16 per 32 weights) in the kernel's form:
        (q - 8) * d + (m + 8 d). Exact but for rounding d and m + 8 d to bfloat16."""
        d32, m32 = d.float(), m.float()
        return cls(codes.to(torch.uint8), d32.to(torch.bfloat16), (m32 + 8 * d32).to(torch.bfloat16), exact=True)

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "Int4Blocks":
        """Asymmetric min/max 4-bit per group of 32 input weights. weight: (N, K), K % 32 == 0."""
        rows, cols = weight.shape
        groups = weight.detach().float().reshape(rows, cols // INT4_GROUP, INT4_GROUP)
        low, high = groups.amin(-1), groups.amax(-1)
        # Round scale and zero to bfloat16 FIRST, then pick each code against the rounded values,
        # so every weight is within about half a step of what the kernel multiplies back.
        scales = ((high - low) / 15).clamp(min=1e-8).to(torch.bfloat16)
        zeros = (low + 8 * scales.float()).to(torch.bfloat16)
        codes = torch.round((groups - zeros.float()[..., None]) / scales.float()[..., None] + 8).clamp(0, 15)
        return cls(codes.reshape(rows, cols).to(torch.uint8), scales, zeros)

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32: the weights the kernel multiplies."""
        rows, cols = self.codes.shape
        codes = self.codes.float().reshape(rows, cols // INT4_GROUP, INT4_GROUP) - 8
        return (codes * self.scales.float()[..., None] + self.zeros.float()[..., None]).reshape(rows, cols)


def int4_misfit(linear: nn.Module) -> str | None:
    """Why torch's int4 kernel cannot hold this Linear, or None when it can."""
    out_features, in_features = linear.weight.shape
    if out_features % 16:
        return f"out_features {out_features} is not a multiple of 16"
    if in_features % INT4_GROUP:
        return f"in_features {in_features} is not a multiple of {INT4_GROUP}"
    return None


@dataclass
class PackedInt4:
    """Int4Blocks in torch's CPU kernel layout. The layout is this torch build's choice for this
    CPU's instruction set, so a cache of it is keyed by both (model/loading.py)."""

    weight: torch.Tensor  # (N, K / 2) uint8
    scales_and_zeros: torch.Tensor  # (K / 32, N, 2) bfloat16
    exact: bool = False

    @classmethod
    def from_blocks(cls, blocks: Int4Blocks) -> "PackedInt4":
        weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(blocks.codes.to(torch.int32), 1)
        scales_and_zeros = torch.stack([blocks.scales.t(), blocks.zeros.t()], dim=-1).contiguous()
        return cls(weight, scales_and_zeros, blocks.exact)


class Int4WeightLinear(nn.Module):
    """y = x W^T + b with W group-wise 4-bit (Int4Blocks), packed for torch's CPU int4 kernel."""

    def __init__(self, weights: Int4Blocks | PackedInt4, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        packed = weights if isinstance(weights, PackedInt4) else PackedInt4.from_blocks(weights)
        self.out_features, self.in_features = packed.weight.shape[0], packed.scales_and_zeros.shape[0] * INT4_GROUP
        self.exact = packed.exact
        self.register_buffer("weight_int4pack", packed.weight)
        self.register_buffer("scales_and_zeros", packed.scales_and_zeros)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def packed(self) -> PackedInt4:
        return PackedInt4(self.weight_int4pack, self.scales_and_zeros, self.exact)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int4WeightLinear":
        return cls(Int4Blocks.from_float(linear.weight), linear.bias)

    @property
    def quantized_weight_count(self) -> int:
        """Weights this module multiplies per token (the cost model counts them)."""
        return self.out_features * self.in_features

    # False for the rows stacked under a LoRA's base (Int4LoraLinear): they only ever run torch's kernel
    # (a q4 copy of them would be a second copy of the model's 4-bit bytes).
    q4_rows = True

    def decode_call(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``forward`` for the lean layer (``kernel_decode_call``; the q4 kernels where they run)."""
        torch_call = kernel_decode_call(self, lambda x, b: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, b["weight_int4pack"], INT4_GROUP, b["scales_and_zeros"]))

        def call(x: torch.Tensor) -> torch.Tensor:
            y = self._q4_forward(x)
            return torch_call(x) if y is None else y
        call.module = self  # type: ignore[attr-defined]
        return call

    def _q4_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """(..., in) float32 CPU rows through the project's q4 kernels where they are selected
        (model/lowbit/native_kernels.py), else None. Why for prompts too: the kernel tiles rows x
        weight rows and unpacks each weight block once for every row (decode_kernels.h), and its int16
        activations are closer to float than torch's bfloat16 ones; at 128-512 rows it measured 1.5-1.6x
        torch's kernel (1 thread, docs/RESULTS.md)."""
        if not self.q4_rows or x.dtype != torch.float32 or x.device.type != "cpu":
            return None
        blocks = q4_scan(self)
        if blocks is None:
            return None
        y = blocks(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._q4_forward(x)
        return self.torch_forward(x) if y is None else y

    def torch_forward(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` through torch's int4 kernel (bfloat16 activations), whatever the machine selects."""
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (N, in)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight_int4pack, INT4_GROUP, self.scales_and_zeros)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantized_weight(self) -> torch.Tensor:
        """(out, in) float32, read back through the kernel itself (identity activations)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.weight_int4pack, INT4_GROUP,
                                                          self.scales_and_zeros).float().t()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 weights (group {INT4_GROUP})"


def int4_supported() -> bool:
    """True where torch has the group-wise int4 CPU kernel (checked on a tiny matmul)."""
    try:
        probe = Int4WeightLinear.from_linear(nn.Linear(32, 16))
        return probe(torch.ones(1, 32)).shape == (1, 16)
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


@dataclass
class QuantizeReport:
    """What ``quantize_weights`` did: module names by how they are stored now."""

    mode: str
    int4: list[str] = field(default_factory=list)
    int8: list[str] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)  # int4 taken from the model file's own 4-bit blocks
    fallbacks: dict[str, str] = field(default_factory=dict)  # name -> why it is int8, not int4 (kernel misfit, the head)
    two_stage_head: str | None = None  # the LM head's name when it is a TwoStageHead

    @property
    def replaced(self) -> int:
        return len(self.int4) + len(self.int8)

    def summary(self) -> str:
        text = f"{self.mode} weights: {len(self.int4)} int4 modules ({len(self.exact)} exact from the model file)"
        if self.int8:
            text += f", {len(self.int8)} int8"
        if self.fallbacks:
            reasons = sorted(set(self.fallbacks.values()))
            text += f" (int8 instead of int4: {'; '.join(reasons)})"
        return text


HEAD_STAYS_INT8 = "the LM head stays int8 (4-bit logits cost measurable agreement)"


def check_low_bit_supported(model: nn.Module, mode: str) -> None:
    """A clear error where ``mode`` cannot run: not on a CPU, or no kernel in this torch build."""
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}; got {mode!r}")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"--quantize {mode} is a CPU path; the model is on {device} (use bfloat16 there)")
    if not int8_supported() or (mode == "int4" and not int4_supported()):
        raise ValueError(f"this torch build has no {mode}-weight CPU kernel; run without --quantize")


def quantize_weights(model: nn.Module, mode: str,
                     blocks: dict[str, Int4Blocks | PackedInt4] | None = None) -> QuantizeReport:
    """Replace every nn.Linear of ``model`` (layers and LM head; GPT-2's Conv1D stays) by its
    low-bit version, in place. CPU only.

    int4: a Linear whose name is in ``blocks`` takes those blocks (the model file's own 4-bit
    values), any other is quantised from its float weights; a Linear the int4 kernel cannot hold
    becomes int8 (named with the reason in the report)."""
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}; got {mode!r}")
    report = QuantizeReport(mode)
    if mode == "none":
        return report
    check_low_bit_supported(model, mode)
    blocks = blocks or {}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module_name, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            full_name = f"{module_name}.{name}" if module_name else name
            if child is head:
                setattr(module, name, _low_bit_head(child, full_name, mode, report, tied_rows(model, child)))
                continue
            setattr(module, name, _low_bit(child, full_name, mode, blocks, report))
    if report.fallbacks:
        log.info(report.summary())
    return report


def tied_rows(model: nn.Module, head: nn.Linear) -> torch.Tensor | None:
    """The input embedding's weight when the LM head shares it (tied embeddings), else None."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    return weight if weight is not None and weight is head.weight else None


def _low_bit_head(head: nn.Linear, name: str, mode: str, report: QuantizeReport,
                  tied: torch.Tensor | None = None) -> nn.Module:
    """The LM head: two-stage (4-bit scan, the top candidates rescored with the tied float rows
    or int8 rows) where the int4 kernel holds it, else int8. The head turns the last hidden state
    into logits whose small differences pick the token: at 4 bits alone the default model's
    agreement with float fell to 0.885, with int8 it is 0.977 (docs/RESULTS.md, "int4 weights");
    two-stage keeps the rescoring head's winners."""
    report.int8.append(name)
    if head.bias is None and int4_misfit(head) is None and int4_supported():
        report.two_stage_head = name
        return TwoStageHead.from_linear(head, tied_rows=tied)
    if mode == "int4":
        report.fallbacks[name] = HEAD_STAYS_INT8
    return Int8WeightLinear(head)


def _low_bit(linear: nn.Linear, name: str, mode: str, blocks: dict[str, Int4Blocks | PackedInt4],
             report: QuantizeReport) -> nn.Module:
    misfit = int4_misfit(linear) if mode == "int4" else "int8 asked for"
    if misfit is None:
        report.int4.append(name)
        if name in blocks:
            if blocks[name].exact:
                report.exact.append(name)
            return Int4WeightLinear(blocks[name], linear.bias)
        return Int4WeightLinear.from_linear(linear)
    if mode == "int4":
        report.fallbacks[name] = misfit
    report.int8.append(name)
    return Int8WeightLinear(linear)


def resolve_quantize(mode: str, device: torch.device, exact_4bit: bool = False) -> str:
    """"auto" on a CPU: int4 when the model's own weights are 4-bit blocks the kernel holds exactly
    (``exact_4bit``: the default model's GGUF) — its full model agrees 0.990 with float on the
    held-out prompts, int8's re-quantised weights 0.969, and it decodes faster at full depth (docs/RESULTS.md,
    "Speed") — else int8 (int4 re-quantised from float costs more than int8); none elsewhere."""
    if mode == "auto":
        if device.type != "cpu":
            return "none"
        if exact_4bit and int4_supported():
            return "int4"
        return "int8" if int8_supported() else "none"
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be auto or one of {', '.join(QUANTIZE_MODES)}; got {mode!r}")
    return mode


# --- fused projections (the lean decode path, model/skipdecode/lean_layer.py) ---------------------------


def fuse_low_bit(modules: list[nn.Module]) -> nn.Module | None:
    """One low-bit Linear computing ``torch.cat([m(x) for m in modules], -1)`` with one kernel call
    (q/k/v, gate/up), or None where they cannot be fused: not all int8 or all int4, biased, or a
    packed int4 layout whose rows do not concatenate on this CPU (probed, as the layout is the
    kernel's per-instruction-set choice). The originals are re-pointed at row slices of the fused
    weights, so fusing costs no second copy of them."""
    if len(modules) < 2 or any(getattr(m, "bias", None) is not None for m in modules):
        return None
    key = tuple(id(m) for m in modules)
    known = _FUSED.get(modules[0])
    if known is not None and known[0] == key:  # the same modules shared by two models: fuse once
        return known[1]
    if all(isinstance(m, Int8WeightLinear) for m in modules):
        fused = _fuse_int8(modules)
    elif all(isinstance(m, Int4WeightLinear) for m in modules):
        fused = _fuse_int4(modules)
    elif all(isinstance(m, LowBitLoraLinear) for m in modules):
        fused = _fuse_lora(modules)
    else:
        return None
    _FUSED[modules[0]] = (key, fused)
    return fused


_FUSED: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, ...], nn.Module | None]]" = weakref.WeakKeyDictionary()


def _fuse_int8(modules: list[Int8WeightLinear]) -> Int8WeightLinear:
    fused = Int8WeightLinear.from_tensors(torch.cat([m.weight_int8 for m in modules]),
                                          torch.cat([m.scales for m in modules]))
    start = 0
    for m in modules:
        end = start + m.out_features
        m.weight_int8, m.scales = fused.weight_int8[start:end], fused.scales[start:end]
        m.keep_bfloat16_copy(None if fused.weight_bf16 is None else fused.weight_bf16[start:end])
        start = end
    return fused


def _fuse_int4(modules: list[Int4WeightLinear]) -> Int4WeightLinear | None:
    packed = PackedInt4(torch.cat([m.weight_int4pack for m in modules]),
                        torch.cat([m.scales_and_zeros for m in modules], dim=1), all(m.exact for m in modules))
    fused = Int4WeightLinear(packed)
    probe = torch.linspace(-1.0, 1.0, modules[0].in_features)[None]
    with torch.no_grad():
        if not torch.equal(fused(probe), torch.cat([m(probe) for m in modules], dim=-1)):
            return None
    start = 0
    for m in modules:
        end = start + m.out_features
        m.weight_int4pack = fused.weight_int4pack[start:end]
        start = end
    return fused


# --- the skip policy beside low-bit weights -------------------------------------------------------


class LowBitLoraLinear(nn.Module):
    """y = base(x) + (x A^T) B^T: a LoRA kept BESIDE shared low-bit weights (as QLoRA runs it).

    Merging a LoRA into 4-bit weights loses its small deltas in the rounding (agreement with
    float at 2x fell to 0.545), and a merged int8 copy is a second set of weights that int4 would
    have to read at every skipping step. Kept beside, the skip policy reads the SAME low-bit
    weights as the full model plus two rank-r float matrices, and its delta stays exact. ``base``
    is shared with the original model (not copied); the scale alpha / r is folded into B."""

    def __init__(self, base: nn.Module, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("lora_a", lora_a)  # (r, in)
        self.register_buffer("lora_b", lora_b)  # (out, r), scale folded in

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    @property
    def side_weight_count(self) -> int:
        """Weights the LoRA multiplies per token beside its base's (A and B: r (in + out)); the cost model counts them."""
        return self.lora_a.numel() + self.lora_b.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + nn.functional.linear(nn.functional.linear(x, self.lora_a), self.lora_b)


def _fuse_lora(modules: list[LowBitLoraLinear]) -> nn.Module | None:
    """q/k/v (gate/up) with their LoRAs: one fused low-bit base, the A's stacked, the B's
    block-diagonal; over int4, A rides in the base's kernel call (``lean_lora``)."""
    base = fuse_low_bit([m.base for m in modules])
    if base is None:
        return None
    return lean_lora(LowBitLoraLinear(base, torch.cat([m.lora_a for m in modules]),
                                      torch.block_diag(*[m.lora_b for m in modules])))


class Int4LoraLinear(nn.Module):
    """A LoRA beside int4 weights in ONE kernel call: A's rows, quantised group-wise to 4 bits,
    are stacked under the base's rows, so the int4 matmul returns the base output and x A^T
    together; then y = base + (x A^T) B^T with B in int8 (one int8 kernel call; float where the
    int8 kernel is missing).

    Why: on a CPU the skip policy's side matmuls were a large share of a skipping layer (decode,
    1 thread, int4: 440 us a layer with the LoRA beside, 300 us without): each is a separate small
    float matmul whose call overhead exceeds its arithmetic, and A in float32 reads more bytes
    than the base's int4 rows. A's 4-bit rounding errs on the small delta, not on the base
    weights, which stay the model file's own values (merging the LoRA into 4-bit weights instead
    rounds the delta away: model/loading.py, skip_policy_weights).

    B in int8 (per output row): at rank 64 a float32 B is more bytes than the layer's own int4
    weights (q/k/v and gate/up hold block-diagonal B's: 2.6 MB a layer against 1.8 MB), and a
    skipping step streams them all; int8 reads a quarter (15 layers' B's, cold cache, 1 thread:
    2.1 ms a step in float32, 0.9 ms in int8). Its rounding errs by at most half a step of a row's
    largest B entry, on the small delta only."""

    def __init__(self, base: Int4WeightLinear, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        super().__init__()
        rank = lora_a.shape[0]
        padded = -(-rank // 16) * 16  # the kernel takes rows in multiples of 16: zero rows pad A and B
        lora_a = torch.cat([lora_a.float(), lora_a.new_zeros(padded - rank, lora_a.shape[1]).float()])
        lora_b = torch.cat([lora_b.float(), lora_b.new_zeros(lora_b.shape[0], padded - rank).float()], dim=1)
        self.side = Int4WeightLinear(Int4Blocks.from_float(lora_a))  # A alone in 4 bits: what the stacked rows hold
        self.stacked = Int4WeightLinear(PackedInt4(torch.cat([base.weight_int4pack, self.side.weight_int4pack]),
                                                   torch.cat([base.scales_and_zeros, self.side.scales_and_zeros], dim=1),
                                                   base.exact))
        self.stacked.q4_rows = False  # torch's kernel alone (forward); the native step stacks q4 blocks itself
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.bias = base.bias
        # B (out, r) with the scale alpha / r folded in: int8 rows where the kernel exists, else float.
        self.lora_b_int8 = Int8WeightLinear.from_tensors(*int8_rows(lora_b)) if int8_supported() else None
        self.lora_bt = None if self.lora_b_int8 is not None else lora_b.t().contiguous()  # (r, out)
        # Plain references for ``forward`` (nn.Module's attribute lookup of a buffer costs ~1 us);
        # this module lives only inside a lean layer and is never moved or saved.
        stacked = self.stacked._buffers
        int4_rows = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(  # noqa: E731 (bfloat16 in and out)
            x, stacked["weight_int4pack"], INT4_GROUP, stacked["scales_and_zeros"])
        b_int8 = None if self.lora_b_int8 is None else self.lora_b_int8._buffers
        self._call_args = (int4_rows, b_int8, self.lora_bt, self.out_features)

    @classmethod
    def of(cls, module: LowBitLoraLinear) -> "Int4LoraLinear | None":
        """``module`` with its A in the base's kernel call, or None where the stacked rows do not
        give the base's own output bit for bit (the packed layout is this CPU's choice)."""
        if not isinstance(module.base, Int4WeightLinear) or module.base.bias is not None:
            return None
        fused = cls(module.base, module.lora_a, module.lora_b)
        probe = torch.linspace(-1.0, 1.0, module.in_features)[None]
        with torch.no_grad():
            both = fused.stacked.torch_forward(probe)  # the packed layout's check: torch's kernel on each
            if not (torch.equal(both[:, : module.out_features], module.base.torch_forward(probe))
                    and torch.equal(both[:, module.out_features:], fused.side.torch_forward(probe))):
                return None
        module.base.weight_int4pack = fused.stacked.weight_int4pack[: module.out_features]  # no second copy
        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        int4_rows, b_int8, lora_bt, out = self._call_args
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        both = int4_rows(rows.to(torch.bfloat16))  # (N, out + r) bfloat16: base | x A^T
        if b_int8 is not None:
            delta = torch._weight_int8pack_mm(both[:, out:], b_int8["weight_int8"], b_int8["scales"])  # a strided view is fine
            y = both[:, :out].to(x.dtype, copy=True).add_(delta)  # (N, out), its own contiguous rows in any dtype
        else:
            y = torch.addmm(both[:, :out].to(x.dtype), both[:, out:].to(x.dtype), lora_bt.to(x.dtype))
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], out)


def lean_lora(module: nn.Module) -> nn.Module:
    """A LowBitLoraLinear over int4 weights as an Int4LoraLinear (built once per module), anything
    else unchanged."""
    if not isinstance(module, LowBitLoraLinear):
        return module
    known = _LEAN_LORA.get(module)
    if known is None:
        known = _LEAN_LORA[module] = (Int4LoraLinear.of(module) or module,)
    return known[0]


# The project's own projection modules (no hooks are ever registered on them): the lean layer
# calls their forward directly (model/skipdecode/lean_layer.py, direct_call).
LOW_BIT_PROJECTIONS = (Int8WeightLinear, Int4WeightLinear, LowBitLoraLinear, Int4LoraLinear)

_LEAN_LORA: "weakref.WeakKeyDictionary[nn.Module, tuple[nn.Module]]" = weakref.WeakKeyDictionary()


# --- the LM head ------------------------------------------------------------------------------------


class TwoStageHead(nn.Module):
    """The LM head in two stages: a 4-bit scan of the whole vocabulary finds the ``candidates``
    best tokens, and only those are rescored exactly: with the float32 rows of the input embedding
    when the head is tied to it (SmolLM2's is: those rows are in memory anyway, so the winner is
    the float head's), else with int8 rows (the int8 head's values).

    Why: the head is 28M of SmolLM2's 135M weights, a third of what a 2x step reads; in 4 bits it
    reads half as many bytes. A 4-bit head ALONE cost agreement (0.977 -> 0.885 with float): its
    logits are close, but the winner among near-equal top tokens moves. The rescoring gives the
    top candidates float (tied) or int8 precision, so the argmax is that head's whenever its
    winner is among the 4-bit scan's top ``candidates`` (32 of 49,152). Logits outside the
    candidates keep their 4-bit values: a sampled tail token's probability moves by the 4-bit error."""

    def __init__(self, scan: "Int4WeightLinear", exact_int8: torch.Tensor | None = None,
                 exact_scales: torch.Tensor | None = None, candidates: int = 32,
                 tied_rows: torch.Tensor | None = None) -> None:
        super().__init__()
        if (tied_rows is None) == (exact_int8 is None):
            raise ValueError("TwoStageHead rescores with tied float rows OR int8 rows (exactly one)")
        self.scan = scan
        # The embedding's own tensor, held in a tuple: not a parameter or buffer of the head (it
        # belongs to the embedding, and the start-up cache must not store it twice).
        self._tied = (tied_rows,) if tied_rows is not None else None  # (V, C) float
        if exact_int8 is not None:
            self.register_buffer("exact_int8", exact_int8)  # (V, C) int8 rows
            self.register_buffer("exact_scales", exact_scales)  # (V,) bfloat16
        self.candidates = min(candidates, scan.out_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, candidates: int = 32,
                    tied_rows: torch.Tensor | None = None) -> "TwoStageHead":
        """``tied_rows``: the input embedding's weight when ``linear`` shares it (rescoring in float)."""
        scan = Int4WeightLinear.from_linear(linear)
        if tied_rows is not None:
            return cls(scan, candidates=candidates, tied_rows=tied_rows)
        exact = Int8WeightLinear(linear)
        return cls(scan, exact.weight_int8, exact.scales, candidates)

    @property
    def tied(self) -> bool:
        return self._tied is not None

    @property
    def in_features(self) -> int:
        return self.scan.in_features

    @property
    def out_features(self) -> int:
        return self.scan.out_features

    bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and x.device.type == "cpu":
            blocks = q4_scan(self.scan)
            if blocks is not None:  # the scan, the top candidates and their rescoring in one native call
                exact, scales = (self._tied[0], None) if self._tied is not None else (self.exact_int8, self.exact_scales)
                if exact.dtype in (torch.float32, torch.int8) and exact.is_contiguous():
                    rows = blocks.two_stage(x.reshape(-1, self.in_features), exact, scales, self.candidates)
                    return rows.reshape(*x.shape[:-1], self.out_features)
        logits = self.scan_logits(x)  # (..., V): 4-bit
        top = logits.topk(self.candidates, dim=-1).indices  # (..., K)
        if self._tied is not None:
            rows = self._tied[0][top].to(x.dtype)  # (..., K, C) float
            exact = (rows @ x.unsqueeze(-1)).squeeze(-1)  # (..., K)
        else:
            rows = self.exact_int8[top].to(x.dtype)  # (..., K, C)
            exact = (rows @ x.unsqueeze(-1)).squeeze(-1) * self.exact_scales[top].to(x.dtype)  # (..., K)
        return logits.scatter(-1, top, exact)

    def ranking(self, x: torch.Tensor) -> torch.Tensor:
        """The logits the candidates are picked from: where the native head runs, its scan with 8-bit
        activations on AVX-512 (a ranking; the 4-bit weights err ~10x more; AVX2's kernels keep 16 bits),
        else ``scan_logits``."""
        if x.dtype == torch.float32 and x.device.type == "cpu":
            blocks = q4_scan(self.scan)
            if blocks is not None:
                return blocks(x.reshape(-1, self.in_features), coarse=True).reshape(*x.shape[:-1], self.out_features)
        return self.scan_logits(x)

    def scan_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The 4-bit logits: the native q4 kernel where it is selected (float32 rows on the CPU;
        model/lowbit/native_kernels.py), else torch's int4 kernel."""
        if x.dtype == torch.float32 and x.device.type == "cpu":
            blocks = q4_scan(self.scan)
            if blocks is not None:
                return blocks(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        return self.scan(x)

    def prepare(self) -> None:
        """Build now what the first call would (the scan's q4 blocks where the q4 kernels run: ~0.2 s
        for SmolLM2's vocabulary), at load rather than inside a visitor's first request; on huge pages,
        as every step streams them (Q4Blocks.place)."""
        blocks = q4_scan(self.scan)
        if blocks is not None:
            blocks.place()

    def dequantized_weight(self) -> torch.Tensor:
        """(out, in) float32: the rows the winning candidates are scored with."""
        if self._tied is not None:
            return self._tied[0].detach().float()
        return self.exact_int8.float() * self.exact_scales.float()[:, None]

    def extra_repr(self) -> str:
        rows = "tied float rows" if self.tied else "int8 rows"
        return (f"in_features={self.in_features}, out_features={self.out_features}, 4-bit scan, "
                f"top {self.candidates} rescored with {rows}")
