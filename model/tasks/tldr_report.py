"""`python -m model eval-task tldr`: the TL;DR evaluation run on the reported posts and written down
(assets/eval/tldr.json, its Markdown table, every arm's summaries), with the hardware it ran on."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from model.common.hardware import hardware_info
from model.generation.generator import TextGenerator
from model.loading import load_model, resolve_device
from model.tasks.tldr import HELDOUT_POSTS, ROUGE_TYPES, read_posts, split_posts
from model.tasks.tldr_eval import ArmModels, StoredRun, TldrEvalConfig, evaluate
from model.tasks.tldr_training import shipped_policy

STEM = "tldr"
TASK_MODEL_NOTE = ("the task model is the default model prompted for a TL;DR (no training split is available "
                   "here; the paper fine-tuned one)")


def arm_policy(config: TldrEvalConfig, speedup: float) -> str | None:
    """The adapter an arm loads: None at 1x (the task model is the default model itself) and for
    ``--policy none``; the speedup's TL;DR policy where shipped (``--policy task``); else "auto" (the
    default skip policy)."""
    if speedup == 1.0 or config.policy == "none":
        return None
    own = shipped_policy(speedup, Path(config.policy_root) if config.policy_root else None)
    return str(own) if config.policy == "task" and own is not None else "auto"


def arm_models(config: TldrEvalConfig) -> tuple[ArmModels, dict[str, str | None]]:
    """The model each arm runs, loaded once per adapter, and which policy each speedup ran (by name)."""
    options = (dict(dtype="float32", quantize="none") if config.weights == "float32"
               else dict(dtype="auto", quantize="auto"))
    loaded: dict[str | None, TextGenerator] = {}
    ran: dict[str, str | None] = {}

    def models(speedup: float) -> TextGenerator:
        adapter = arm_policy(config, speedup)
        if adapter not in loaded:
            loaded[adapter] = TextGenerator(load_model(None, adapter=adapter, device=config.device, **options))
        path = loaded[adapter].loaded.adapter_path
        ran[f"{speedup:g}x"] = f"{Path(path).parent.name}/{Path(path).name}" if path else None
        return loaded[adapter]

    return models, ran


def run_tldr_eval(config: TldrEvalConfig, command: str | None = None) -> dict:
    """The evaluation, written to ``config.output``; ``command``: the command line that ran it, recorded."""
    if config.threads:
        torch.set_num_threads(config.threads)
    heldout, reported = split_posts(read_posts())
    posts = heldout if config.split == "heldout" else reported
    posts = posts[: config.posts] if config.posts else posts
    start = time.perf_counter()
    stored, earlier = stored_run(config) if config.rerun else (None, None)
    models, ran = arm_models(config)
    body = evaluate(models, posts, config, stored)
    outputs = body.pop("outputs")
    hardware = hardware_info(resolve_device(config.device))
    policies = ran
    if earlier is not None:
        policies = {**earlier["policies"], **ran}
        if earlier["hardware"]["summary"] != hardware["summary"]:
            raise ValueError(f"--rerun keeps speed rows measured on {earlier['hardware']['summary']}, not this "
                             f"machine ({hardware['summary']}): run every arm")
    report = {"task": "tldr", "command": command, "note": TASK_MODEL_NOTE, "policies": policies,
              "weights": models(1.0).loaded.weights, "split": config.split, "posts_scored": len(posts),
              "heldout_posts": HELDOUT_POSTS, **body, "minutes": round((time.perf_counter() - start) / 60, 1),
              "hardware": hardware}
    if earlier is not None:
        report["kept"] = {"speedups_rerun": list(config.rerun), "from_command": earlier["command"],
                          "from_minutes": earlier["minutes"],
                          "arms_kept": [arm["label"] for arm in earlier["arms"]
                                        if arm["speedup"] not in config.rerun]}
    write_report(Path(config.output), report, outputs, stem=report_stem(config))
    return report


# what a kept arm must share with the run that keeps it: every setting but where it runs and writes
SAME_FOR_KEPT_ARMS = tuple(spec.name for spec in dataclasses.fields(TldrEvalConfig)
                           if spec.name not in ("device", "threads", "output", "rerun"))


def stored_run(config: TldrEvalConfig) -> tuple[StoredRun, dict]:
    """The report in ``config.output`` a --rerun keeps arms from, and that report; it must have been made with
    the same settings (SAME_FOR_KEPT_ARMS)."""
    path = Path(config.output) / f"{report_stem(config)}.json"
    outputs_path = path.with_name(f"{report_stem(config)}-outputs.jsonl")
    if not path.is_file() or not outputs_path.is_file():
        raise ValueError(f"--rerun keeps the other arms of the report in {config.output}, and there is none: run every arm")
    earlier = json.loads(path.read_text())
    made, wanted = earlier["config"], dataclasses.asdict(config)
    differ = [name for name in SAME_FOR_KEPT_ARMS if _listed(made.get(name)) != _listed(wanted[name])]
    if differ:
        raise ValueError(f"--rerun: the stored report was made with other {', '.join(differ)}: run every arm")
    rows = [json.loads(line) for line in outputs_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return StoredRun(earlier["arms"], earlier["speed"], {row["label"]: row["outputs"] for row in rows}), earlier


def _listed(value: object) -> object:
    return list(value) if isinstance(value, (list, tuple)) else value


def report_stem(config: TldrEvalConfig) -> str:
    return STEM if config.split == "reported" else f"{STEM}-{config.split}"


def write_report(output: Path, report: dict, outputs: dict[str, list[str]], stem: str = STEM) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{stem}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (output / f"{stem}.md").write_text(report_markdown(report))
    with (output / f"{stem}-outputs.jsonl").open("w", encoding="utf-8") as handle:
        for label, texts in outputs.items():
            handle.write(json.dumps({"label": label, "outputs": texts}, ensure_ascii=False) + "\n")


def _share(arm: dict, name: str) -> str:
    share = arm.get("shares", {}).get(name)
    return "1" if share is None else f"{share['share']:.3f} [{share['low']:.3f}, {share['high']:.3f}]"


def report_markdown(report: dict) -> str:
    policies = ", ".join(f"{label}: {name or 'none'}" for label, name in report["policies"].items() if label != "1x")
    lines = [f"# Reddit TL;DR: {report['posts_scored']} {report['split']} posts ({report['hardware']['summary']})", "",
             f"Greedy, {report['weights']} weights; {report['note']}. Skip policies: {policies}. ROUGE F1 x 100; "
             "shares of the 1x arm with 95% paired bootstrap intervals over posts." + _kept_line(report), "",
             "| arm | ROUGE-1 | ROUGE-2 | ROUGE-L | ROUGE-L share | ROUGE-1 share | repeated 4-grams | "
             "names the main subject | mean layers a step | prompt layers |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in report["arms"]:
        scores = arm["scores"]
        subject = "–" if arm["names_main_subject"] is None else f"{100 * arm['names_main_subject']:.1f}%"
        lines.append(f"| {arm['label']} | " + " | ".join(f"{scores[name]:.2f}" for name in ROUGE_TYPES)
                     + f" | {_share(arm, 'rougeL')} | {_share(arm, 'rouge1')} | {100 * arm['repetition']:.1f}% | "
                     f"{subject} | {arm['mean_layers_per_step']:.1f} | {arm['prefill_layers']} |")
    lines += ["", "| speedup | prompt | decode speedup | whole request | first token: 1x / SkipDecode | cost model |",
              "|---|---|---|---|---|---|"]
    for row in report["speed"]:
        prompt = "full depth" if row["prompt_at_full_depth"] else "first budget"
        lines.append(f"| {row['speedup']:g}x | {prompt} | {row['decode_speedup']:.2f}x | {row['end_to_end_speedup']:.2f}x "
                     f"| {row['full_first_token_s']:.3f} s / {row['skip_first_token_s']:.3f} s | "
                     f"{row['cost_model_bound']:.2f}x |")
    return "\n".join(lines) + "\n"


def _kept_line(report: dict) -> str:
    kept = report.get("kept")
    if not kept:
        return ""
    rerun = ", ".join(f"{speedup:g}x" for speedup in kept["speedups_rerun"])
    return (f" Only {rerun} ran again (`{report['command']}`: the policies that changed). The other arms' summaries "
            f"({'; '.join(kept['arms_kept'])}) are those of `{kept['from_command']}`, scored again, and their "
            "speed rows are its own, on the same machine.")


def config_from(values: dict) -> TldrEvalConfig:
    return TldrEvalConfig(**{spec.name: values[spec.name] for spec in dataclasses.fields(TldrEvalConfig)})
