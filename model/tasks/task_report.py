"""``python -m model eval-task e2e``: every arm on the test MRs, scored, timed and written as
assets/eval/<task>.json and .md (ours beside the paper's, each as a share of its own 1x).

Arms: the task model (1x); SkipDecode with the per-speedup policy, the shared policy and no
policy at each speedup; and, on the same MRs, the untouched default model and the general chat
skip policy (what the product offered before the task existed).
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from model.common.hardware import hardware_info
from model.generation.generator import TextGenerator
from model.generation.schedules import ScheduleRequest
from model.loading import load_model, resolve_device
from model.skipdecode.schedule import cost_speedup, layer_speedup
from model.tasks.e2e import E2ERecord, place_swaps, reported_records, training_places
from model.tasks.task_eval import closeness, describe, measure_speed, task_scores
from model.tasks.task_models import (
    POLICY_SPEEDUPS,
    check_task,
    load_task_model,
    policy_dir,
    policy_info,
    task_assets,
    task_schedule,
)
from model.training.checkpoints import portable_path

TASK_MODEL_LABEL = "task model (1x)"  # the 1x arm: the full model every closeness is measured against


@dataclass
class TaskEvalConfig:
    task: str = "e2e"
    speedups: tuple[float, ...] = POLICY_SPEEDUPS
    weights: str = "float32"  # float32, or "default": the CPU default (low-bit) weights
    device: str = "auto"
    mrs: int | None = None  # the first N test MRs (quick runs); None: all 630
    batch_size: int = 32
    speed_mrs: int = 16  # MRs timed per speed row (0: no speed rows)
    speed_batches: tuple[int, ...] = (1, 8)
    speed_repeats: int = 2
    baselines: bool = True  # the untouched model and the general chat policy on the same MRs
    policy_free_arms: bool = True  # the task model skipping without a policy at each speedup
    quality: bool = True  # False: the speed rows only
    output: str = "assets/eval"
    threads: int | None = None
    # the folder holding <task>/task and <task>/skip-* (by default task_assets(), read when a config is made)
    adapters: str = field(default_factory=lambda: str(task_assets()))
    # Fold this run's arms into the report already in --output (same labels replaced, the rest
    # kept): re-measure one retrained policy without re-running every arm. Its 1x must match.
    update: bool = False
    # Places the devset never names swapped for known ones before decoding and back after (the
    # challenge baseline's delexicalisation): how much of a policy's loss is copying a new name.
    # Its report is its own (<task>-delexicalised*.json), beside the plain one.
    delexicalised_places: bool = False

    @property
    def root(self) -> Path:
        return Path(self.adapters)

    def __post_init__(self) -> None:
        check_task(self.task)
        if self.weights not in ("float32", "default"):
            raise ValueError(f"--weights must be float32 or default; got {self.weights!r}")
        if not self.speedups or any(not 1 < s <= 6 for s in self.speedups):
            raise ValueError(f"--speedups must be targets in (1, 6]; got {self.speedups}")
        if self.mrs is not None and self.mrs < 1:
            raise ValueError("--mrs must be >= 1")

    @property
    def known_places(self) -> frozenset[str] | None:
        """The places left as written when places are delexicalised (None: nothing is swapped)."""
        return training_places() if self.delexicalised_places else None

    @property
    def load_options(self) -> dict[str, Any]:
        """How every arm's model loads: float32 throughout, or the CPU default (low-bit) weights."""
        if self.weights == "float32":
            return dict(device=self.device, dtype="float32", quantize="none")
        return dict(device=self.device, dtype="auto", quantize="auto")


@dataclass
class Arm:
    label: str
    policy: str  # "task model", "per-speedup", "shared", "none", "untouched model", "general chat"
    speedup: float
    scores: dict
    shares: dict = field(default_factory=dict)  # scores as a share of the task model's
    achieved_layer_speedup: float = 1.0
    cost_model_speedup: float = 1.0
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)


