"""Every product shell script parses (`bash -n`), and the lease check (gpu_check.sh), which runs only
on a lent machine where an error costs a lease, runs every stage on the CPU. The lab's shell scripts:
tests/lab/test_shell_scripts.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.sh"))


def test_the_lease_check_is_among_those_checked():
    assert {"gpu_check.sh", "setup.sh", "start.sh", "test.sh"} <= {script.name for script in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda script: script.name)
def test_the_script_parses(script: Path):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_a_broken_script_is_caught(tmp_path: Path):
    broken = tmp_path / "broken.sh"
    broken.write_text("if true; then\n  echo unclosed\n")
    assert subprocess.run(["bash", "-n", str(broken)], capture_output=True, check=False).returncode != 0


def test_the_gpu_check_needs_an_output_folder():
    check = next(script for script in SCRIPTS if script.name == "gpu_check.sh")
    result = subprocess.run(["bash", str(check)], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "usage: gpu_check.sh [--dry-run] OUT" in result.stderr


@pytest.mark.slow  # spawns pytest, the bench, a burst and the thread scaling on a tiny model (minutes)
def test_the_gpu_check_dry_run_runs_every_stage_on_the_cpu(tmp_path: Path):
    """The lease's one command, every stage on the CPU with a tiny random model: a lease costs device
    time, so the script must be known to run before it gets one."""
    check = next(script for script in SCRIPTS if script.name == "gpu_check.sh")
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(check), "--dry-run", str(out)], capture_output=True, text=True,
                            check=False, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.md", "burst.json", "env.txt", "log.txt",
                                                     "summary.txt", "tests.log", "threads.json", "threads.md"]  # 9 files
    summary = (out / "summary.txt").read_text()
    assert all(f"{stage} status=0" in summary for stage in ("tiny-model", "tests", "bench", "burst", "threads"))
    tests = (out / "tests.log").read_text()
    assert "passed" in tests and "skipped" in tests and "CUDA graphs need a CUDA device" in tests
    bench = json.loads((out / "bench.json").read_text())
    assert {"full", "skipdecode", "static full", "static skipdecode", "compiled full",
            "compiled skipdecode"} <= {row["mode"] for row in bench["rows"]}
    burst = json.loads((out / "burst.json").read_text())["batched"]
    assert burst["answered_own_prompt"] == 4 and burst["largest_batch"] >= 2 and not burst["bursts"][0]["errors"]
    assert any("need a CUDA device" in note for note in bench["notes"])
    assert "| static skip 2x" in (out / "bench.md").read_text()
    threads = json.loads((out / "threads.json").read_text())
    assert [(r["threads"], r["hardware"]["torch_threads"]) for r in threads] == [(1, 1), (2, 2)]
    assert all({row["mode"] for row in r["rows"]} == {"full", "skipdecode"} for r in threads)
    table = (out / "threads.md").read_text()
    assert "| 1 |" in table and "| 2 |" in table and "CPU flags" in table
