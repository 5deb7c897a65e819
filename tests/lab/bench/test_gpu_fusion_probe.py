"""lab/bench/gpu_fusion_probe.py, dry-run on the CPU with a tiny config: a lease runs it for minutes at most,
so it must not meet a broken argument or a missing key there first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import run_script


@pytest.mark.slow
def test_the_fusion_probe_times_both_steps_and_compares_their_tokens(tmp_path: Path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=256, tie_word_embeddings=True)))
    output = tmp_path / "out" / "fusion.json"
    run_script("lab/bench/gpu_fusion_probe.py", "--config", str(config), "--device", "cpu", "--dtype", "float32",
               "--tokens", "4", "--repeats", "1", "--batch-sizes", "1,2", "--output", str(output))
    report = json.loads(output.read_text())
    assert report["layers"] == 2 and report["device"] == "cpu"
    assert [(row["batch"], row["mode"]) for row in report["rows"]] == [
        (batch, mode) for batch in (1, 2) for mode in ("graphs", "compiled graphs")]
    assert all(row["tokens_per_second"] > 0 and row["decode_step_ms"] > 0 for row in report["rows"])
    assert [row.get("same_tokens_as_graphs") for row in report["rows"][1::2]] == [True, True]
