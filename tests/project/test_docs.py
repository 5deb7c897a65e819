"""The README stays a page for users, and nothing moved out of it is lost: every relative link in
README.md and docs/ resolves, and every figure (image) is reachable from the README by links."""

import re
from pathlib import Path

from tests.support import ROOT

README_MAX_LINES = 250
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


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


def test_every_relative_link_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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
    every_image = {(page.parent / target).resolve() for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
                   for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text())}
    assert every_image <= images, sorted(str(p.relative_to(ROOT)) for p in every_image - images)
    for figure in ("assets/images/playground.png", "assets/images/results.png"):
        assert (ROOT / figure).resolve() in images, f"{figure} is not reachable from README.md"
    for doc in ("RESULTS", "TRAINING", "SERVING", "DEVELOPING", "DESIGN"):
        assert (ROOT / "docs" / f"{doc}.md").resolve() in seen, f"README.md links to no docs/{doc}.md"
