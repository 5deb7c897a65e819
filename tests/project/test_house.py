"""House rules a reviewer would otherwise check by hand (issue #35, "habits"): no function or
method in app/ or model/ is longer than MAX_FUNCTION_LINES, counted from its ``def`` (decorators
not included) to its last line, docstring and comments included. A longer one is split into
named steps (see docs/DEVELOPING.md). And tests sit in folders named like the packages they test."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT

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


# Test folders with no package of their own: project-wide rules (layers, house, docs).
TEST_FOLDERS_WITHOUT_A_PACKAGE = {"project"}


def misplaced_tests(tests_root: Path, repo_root: Path) -> list[str]:
    """Test files not laid out like the packages: tests/<path>/test_x.py needs <path> to be a
    folder of the repository (model/skipdecode, app, scripts...) or a project-wide folder."""
    wrong = []
    for path in sorted(tests_root.rglob("test_*.py")):
        folder = path.parent.relative_to(tests_root)
        if folder == Path("."):
            wrong.append(f"{path.name}: directly in tests/")
        elif not (repo_root / folder).is_dir() and folder.parts[0] not in TEST_FOLDERS_WITHOUT_A_PACKAGE:
            wrong.append(f"{folder / path.name}: no folder {folder} in the repository")
    return wrong


def test_tests_are_laid_out_like_the_packages():
    assert len(list((ROOT / "tests").rglob("test_*.py"))) > 20
    assert not misplaced_tests(ROOT / "tests", ROOT)


def test_a_misplaced_test_is_named(tmp_path):
    (tmp_path / "repo" / "model" / "skipdecode").mkdir(parents=True)
    for name in ("model/skipdecode/test_ok.py", "test_flat.py", "model/nowhere/test_lost.py", "project/test_p.py"):
        (tmp_path / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / name).write_text("")
    assert misplaced_tests(tmp_path / "tests", tmp_path / "repo") == [
        "model/nowhere/test_lost.py: no folder model/nowhere in the repository", "test_flat.py: directly in tests/"]
