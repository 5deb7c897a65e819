"""A low-bit weight path for CPU: int8 weights (per output channel), activations in bfloat16.

Why weight-only: batch-1 decoding on a CPU is bound by reading the weights (SmolLM2-135M moves
540 MB of float32 per token); int8 weights move a quarter of that. Quantising the ACTIVATIONS
as well (torch.ao's dynamic quantisation) was measured on SmolLM2-135M and loses half of the
full model's next-token agreement (0.43-0.51 teacher-forced against float32): its residual
stream has large outlier dimensions that one activation scale per tensor cannot hold. Weight-only
int8 keeps 0.96 agreement (README, "Speed").

The matmul is torch's own CPU kernel for int8 weights with bfloat16 activations
(``torch._weight_int8pack_mm``, the kernel behind gpt-fast's and torchao's int8 weight-only CPU
path); everything else (norms, attention, the KV cache, the residual stream) stays in the model's
dtype. Quantising is in place: each nn.Linear of the model becomes an Int8WeightLinear.
"""

from __future__ import annotations

import torch
from torch import nn

QUANTIZE_MODES = ("none", "int8")


class Int8WeightLinear(nn.Module):
    """y = x W^T + b with W stored as int8 per output channel (symmetric, scale = max|w| / 127)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # (out, in)
        # The kernel takes bfloat16 scales: round them FIRST and quantise with the rounded value,
        # so each weight is within half a step of what the kernel multiplies back.
        scales = (weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0).to(torch.bfloat16)  # (out,)
        steps = scales.float()[:, None]
        self.register_buffer("weight_int8", torch.round(weight / steps).clamp(-128, 127).to(torch.int8))
        self.register_buffer("scales", scales)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (N, in)
        y = torch._weight_int8pack_mm(flat, self.weight_int8, self.scales)  # (N, out), bfloat16
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight_int8.float() * self.scales.float()[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def int8_supported() -> bool:
    """True where torch has the int8-weight kernel for this CPU (checked on a tiny matmul)."""
    try:
        probe = Int8WeightLinear(nn.Linear(8, 4))
        return probe(torch.ones(1, 8)).shape == (1, 4)
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def quantize_weights(model: nn.Module, mode: str) -> int:
    """Replace every nn.Linear of ``model`` (layers and LM head; GPT-2's Conv1D stays) by its int8
    version, in place. Returns the number of replaced modules. CPU only."""
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}; got {mode!r}")
    if mode == "none":
        return 0
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"--quantize int8 is a CPU path; the model is on {device} (use bfloat16 there)")
    if not int8_supported():
        raise ValueError("this torch build has no int8-weight CPU kernel; run without --quantize")
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8WeightLinear(child))
                replaced += 1
    return replaced


def resolve_quantize(mode: str, device: torch.device) -> str:
    """"auto": int8 on CPU (its measured cost is negligible, README), none elsewhere."""
    if mode == "auto":
        return "int8" if device.type == "cpu" and int8_supported() else "none"
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be auto or one of {', '.join(QUANTIZE_MODES)}; got {mode!r}")
    return mode
