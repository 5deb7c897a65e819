"""The held-out curve of a training run: a fixed subset of the held-out prompts (never trained
on), the full model's greedy continuations of them and its logits, and the student's
teacher-forced agreement, KL and perplexity ratio at 1.5x / 2x / 3x every few steps."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from model.skipdecode.schedule import full_schedule, max_layer_speedup, solve_schedule
from model.training.data import DEFAULT_EVAL_PROMPTS, batches_of, cached_examples, read_prompts, teacher_continuations
from model.training.scoring import skip_policy_logits, teacher_forced_scores

HELDOUT_SPEEDUPS = (1.5, 2.0, 3.0)


@dataclass
class HeldOut:
    """A fixed held-out subset: the full model's greedy continuations and its logits on them."""

    batches: list[tuple]
    teacher_logits: list[torch.Tensor]  # (B, N, V) per batch
    teacher_nll: float  # the full model's mean NLL of its own continuations
    tokens: int


def heldout_set(generator, config, cache_file: Path) -> HeldOut | None:
    """The first ``config.eval_prompts`` held-out prompts (None when the curve is off or the run
    trains on user data, where the full model's text is not the target)."""
    if not config.eval_every or config.data:
        return None
    prompts = read_prompts(DEFAULT_EVAL_PROMPTS, config.eval_prompts)
    examples = cached_examples(cache_file, lambda: teacher_continuations(
        generator, prompts, max_new_tokens=config.eval_tokens, batch_size=config.teacher_batch_size))
    batches = batches_of(examples, 8, generator.loaded.pad_token_id, generator.loaded.device)
    model, num_layers = generator.loaded.model, generator.num_layers
    with torch.inference_mode():
        teacher = [skip_policy_logits(model, ids, mask, full_schedule(num_layers), p).float()
                   for ids, mask, _, p in batches]
    full = teacher_forced_scores(model, batches, lambda steps: full_schedule(num_layers))
    return HeldOut(batches=batches, teacher_logits=teacher, teacher_nll=full.nll, tokens=config.eval_tokens)


def heldout_scores(model, bridge, heldout: HeldOut, config, num_layers: int) -> dict:
    """Teacher-forced agreement, KL and perplexity ratio at 1.5x, 2x and 3x (linear decay over
    the held-out continuation length, the run's placement), plus 1.0x."""
    scores: dict = {}
    was_training = model.training
    model.eval()
    try:
        for speedup in (1.0,) + HELDOUT_SPEEDUPS:
            if speedup > max_layer_speedup(num_layers, config.warmup_layers):
                continue  # unreachable on a shallow model
            if speedup == 1.0:
                schedule = full_schedule(num_layers)
            else:
                schedule = solve_schedule(num_layers, speedup, decay="linear", warmup=config.warmup_layers,
                                          order=config.order, ranking=config.ranking, decay_length=heldout.tokens,
                                          num_steps=max(1, heldout.tokens - 1)).config
            result = teacher_forced_scores(model, heldout.batches, lambda steps, s=schedule: s, bridge,
                                           heldout.teacher_logits)
            scores[f"{speedup:g}x"] = {"agreement": round(result.agreement, 4), "kl": round(result.kl, 4),
                                       "perplexity_ratio": round(math.exp(result.nll - heldout.teacher_nll), 4)}
    finally:
        model.train(was_training)
    return scores


# --- an adapter's lineage: several training runs, one continuing the other -----------------------

_LOG_LINE = re.compile(r"^(?:untrained|step (\d+) \([\d.]+ min\)) held-out: (.*)$")
_LOG_SCORE = re.compile(r"([\d.]+x) agree ([\d.]+) KL ([\d.]+)")


@dataclass
class Stage:
    """One training run of an adapter's lineage: its name, batch size and the held-out lines its
    log printed ("untrained held-out: ..." and "step N (M min) held-out: ...")."""

    name: str
    batch_size: int
    log_text: str
    note: str = ""  # what the run changed, for the figure's caption


def parse_heldout_log(text: str) -> list[dict]:
    """The held-out rows of a training log, as {"step", "heldout": {"2x": {"agreement", "kl"}}}
    (the untrained row is step 0); progress-bar carriage returns are read as line breaks."""
    rows = []
    for line in text.replace("\r", "\n").splitlines():
        match = _LOG_LINE.match(line.strip())
        if match:
            scores = {name: {"agreement": float(agree), "kl": float(kl)}
                      for name, agree, kl in _LOG_SCORE.findall(match.group(2))}
            rows.append({"step": int(match.group(1) or 0), "heldout": scores})
    return rows


def lineage_curve(stages: list[Stage]) -> list[dict]:
    """One held-out curve over runs that each continued the previous one's adapter: rows carry
    their run ("stage", and "stage_note" when it has one), its step, and the training sequences seen since the first run began
    ("sequences": steps x batch size, summed over the runs), the x-axis on which runs of
    different batch sizes compare. A later run's step-0 row repeats the previous run's end and
    is dropped."""
    curve: list[dict] = []
    seen = 0
    for index, stage in enumerate(stages):
        rows = parse_heldout_log(stage.log_text)
        if not rows:
            raise ValueError(f"stage {stage.name!r}: no held-out lines in its log")
        for row in rows:
            if index > 0 and row["step"] == 0:
                continue
            curve.append(dict(row, stage=stage.name, sequences=seen + row["step"] * stage.batch_size,
                              **({"stage_note": stage.note} if stage.note else {})))
        seen += rows[-1]["step"] * stage.batch_size
    return curve


def stage_notes(curve: list[dict]) -> list[tuple[str, str]]:
    """(stage, note) of a lineage curve's runs in order, for the runs that have a note."""
    notes: dict[str, str] = {}
    for row in curve:
        if row.get("stage_note"):
            notes.setdefault(row["stage"], row["stage_note"])
    return list(notes.items())
