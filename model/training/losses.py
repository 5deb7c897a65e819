"""Training losses of the skip policy (besides the KL in model.training.scoring): cross-entropy on user
data, hidden-state matching where a generated position enters the upper block, and unlikelihood
on the tokens that keep a loop going."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.skipdecode.schedule import ScheduleConfig
from model.skipdecode.skip_policy import entry_layers
from model.training.data import loop_start, repeated_ngram_ends


def cross_entropy_loss(student_logits, ids, target_mask, prompt_len: int, flip_weight: float = 0.0) -> torch.Tensor:
    """Cross-entropy on the target tokens, averaged over real targets; with ``flip_weight`` a position
    whose student argmax is not the target token weighs 1 + flip_weight (a weighted mean): where the
    targets are a model's greedy text, the tokens greedy decoding would get wrong (a missed stop)."""
    targets = ids[:, prompt_len:]  # (B, N)
    losses = F.cross_entropy(student_logits.float().transpose(1, 2), targets, reduction="none")  # (B, N)
    weight = target_mask.float()
    if flip_weight:
        flipped = student_logits.detach().argmax(-1) != targets
        weight = weight * (1.0 + flip_weight * flipped.float())
    return (losses * weight).sum() / weight.sum().clamp(min=1)


def loop_masks(targets: torch.Tensor, target_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL mask, negatives) of a batch's targets (B, N) and target mask (B, N): the KL covers each
    target up to where it starts to loop (model.training.data.loop_start, as --trim-loops cuts it); the
    negatives are the tokens from there on that complete a 4-gram the target already holds."""
    kl_mask = torch.zeros_like(target_mask)
    negatives = torch.zeros_like(target_mask)
    for row, (tokens, length) in enumerate(zip(targets.tolist(), target_mask.sum(1).tolist())):
        tokens = tokens[:length]
        start = loop_start(tokens)
        kl_mask[row, :start] = True
        flags = repeated_ngram_ends(tokens)
        negatives[row, start:length] = torch.tensor(flags[start:], dtype=torch.bool)
    return kl_mask, negatives


def unlikelihood_loss(student_logits, ids, negatives, prompt_len: int) -> torch.Tensor:
    """Mean of -log(1 - p(token)) over the flagged positions (sequence-level unlikelihood, Welleck
    et al. 2019): lowers the student's probability of each token that continues a loop, where the
    KL to a teacher that loops too would keep it."""
    if not bool(negatives.any()):
        return student_logits.sum() * 0.0
    logits = student_logits[negatives].float()  # (K, V): only the flagged positions (V is large)
    targets = ids[:, prompt_len:][negatives].unsqueeze(-1)  # (K, 1)
    # log(1 - p) as the log-mass of every OTHER token: exact and with a gradient even where p
    # rounds to 1 (a confident loop, the case that matters), unlike log(1 - exp(log p)).
    log_rest = torch.logsumexp(logits.scatter(-1, targets, float("-inf")), -1) - torch.logsumexp(logits, -1)  # (K,)
    return -log_rest.mean()


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