def _arm(label: str, policy: str, speedup: float, generator: TextGenerator, records: Sequence[E2ERecord],
         schedule: ScheduleRequest, config: TaskEvalConfig, max_new_tokens: int) -> Arm:
    start = time.perf_counter()
    run = describe(generator, [r.mr for r in records], schedule, max_new_tokens, config.batch_size,
                   config.known_places)
    num_layers = generator.num_layers
    arm = Arm(label=label, policy=policy, speedup=speedup, scores=task_scores(run.outputs, records),
              achieved_layer_speedup=round(layer_speedup(num_layers, run.step_layers), 3),
              cost_model_speedup=round(cost_speedup(num_layers, run.step_layers, generator.cost), 3),
              seconds=round(time.perf_counter() - start, 1), outputs=run.outputs)
    print(f"eval-task: {label}: {arm.scores} (layers {arm.achieved_layer_speedup:.2f}x, {arm.seconds:.0f} s)", flush=True)
    return arm


def _release_memory() -> None:
    """After the caller dropped its last reference to an arm's model: free it before the next loads."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def quality_arms(config: TaskEvalConfig, records: Sequence[E2ERecord]) -> list[Arm]:
    """Every arm's descriptions and scores on ``records``."""
    settings = check_task(config.task)
    common = config.load_options
    arms: list[Arm] = []
    task_model = TextGenerator(load_task_model(config.task, policy=None, root=config.root, **common))
    num_layers = task_model.num_layers
    arms.append(_arm(TASK_MODEL_LABEL, "task model", 1.0, task_model, records,
                     task_schedule(config.task, 1.0, num_layers, full=True), config, settings.max_new_tokens))
    for speedup in config.speedups if config.policy_free_arms else ():
        arms.append(_arm(f"no policy {speedup:g}x", "none", speedup, task_model, records,
                         task_schedule(config.task, speedup, num_layers, skip_policy=False), config,
                         settings.max_new_tokens))
    del task_model
    _release_memory()
    for policy, folder_of in (("per-speedup", lambda s: policy_dir(config.task, s, config.root)),
                              ("shared", lambda s: policy_dir(config.task, None, config.root))):
        by_folder: dict[Path, list[float]] = {}  # the shared policy loads once for all its speedups
        for speedup in config.speedups:
            by_folder.setdefault(folder_of(speedup), []).append(speedup)
        for folder, speedups in by_folder.items():
            if not (folder / "adapter_config.json").is_file():
                continue
            generator = TextGenerator(load_task_model(config.task, policy=folder, root=config.root, **common))
            for speedup in speedups:
                arms.append(_arm(f"{policy} policy {speedup:g}x", policy, speedup, generator, records,
                                 task_schedule(config.task, speedup, num_layers), config, settings.max_new_tokens))
            del generator
            _release_memory()
    if config.baselines:
        arms += baseline_arms(config, records, num_layers)
    task_scores_1x = arms[0].scores
    for arm in arms:
        arm.shares = {k: round(v / task_scores_1x[k], 3) if task_scores_1x[k] else None for k, v in arm.scores.items()}
    return arms


def baseline_arms(config: TaskEvalConfig, records: Sequence[E2ERecord], num_layers: int) -> list[Arm]:
    """The default model without the task's fine-tuning: full depth, and the general chat skip
    policy at 2x and 3x on the task's schedule."""
    settings = check_task(config.task)
    arms = []
    untouched = TextGenerator(load_model(None, adapter=None, **config.load_options))
    arms.append(_arm("untouched model (1x)", "untouched model", 1.0, untouched, records,
                     task_schedule(config.task, 1.0, num_layers, full=True), config, settings.max_new_tokens))
    del untouched
    _release_memory()
    general = TextGenerator(load_model(None, adapter="auto", **config.load_options))
    if general.loaded.adapter_path:
        for speedup in (2.0, 3.0):
            arms.append(_arm(f"general chat policy {speedup:g}x", "general chat", speedup, general, records,
                             task_schedule(config.task, speedup, num_layers), config, settings.max_new_tokens))
    del general
    _release_memory()
    return arms


