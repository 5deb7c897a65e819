"""The README stays a page for users, and nothing moved out of it is lost: its prose lines are short
enough to read, every relative link in README.md and docs/ (docs/history/ too) resolves, and every
figure (image) is reachable from the README by links."""

import re
from pathlib import Path

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


def test_the_settings_table_is_the_generated_one():
    """docs/SERVING.md's table of environment variables is model/common/settings.py's, as generated (a
    stale one: `python -m model settings-table --write`)."""
    from model.common.settings import SETTINGS_PAGE, with_settings_table

    page = SETTINGS_PAGE.read_text()
    assert SETTINGS_PAGE == ROOT / "docs" / "SERVING.md"
    assert page == with_settings_table(page), "docs/SERVING.md's settings table is stale: run " \
        "`python -m model settings-table --write`"
