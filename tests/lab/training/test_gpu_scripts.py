"""The GPU runs' shell scripts (lab/training/*.sh) on the CPU: what each needs and the checkpoint snapper.
They run only on a lent machine, where an error costs a lease."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPTS = sorted((Path(__file__).resolve().parents[3] / "lab" / "training").glob("*.sh"))


def test_the_family_script_needs_an_output_folder():
    family = next(script for script in SCRIPTS if script.name == "gpu_e2e_family.sh")
    result = subprocess.run(["bash", str(family)], capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "usage: gpu_e2e_family.sh OUT_DIR" in result.stderr


def test_the_last_checkpoint_is_kept_once_and_no_half_copy_stays(tmp_path: Path):
    run = tmp_path / "run"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "training_info.json").write_text('{"step": 40}')
    (run / "copy.partial").mkdir()  # a copy a killed snapper left behind
    library = next(script for script in SCRIPTS if script.name == "checkpoint_snaps.sh")
    command = f'PY=python3; . "{library}"; snap_last "{run}"; snap_last "{run}"'
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in run.iterdir()) == ["adapter", "adapter-step-40"]
    assert (run / "adapter-step-40" / "training_info.json").is_file()
