"""Every lab shell script parses (`bash -n`): the GPU runs run only on a lent machine, where a syntax
error costs a lease, so they are checked here on every run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "lab").rglob("*.sh"))


def test_the_gpu_runs_are_among_those_checked():
    names = {script.name for script in SCRIPTS}
    assert {"gpu_e2e_family.sh", "gpu_e2e_distil.sh", "gpu_task_e2e.sh", "checkpoint_snaps.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda script: str(script.relative_to(script.parents[2])))
def test_the_script_parses(script: Path):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
