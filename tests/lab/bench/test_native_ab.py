"""lab/bench/native_ab.py: two builds of the native step alternated in one process, paired by round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import run_script


@pytest.mark.slow  # loads the default model in int4
def test_a_baseline_build_and_this_checkouts_run_alternated_and_pair_their_steps(tmp_path: Path):
    """Against HEAD's sources (this checkout's in a clean clone: the same build, no second compile) the
    arms are one build, so their paired steps can only differ by the host's noise."""
    output = tmp_path / "native-ab.json"
    run_script("lab/bench/native_ab.py", "--baseline", "HEAD", "--batch-sizes", "1,2", "--tokens", "8",
               "--repeats", "2", "--output", str(output), timeout=900)
    report = json.loads(output.read_text())
    assert report["baseline"] == "HEAD" and report["repeats"] == 2 and report["tokens"] == 8
    assert [row["batch_size"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["step_ms_baseline"] > 0 and row["step_ms_this_checkout"] > 0
        low, high = row["paired_range"]
        assert low <= row["paired_speedup"] <= high
        assert 0.4 < row["paired_speedup"] < 2.5


@pytest.mark.slow  # loads the default model in int4
def test_the_heads_call_alone_is_paired_and_its_logits_compared(tmp_path: Path):
    output = tmp_path / "native-ab-head.json"
    run_script("lab/bench/native_ab.py", "--baseline", "HEAD", "--part", "head", "--batch-sizes", "1,8",
               "--repeats", "3", "--output", str(output), timeout=900)
    report = json.loads(output.read_text())
    assert report["part"] == "head" and [row["batch_size"] for row in report["rows"]] == [1, 8]
    for row in report["rows"]:
        assert row["same_logits"] is True  # HEAD's head and this checkout's: the same integers, the same order
        assert row["head_ms_baseline"] > 0 and row["head_ms_this_checkout"] > 0
        assert row["paired_range"][0] <= row["paired_speedup"] <= row["paired_range"][1]


def test_the_baseline_sources_are_the_revisions_files():
    import subprocess

    from lab.bench import native_ab

    head = native_ab.baseline_sources("HEAD")
    assert len(head) == 3 and head[0].startswith(b"//") and b"decode_layers" in head[0]
    assert b"amx" in head[2] and b"decode" in head[1]
    with pytest.raises(subprocess.CalledProcessError):
        native_ab.baseline_sources("no-such-revision")


def test_an_arm_runs_the_schedule_it_was_given_on_its_build(monkeypatch):
    """--speedup: each arm's decoder generates at the SkipDecode schedule (not the full depth the alternation
    asks for), after its build was pointed at."""
    from lab.bench import native_ab

    pointed, generated = [], []
    monkeypatch.setattr(native_ab, "run_on", lambda decoder, module: pointed.append(module))

    class Decoder:
        def generate(self, ids, mask, schedule, **kwargs):
            generated.append((schedule, kwargs))
            return "result"

    skip, full = object(), object()
    arm = native_ab.OnBuild(Decoder(), "build", skip)
    assert arm.generate("ids", "mask", full, max_new_tokens=4) == "result"
    assert pointed == ["build"] and generated == [(skip, {"max_new_tokens": 4})]
    native_ab.OnBuild(Decoder(), "other").generate("ids", "mask", full, max_new_tokens=4)
    assert generated[-1][0] is full and pointed[-1] == "other"
