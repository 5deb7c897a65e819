"""lab/bench/batch_ratio.py: batch sizes alternated in one process, ratios paired by round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import run_script


@pytest.mark.slow  # loads the default model in int4
def test_the_batch_ratio_alternates_the_sizes_and_pairs_their_ratios(tmp_path: Path):
    output = tmp_path / "batch-ratio.json"
    run_script("lab/bench/batch_ratio.py", "--batch-sizes", "1,3", "--tokens", "12", "--repeats", "2",
               "--output", str(output), timeout=900)
    report = json.loads(output.read_text())
    assert report["weights"] == "int4" and report["repeats"] == 2 and report["tokens"] == 12
    first, second = report["rows"]
    assert (first["batch_size"], second["batch_size"]) == (1, 3) and first["rounds"] == 2
    assert first["vs_first_batch"] == 1.0  # each round against itself
    assert second["tokens_per_second"] > 0 and second["decode_step_ms"] > 0 and second["decode_tokens_per_second"] > 0
    # three rows a step cost less than three steps of one on any CPU (the weights are read once a step), so
    # batch 3 yields more tokens a second; swapping the pair or forgetting the rows would put it below 1
    assert 1.05 < second["vs_first_batch"] < 6
    # each round's steps: the paired ratio is the median of these rounds' (3 rows over 1 row, step for step)
    assert [sorted(r) for r in report["rounds"]] == [["1", "3"], ["1", "3"]]
    ratios = sorted(3 * r["1"] / r["3"] for r in report["rounds"])
    assert ratios[0] - 0.01 <= second["vs_first_batch"] <= ratios[-1] + 0.01
