"""A task's shipped models: the task model (a LoRA merged into the default model: the paper's 1x)
and its skip policies (gated LoRAs on top of it: 1x stays the task model bit for bit).

assets/adapters/<task>/ holds ``task/`` and one ``skip-<S>x/`` per trained target speedup, plus
``skip-all/`` (one policy for every speedup, the project's random-schedule recipe). Every
generation of the task goes through ``task_schedule``: the schedule its policies were trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from model.common.settings import settings
from model.generation.schedules import ScheduleRequest
from model.loading import LoadedModel, default_model_folder, load_model, load_tokenizer
from model.skipdecode.schedule import depth_share_floor

SHIPPED_TASK_ASSETS = Path(__file__).resolve().parents[2] / "assets" / "adapters"
TASKS = ("e2e",)
POLICY_SPEEDUPS = (2.0, 3.0, 4.0, 5.0)  # the paper's table: one policy per target speedup
SHARED_POLICY = "skip-all"


@dataclass(frozen=True)
class TaskSettings:
    """How a task generates: its output budget and the schedule its policies were trained on."""

    # E2E: references are 29 tokens at the median (train and test, EOS counted), 43 at the 90th
    # percentile, 93 at most. The decay reaches its floor as a typical description ends, so the
    # target speedup holds over a typical output; longer ones finish at the floor.
    decay_length: int = 32
    max_new_tokens: int = 96
    # The floor keeps 2/3 of the average depth (2x on 30 layers: 20 -> 10, 5x: 8 -> 4): the
    # description's last facts are never written by one to three layers.
    floor_share: float = 2 / 3
    lora_rank: int = 16


TASK_SETTINGS = {"e2e": TaskSettings()}


def check_task(task: str) -> TaskSettings:
    if task not in TASK_SETTINGS:
        raise ValueError(f"unknown task {task!r}: one of {', '.join(TASKS)}")
    return TASK_SETTINGS[task]


def task_assets() -> Path:
    """The folder of the tasks' models: $SKIPDECODE_TASK_ADAPTERS (a run's exports, a test's tiny
    adapters), else the shipped ones. A function, not a constant: the settings are read when first asked,
    never at import, so a variable set before the first use is seen."""
    return settings().task_adapters or SHIPPED_TASK_ASSETS


def task_folder(task: str, root: Path | None = None) -> Path:
    """<root>/<task> (``root`` None: task_assets())."""
    check_task(task)
    return Path(root if root is not None else task_assets()) / task


def task_adapter_dir(task: str, root: Path | None = None) -> Path:
    return task_folder(task, root) / "task"


def policy_name(speedup: float | None) -> str:
    """skip-3x for a per-speedup policy, skip-all for the shared one (speedup None)."""
    return SHARED_POLICY if speedup is None else f"skip-{speedup:g}x"


def policy_dir(task: str, speedup: float | None, root: Path | None = None) -> Path:
    return task_folder(task, root) / policy_name(speedup)


def policy_for(task: str, speedup: float, root: Path | None = None) -> Path | None:
    """The policy SkipDecode runs at ``speedup``: its own where one was trained for it, else the
    shared one; None where neither is present (the task model skips without a policy)."""
    own = policy_dir(task, speedup, root) if any(abs(speedup - s) < 1e-9 for s in POLICY_SPEEDUPS) else None
    for folder in (own, policy_dir(task, None, root)):
        if folder is not None and (folder / "adapter_config.json").is_file():
            return folder
    return None


def task_schedule(task: str, speedup: float, num_layers: int, full: bool = False,
                  skip_policy: bool = True) -> ScheduleRequest:
    """The schedule a task's policies were trained on, at ``speedup``: linear decay over the task's
    decay length, floored at its depth share, the speedup held over the decay length."""
    settings = check_task(task)
    floor = None if full or speedup <= 1 else depth_share_floor(num_layers, speedup, settings.floor_share)
    return ScheduleRequest(target_speedup=max(1.0, speedup), decay="linear", decay_length=settings.decay_length,
                           min_layers_floor=floor, speedup_steps=settings.decay_length, full=full or speedup <= 1,
                           skip_policy=skip_policy)


def load_task_model(task: str, speedup: float | None = None, *, policy: str | Path | None = "auto",
                    device: str = "auto", dtype: str = "auto", quantize: str = "auto",
                    root: Path | None = None) -> LoadedModel:
    """The task model with the skip policy for ``speedup`` ("auto"), a given policy folder, or
    none (``policy=None``). The task model is the full model of every comparison."""
    task_dir = task_adapter_dir(task, root)
    if not (task_dir / "adapter_config.json").is_file():
        raise ValueError(f"the {task} task model is not in {task_dir}: train it with `python -m model train-task {task}`")
    if policy == "auto":
        policy = policy_for(task, speedup if speedup is not None else POLICY_SPEEDUPS[0], root)
    return load_model(None, device=device, dtype=dtype, adapter=str(policy) if policy else None,
                      quantize=quantize, task_adapter=str(task_dir))


@lru_cache(maxsize=1)
def task_tokenizer() -> Any:
    """The tokenizer every task model uses (a task model is the default model with a LoRA merged),
    read alone in a fraction of a second: a server sizes a task's job with it before the model loads."""
    return load_tokenizer(default_model_folder())


def policy_info(folder: Path) -> dict:
    """What a shipped policy's training_info.json says of its training (speedup, rank, steps)."""
    info_file = Path(folder) / "training_info.json"
    if not info_file.is_file():
        return {}
    info = json.loads(info_file.read_text())
    config = info.get("config", {})
    return {"step": info.get("step"), "fixed_speedup": config.get("fixed_speedup"),
            "speedup_range": config.get("speedup_range"), "lora_rank": config.get("lora_rank"),
            "kl_weight": config.get("kl_weight"), "hardware": info.get("hardware")}
