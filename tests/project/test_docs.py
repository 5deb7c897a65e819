"""The README stays a page for users, and nothing moved out of it is lost: its prose lines are short
enough to read, every relative link in README.md and docs/ (docs/history/ too) resolves, and every
figure (image) is reachable from the README by links. The module maps (docs/DESIGN.md's, docs/DEVELOPING.md's)
name only paths that exist, and DESIGN.md's names every module of the product. DEVELOPING.md's table of the
tree by size (tests/project/tree_table.py writes it) is within 10% of the tree."""

import re
from pathlib import Path

from tests.project import tree_table
from tests.support import ROOT

README_MAX_LINES = 250
README_MAX_LINE_CHARS = 120
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
LINK_TARGET = re.compile(r"\]\([^)\s]+\)")


def _doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def long_prose_lines(text: str, limit: int = README_MAX_LINE_CHARS) -> list[str]:
    """Lines of a markdown page over ``limit`` characters, outside tables and code blocks, a link's
    target not counted (its text is): "line N (length): start"."""
    long, in_code = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        length = len(LINK_TARGET.sub("]", line))
        if not in_code and not line.lstrip().startswith("|") and length > limit:
            long.append(f"line {number} ({length}): {line[:60]}")
    return long


def _links(page: Path) -> list[tuple[str, Path]]:
    """(the link as written, the file it points to) for every relative link of a markdown page."""
    found = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the same page
        found.append((target, (page.parent / target.split("#")[0]).resolve()))
    return found


def test_the_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_the_readme_lines_are_readable():
    long = long_prose_lines((ROOT / "README.md").read_text())
    assert not long, f"README.md lines over {README_MAX_LINE_CHARS} characters outside tables and code: {long}"


def test_the_line_check_finds_a_long_prose_line():
    """The check itself: a 121-character sentence is found; a long table row, code line or link target is not."""
    prose, url = "x" * 121, "https://example.org/" + "y" * 200
    text = "\n".join(["x" * 120, f"| {prose} |", "```bash", prose, "```", f"See [the page]({url}).", prose])
    assert long_prose_lines(text) == [f"line 7 (121): {'x' * 60}"]


def test_every_relative_link_resolves():
    pages = _doc_pages()
    broken = [f"{page.relative_to(ROOT)}: {text}" for page in pages for text, path in _links(page) if not path.exists()]
    assert not broken, broken


def test_every_figure_is_reachable_from_the_readme():
    seen, todo, images = set(), [ROOT / "README.md"], set()
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for _, path in _links(page):
            if path.suffix == ".md" and path.exists():
                todo.append(path)
            elif path.suffix in (".png", ".svg", ".gif", ".jpg"):
                images.add(path)
    every_image = {(page.parent / target).resolve() for page in _doc_pages()
                   for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text())}
    assert every_image <= images, sorted(str(p.relative_to(ROOT)) for p in every_image - images)
    for figure in ("assets/images/playground.png", "assets/images/results.png"):
        assert (ROOT / figure).resolve() in images, f"{figure} is not reachable from README.md"
    for doc in ("RESULTS", "TRAINING", "SERVING", "DEVELOPING", "DESIGN"):
        assert (ROOT / "docs" / f"{doc}.md").resolve() in seen, f"README.md links to no docs/{doc}.md"


# The module maps: docs/DESIGN.md's names every product module; docs/DEVELOPING.md's is the short tour.
MAPS = {"docs/DESIGN.md": "## Module map", "docs/DEVELOPING.md": "## What is inside"}
CODE = re.compile(r"`([^`\s]+)`")  # a backticked name without spaces: a path, a function, a setting


def map_rows(text: str, heading: str) -> list[tuple[str, str]]:
    """(first cell, the rest of the row) of each body row of the table under ``heading``. The rest is kept
    whole: a cell's code may hold a "|" (`generate|train`), so only the first one splits."""
    section = text.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    body = [line.strip() for line in section.splitlines() if line.startswith("|")][2:]  # past the header and rule
    cells = [line.strip("|").split("|", 1) for line in body]
    return [(first.strip(), rest.strip()) for first, rest in cells]


def missing_paths(rows: list[tuple[str, str]], root: Path) -> list[str]:
    """Every path a map names that is not there: each name in a row's first cell (the files it is about),
    and each name with a "/" in the rest (a file it points to)."""
    named = [name for first, rest in rows
             for name in CODE.findall(first) + [n for n in CODE.findall(rest) if "/" in n]]
    return [name for name in named if not (root / name).exists()]


