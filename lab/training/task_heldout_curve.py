"""Held-out devset BLEU of a task's skip policy at one speedup, for an adapter folder (a run's
checkpoint copy, or a shipped policy): the curve a continuation is judged by, never the test set.

    PYTHONPATH=. python lab/training/task_heldout_curve.py runs/e2e-skip-2x-cont/adapter-step-50 --speedup 2
    PYTHONPATH=. python lab/training/task_heldout_curve.py runs/e2e-task-relex2/adapter-step-40 --speedup 1 --relexicalised 2

``--speedup 1`` scores the folder as a task model itself (full depth). ``--relexicalised K`` scores K
rewritten copies of each held-out MR instead (pubs, restaurants, the other cuisines:
model/tasks/e2e.py relexicalised_records), the test set's values that the devset lacks. ``--long N``
also judges a policy on N new MRs that name all eight attributes (the test set's hardest, rare in
the devset), against the task model's own text since they have no references: the share of
descriptions naming the MR's near place, and closeness; ``--invented-places`` takes their name and
near place from places no training data names (the test set's own restaurants are such places).

    PYTHONPATH=. python lab/training/task_heldout_curve.py assets/adapters/e2e/skip-2x --speedup 2 --relexicalised --long 100 --invented-places

Prints one JSON line per adapter and held-out set: the task model's scores at 1x and the policy's
at the speedup, with how close it stays to the task model's own descriptions (with
``--no-task-model``, the policy's scores alone). 50 held-out MRs of devset.csv, float32, CPU unless
``--device`` (model/tasks/task_training.py: heldout_bleu, long_mr_fidelity).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from model.tasks.task_training import (
    TaskRun,
    heldout_bleu,
    heldout_records,
    long_mr_fidelity,
    sparse_mr_made_up,
    train_config,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapters", nargs="+", help="one or more adapter folders (a run's checkpoint copies)")
    parser.add_argument("--speedup", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mrs", type=int, default=50)
    parser.add_argument("--relexicalised", type=int, nargs="*", default=[0],
                        help="copies per held-out MR; several values score several sets (0: the MRs as written; "
                             "none: no such set)")
    parser.add_argument("--long", type=int, default=0,
                        help="also N new MRs naming all eight attributes, judged against the task model's text "
                             "(no references): how often the near place is named, closeness")
    parser.add_argument("--sparse", type=int, default=0,
                        help="also N new MRs with few facts (each optional attribute present half the time), "
                             "judged by how many descriptions make up a fact the MR does not give, at 1x and here")
    parser.add_argument("--invented-places", action="store_true",
                        help="with --long: their name and near place invented, in no training data")
    parser.add_argument("--delexicalised-places", action="store_true",
                        help="with --long: places the training MRs never name are swapped for known ones in the "
                             "prompt and back in the text (the challenge baseline's delexicalisation)")
    parser.add_argument("--task-adapter", default=None, help="the task model a policy runs on (default: the shipped one)")
    parser.add_argument("--device", default="cpu", help="cpu (the figures in the docs) or cuda")
    parser.add_argument("--no-task-model", action="store_true",
                        help="score the policy alone: no 1x pass, so no closeness to the task model's text")
    args = parser.parse_args()
    if args.delexicalised_places and not args.long:
        parser.error("--delexicalised-places applies to the --long MRs (the held-out devset MRs name no new place)")
    if (args.long or args.sparse) and args.speedup == 1:
        parser.error("--long and --sparse judge a policy against the task model: give a --speedup above 1")
    torch.set_num_threads(args.threads)
    task_model = args.speedup == 1
    run = TaskRun(policy="task" if task_model else f"{args.speedup:g}", device=args.device, heldout_mrs=args.mrs,
                  task_adapter=args.task_adapter)
    config = train_config(run, Path("unused-train.jsonl"))  # only its task adapter is read
    speedups = (1.0,) if task_model else ((args.speedup,) if args.no_task_model else (1.0, args.speedup))
    for adapter in args.adapters:
        for copies in args.relexicalised:
            held = heldout_records(run, copies)
            scores = heldout_bleu(run, config, Path(adapter), speedups, held)
            print(json.dumps({"adapter": adapter, "task_adapter": config.task_adapter, "relexicalised": copies,
                              "mrs": len(held), "device": args.device, **scores}), flush=True)
        if args.long:
            scores = long_mr_fidelity(run, config, Path(adapter), args.speedup, args.long, args.invented_places,
                                      args.delexicalised_places)
            kind = ("long-invented-places" if args.invented_places else "long") + (
                "-delexicalised" if args.delexicalised_places else "")
            print(json.dumps({"adapter": adapter, "task_adapter": config.task_adapter, "set": kind, "mrs": args.long,
                              "device": args.device, **scores}), flush=True)
        if args.sparse:
            scores = sparse_mr_made_up(run, config, Path(adapter), args.speedup, args.sparse)
            print(json.dumps({"adapter": adapter, "task_adapter": config.task_adapter, "set": "sparse",
                              "mrs": args.sparse, "device": args.device, **scores}), flush=True)


if __name__ == "__main__":
    main()
