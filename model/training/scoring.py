"""Teacher-forced scoring under a skip schedule: the student's logits, and agreement / NLL / KL
against the full model, over collated batches. Used by training (the loss and the held-out
curve) and by evaluation (the quality report), so both measure the same thing.

A batch is (ids (B, P + N), mask (B, P + N), target_mask (B, N), P) from model.training.data.collate:
generated position P + k is decode step k, exactly as in the lock-step decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from model.skipdecode.decoder import execution_mask, masked_forward, masked_forward_after_prompt
from model.skipdecode.schedule import ScheduleConfig
from model.skipdecode.skip_policy import EntryBridge, gated
from model.training.prompt_store import PromptStore


def skip_policy_logits(model, ids, mask, schedule: ScheduleConfig, prompt_len: int, *,
                       bridge: EntryBridge | None = None, hidden_states: list | None = None,
                       prompts: PromptStore | None = None) -> torch.Tensor:
    """Logits (B, N, V) predicting target token k at position P - 1 + k, under ``schedule``.

    A gated LoRA (skip_policy.install_lora_gate) acts only at positions that bypass layers.
    ``prompts``: nothing trainable acts on the prompt (a gated LoRA, no full fine-tuning), so where the
    prompt runs every layer its keys and values come from the store (each prompt prefilled once, without
    gradients) and only the generated positions run (decoder.masked_forward_after_prompt: the same
    logits, a fraction of the compute when the prompt is long).
    """
    executes = execution_mask(schedule, prompt_len, ids.shape[1])
    batch = ids.shape[0]
    if prompts is not None and hidden_states is None and bool(executes[:prompt_len].all()):
        cache, first = prompts.batch(model, ids, mask, prompt_len)
        with gated(model, executes[prompt_len:], batch):
            rest = masked_forward_after_prompt(model, ids, mask, executes, cache, prompt_length=prompt_len,
                                               bridge=bridge)
        return torch.cat([first, rest[:, :-1]], dim=1)
    with gated(model, executes, batch):
        logits = masked_forward(model, ids, mask, executes, logits_from=prompt_len - 1, bridge=bridge,
                                hidden_states=hidden_states)
    return logits[:, :-1]


def kl_per_position(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) at every position: (B, N, V) x2 -> (B, N)."""
    teacher = F.log_softmax(teacher_logits.float(), dim=-1)
    student = F.log_softmax(student_logits.float(), dim=-1)
    return (teacher.exp() * (teacher - student)).sum(-1)


def distillation_loss(student_logits, teacher_logits, target_mask, flip_weight: float = 0.0) -> torch.Tensor:
    """KL(teacher || student) per target position, averaged over real targets; with ``flip_weight``
    a position whose student argmax differs from the teacher's weighs 1 + flip_weight (a weighted mean)."""
    kl = kl_per_position(student_logits, teacher_logits)  # (B, N)
    weight = target_mask.float()
    if flip_weight:
        flipped = student_logits.detach().argmax(-1) != teacher_logits.argmax(-1)  # (B, N)
        weight = weight * (1.0 + flip_weight * flipped.float())
    return (kl * weight).sum() / weight.sum().clamp(min=1)


@dataclass(frozen=True)
class Scores:
    """Means over real target positions."""

    agreement: float  # the student's argmax == the target token (the full model's greedy token)
    nll: float  # the target token's negative log-likelihood under the student
    kl: float | None  # KL(full model || student), when the full model's logits were given
    # Per example, in batch order: (agreeing positions, NLL sum, real target positions); the
    # means above pool these. A paired comparison of two models resamples them.
    per_example: tuple[tuple[float, float, float], ...] = ()


def teacher_forced_scores(model, batches: Sequence[tuple], schedule_for: Callable[[int], ScheduleConfig],
                          bridge: EntryBridge | None = None,
                          teacher_logits: Sequence[torch.Tensor] | None = None) -> Scores:
    """Score ``model`` under ``schedule_for(N)`` over ``batches``; KL needs the teacher's logits per batch."""
    kl = 0.0
    per_example: list[tuple[float, float, float]] = []
    # no_grad, not inference_mode: training calls this between steps, and inference tensors
    # left in a module's buffers would break the next backward.
    with torch.no_grad():
        for index, (ids, mask, target_mask, prompt_len) in enumerate(batches):
            logits = skip_policy_logits(model, ids, mask, schedule_for(target_mask.shape[1]), prompt_len,
                                        bridge=bridge).float()  # (B, N, V)
            targets = ids[:, prompt_len:]
            weight = target_mask.float()
            agree = ((logits.argmax(-1) == targets).float() * weight).sum(1)  # (B,)
            nll = (F.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * weight).sum(1)  # (B,)
            per_example += zip(agree.tolist(), nll.tolist(), weight.sum(1).tolist())
            if teacher_logits is not None:
                kl += float((kl_per_position(logits, teacher_logits[index]) * weight).sum())
    count = max(sum(row[2] for row in per_example), 1.0)
    return Scores(agreement=sum(row[0] for row in per_example) / count, nll=sum(row[1] for row in per_example) / count,
                  kl=kl / count if teacher_logits is not None else None, per_example=tuple(per_example))