def speed_rows(config: TaskEvalConfig, records: Sequence[E2ERecord]) -> list[dict]:
    """Measured decode and end-to-end speedups against the task model, per speedup and batch."""
    if not config.speed_mrs:
        return []
    settings = check_task(config.task)
    common = config.load_options
    # the prompts the quality arms saw
    mrs = [swap.mr for swap in place_swaps([r.mr for r in records[: config.speed_mrs]], config.known_places)]
    rows = []
    for speedup in config.speedups:
        loaded = load_task_model(config.task, speedup, root=config.root, **common)
        generator = TextGenerator(loaded)
        full = task_schedule(config.task, 1.0, generator.num_layers, full=True)
        skip = task_schedule(config.task, speedup, generator.num_layers)
        for batch in config.speed_batches:
            row = measure_speed(generator, mrs, full, skip, speedup, batch, settings.decay_length, config.speed_repeats)
            rows.append({**asdict(row), "policy": Path(loaded.adapter_path).name if loaded.adapter_path else "none",
                         "weights": loaded.weights})
            print(f"eval-task: speed {speedup:g}x batch {batch}: decode {row.decode_speedup:.2f}x "
                  f"(bound {row.cost_model_bound:.2f}x), end to end {row.end_to_end_speedup:.2f}x", flush=True)
        del generator, loaded
        _release_memory()
    return rows


def run_task_eval(config: TaskEvalConfig) -> dict:
    if config.threads:
        torch.set_num_threads(config.threads)
    records = reported_records()[: config.mrs] if config.mrs else reported_records()
    start = time.perf_counter()
    arms = quality_arms(config, records) if config.quality else []
    speed = speed_rows(config, records)
    device = resolve_device(config.device)
    report = {
        "task": config.task, "config": {**asdict(config), "adapters": portable_path(config.adapters)}, "test_mrs": len(records),
        "minutes": round((time.perf_counter() - start) / 60, 1), "hardware": hardware_info(device),
        "policies": {p.name: policy_info(p) for p in sorted((config.root / config.task).glob("*")) if p.is_dir()},
        "arms": [{k: v for k, v in asdict(a).items() if k != "outputs"} for a in arms],
        "speed": speed,
    }
    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    stem = config.task + ("-delexicalised" if config.delexicalised_places else "") + (
        "" if config.weights == "float32" else f"-{config.weights}")
    outputs = {arm.label: arm.outputs for arm in arms}
    if config.update:
        report, outputs = _folded_into_existing(output, stem, report, outputs)
    if arms:
        add_closeness(report, outputs)
    _write_report(output, stem, report)
    if not arms:  # a speed-only run leaves the quality files as they are
        return report
    with (output / f"{stem}-outputs.jsonl").open("w", encoding="utf-8") as handle:
        for label, texts in outputs.items():
            handle.write(json.dumps({"label": label, "outputs": texts}, ensure_ascii=False) + "\n")
    return report


def add_closeness(report: dict, outputs: dict[str, list[str]]) -> dict:
    """Each arm's closeness to the task model's own descriptions of the same MRs (BLEU against
    them, the share described identically), from the arms' outputs; arms without outputs get none."""
    full = outputs.get(TASK_MODEL_LABEL)
    for arm in report["arms"]:
        texts = outputs.get(arm["label"])
        arm["vs_task_model"] = closeness(texts, full) if full is not None and texts is not None else None
    return report


def refresh_report(output: str | Path, stem: str) -> dict:
    """A written report re-derived from its own files (closeness added, Markdown rewritten): no model runs."""
    output = Path(output)
    report = json.loads((output / f"{stem}.json").read_text())
    if not (output / f"{stem}-outputs.jsonl").is_file():
        raise ValueError(f"{output / stem}-outputs.jsonl does not exist: closeness needs the arms' outputs")
    add_closeness(report, _read_outputs(output, stem))
    _write_report(output, stem, report)
    return report


