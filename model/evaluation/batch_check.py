"""`python -m model batch-check`: a row of a shared batch against the same job run alone.

The playground runs a class's jobs as ONE batch (app/serving/batcher.py): their prompts left padded
after the common start they share, read once (``shared_prefix_padded``), then SkipDecode's rows step
together. Numerically that is not the job alone: other matrix shapes, the low-bit kernels' batched
paths, a prefill split in two. This check says how much it matters: each held-out prompt's greedy
continuation run ALONE (batch 1, the product's weights) is fed, teacher-forced, to the batched path
(``batch_size`` prompts at a time, laid out as the batcher lays them out) one token at a time
(``SkipDecoder.forced_predictions``); agreement is the share of positions where the batched argmax
is the token the job alone chose. For the full model and for SkipDecode at each speedup.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from model.common.hardware import cpu_flags, cpu_model
from model.generation.generator import TextGenerator
from model.generation.runs import GenerationRequest
from model.generation.schedules import ScheduleRequest
from model.loading import load_model
from model.skipdecode.decoder import shared_prefix_padded
from model.skipdecode.schedule import ScheduleConfig
from model.training.data import DEFAULT_EVAL_PROMPTS, read_prompts


@dataclass
class BatchCheckConfig:
    speedups: tuple[float, ...] = (1.0, 2.0)  # 1.0: the full model
    prompts: str = str(DEFAULT_EVAL_PROMPTS)
    max_prompts: int | None = 64
    tokens: int = 48
    batch_size: int = 16
    model: str | None = None
    adapter: str | None = "auto"
    quantize: str = "auto"  # the product's weights (int4 on a CPU)


@dataclass
class BatchCheckRow:
    target_speedup: float
    agreement: float  # share of positions where the batched argmax is the token the job alone chose
    positions: int
    shared_prefix_tokens: list[int]  # per batch: the common start read once


@dataclass
class BatchCheckReport:
    model: str
    weights: str
    num_prompts: int
    tokens: int
    batch_size: int
    cpu: str
    cpu_flags: list[str]
    rows: list[BatchCheckRow] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        lines = [f"{self.model} ({self.weights}), {self.num_prompts} held-out prompts, each one's {self.tokens}-token "
                 f"greedy continuation alone fed to batches of {self.batch_size} (common start read once); "
                 f"CPU flags {' '.join(self.cpu_flags) or 'none'}.", "",
                 "| target | agreement with the job alone | positions | common start read once |", "|---|---|---|---|"]
        lines += [f"| {r.target_speedup:g}x | {r.agreement:.4f} | {r.positions} | "
                  f"{', '.join(map(str, r.shared_prefix_tokens))} tokens |" for r in self.rows]
        return "\n".join(lines)


def run_batch_check(config: BatchCheckConfig, progress: Callable[[str], None] = print) -> BatchCheckReport:
    generator = TextGenerator(load_model(config.model, device="cpu", adapter=config.adapter, quantize=config.quantize))
    prompts = read_prompts(config.prompts, config.max_prompts)
    if not prompts:
        raise ValueError(f"no prompts in {config.prompts}")
    report = BatchCheckReport(model=generator.loaded.name, weights=generator.loaded.weights, num_prompts=len(prompts),
                              tokens=config.tokens, batch_size=config.batch_size, cpu=cpu_model(),
                              cpu_flags=cpu_flags())
    for speedup in config.speedups:
        schedule = generator.schedules.schedule_for(_schedule_request(speedup), config.tokens).config
        alone = [_alone(generator, prompt, speedup, config.tokens) for prompt in prompts]
        same = total = 0
        prefixes = []
        for start in range(0, len(prompts), config.batch_size):
            agreed, counted, prefix = _batched_agreement(generator, prompts[start:start + config.batch_size],
                                                         alone[start:start + config.batch_size], schedule)
            same, total = same + agreed, total + counted
            prefixes.append(prefix)
        report.rows.append(BatchCheckRow(speedup, round(same / max(1, total), 4), total, prefixes))
        progress(f"{speedup:g}x: agreement with the job alone {report.rows[-1].agreement:.4f} over {total} positions")
    return report


def _alone(generator: TextGenerator, prompt: str, speedup: float, tokens: int) -> list[int]:
    """The job alone: one prompt, batch 1, greedy, under the product's schedule at ``speedup``."""
    request = GenerationRequest(prompts=(prompt,), schedule=_schedule_request(speedup), max_new_tokens=tokens)
    return list(generator.generate(request).decode.tokens[0])


def _schedule_request(speedup: float) -> ScheduleRequest:
    """The product's schedule at ``speedup`` (1: the full model)."""
    return ScheduleRequest(full=True) if speedup == 1.0 else ScheduleRequest(target_speedup=speedup)


def _batched_agreement(generator: TextGenerator, prompts: list[str], alone: list[list[int]],
                       schedule: ScheduleConfig) -> tuple[int, int, int]:
    """(positions agreeing, positions compared, the common start's tokens) for one batch."""
    rows = generator.text.token_rows(prompts)
    ids, mask, prefix = shared_prefix_padded(rows, generator.loaded.pad_token_id)
    steps = max(len(tokens) for tokens in alone)
    targets = torch.full((len(rows), steps), generator.loaded.pad_token_id, dtype=torch.long)
    valid = torch.zeros((len(rows), steps), dtype=torch.bool)
    for row, tokens in enumerate(alone):
        targets[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        valid[row, :len(tokens)] = True
    decoder = generator.decoder_for(ScheduleRequest(full=schedule.min_layers >= schedule.num_layers))
    predicted = decoder.forced_predictions(ids, mask, targets, schedule, shared_prefix=prefix).cpu()
    return int(((predicted == targets) & valid).sum()), int(valid.sum()), prefix
