"""`batch-check` on a tiny float model: a shared batch's rows agree with the jobs alone, and a batch
whose rows were crossed (another row's prompt) is caught."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from model.evaluation import batch_check
from model.evaluation.batch_check import BatchCheckConfig, run_batch_check

PROMPTS_FILE_ROWS = ["Name three colours.", "What is the capital of France?", "Tell me about the sea.",
                     "Why is the sky blue?", "Write a haiku about rain.", "List four fruits."]


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in PROMPTS_FILE_ROWS))
    return str(path)


def _config(tiny_folder, prompts_file, **changes) -> BatchCheckConfig:
    options = dict(model=str(tiny_folder), adapter=None, quantize="none", prompts=prompts_file, max_prompts=6,
                   tokens=8, batch_size=3, speedups=(1.0, 2.0))
    return BatchCheckConfig(**(options | changes))


def test_a_shared_batchs_rows_agree_with_the_jobs_alone(tiny_folder, prompts_file):
    report = run_batch_check(_config(tiny_folder, prompts_file), progress=lambda line: None)
    assert [row.target_speedup for row in report.rows] == [1.0, 2.0]
    for row in report.rows:
        assert row.agreement >= 0.99 and row.positions > 0
        assert all(prefix > 0 for prefix in row.shared_prefix_tokens)  # the chat template's system turn, read once
    assert "| 2x |" in report.to_markdown()


def test_a_batch_whose_rows_were_crossed_is_caught(tiny_folder, prompts_file, monkeypatch):
    laid_out = batch_check.shared_prefix_padded

    def crossed(rows, pad_id):  # every row reads its neighbour's prompt: what a crossing bug would do
        return laid_out(rows[1:] + rows[:1], pad_id)
    monkeypatch.setattr(batch_check, "shared_prefix_padded", crossed)
    report = run_batch_check(_config(tiny_folder, prompts_file, speedups=(1.0,)), progress=lambda line: None)
    assert report.rows[0].agreement < 0.9


def test_the_command_writes_its_report(tiny_folder, prompts_file, tmp_path):
    out = tmp_path / "batch.json"
    done = subprocess.run([sys.executable, "-m", "model", "batch-check", "--model", str(tiny_folder), "--no-adapter",
                           "--quantize", "none", "--max-prompts", "3", "--tokens", "4", "--batch-size", "3",
                           "--speedups", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out.read_text())["rows"][0]["positions"] > 0
