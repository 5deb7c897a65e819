"""Which checkpoint of each chat-family run ships: the rule of assets/study/gpu-chat-family/RULE.txt,
applied by lab/training/gpu_chat_family.sh after its runs.

    python lab/training/chat_family_pick.py WORK 1.5 2 3

WORK holds one run per speedup, WORK/skip-<S>x (train_log.jsonl, adapter-step-N checkpoints, the
run's log in WORK/logs/skip-<S>x.log) and WORK/start (the policy every run started from: step 0).
Candidates are the start and every checkpoint that was saved AND scored on the held-out prompts
(assets/prompts/eval.jsonl: never the fact questions); the pick has the best teacher-forced held-out
agreement at the run's own speedup, then the lower KL, then the earlier step. One line per speedup
on stdout: ``S PICK agreement=A kl=K step=N``, then every candidate; ``S none`` when nothing was scored.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# train's first line of held-out scores (the start, before any step), as printed to its log
UNTRAINED = re.compile(r"untrained held-out: (.*)")
SCORE = re.compile(r"([0-9.]+)x agree ([0-9.]+) KL ([0-9.]+)")


@dataclass(frozen=True)
class Candidate:
    step: int
    folder: Path
    agreement: float
    kl: float

    def line(self) -> str:
        return f"agreement={self.agreement:.4f} kl={self.kl:.4f} step={self.step}"


def speed_key(speedup: float) -> str:
    """The held-out record's key of a speedup, as train writes it ("1.5x", "2x")."""
    return f"{speedup:g}x"


def start_scores(log: Path, speedup: float) -> tuple[float, float] | None:
    """(agreement, KL) of the start at ``speedup`` from the run's "untrained held-out" line."""
    if not log.is_file():
        return None
    for line in log.read_text(errors="replace").replace("\r", "\n").splitlines():
        found = UNTRAINED.search(line)
        if found:
            for speed, agreement, kl in SCORE.findall(found.group(1)):
                if abs(float(speed) - speedup) < 1e-9:
                    return float(agreement), float(kl)
    return None


def candidates(work: Path, speedup: float) -> list[Candidate]:
    """The start and every snapped checkpoint with a held-out score at ``speedup``."""
    name = f"skip-{speedup:g}x"
    run, found = work / name, []
    start = start_scores(work / "logs" / f"{name}.log", speedup)
    if start is not None and (work / "start" / "adapter_config.json").is_file():
        found.append(Candidate(0, work / "start", *start))
    log = run / "train_log.jsonl"
    for line in (log.read_text().splitlines() if log.is_file() else []):
        try:
            record = json.loads(line)
            score = record["heldout"][speed_key(speedup)]
        except (ValueError, KeyError, TypeError):
            continue  # a step without a held-out point (or a torn last line)
        folder = run / f"adapter-step-{record['step']}"
        if (folder / "adapter_config.json").is_file():
            found.append(Candidate(int(record["step"]), folder, float(score["agreement"]), float(score["kl"])))
    return found


def pick(found: Sequence[Candidate]) -> Candidate | None:
    """The best agreement, then the lower KL, then the earlier step."""
    return min(found, key=lambda c: (-c.agreement, c.kl, c.step), default=None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("speedups", type=float, nargs="+")
    args = parser.parse_args(argv)
    for speedup in args.speedups:
        found = candidates(args.work, speedup)
        best = pick(found)
        if best is None:
            print(f"{speedup:g} none")
            continue
        others = " ".join(f"[{c.folder.name} {c.line()}]" for c in found)
        print(f"{speedup:g} {best.folder} {best.line()} {others}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
