"""lab/bench/huge_pages_ab.py: 4 KiB pages against huge pages, alternated in one process, paired by round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import run_script


@pytest.mark.slow  # loads the default model in int4 (twice for the weights)
@pytest.mark.parametrize("part", ["weights", "cache"])
def test_both_arms_run_alternated_and_pair_their_steps(part: str, tmp_path: Path):
    output = tmp_path / "huge-pages.json"
    run_script("lab/bench/huge_pages_ab.py", "--part", part, "--batch-sizes", "1,2", "--tokens", "8", "--repeats", "2",
               "--output", str(output), timeout=900)
    report = json.loads(output.read_text())
    assert report["part"] == part and report["repeats"] == 2 and report["tokens"] == 8
    assert [row["batch_size"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["step_ms_4k_pages"] > 0 and row["step_ms_huge_pages"] > 0
        low, high = row["paired_range"]
        assert low <= row["paired_speedup"] <= high
        # the same weights and the same arithmetic on either kind of page: no arm can be several times the other
        assert 0.4 < row["paired_speedup"] < 2.5
