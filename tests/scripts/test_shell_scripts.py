"""Every shell script parses (`bash -n`): the GPU scripts run only on a lent machine, where a
syntax error costs a lease, so they are checked here on every run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.sh"))


def test_the_gpu_scripts_are_among_those_checked():
    names = {script.name for script in SCRIPTS}
    assert {"gpu_e2e_family.sh", "gpu_e2e_distil.sh", "gpu_task_e2e.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda script: script.name)
def test_the_script_parses(script: Path):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_a_broken_script_is_caught(tmp_path: Path):
    broken = tmp_path / "broken.sh"
    broken.write_text("if true; then\n  echo unclosed\n")
    assert subprocess.run(["bash", "-n", str(broken)], capture_output=True, check=False).returncode != 0


def test_the_family_script_needs_an_output_folder():
    family = next(script for script in SCRIPTS if script.name == "gpu_e2e_family.sh")
    result = subprocess.run(["bash", str(family)], capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "usage: gpu_e2e_family.sh OUT_DIR" in result.stderr
