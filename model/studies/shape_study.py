"""The schedule-shape study: ``python -m model shape-study``.

At a fixed layer speedup the solver's default shape starts deep and decays to almost nothing
(2x on the default model: 28 -> 1 layers, the last tokens through 1-5 layers). Is that the best
use of the layer budget for the text a user reads? Every arm spends the SAME budget (the solver
hits the same layer speedup) with a different shape: linear decay with a floor of at least F
layers per step (F = 1 is the solver's default), or a flat (constant) depth. Each arm is judged
by the free-running measures of ``eval`` on the held-out prompts: the original model's
perplexity of the text (as a ratio to its own), repetition and fact retention, next to
teacher-forced agreement. Results: assets/study/shape.json and shape.md, rewritten after every
row so a long run can be read while it goes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from model.common.hardware import cpu_summary
from model.evaluation.evaluation import EvalConfig, evaluate_shapes
from model.evaluation.reporting import write_result_files
from model.training.data import DEFAULT_EVAL_PROMPTS, DEFAULT_FACTS


@dataclass
class ShapeConfig:
    speedups: tuple[float, ...] = (2.0,)
    decays: tuple[str, ...] = ("linear", "constant")
    floors: tuple[int, ...] = (1, 4, 8, 12)  # least layers per step; 1 = the solver's default shape
    max_prompts: int | None = None
    max_facts: int | None = None
    tokens: int = 48
    fact_tokens: int = 32
    batch_size: int = 16
    threads: int = 1
    model: str | None = None  # default: the embedded model
    adapter: str = "auto"
    prompts: str | None = None  # default: assets/prompts/eval.jsonl
    facts: str | None = None  # default: assets/prompts/facts.jsonl; "none" to skip
    device: str = "auto"
    output: str = "assets/study"

    def __post_init__(self) -> None:
        if not self.speedups or min(self.speedups) <= 1.0:
            raise ValueError(f"speedups must be above 1 (1 is the full model); got {self.speedups}")
        if not self.floors or min(self.floors) < 1:
            raise ValueError(f"floors must be layer counts >= 1; got {self.floors}")
        if not self.decays:
            raise ValueError("decays must name at least one decay function")

    def shapes(self) -> list[tuple[str, int]]:
        """(decay, floor) arms; a flat schedule is one arm (its depth IS the budget, a floor changes nothing)."""
        floors = sorted(set(self.floors))
        return [(decay, floor) for decay in self.decays for floor in (floors[:1] if decay == "constant" else floors)]


def run_shape_study(config: ShapeConfig, progress: Callable[[str], None] = print) -> dict:
    import torch  # noqa: PLC0415

    torch.set_num_threads(config.threads)
    facts = None if config.facts == "none" else config.facts or str(DEFAULT_FACTS)
    eval_config = EvalConfig(model=config.model, adapter=config.adapter, device=config.device,
                             prompts=config.prompts or str(DEFAULT_EVAL_PROMPTS), max_prompts=config.max_prompts,
                             continuation_tokens=config.tokens, speedups=config.speedups,
                             batch_size=config.batch_size, facts=facts, max_facts=config.max_facts,
                             fact_tokens=config.fact_tokens, include_no_adapter=False)
    study = {"config": asdict(config), "hardware": cpu_summary(), "rows": []}

    def on_row(decay: str, floor: int, row) -> None:
        study["rows"].append({"decay": decay, "floor": floor, **asdict(row)})
        progress(f"{decay} floor {floor} at {row.target_speedup:g}x ({row.max_layers}->{row.min_layers} layers, "
                 f"{row.layer_speedup:.2f}x): judged ppl ratio {row.judged_ppl_ratio}, repetition {row.repetition}, "
                 f"fact retention {row.fact_retention}, agreement {row.agreement}")
        write_shape_study(study, config.output)

    report = evaluate_shapes(eval_config, config.shapes(), on_row, progress)
    study["reference"] = {"model": report.model, "adapter": report.adapter, "prompts": report.num_prompts,
                          "full_repetition": report.full_repetition, "facts": report.facts,
                          "full_fact_accuracy": report.full_fact_accuracy, "warmup": report.warmup,
                          "order": report.order}
    write_shape_study(study, config.output)
    progress(f"wrote {Path(config.output) / 'shape.md'}")
    return study


def write_shape_study(study: dict, folder: str | Path) -> tuple[Path, Path]:
    return write_result_files(folder, "shape", study, shape_markdown(study))


def shape_markdown(study: dict) -> str:
    config, reference = study["config"], study.get("reference", {})
    lines = [
        f"Schedule shape at a fixed layer budget ({study['hardware']}, {config['threads']} thread(s)): held-out "
        f"prompts of assets/prompts/eval.jsonl ({config['tokens']}-token greedy replies) and fact questions of "
        f"assets/prompts/facts.jsonl ({config['fact_tokens']}-token replies), never trained on; "
        f"`python -m model shape-study`. Floor F: no step runs fewer than F layers (1 = the solver's default).",
        "",
    ]
    if reference:
        lines += [f"Adapter {reference['adapter']}; full model: repetition {reference['full_repetition']}, "
                  f"answers {reference['full_fact_accuracy']} of {reference['facts']} fact questions right.", ""]
    lines += ["| target | decay | floor | max→min layers | layer speedup | judged ppl ratio | repetition | "
              "fact retention | agreement | ppl ratio |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in study["rows"]:
        lines.append(f"| {r['target_speedup']:g}x | {r['decay']} | {r['floor']} | {r['max_layers']}→{r['min_layers']} | "
                     f"{r['layer_speedup']:.2f}x | {_cell(r['judged_ppl_ratio'], '.2f')} | {_cell(r['repetition'], '.3f')} | "
                     f"{_cell(r['fact_retention'], '.3f')} | {r['agreement']:.3f} | {r['perplexity_ratio']:.2f} |")
    return "\n".join(lines)


def _cell(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)