def unmapped_modules(rows: list[tuple[str, str]], root: Path) -> list[str]:
    """The product's modules (model/ and app/, not __init__.py) that no row's first cell names, by itself
    or by a folder above it ("app/")."""
    named = {name for first, _ in rows for name in CODE.findall(first)}
    folders = tuple(name for name in named if name.endswith("/"))
    modules = sorted(str(path.relative_to(root)) for package in ("model", "app")
                     for path in (root / package).rglob("*.py") if path.name != "__init__.py")
    return [module for module in modules if module not in named and not module.startswith(folders or ("\0",))]


def test_every_path_the_module_maps_name_exists():
    missing = {page: missing_paths(map_rows((ROOT / page).read_text(), heading), ROOT)
               for page, heading in MAPS.items()}
    assert not any(missing.values()), f"paths named in a map that are not there: {missing}"


def test_every_product_module_is_in_the_design_maps():
    rows = map_rows((ROOT / "docs/DESIGN.md").read_text(), MAPS["docs/DESIGN.md"])
    assert len(rows) > 30  # the table was found
    unmapped = unmapped_modules(rows, ROOT)
    assert not unmapped, f"docs/DESIGN.md's module map names none of {unmapped}: add a row (or name it in one)"


def test_the_map_checks_find_a_lost_path_and_an_unmapped_module(tmp_path):
    for name in ("model/a.py", "model/b.py", "model/__init__.py", "app/page/c.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    text = "\n".join(["# Map", "## Module map", "", "| module | job |", "|---|---|",
                      "| `model/a.py`, `model/gone.py` | see `app/page/` and `run_it` |", "| `app/page/` | the page |",
                      "## Next", "| `model/b.py` | another table |"])
    rows = map_rows(text, "## Module map")
    assert rows == [("`model/a.py`, `model/gone.py`", "see `app/page/` and `run_it`"), ("`app/page/`", "the page")]
    assert missing_paths(rows, tmp_path) == ["model/gone.py"]
    assert unmapped_modules(rows, tmp_path) == ["model/b.py"]


def test_the_tree_table_in_developing_is_current():
    stale = tree_table.stale_figures((ROOT / "docs/DEVELOPING.md").read_text())
    assert not stale, f"docs/DEVELOPING.md's tree table is off: {stale}; run python -m tests.project.tree_table --write"


def test_the_tree_table_allows_small_edits_and_finds_growth(tmp_path):
    """The check itself, on a tree of one folder: 9% more lines is current, 20% more is not; the table
    is written between the page's markers and read back."""
    kernels, tests = tmp_path / "model" / "lowbit" / "kernels.py", tmp_path / "tests" / "test_a.py"
    for path, text in ((kernels, "x = 1\n" * 100), (tests, "def test_one():\n    pass\n")):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    page = tmp_path / "PAGE.md"
    page.write_text(f"# Page\n\n{tree_table.START}\nthe stale table\n{tree_table.END}\n\nafter\n")
    tree_table.write_page(page, tmp_path)
    text = page.read_text()
    assert text.startswith("# Page\n\n") and text.endswith("\n\nafter\n") and "the stale table" not in text
    rows, count = tree_table.page_figures(text)
    assert rows["model/lowbit"] == (1, 100) and rows["app/page"] == (0, 0) and count == 1
    assert tree_table.stale_figures(text, tmp_path) == []
    kernels.write_text("x = 1\n" * 109)
    assert tree_table.stale_figures(text, tmp_path) == []
    kernels.write_text("x = 1\n" * 120)
    assert tree_table.stale_figures(text, tmp_path) == ["model/lowbit: lines 100 on the page, 120 in the tree"]


def test_the_settings_table_is_the_generated_one():
    """docs/SERVING.md's table of environment variables is model/common/settings.py's, as generated (a
    stale one: `python -m model settings-table --write`)."""
    from model.common.settings import SETTINGS_PAGE, with_settings_table

    page = SETTINGS_PAGE.read_text()
    assert SETTINGS_PAGE == ROOT / "docs" / "SERVING.md"
    assert page == with_settings_table(page), "docs/SERVING.md's settings table is stale: run " \
        "`python -m model settings-table --write`"
