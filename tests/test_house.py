"""House rules a reviewer would otherwise check by hand (issue #35, "habits"): no function or
method in app/ or model/ is longer than MAX_FUNCTION_LINES, counted from its ``def`` (decorators
not included) to its last line, docstring and comments included. A longer one is split into
named steps (see docs/DEVELOPING.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60


def _functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_function_over_sixty_lines():
    files = [*sorted((ROOT / "app").rglob("*.py")), *sorted((ROOT / "model").rglob("*.py"))]
    assert len(files) > 20  # the walk found the packages
    too_long = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
                for path in files for name, line, length in _functions(path) if length > MAX_FUNCTION_LINES]
    assert not too_long, f"split these into named steps (at most {MAX_FUNCTION_LINES} lines each): {too_long}"


def test_the_walk_counts_a_long_function(tmp_path):
    """The counter itself: a 61-line function is found, a 60-line one is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n    return 0\n\n\ndef short():\n{body}\n")
    lengths = {name: length for name, _, length in _functions(tmp_path / "long.py")}
    assert lengths == {"long": 61, "short": 60}
