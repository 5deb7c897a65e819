"""The skip-policy recipe study: ``python -m model study``.

Every arm trains the default model's skip policy for the SAME CPU-time budget (same threads)
and is measured on the SAME held-out subset (the first prompts of assets/prompts/eval.jsonl):
teacher-forced agreement with the full model and perplexity ratio at 1.0x / 1.5x / 2x / 3x
(linear decay over 48 tokens), free-running ROUGE-L at 2x, and the held-out curve over
training. Arms differ from the baseline in one thing each:

* placement: warmup 1 / 2 / 4 / 6 (warmup + top order), first_last, and a nested order ranked
  by the model's own measured layer importance;
* an entry bridge; KL plus hidden-state matching; the schedule mix; sampled teacher data;
  LoRA capacity (rank, modules); an ungated LoRA (the full-depth fidelity trade-off).

Results: assets/study/study.json (table + curves + layer importance) and study.md. Arms already
measured are kept (delete runs/study/<arm>/result.json to rerun one).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from model.common.hardware import cpu_summary
from model.evaluation.evaluation import EvalConfig, evaluate
from model.evaluation.reporting import write_result_files
from model.generation.generator import TextGenerator
from model.loading import load_model
from model.skipdecode.decoder import masked_forward
from model.training.heldout import heldout_set
from model.training.scoring import distillation_loss
from model.training.training import TrainConfig, train

REPO = Path(__file__).resolve().parents[2]
BASELINE = dict(warmup_layers=4)

# name -> (what it tests, TrainConfig overrides on top of BASELINE)
ARMS: dict[str, tuple[str, dict]] = {
    "warmup1": ("placement: warmup 1 (the paper)", dict(warmup_layers=1)),
    "warmup2": ("placement: warmup 2", dict(warmup_layers=2)),
    "warmup4": ("placement: warmup 4 (baseline)", dict()),
    "warmup6": ("placement: warmup 6", dict(warmup_layers=6)),
    "first_last": ("placement: first and last layers kept (D3-style), warmup 1", dict(order="first_last", warmup_layers=1)),
    "importance": ("placement: nested order ranked by measured layer importance", dict(order="ranked", warmup_layers=0)),
    "bridge": ("entry bridge, rank 16", dict(bridge_rank=16)),
    "hidden": ("KL + hidden-state matching (entry and final), weight 1", dict(hidden_weight=1.0)),
    "focused": ("schedule mix: 1.5-3x, linear 60%", dict(schedule_mix="focused")),
    "rank4": ("capacity: LoRA rank 4", dict(lora_rank=4, lora_alpha=8)),
    "rank64": ("capacity: LoRA rank 64", dict(lora_rank=64, lora_alpha=128)),
    "attention_only": ("capacity: LoRA on q/k/v/o only", dict(lora_modules=("q_proj", "k_proj", "v_proj", "o_proj"))),
    "ungated": ("LoRA at every position (changes the full-depth model)", dict(gate_lora=False)),
    "sampled": ("data: greedy + 1 sampled continuation per prompt (T = 0.8)", dict(samples_per_prompt=1)),
}


@dataclass
class StudyConfig:
    minutes: float = 6.0  # training CPU time per arm (this process's, held-out evaluation excluded)
    arms: tuple[str, ...] = ()  # () = all
    runs_dir: str = "runs/study"
    output: str = "assets/study"
    threads: int = 1
    eval_prompts: int = 16
    eval_tokens: int = 48
    eval_every: int = 40
    batch_size: int = 4
    learning_rate: float = 1e-3
    max_target_tokens: int = 32
    device: str = "cpu"

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
        if not self.minutes > 0:
            raise ValueError(f"minutes must be > 0; got {self.minutes}")


@dataclass
class ArmResult:
    arm: str
    description: str
    minutes: float  # training CPU time actually used
    steps: int
    untrained: dict  # held-out scores before training (same placement)
    heldout: dict  # held-out scores at the end: {"1x": {...}, "1.5x": {...}, ...}
    rouge_l_2x: float | None
    curve: list[dict] = field(default_factory=list)
    overrides: dict = field(default_factory=dict)


def measure_layer_importance(loaded, heldout_batches, teacher_logits) -> list[float]:
    """KL to the full model when ONE layer is bypassed at every generated position (teacher
    forced, untrained model): how much each layer matters for the next token."""
    num_layers = loaded.num_layers
    importance = []
    with torch.inference_mode():
        for layer in range(num_layers):
            total = count = 0.0
            for (ids, mask, target_mask, p), teacher in zip(heldout_batches, teacher_logits):
                executes = torch.ones(ids.shape[1], num_layers, dtype=torch.bool)
                executes[p:, layer] = False
                logits = masked_forward(loaded.model, ids, mask, executes, logits_from=p - 1)[:, :-1]
                weight = float(target_mask.sum())
                total += float(distillation_loss(logits, teacher, target_mask)) * weight
                count += weight
            importance.append(round(total / count, 5))
    return importance


def ranking_from_importance(importance: list[float]) -> tuple[int, ...]:
    """Layers most important first (ties: the lower layer first)."""
    return tuple(sorted(range(len(importance)), key=lambda i: (-importance[i], i)))


def run_study(config: StudyConfig, progress: Callable[[str], None] = print) -> dict:
    torch.set_num_threads(config.threads)
    runs = Path(config.runs_dir)
    runs.mkdir(parents=True, exist_ok=True)
    base = _base_train_config(config)
    importance = _layer_importance(config, base, runs, progress)
    ranking = ranking_from_importance(importance)
    progress(f"layer importance (KL when bypassed alone): {importance}; ranking {ranking}")

    results: list[ArmResult] = []
    for name in config.arms or tuple(ARMS):
        result_file = runs / name / "result.json"
        if result_file.is_file():
            results.append(ArmResult(**json.loads(result_file.read_text())))
            progress(f"[{name}] kept the earlier measurement")
            continue
        results.append(_run_arm(name, config, base, runs, ranking, progress))

    study = {"budget_minutes": config.minutes, "threads": config.threads, "eval_prompts": config.eval_prompts,
             "eval_tokens": config.eval_tokens, "hardware": cpu_summary(), "layer_importance": importance,
             "ranking": list(ranking), "arms": [asdict(r) for r in results]}
    write_study(study, config.output)
    return study


def _base_train_config(config: StudyConfig) -> TrainConfig:
    """Every arm's TrainConfig before its overrides. Short budgets: small batches of 32-token targets and a
    higher learning rate give each arm as many updates as the budget allows (the long run uses the defaults)."""
    return TrainConfig(max_steps=100_000, max_minutes=config.minutes, threads=config.threads,
                       eval_every=config.eval_every, eval_prompts=config.eval_prompts, eval_tokens=config.eval_tokens,
                       batch_size=config.batch_size, learning_rate=config.learning_rate,
                       max_target_tokens=config.max_target_tokens, warmup_steps=5,
                       device=config.device, save_every=100_000, **BASELINE)


def _layer_importance(config: StudyConfig, base: TrainConfig, runs: Path, progress: Callable[[str], None]
                      ) -> list[float]:
    """The untrained model's layer importance: measured once, then read from runs/layer_importance.json."""
    importance_file = runs / "layer_importance.json"
    if importance_file.is_file():
        return json.loads(importance_file.read_text())
    progress("measuring layer importance (one layer bypassed at a time, untrained model) ...")
    loaded = load_model(None, device=config.device, dtype="float32", adapter=None)
    held = heldout_set(TextGenerator(loaded), base, runs / f"heldout-{config.eval_prompts}-{config.eval_tokens}.jsonl")
    importance = measure_layer_importance(loaded, held.batches, held.teacher_logits)
    importance_file.write_text(json.dumps(importance))
    del loaded, held
    return importance


