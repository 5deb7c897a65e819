"""Where an E2E arm loses its BLEU: the test MRs grouped by how many attributes they name, each
group's corpus BLEU per arm, and how many descriptions name the MR's ``near[...]`` place word for
word; then the same count per near place, with whether the devset (all the training data) ever
names that place: a place never seen in training must be copied from the prompt; last, per
attribute, how many descriptions mention it at all (model/tasks/e2e.py: unmentioned_attributes),
and how many mention every fact of their MR; and how many mention it though their MR does not give
it, a fact made up (added_attributes), and how many make up none.

    PYTHONPATH=. python lab/studies/e2e_by_attributes.py assets/eval/e2e-outputs.jsonl
    PYTHONPATH=. python lab/studies/e2e_by_attributes.py assets/eval/e2e-outputs.jsonl --arms "task model (1x)" "per-speedup policy 2x"

Reads an eval-task outputs file (one JSON line per arm: its label and one output per test MR, in
the test set's order; an ``--mrs N`` run's file covers the first N) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from model.tasks.e2e import (
    ATTRIBUTES,
    E2ERecord,
    added_attributes,
    dev_split,
    parse_mr,
    place_names,
    reported_records,
    unmentioned_attributes,
)
from model.tasks.task_eval import bleu, names_near_place


def groups_by_attribute_count(records: list[E2ERecord]) -> dict[int, list[int]]:
    """Indices of the records, keyed by how many attributes each MR names."""
    groups: dict[int, list[int]] = defaultdict(list)
    for index, record in enumerate(records):
        groups[len(parse_mr(record.mr))].append(index)
    return dict(sorted(groups.items()))


def near_named(outputs: list[str], records: list[E2ERecord], indices: list[int]) -> tuple[int, int]:
    """(descriptions that contain the MR's near[...] value verbatim, MRs that have one)."""
    flags = [names_near_place(records[i].mr, outputs[i]) for i in indices]
    asked = [flag for flag in flags if flag is not None]
    return sum(asked), len(asked)


def devset_places() -> set[str]:
    """Every place name the devset (training and held-out MRs) uses, as a name or a near place."""
    train, held = dev_split()
    return place_names([*train, *held])


def near_place_rows(records: list[E2ERecord]) -> dict[str, list[int]]:
    """Indices of the records that have a near place, keyed by that place, the most frequent first."""
    rows: dict[str, list[int]] = defaultdict(list)
    for index, record in enumerate(records):
        near = parse_mr(record.mr).get("near")
        if near:
            rows[near].append(index)
    return dict(sorted(rows.items(), key=lambda item: -len(item[1])))


def attribute_counts(check: Callable[[str, str], list[str]], outputs: list[str],
                     records: list[E2ERecord]) -> tuple[dict[str, int], int]:
    """(per attribute, the descriptions ``check(mr, text)`` names it for; the descriptions it names none for)."""
    counts: dict[str, int] = defaultdict(int)
    clear = 0
    for record, text in zip(records, outputs):
        named = check(record.mr, text)
        clear += not named
        for attribute in named:
            counts[attribute] += 1
    return dict(counts), clear


def mention_counts(outputs: list[str], records: list[E2ERecord]) -> tuple[dict[str, int], int]:
    """(per attribute, the descriptions that never mention it; the descriptions that mention every fact)."""
    return attribute_counts(unmentioned_attributes, outputs, records)


def made_up_counts(outputs: list[str], records: list[E2ERecord]) -> tuple[dict[str, int], int]:
    """(per attribute, the descriptions that mention it though their MR does not give it; the
    descriptions that make up no fact)."""
    return attribute_counts(added_attributes, outputs, records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outputs", type=Path)
    parser.add_argument("--arms", nargs="*", default=None, help="labels to show (default: every arm in the file)")
    args = parser.parse_args()
    arms = {row["label"]: row["outputs"] for row in map(json.loads, args.outputs.read_text().splitlines())}
    labels = args.arms or list(arms)
    unknown = [label for label in labels if label not in arms]
    if unknown:
        parser.error(f"no arm {unknown[0]!r} in {args.outputs}; it has: {', '.join(arms)}")
    # an --mrs run (e2e-default-outputs.jsonl) described the first N test MRs
    records = reported_records()[: len(arms[labels[0]])]
    print("| attributes | MRs | " + " | ".join(f"{label}: BLEU, near named" for label in labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for count, indices in groups_by_attribute_count(records).items():
        cells = []
        for label in labels:
            outputs = arms[label]
            score = bleu([outputs[i] for i in indices], [records[i].references for i in indices])
            named, asked = near_named(outputs, records, indices)
            cells.append(f"{score:.1f}, {named}/{asked}" if asked else f"{score:.1f}, -")
        print(f"| {count} | {len(indices)} | " + " | ".join(cells) + " |")
    seen = devset_places()
    print()
    print("| near place | in the devset | MRs | " + " | ".join(f"{label}: near named" for label in labels) + " |")
    print("|---|---|---|" + "---|" * len(labels))
    for near, indices in near_place_rows(records).items():
        cells = [f"{near_named(arms[label], records, indices)[0]}/{len(indices)}" for label in labels]
        print(f"| {near} | {'yes' if near in seen else 'no'} | {len(indices)} | " + " | ".join(cells) + " |")
    asked = {attribute: sum(attribute in parse_mr(r.mr) for r in records) for attribute in ATTRIBUTES}
    counts = {label: mention_counts(arms[label], records) for label in labels}
    print()
    print("| attribute | MRs | " + " | ".join(f"{label}: mentioned" for label in labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for attribute, total in asked.items():
        cells = [f"{total - counts[label][0].get(attribute, 0)}" for label in labels]
        print(f"| {attribute} | {total} | " + " | ".join(cells) + " |")
    print(f"| every fact | {len(records)} | " + " | ".join(str(counts[label][1]) for label in labels) + " |")
    not_given = {attribute: len(records) - total for attribute, total in asked.items()}
    made_up = {label: made_up_counts(arms[label], records) for label in labels}
    print()
    print("| attribute | MRs without it | " + " | ".join(f"{label}: made up" for label in labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for attribute, total in not_given.items():
        if total:
            cells = [str(made_up[label][0].get(attribute, 0)) for label in labels]
            print(f"| {attribute} | {total} | " + " | ".join(cells) + " |")
    print(f"| no fact made up | {len(records)} | " + " | ".join(str(made_up[label][1]) for label in labels) + " |")


if __name__ == "__main__":
    main()
