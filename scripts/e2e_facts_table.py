"""Facts on the E2E test set, per arm: the share of descriptions with a WRONG fact (a stated value that
contradicts the MR), a made-up one, a missing one, and the share with every fact stated and nothing
made up (model/tasks/e2e_facts.py), from the committed eval-task outputs, with each arm's BLEU and
ROUGE-L from its report beside them.

    PYTHONPATH=. python scripts/e2e_facts_table.py                 # prints the Markdown tables
    PYTHONPATH=. python scripts/e2e_facts_table.py --write         # also writes assets/eval/e2e-facts.json

The Results tab and the E2E lesson read assets/eval/e2e-facts.json (computing it takes ~10 s on 2
cores, too long for every start); tests check it against a fresh count.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from model.tasks.e2e import reported_records
from model.tasks.e2e_facts import fact_counts

EVAL = Path(__file__).resolve().parents[1] / "assets" / "eval"
REPORTS = ("e2e-delexicalised", "e2e")  # the playground's pipeline first, then the same policies without the swap
FACTS_FILE = EVAL / "e2e-facts.json"


def report_facts(stem: str, folder: Path = EVAL) -> dict[str, dict[str, float]]:
    """{arm label: fact_counts} for one report's outputs file (its MRs: the test set's first ones)."""
    mrs = [record.mr for record in reported_records()]
    facts = {}
    for line in (folder / f"{stem}-outputs.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        facts[row["label"]] = fact_counts(mrs[: len(row["outputs"])], row["outputs"])
    return facts


def markdown(stem: str, facts: dict[str, dict[str, float]], folder: Path = EVAL) -> str:
    """One report's arms: wrong and made-up first, then missing and all right, then BLEU and ROUGE-L."""
    report = json.loads((folder / f"{stem}.json").read_text(encoding="utf-8"))
    scores = {arm["label"]: arm["scores"] for arm in report["arms"]}
    lines = [f"{stem} ({report['test_mrs']} test MRs):", "",
             "| arm | a wrong fact | a made-up fact | a fact missing | every fact right | BLEU | ROUGE-L |",
             "|---|---|---|---|---|---|---|"]
    for label, counts in facts.items():
        score = scores.get(label, {})
        lines.append(f"| {label} | {counts['wrong']:.1%} | {counts['made up']:.1%} | {counts['missing']:.1%} | "
                     f"{counts['all right']:.1%} | {score.get('bleu', float('nan')):.2f} | "
                     f"{score.get('rouge_l', float('nan')):.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write {FACTS_FILE.relative_to(EVAL.parents[1])}")
    args = parser.parse_args()
    every = {stem: report_facts(stem) for stem in REPORTS}
    for stem, facts in every.items():
        print(markdown(stem, facts), end="\n\n")
    if args.write:
        FACTS_FILE.write_text(json.dumps(every, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
