"""How close a 3x policy stays to the task model on MRs it TRAINED on (the distillation targets' own
MRs: the first 100 devset training MRs and the first 100 synthetic ones) against held-out ones:
whether it underfits its own targets (capacity, the schedule) or fails to generalise.

    PYTHONPATH=. python assets/study/cpu-2026-11-27d-e2e-sparse/fit_check.py assets/adapters/e2e/skip-3x \
        runs/gpu-lease-4/distilled.jsonl

(runs/gpu-lease-4/distilled.jsonl: `gunzip -c assets/study/gpu-2026-11-26-e2e-distil/distilled.jsonl.gz`.)
Prints one JSON line per set: BLEU and identical share against the task model's own text (both
decoded here, float32, 2 threads), and the share where the policy makes up a kind of fact the task
model's text does not.
"""

import json
import sys
from pathlib import Path

import torch

from model.tasks.task_eval import closeness, made_up_beyond_share
from model.tasks.task_training import TaskRun, _descriptions, train_config

TRAINING_MRS = 497  # the distillation file's devset MRs come first, then the synthetic ones


def main() -> None:
    torch.set_num_threads(2)
    adapter, rows_file = Path(sys.argv[1]), sys.argv[2]
    prefix = "meaning representation: "
    mrs = [json.loads(line)["prompt"].split(prefix, 1)[1] for line in open(rows_file, encoding="utf-8")]
    groups = {"training devset MRs": mrs[:100], "synthetic MRs (0.75)": mrs[TRAINING_MRS:TRAINING_MRS + 100]}
    run = TaskRun(policy="3")
    config = train_config(run, Path("unused"))
    for name, group in groups.items():
        out = _descriptions(run, config, adapter, group, (1.0, 3.0))
        print(json.dumps({"adapter": str(adapter), "set": name, "mrs": len(group), **closeness(out[3.0], out[1.0]),
                          "beyond_task_model": made_up_beyond_share(group, out[3.0], out[1.0])}), flush=True)


if __name__ == "__main__":
    main()
