"""Held-out devset BLEU of a task's skip policy at one speedup, for an adapter folder (a run's
checkpoint copy, or a shipped policy): the curve a continuation is judged by, never the test set.

    PYTHONPATH=. python scripts/task_heldout_curve.py runs/e2e-skip-2x-cont/adapter-step-50 --speedup 2

Prints one JSON line: the task model's scores at 1x and the policy's at the speedup, with how close
it stays to the task model's own descriptions (50 held-out MRs of devset.csv, float32, CPU;
model/tasks/task_training.py: heldout_bleu).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from model.tasks.task_training import TaskRun, heldout_bleu, train_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapter")
    parser.add_argument("--speedup", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mrs", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = TaskRun(policy=f"{args.speedup:g}", device="cpu", heldout_mrs=args.mrs)
    config = train_config(run, Path("unused-train.jsonl"))  # only its task adapter is read
    scores = heldout_bleu(run, config, Path(args.adapter), (1.0, args.speedup))
    print(json.dumps({"adapter": args.adapter, **scores}))


if __name__ == "__main__":
    main()
