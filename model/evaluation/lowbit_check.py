"""`python -m model lowbit-check`: low-bit weights against float, through the cached decoder.

Teacher-forced agreement of int4/int8 weights with the float weights, on the held-out prompts
(assets/prompts/eval.jsonl), for the full model AND for SkipDecode with the skip-policy adapter
(the LoRA-merged weights, quantised the same way): both weight sets are fed the float full
model's greedy continuation one token at a time (``SkipDecoder.forced_predictions``), and
agreement is the share of positions where the low-bit argmax equals the float one. At full
depth the float argmax IS the continuation, so that figure equals eval's ``--quantize`` row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from model.generation.generator import TextGenerator
from model.generation.schedules import ScheduleRequest
from model.loading import load_model
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.schedule import ScheduleConfig, full_schedule
from model.training.data import DEFAULT_EVAL_PROMPTS, read_prompts, teacher_continuations


@dataclass
class LowBitCheckConfig:
    quantize: tuple[str, ...] = ("int4",)
    speedups: tuple[float, ...] = (1.0, 2.0)  # 1.0: the full model (original weights)
    prompts: str = str(DEFAULT_EVAL_PROMPTS)
    max_prompts: int | None = None
    tokens: int = 48
    batch_size: int = 16
    model: str | None = None
    adapter: str | None = "auto"


@dataclass
class LowBitRow:
    weights: str
    target_speedup: float
    agreement: float  # share of positions where the low-bit argmax equals the float argmax
    positions: int


@dataclass
class LowBitReport:
    model: str
    adapter: str | None
    num_prompts: int
    tokens: int
    rows: list[LowBitRow] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        lines = [f"{self.model} ({'adapter' if self.adapter else 'no adapter'}), {self.num_prompts} held-out prompts, "
                 f"{self.tokens}-token float greedy continuations, teacher-forced through the cached decoder.", "",
                 "| weights | target | agreement with float | positions |", "|---|---|---|---|"]
        lines += [f"| {r.weights} | {r.target_speedup:g}x | {r.agreement:.4f} | {r.positions} |" for r in self.rows]
        return "\n".join(lines)


def run_lowbit_check(config: LowBitCheckConfig, progress: Callable[[str], None] = print) -> LowBitReport:
    reference = TextGenerator(load_model(config.model, device="cpu", adapter=config.adapter, quantize="none"))
    prompts = read_prompts(config.prompts, config.max_prompts)
    examples = teacher_continuations(reference, prompts, max_new_tokens=config.tokens, max_prompt_tokens=10**9,
                                     batch_size=config.batch_size)
    schedules = {s: _schedule(reference, s, config.tokens) for s in config.speedups}
    report = LowBitReport(model=reference.loaded.name, adapter=reference.loaded.adapter_path,
                          num_prompts=len(prompts), tokens=config.tokens)
    float_predictions = {s: _predict(reference, examples, schedules[s], config.batch_size) for s in config.speedups}
    for weights in config.quantize:
        low_bit = TextGenerator(load_model(config.model, device="cpu", adapter=config.adapter, quantize=weights))
        for speedup, schedule in schedules.items():
            same = total = 0
            for (ours, valid), (theirs, _) in zip(_predict(low_bit, examples, schedule, config.batch_size),
                                                 float_predictions[speedup]):
                same += int(((ours == theirs) & valid).sum())
                total += int(valid.sum())
            report.rows.append(LowBitRow(weights, speedup, round(same / max(1, total), 4), total))
            progress(f"{weights} at {speedup:g}x: agreement with float {report.rows[-1].agreement:.4f} over {total} positions")
    return report


def _schedule(generator, speedup: float, tokens: int) -> ScheduleConfig:
    if speedup == 1.0:
        return full_schedule(generator.num_layers, tokens)
    return generator.schedules.schedule_for(ScheduleRequest(target_speedup=speedup), tokens).config  # the product's shape


def _predict(generator, examples, schedule: ScheduleConfig, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per batch: (argmax (B, N), valid (B, N)) of the skip decoder fed each example's target."""
    decoder: SkipDecoder = generator.skip_decoder if schedule.min_layers < schedule.num_layers else generator.full_decoder
    pad = generator.loaded.pad_token_id
    out = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        width, steps = max(len(e.prompt) for e in chunk), max(len(e.target) for e in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        targets = torch.full((len(chunk), steps), pad, dtype=torch.long)
        valid = torch.zeros((len(chunk), steps), dtype=torch.bool)
        for row, example in enumerate(chunk):
            ids[row, width - len(example.prompt):] = torch.tensor(example.prompt)
            mask[row, width - len(example.prompt):] = 1
            targets[row, :len(example.target)] = torch.tensor(example.target)
            valid[row, :len(example.target)] = True
        out.append((decoder.forced_predictions(ids, mask, targets, schedule).cpu(), valid))
    return out
