"""The GPU runs' shell scripts (lab/training/*.sh) on the CPU: what each needs, the checkpoint snapper, and
the chat family's dry run. They run only on a lent machine, where an error costs a lease."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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


def test_the_chat_family_script_needs_an_output_folder():
    script = next(script for script in SCRIPTS if script.name == "gpu_chat_family.sh")
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "usage: gpu_chat_family.sh OUT_DIR" in result.stderr


@pytest.mark.slow
def test_the_chat_family_dry_run_runs_every_stage_on_a_tiny_model(tmp_path: Path):
    """DRY_RUN=1: the rule printed, targets written, the start cut to a lower rank, two policies
    trained side by side on their own speedups with held-out points, snapped, picked, exported in
    bf16 and packed, on the CPU (the default model's tokenizer on a tiny random Llama)."""
    import json
    import os
    import sys
    import tarfile

    root = SCRIPTS[0].parents[2]
    script = root / "lab" / "training" / "gpu_chat_family.sh"
    env = {**os.environ, "DRY_RUN": "1", "WORK": str(tmp_path / "work"), "SPEEDUPS": "1.5 3", "PYTHON": sys.executable,
           "UNLIKELIHOOD": "0.5"}
    result = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True,
                            check=False, cwd=root, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "written before the run" in result.stdout and "2. The family (the three picks)" in result.stdout
    out = tmp_path / "out"
    for name in ("skip-1.5x", "skip-3x"):
        with tarfile.open(out / f"{name}.tar") as packed:
            names = packed.getnames()
            assert {f"{name}/adapter_config.json", f"{name}/bridge.safetensors", f"{name}/training_info.json"} <= set(names)
            info = json.load(packed.extractfile(f"{name}/training_info.json"))
        speedup = float(name[5:-1])
        assert tuple(info["config"]["speedup_range"]) == (speedup, speedup)  # its own speedup's schedules only
        assert info["config"]["lora_rank"] == 2 and info["skip_policy"]["bridge_rank"] == 2
        assert info["config"]["unlikelihood"] == 0.5  # the knob reaches every run
        curve = [json.loads(line) for line in (out / "curves" / f"{name}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in curve if "heldout" in r] == [1, 2]  # a held-out point at every save
    picked = (tmp_path / "work" / "logs" / "picked.txt").read_text().splitlines()
    assert [line.split()[0] for line in picked] == ["1.5", "3"] and all("agreement=" in line for line in picked)
    assert (out / "report.tar.gz").stat().st_size > 0
