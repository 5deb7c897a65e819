"""docs/RESULTS.md is today's figures, made from the committed JSON by ``python -m model results``:
the committed page is what the JSON gives now (a JSON rewritten without the page, or a page edited by
hand, fails here), every table row names its source, and every source names its file, command and
hardware, "not recorded" where the JSON holds none. README's results table quotes the page."""

from __future__ import annotations

import re

from model.cli import main
from model.evaluation import results_page
from model.evaluation.results_page import NOT_RECORDED, PAGE, Source, command, hardware, page_is_current, render
from tests.support import ROOT

SOURCE_CELL = re.compile(r"^S\d+(, S\d+)*$")


def _table_rows(text: str) -> list[list[str]]:
    """The body rows of every markdown table in ``text``: not a header (the line above a rule), not a rule."""
    lines = text.splitlines() + [""]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line, below in zip(lines, lines[1:])
            if line.startswith("| ") and not below.startswith("|---")]


def test_the_committed_page_is_what_the_json_gives():
    assert (ROOT / PAGE).read_text() == render(ROOT), \
        "docs/RESULTS.md is not what the JSON under assets/ gives: run `python -m model results` and commit it"


def test_the_check_fails_on_a_page_that_differs(tmp_path, capsys):
    page = tmp_path / "RESULTS.md"
    page.write_text(render(ROOT))
    assert page_is_current(ROOT, page)
    assert main(["results", "--check", "--output", str(page)]) == 0
    page.write_text(page.read_text().replace("| per-speedup policy 4x | 27.8% |", "| per-speedup policy 4x | 12.0% |"))
    assert not page_is_current(ROOT, page)
    assert main(["results", "--check", "--output", str(page)]) == 1
    assert "differs from what the JSON under assets/ gives" in capsys.readouterr().err
    assert main(["results", "--output", str(page)]) == 0  # the command writes it back
    assert page_is_current(ROOT, page)


def test_every_row_names_a_source_and_every_source_its_file_command_and_hardware():
    text = render(ROOT)
    figures, listed = text.split("## Sources")
    rows = _table_rows(figures)
    assert len(rows) > 60
    unsourced = [row for row in rows if not SOURCE_CELL.match(row[-1])]
    assert not unsourced, unsourced
    used = {source for row in rows for source in row[-1].split(", ")}
    sources = {row[0]: row for row in _table_rows(listed)}
    assert used == set(sources) and len(sources) == len(results_page.SOURCES)  # each listed source is read by a row
    for source_id, file_cell, command_cell, hardware_cell in sources.values():
        assert (ROOT / re.search(r"\((?:\.\./)?([^)]+)\)", file_cell).group(1).lstrip("./")).is_file()
        assert command_cell.startswith("`") or command_cell == NOT_RECORDED, (source_id, command_cell)
        assert hardware_cell, source_id


def test_a_json_without_hardware_or_command_says_not_recorded():
    assert hardware({}) == NOT_RECORDED and command({}, Source("assets/x.json")) == NOT_RECORDED
    assert hardware({"cpu_flags": ["avx2"]}) == "CPU flags avx2; CPU model not recorded"
    assert command({"command": "python x.py"}, Source("assets/x.json", "python y.py")) == "`python x.py`"
    documented = command({"hardware": {"torch_threads": 2}}, Source("assets/x.json", "bench --threads T --json b-tT.json"))
    assert documented == "`bench --threads 2 --json b-t2.json` (not in the JSON: as the notebook gives it)"


def test_the_readme_results_table_quotes_the_page():
    """Every figure of README's results table ("today") is on the generated page, as the page writes it."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = _table_rows(section)
    assert len(rows) >= 8
    page = (ROOT / PAGE).read_text()
    missing = [(row[0], figure) for row in rows for figure in re.findall(r"\d[\d,]*(?:\.\d+)?[x%]?", row[1])
               if figure not in page]
    assert not missing, missing
