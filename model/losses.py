"""Training losses of the skip policy (besides the KL in model.scoring): cross-entropy on user
data and hidden-state matching where a generated position enters the upper block."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.schedule import ScheduleConfig
from model.skip_policy import entry_layers


def cross_entropy_loss(student_logits, ids, target_mask, prompt_len: int) -> torch.Tensor:
    targets = ids[:, prompt_len:]
    losses = F.cross_entropy(student_logits.float().transpose(1, 2), targets, reduction="none")
    return (losses * target_mask).sum() / target_mask.sum().clamp(min=1)


def _relative_error(student: torch.Tensor, teacher: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean over weighted positions of ||s - t||^2 / ||t||^2. student/teacher (B, T, C), weight (B, T)."""
    error = (student.float() - teacher.float()).pow(2).sum(-1) / teacher.float().pow(2).sum(-1).clamp(min=1e-6)
    return (error * weight).sum() / weight.sum().clamp(min=1)


def hidden_matching_loss(student_states: list, teacher_states: list, schedule: ScheduleConfig,
                         prompt_len: int, target_mask: torch.Tensor) -> torch.Tensor:
    """Relative error of the hidden state where a generated position ENTERS the upper block
    (after the bridge) and of the final hidden state, against the full model's at the same layer.

    states: L + 1 tensors (B, T, C), the input of every layer then the final output.
    """
    weight = target_mask.float()  # generated positions P .. P + N - 1
    generated = slice(prompt_len, prompt_len + target_mask.shape[1])
    loss = _relative_error(student_states[-1][:, generated], teacher_states[-1][:, generated], weight)
    by_entry: dict[int, list[int]] = {}
    for k in range(target_mask.shape[1]):
        for layer in entry_layers(schedule.step_layers(k)):
            by_entry.setdefault(layer, []).append(k)
    for layer, steps in by_entry.items():
        columns = torch.tensor([prompt_len + k for k in steps], device=target_mask.device)
        loss = loss + _relative_error(student_states[layer][:, columns], teacher_states[layer][:, columns],
                                      weight[:, steps]) * len(steps) / target_mask.shape[1]
    return loss
