"""Checkpoints of a skip-policy run: the accelerate state (for --resume) and the adapter folder
the app loads, with how it was made (training_info.json)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from model.common.hardware import hardware_info
from model.skipdecode.skip_policy import EntryBridge


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
        if config.keep_adapters:  # every save kept, so a rule can choose among them on held-out data
            kept = output / f"adapter-step-{step:06d}"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(output / "adapter", kept)


def save_adapter(model, folder: Path, config, step: int, seconds: float,
                 bridge: EntryBridge | None = None) -> None:
    """The adapter (peft format, float32: a reload gives bit-identical logits), the bridge, and
    how they were made (paths relative to the repository, no machine-specific absolute paths)."""
    model.save_pretrained(folder)
    if bridge is not None:
        bridge.save(folder)
    settings = asdict(config)
    for key in ("prompts", "data", "output_dir", "model", "task_adapter", "init_adapter", "sequences"):
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
    root = Path(__file__).resolve().parents[2]
    try:
        return str(Path(value).resolve().relative_to(root))
    except ValueError:
        return value


def load_initial_adapter(model, bridge: EntryBridge | None, folder: str | Path, config) -> None:
    """Start a run from a trained adapter's weights (LoRA, and the bridge when both have one):
    a GPU run's exported adapter continues on another machine, with a new optimiser, schedule
    mix or data. Its rank, alpha and target modules must be the run's, or it stops with why."""
    from peft import set_peft_model_state_dict  # noqa: PLC0415
    from safetensors.torch import load_file  # noqa: PLC0415

    folder = Path(folder)
    config_file, weights_file = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not (config_file.is_file() and weights_file.is_file()):
        raise ValueError(f"--init-adapter: {folder} is not an adapter folder (adapter_config.json + adapter_model.safetensors)")
    saved = json.loads(config_file.read_text())
    run = model.peft_config["default"]
    mismatched = [f"{name} {saved.get(name)!r} (the run: {mine!r})"
                  for name, mine in (("r", run.r), ("lora_alpha", run.lora_alpha))
                  if saved.get(name) != mine]
    if sorted(saved.get("target_modules") or []) != sorted(run.target_modules):
        mismatched.append(f"target_modules {sorted(saved.get('target_modules') or [])} (the run: {sorted(run.target_modules)})")
    if mismatched:
        raise ValueError(f"--init-adapter {folder} does not fit this run: " + "; ".join(mismatched)
                         + " (set --lora-rank / --lora-alpha / --lora-modules to the adapter's)")
    weights = load_file(str(weights_file))
    parameter = next(model.parameters())
    weights = {key: value.to(device=parameter.device, dtype=torch.float32) for key, value in weights.items()}
    result = set_peft_model_state_dict(model, weights)
    if result.unexpected_keys:
        raise ValueError(f"--init-adapter {folder}: weights this run has no place for: {result.unexpected_keys[:3]}")
    saved_bridge = EntryBridge.load(folder, device=parameter.device)
    if bridge is not None and saved_bridge is not None:
        if (saved_bridge.num_layers, saved_bridge.rank) != (bridge.num_layers, bridge.rank):
            raise ValueError(f"--init-adapter {folder}: its bridge has rank {saved_bridge.rank}, the run's {bridge.rank}")
        with torch.no_grad():
            bridge.down.copy_(saved_bridge.down)
            bridge.up.copy_(saved_bridge.up)


def resume_checkpoint(accelerator, output: Path) -> tuple[int, float]:
    checkpoints = sorted((output / "checkpoints").glob("step-*"))
    if not checkpoints:
        raise ValueError(f"--resume: no checkpoint under {output / 'checkpoints'}")
    accelerator.load_state(str(checkpoints[-1]))
    progress = checkpoints[-1] / "progress.json"
    seconds = json.loads(progress.read_text())["seconds"] if progress.is_file() else 0.0
    return int(checkpoints[-1].name.split("-")[1]), float(seconds)