def _run_arm(name: str, config: StudyConfig, base: TrainConfig, runs: Path, ranking: tuple[int, ...],
             progress: Callable[[str], None]) -> ArmResult:
    """Train one arm for the budget from a clean folder, measure it, write its result.json."""
    description, overrides = ARMS[name]
    folder = runs / name
    if folder.exists():
        shutil.rmtree(folder)  # an interrupted arm starts over: equal budgets
    folder.mkdir(parents=True)
    _share_teacher_cache(runs, folder)
    arm_config = replace(base, output_dir=str(folder), **overrides)
    if arm_config.order == "ranked":
        arm_config = replace(arm_config, ranking=ranking)
    progress(f"[{name}] {description}: training {config.minutes:g} min ...")
    trained = train(arm_config)
    minutes = trained.heldout[-1].get("cpu_minutes", 0.0) if trained.heldout else config.minutes
    _keep_teacher_cache(folder, runs)
    curve = trained.heldout
    report = evaluate(EvalConfig(adapter=str(folder / "adapter"), max_prompts=config.eval_prompts,
                                 continuation_tokens=config.eval_tokens, speedups=(2.0,), device=config.device,
                                 include_no_adapter=False), progress=lambda line: None)
    rouge = report.rows[0].rouge_l if report.rows else None
    arm = ArmResult(arm=name, description=description, minutes=round(minutes, 2), steps=trained.steps,
                    untrained=curve[0] if curve and curve[0]["step"] == 0 else {},
                    heldout=curve[-1] if curve else {}, rouge_l_2x=rouge, curve=curve,
                    overrides={k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()})
    (folder / "result.json").write_text(json.dumps(asdict(arm), indent=2))
    progress(f"[{name}] {trained.steps} steps in {minutes:.1f} min: " + _summary(arm))
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)  # full training states: hundreds of MB
    return arm


