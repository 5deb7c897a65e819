"""How sure is each E2E share? Every arm's BLEU and ROUGE-L as a share of the task model's, with a
95% paired bootstrap interval over the test MRs and how often a draw falls below the issue's bar for
that speedup (model/tasks/task_intervals.py).

    PYTHONPATH=. python lab/studies/e2e_share_intervals.py assets/eval/e2e-delexicalised-outputs.jsonl
    PYTHONPATH=. python lab/studies/e2e_share_intervals.py assets/eval/e2e-outputs.jsonl --resamples 500

Reads an eval-task outputs file (one JSON line per arm: its label and one output per test MR, in the
test set's order; an ``--mrs N`` run's file covers the first N) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from model.tasks.e2e import reported_records
from model.tasks.task_intervals import ShareInterval, per_mr_scores, share_intervals

TASK_MODEL = "task model (1x)"
# The bars: a share of the task model's BLEU and ROUGE-L at each target speedup (none at 4x).
BARS = {2: 0.99, 3: 0.98, 5: 0.95}


def bar_for(label: str) -> float | None:
    """The bar of the speedup an arm's label names ("per-speedup policy 3x" -> 0.98), None where none."""
    found = re.search(r"(\d+)x\b", label)
    return BARS.get(int(found.group(1))) if found else None


def _cells(interval: ShareInterval) -> str:
    below = "" if interval.below is None else f"{interval.below:.0%}"
    return f"{interval.share:.3f} | {interval.low:.3f}-{interval.high:.3f} | {below}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outputs", type=Path)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    arms = {row["label"]: row["outputs"] for row in map(json.loads, args.outputs.read_text().splitlines())}
    if TASK_MODEL not in arms:
        raise SystemExit(f"{args.outputs}: no '{TASK_MODEL}' arm to take shares of")
    records = reported_records()[: len(arms[TASK_MODEL])]
    references = [record.references for record in records]
    task_model = per_mr_scores(arms[TASK_MODEL], references)
    print(f"{len(records)} test MRs, {args.resamples} paired draws (seed {args.seed})\n")
    print("| arm | bar | BLEU share | 95% interval | draws below the bar | ROUGE-L share | 95% interval "
          "| draws below the bar |")
    print("|---|---|---|---|---|---|---|---|")
    for label, outputs in arms.items():
        if label == TASK_MODEL or len(outputs) != len(records):
            continue
        bleu, rouge = share_intervals(label, per_mr_scores(outputs, references), task_model, bar=bar_for(label),
                                      resamples=args.resamples, seed=args.seed)
        bar = "" if bleu.bar is None else f"{bleu.bar:.2f}"
        print(f"| {label} | {bar} | {_cells(bleu)} | {_cells(rouge)} |")


if __name__ == "__main__":
    main()
