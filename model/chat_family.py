"""General chat's skip-policy family: one policy per target speedup, beside the shared policy (issue #53).

A family folder holds one skip-policy adapter per speedup it was trained for, ``skip-1.5x/``,
``skip-2x/``, ``skip-3x/`` (lab/training/gpu_chat_family.sh trains each only on its own speedup's
schedules). SkipDecode at a speedup with its own policy runs that policy; at any other speedup
(2.5x, 4x) the shared policy (the one adapter trained on every speedup) runs, as before. The
playground looks for the family in ``<adapters>/chat`` (``$SKIPDECODE_TASK_ADAPTERS`` moves it with
the tasks' adapters); ``python -m model eval --candidate FAMILY`` compares it, speedup by speedup,
with the shared policy, and checks the issue's targets (``TARGETS``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

ADAPTERS = Path(os.environ.get("SKIPDECODE_TASK_ADAPTERS") or Path(__file__).resolve().parents[1] / "assets" / "adapters")
CHAT_FAMILY = "chat"  # <adapters>/chat: the family the playground runs
POLICY_FOLDER = re.compile(r"skip-([0-9]+(?:\.[0-9]+)?)x")
SAME_SPEEDUP = 1e-9  # a family policy runs at exactly its speedup (the playground's buttons: 1.5, 2, 3)


def family_folder(root: Path | None = None) -> Path:
    """Where the playground's chat family lives (it may not exist: then the shared policy runs everywhere)."""
    return Path(root if root is not None else ADAPTERS) / CHAT_FAMILY


def policy_name(speedup: float) -> str:
    """skip-1.5x, skip-2x: a family policy's folder name."""
    return f"skip-{speedup:g}x"


def is_adapter(folder: Path) -> bool:
    return (Path(folder) / "adapter_config.json").is_file()


def family_policies(folder: Path) -> dict[float, Path]:
    """speedup -> policy folder, for every ``skip-<S>x`` adapter in ``folder`` ({} if none or no folder)."""
    folder = Path(folder)
    if not folder.is_dir() or is_adapter(folder):
        return {}
    found = {}
    for child in sorted(folder.iterdir()):
        match = POLICY_FOLDER.fullmatch(child.name)
        if match and is_adapter(child) and float(match.group(1)) > 1:
            found[float(match.group(1))] = child
    return found


def is_family(folder: Path) -> bool:
    """A folder of per-speedup policies (not itself an adapter)."""
    return bool(family_policies(folder))


def family_policy(folder: Path, speedup: float) -> Path | None:
    """The family's own policy for exactly ``speedup``; None in between (the shared policy runs there)."""
    return next((path for s, path in family_policies(folder).items() if abs(s - speedup) < SAME_SPEEDUP), None)


def trained_on(policy: Path) -> str | None:
    """The model a policy was trained on, as its training_info.json says (None: the default model)."""
    info = Path(policy) / "training_info.json"
    try:
        return json.loads(info.read_text()).get("config", {}).get("model")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class Target:
    """One of the issue's bars for a family: ``measure`` at ``speedup`` at least (or at most) ``bound``."""

    speedup: float
    measure: str  # an EvalRow field: agreement, judged_ppl_ratio, fact_retention
    bound: float
    at_least: bool  # True: the value must be >= bound; False: <= bound

    def describe(self) -> str:
        return f"{self.measure} {'>=' if self.at_least else '<='} {self.bound:g} at {self.speedup:g}x"


# Issue #53's targets (held-out prompts and fact questions): what the family must reach to replace
# the shared policy (assets/study/gpu-chat-family/RULE.txt, written before the lease).
TARGETS = (
    Target(1.5, "fact_retention", 0.95, True),
    Target(2.0, "fact_retention", 0.90, True),
    Target(2.0, "judged_ppl_ratio", 1.5, False),
    Target(2.0, "agreement", 0.70, True),
    Target(3.0, "fact_retention", 0.75, True),
    Target(3.0, "judged_ppl_ratio", 2.5, False),
)


@dataclass(frozen=True)
class TargetCheck:
    target: Target
    value: float | None  # None: not measured in this run
    met: bool

    def describe(self) -> str:
        shown = "not measured" if self.value is None else f"{self.value:.3f}"
        return f"{self.target.describe()}: {shown} ({'met' if self.met else 'not met'})"


def check_targets(values: Mapping[tuple[str, float], float | None]) -> list[TargetCheck]:
    """Each target against ``values[(measure, speedup)]`` (a family's own rows); unmeasured is not met."""
    checks = []
    for target in TARGETS:
        value = next((v for (measure, speedup), v in values.items()
                      if measure == target.measure and abs(speedup - target.speedup) < SAME_SPEEDUP), None)
        met = value is not None and (value >= target.bound if target.at_least else value <= target.bound)
        checks.append(TargetCheck(target, value, met))
    return checks