def _write_report(output: Path, stem: str, report: dict) -> None:
    (output / f"{stem}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (output / f"{stem}.md").write_text(report_markdown(report))


def _read_outputs(output: Path, stem: str) -> dict[str, list[str]]:
    """Each arm's descriptions as the report keeps them (label -> outputs); none without the file."""
    path = output / f"{stem}-outputs.jsonl"
    rows = map(json.loads, path.read_text(encoding="utf-8").splitlines()) if path.is_file() else ()
    return {row["label"]: row["outputs"] for row in rows}


def _folded_into_existing(output: Path, stem: str, report: dict, outputs: dict) -> tuple[dict, dict]:
    """--update: this run's report and outputs folded into the ones already in ``output``."""
    existing_file = output / f"{stem}.json"
    if not existing_file.is_file():
        raise ValueError(f"--update: there is no {existing_file} to update")
    merged = merged_report(json.loads(existing_file.read_text()), report)
    return merged, _read_outputs(output, stem) | outputs


REFERENCE_SCORES = ("bleu", "rouge_l", "nist")  # what every report's arms were scored by ("facts" came later)


def _reference_scores(arm: dict) -> dict:
    return {key: arm["scores"].get(key) for key in REFERENCE_SCORES}


def merged_report(existing: dict, fresh: dict) -> dict:
    """``fresh`` (a run of some arms) folded into ``existing`` (the full report): arms with the same
    label replaced in place, new ones added, the others kept; the replaced arms' policies' details
    updated; each fold recorded under "updates" (its arms, config, hardware, minutes). Both must
    score the same test MRs and the same task model: a differing 1x is refused (the shares would
    mix two task models). A speed-only run (``--no-quality``) replaces the speed rows it timed instead."""
    if not fresh["arms"]:
        return _merged_speed(existing, fresh)
    if existing["task"] != fresh["task"] or existing["test_mrs"] != fresh["test_mrs"]:
        raise ValueError(f"--update: the report has {existing['test_mrs']} {existing['task']} MRs, this run "
                         f"{fresh['test_mrs']} {fresh['task']} MRs")
    old_1x, new_1x = (next((a for a in r["arms"] if a["speedup"] == 1.0 and a["policy"] == "task model"), None)
                      for r in (existing, fresh))
    if old_1x is None or new_1x is None or _reference_scores(old_1x) != _reference_scores(new_1x):
        raise ValueError(f"--update: the task model scores differently here ({new_1x and new_1x['scores']}) than "
                         f"in the report ({old_1x and old_1x['scores']}): re-run every arm instead")
    replaced = {a["label"]: a for a in fresh["arms"] if a is not new_1x}
    changed = list(replaced)
    # the same task model's text: the 1x keeps its row and gains the scores added since (e.g. "facts")
    replaced[old_1x["label"]] = {**old_1x, "scores": {**new_1x["scores"], **old_1x["scores"]},
                                 "shares": {**new_1x["shares"], **old_1x["shares"]}}
    arms = [replaced.pop(a["label"], a) for a in existing["arms"]] + list(replaced.values())
    policies = dict(existing.get("policies", {}))
    for arm in fresh["arms"]:
        if arm["policy"] == "per-speedup":
            name = f"skip-{arm['speedup']:g}x"
            policies[name] = fresh["policies"].get(name, policies.get(name))
    update = {"arms": changed, "config": fresh["config"], "hardware": fresh["hardware"], "minutes": fresh["minutes"]}
    return {**existing, "arms": arms, "policies": policies, "updates": [*existing.get("updates", []), update]}


def _merged_speed(existing: dict, fresh: dict) -> dict:
    """A speed-only run folded in: its (target, batch) rows replace the same rows, the others kept.
    Refused for another task or task model (its training record differs), for other weights of a
    policy than the report's quality rows were measured with, for rows timed over other MRs,
    repeats or steps than the report's, and for a run that timed nothing."""
    if not fresh["speed"]:
        raise ValueError("--update: this run measured neither quality nor speed")
    old_policies, new_policies = existing.get("policies", {}), fresh.get("policies", {})
    if existing["task"] != fresh["task"] or old_policies.get("task") != new_policies.get("task"):
        raise ValueError("--update: this speed run used another task or task model than the report")
    for row in fresh["speed"]:
        if row["policy"] in old_policies and old_policies[row["policy"]] != new_policies.get(row["policy"]):
            raise ValueError(f"--update: this speed run timed other {row['policy']} weights than the report's "
                             "quality rows: re-measure its quality first")
    shape = {(row.get("mrs"), row.get("repeats"), row.get("steps")) for row in existing.get("speed", []) + fresh["speed"]}
    if len(shape) > 1:
        raise ValueError(f"--update: speed rows timed differently (MRs, repeats, steps: {sorted(shape, key=str)}) "
                         "would share one table")
    fresh_rows = {(row["speedup"], row["batch_size"]): row for row in fresh["speed"]}
    speed = [fresh_rows.pop((row["speedup"], row["batch_size"]), row) for row in existing.get("speed", [])]
    speed += list(fresh_rows.values())
    timed = [f"speed {row['speedup']:g}x batch {row['batch_size']}" for row in fresh["speed"]]
    update = {"arms": timed, "config": fresh["config"], "hardware": fresh["hardware"], "minutes": fresh["minutes"]}
    return {**existing, "speed": speed, "updates": [*existing.get("updates", []), update]}


def _share(value: float | None) -> str:
    """A share of the task model's score; none where the task model scored 0 (a tiny test model)."""
    return "-" if value is None else f"{value:.3f}"


def report_markdown(report: dict) -> str:
    """The report's tables as Markdown (the Results tab and README quote it)."""
    hw = report["hardware"]
    title = (f"on the test set ({report['test_mrs']} MRs)" if report["arms"]
             else f"speed on {report['config']['speed_mrs']} test MRs")
    lines = [f"# {report['task'].upper()} {title}", "",
             f"Weights: {report['config']['weights']}; {hw.get('summary', '?')}; CPU flags: "
             f"{' '.join(hw.get('cpu_flags', []))}; torch {hw.get('torch', '?')}; {report['minutes']} min.", "",
             *(["| arm | target | BLEU | ROUGE-L | NIST | BLEU share | ROUGE-L share | BLEU against the task model's "
                "text | same text as the task model | layer speedup | cost-model |",
                "|---|---|---|---|---|---|---|---|---|---|---|"] if report["arms"] else [])]
    if report["config"].get("delexicalised_places"):
        lines[4:4] = ["Places delexicalised: each name or near place the training MRs never name was swapped for "
                      "one they do before decoding and written back after (the challenge baseline's way), in "
                      "every arm alike.", ""]
    remeasured = []
    for update in report.get("updates", []):  # in the order they were made
        uhw = update["hardware"]
        remeasured += ["", f"Re-measured later ({update['config']['device']}, {uhw.get('summary', '?')}; "
                           f"{update['minutes']} min): {', '.join(update['arms'])}."]
    lines[3:3] = remeasured
    for arm in report["arms"]:
        s, sh, near = arm["scores"], arm["shares"], arm.get("vs_task_model")
        closeness_cells = f"{near['bleu']:.2f} | {100 * near['same_share']:.1f}%" if near else "- | -"
        lines.append(f"| {arm['label']} | {arm['speedup']:g}x | {s['bleu']:.2f} | {s['rouge_l']:.2f} | {s['nist']:.3f} | "
                     f"{_share(sh['bleu'])} | {_share(sh['rouge_l'])} | {closeness_cells} | {arm['achieved_layer_speedup']:.2f}x | "
                     f"{arm['cost_model_speedup']:.2f}x |")
    if report["speed"]:
        lines += ["", f"Speed: {report['speed'][0]['steps']} decode steps per prompt (the decay length), EOS "
                  "ignored so both arms run the same steps; tokens/s over those steps.", "",
                  "| target | batch | policy | weights | task model decode tok/s | SkipDecode decode tok/s | "
                  "decode speedup | cost-model bound | share of bound | end to end |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for row in report["speed"]:
            lines.append(f"| {row['speedup']:g}x | {row['batch_size']} | {row['policy']} | {row['weights']} | "
                         f"{row['full_decode_tps']:.1f} | {row['skip_decode_tps']:.1f} | {row['decode_speedup']:.2f}x | "
                         f"{row['cost_model_bound']:.2f}x | {row['share_of_bound']:.2f} | {row['end_to_end_speedup']:.2f}x |")
    return "\n".join(lines) + "\n"
