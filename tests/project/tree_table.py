"""The tree by size, for docs/DEVELOPING.md ("What is inside"): each folder of the product and of the lab
with its source files and their lines, and the number of test functions.

    python -m tests.project.tree_table            # prints the table
    python -m tests.project.tree_table --write    # writes it between the markers in docs/DEVELOPING.md

tests/project/test_docs.py checks the page's figures against the tree within TOLERANCE, so the table
is rewritten when the tree has grown or shrunk, not on every edit. It lives with the project-wide
tests, not in scripts/: it reads lab/, and the product never reaches into the lab (test_layers.py).
"""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "DEVELOPING.md"
START, END = "<!-- tree-table: start (python -m tests.project.tree_table --write) -->", "<!-- tree-table: end -->"
SOURCE_SUFFIXES = (".py", ".sh", ".cpp", ".h")
# (folder, what is in it); a folder "(top level)" counts its own files, not its subfolders' (listed apart)
FOLDERS = (
    ("model", "the library's top: the CLI, loading, the race"),
    ("model/skipdecode", "the method: schedules, the decoder, caches, the skip policy"),
    ("model/lowbit", "low-bit weights and the native decode step (C++)"),
    ("model/generation", "text in, text out: TextGenerator and its parts"),
    ("model/training", "self-distillation, its data and checkpoints"),
    ("model/evaluation", "eval, the bench, the checks, the results page"),
    ("model/tasks", "the paper's tasks: E2E and Reddit TL;DR"),
    ("model/studies", "the recipe, scaling and shape studies"),
    ("model/common", "the settings, checks, paths, progress, hardware, huge pages"),
    ("app", "the page's top: layout, handlers, settings, the task view"),
    ("app/page", "what the page shows"),
    ("app/serving", "what keeps the server fair and safe"),
    ("scripts", "the product's commands"),
    ("lab/bench", "the lab: A/B benchmarks and kernel probes"),
    ("lab/serving", "the lab: the server's one-off measurements"),
    ("lab/studies", "the lab: studies"),
    ("lab/training", "the lab: GPU training runs and their picks"),
)
TOP_LEVEL = ("model", "app")  # folders whose subfolders have rows of their own
TOLERANCE = 0.10  # a figure on the page may differ from the tree's by this share (and always by one)
ROW = re.compile(r"^\| `([^`]+)/`[^|]*\| (\d+) \| (\d+) \|")  # | `folder/` (top level) | files | lines |
TESTS_ROW = re.compile(r"^Test functions: (\d+)")


@dataclass(frozen=True)
class FolderSize:
    folder: str
    files: int
    lines: int


def folder_size(folder: str, root: Path = ROOT) -> FolderSize:
    """The source files directly in ``folder`` (and below it, unless it is a top level with rows of
    its own below) and their lines."""
    pattern = "*" if folder in TOP_LEVEL else "**/*"
    files = [path for path in (root / folder).glob(pattern)
             if path.suffix in SOURCE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts]
    return FolderSize(folder, len(files), sum(len(path.read_text(encoding="utf-8").splitlines()) for path in files))


def test_functions(root: Path = ROOT) -> int:
    """The test functions under tests/ (a parametrized one counts once): what the suite is made of."""
    count = 0
    for path in (root / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        count += sum(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
                     for node in ast.walk(tree))
    return count


def render(root: Path = ROOT) -> str:
    """The table and the test count as the page holds them, markers included."""
    lines = [START, "", "| folder | files | lines | what |", "|---|---|---|---|"]
    for folder, what in FOLDERS:
        size = folder_size(folder, root)
        top = " (top level)" if folder in TOP_LEVEL else ""
        lines.append(f"| `{folder}/`{top} | {size.files} | {size.lines} | {what} |")
    lines += ["", f"Test functions: {test_functions(root)} (under tests/; a parametrized one counts once).", "", END]
    return "\n".join(lines)


def page_figures(text: str) -> tuple[dict[str, tuple[int, int]], int | None]:
    """({folder: (files, lines)}, test functions) as the page between the markers states them."""
    table = text.split(START, 1)[1].split(END, 1)[0] if START in text else ""
    rows, tests = {}, None
    for line in table.splitlines():
        if row := ROW.match(line):
            rows[row[1]] = (int(row[2]), int(row[3]))
        elif count := TESTS_ROW.match(line):
            tests = int(count[1])
    return rows, tests


def close(stated: int, actual: int) -> bool:
    return abs(stated - actual) <= max(1, TOLERANCE * actual)


def stale_figures(text: str, root: Path = ROOT) -> list[str]:
    """What the page states that the tree no longer is (a folder missing, added, or off by more than
    TOLERANCE): "model/lowbit: lines 2544 on the page, 3100 in the tree"."""
    rows, tests = page_figures(text)
    stale = [f"{folder}: not on the page" for folder, _ in FOLDERS if folder not in rows]
    stale += [f"{folder}: on the page, not in FOLDERS" for folder in rows if folder not in dict(FOLDERS)]
    for folder in (f for f, _ in FOLDERS if f in rows):
        size = folder_size(folder, root)
        for what, stated, actual in (("files", rows[folder][0], size.files), ("lines", rows[folder][1], size.lines)):
            if not close(stated, actual):
                stale.append(f"{folder}: {what} {stated} on the page, {actual} in the tree")
    if tests is None or not close(tests, test_functions(root)):
        stale.append(f"test functions: {tests} on the page, {test_functions(root)} in the tree")
    return stale


def write_page(page: Path = PAGE, root: Path = ROOT) -> None:
    """The table written between the page's markers (they must be there: the table's place is chosen by hand)."""
    text = page.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{page}: no {START} ... {END} markers")
    before, rest = text.split(START, 1)
    page.write_text(before + render(root) + rest.split(END, 1)[1], encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write the table into {PAGE.relative_to(ROOT)}")
    args = parser.parse_args()
    if args.write:
        write_page()
    print(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
