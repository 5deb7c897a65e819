"""Checkpoints of a skip-policy run: the accelerate state (for --resume) and the adapter folder
the app loads, with how it was made (training_info.json)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from model.hardware import hardware_info
from model.skip_policy import EntryBridge


def save_checkpoint(accelerator, model, output: Path, step: int, config, seconds: float) -> None:
    """accelerate state (resume) + the adapter itself (what the app loads)."""
    accelerator.wait_for_everyone()
    folder = output / "checkpoints" / f"step-{step:06d}"
    accelerator.save_state(str(folder))
    if accelerator.is_main_process:
        for old in sorted((output / "checkpoints").glob("step-*"))[:-2]:  # full states are large: keep two
            shutil.rmtree(old, ignore_errors=True)
        (folder / "progress.json").write_text(json.dumps({"step": step, "seconds": seconds}))
        unwrapped = accelerator.unwrap_model(model)
        save_adapter(unwrapped.lm, output / "adapter", config, step, seconds, bridge=unwrapped.bridge)


def save_adapter(model, folder: Path, config, step: int, seconds: float,
                 bridge: EntryBridge | None = None) -> None:
    """The adapter (peft format, float32: a reload gives bit-identical logits), the bridge, and
    how they were made (paths relative to the repository, no machine-specific absolute paths)."""
    model.save_pretrained(folder)
    if bridge is not None:
        bridge.save(folder)
    settings = asdict(config)
    for key in ("prompts", "data", "output_dir", "model"):
        settings[key] = portable_path(settings[key])
    info = {"step": step, "seconds": round(seconds, 1), "config": settings,
            "skip_policy": {"gated": config.gate_lora, "bridge_rank": config.bridge_rank,
                            "warmup": config.warmup_layers, "order": config.order, "ranking": list(config.ranking)},
            "hardware": hardware_info(torch.device("cuda" if torch.cuda.is_available() else "cpu"))}
    (folder / "training_info.json").write_text(json.dumps(info, indent=2, default=str))


def portable_path(value):
    """A path inside the repository as a relative path; anything else unchanged (training info and
    eval reports carry no machine's absolute paths)."""
    if not isinstance(value, str) or not value:
        return value
    root = Path(__file__).resolve().parents[1]
    try:
        return str(Path(value).resolve().relative_to(root))
    except ValueError:
        return value


def resume_checkpoint(accelerator, output: Path) -> tuple[int, float]:
    checkpoints = sorted((output / "checkpoints").glob("step-*"))
    if not checkpoints:
        raise ValueError(f"--resume: no checkpoint under {output / 'checkpoints'}")
    accelerator.load_state(str(checkpoints[-1]))
    progress = checkpoints[-1] / "progress.json"
    seconds = json.loads(progress.read_text())["seconds"] if progress.is_file() else 0.0
    return int(checkpoints[-1].name.split("-")[1]), float(seconds)