def _summary(arm: ArmResult) -> str:
    h = arm.heldout
    parts = [f"{k} {h[k]['agreement']:.3f}" for k in ("1x", "1.5x", "2x", "3x") if k in h]
    return "agreement " + ", ".join(parts) + f"; ROUGE-L@2x {arm.rouge_l_2x}"


def _share_teacher_cache(runs: Path, folder: Path) -> None:
    """The teacher's continuations are the same for every arm: write them once, reuse them."""
    for cached in runs.glob("*.jsonl"):
        shutil.copy(cached, folder / cached.name)


def _keep_teacher_cache(folder: Path, runs: Path) -> None:
    for cached in list(folder.glob("teacher_continuations-*.jsonl")) + list(folder.glob("heldout-*.jsonl")):
        if not (runs / cached.name).exists():
            shutil.copy(cached, runs / cached.name)


def write_study(study: dict, folder: str | Path) -> tuple[Path, Path]:
    return write_result_files(folder, "study", study, study_markdown(study))


def study_markdown(study: dict) -> str:
    lines = [
        f"Each arm: {study['budget_minutes']:g} CPU minutes of training on {study['threads']} thread(s) "
        f"({study['hardware']}); held-out: first {study['eval_prompts']} prompts of assets/prompts/eval.jsonl, "
        f"{study['eval_tokens']}-token greedy continuations of the full model, linear decay. "
        "Agreement = teacher-forced next-token agreement with the full model; ppl ratio = perplexity of the "
        "full model's text under SkipDecode over the full model's own.",
        "",
        "| arm | what | CPU min | steps | agree 1x | agree 1.5x | agree 2x | agree 3x | ppl ratio 2x | ROUGE-L 2x | untrained agree 2x |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in study["arms"]:
        h, u = arm["heldout"], arm["untrained"]

        def agree(scores, key):
            return f"{scores[key]['agreement']:.3f}" if key in scores else "–"

        ppl = f"{h['2x']['perplexity_ratio']:.2f}" if "2x" in h else "–"
        rouge = "–" if arm["rouge_l_2x"] is None else f"{arm['rouge_l_2x']:.3f}"
        lines.append(f"| {arm['arm']} | {arm['description']} | {arm['minutes']:.1f} | {arm['steps']} | {agree(h, '1x')} | "
                     f"{agree(h, '1.5x')} | {agree(h, '2x')} | {agree(h, '3x')} | {ppl} | {rouge} | {agree(u, '2x')} |")
    importance = study.get("layer_importance") or []
    if importance:
        lines += ["", "Layer importance (KL to the full model when that layer alone is bypassed): " +
                  ", ".join(f"{i}: {v:.3f}" for i, v in enumerate(importance))]
    return "\n".join(lines)


def best_arm(study: dict, speedup: str = "2x") -> str:
    """The arm with the best held-out agreement at ``speedup`` (ties: mean over 1.5x-3x)."""
    def score(arm):
        h = arm["heldout"]
        mean = sum(h[k]["agreement"] for k in ("1.5x", "2x", "3x") if k in h) / 3
        return (h.get(speedup, {}).get("agreement", -math.inf), mean)
    return max(study["arms"], key=score)["arm"]
