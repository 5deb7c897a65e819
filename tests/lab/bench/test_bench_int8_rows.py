"""lab/bench/bench_int8_rows.py: both int8 paths timed side by side, each path's agreement with float."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.lowbit.native_kernels import int8_bf16_rows
from tests.support import run_script


@pytest.mark.slow
@pytest.mark.skipif(not int8_bf16_rows(), reason="int8 rows stay on torch's kernel on this CPU (no AMX-BF16 or AVX512-BF16)")
def test_the_int8_rows_bench_times_both_paths_and_their_agreement_with_float(tmp_path: Path):
    output = tmp_path / "int8-rows.json"
    run_script("lab/bench/bench_int8_rows.py", "--batch-sizes", "2", "--tokens", "3", "--repeats", "1",
               "--output", str(output))
    report = json.loads(output.read_text())
    assert [row["path"] for row in report["rows"]] == ["torch int8 kernel", "AMX-BF16 rows"]
    for row in report["rows"]:
        assert row["batch"] == 2 and row["prefill_ms"] > 0 and row["decode_step_ms"] > 0
        assert 0 <= row["vs_float"]["rows_equal"] <= 2 and 0 <= row["vs_float"]["positions_equal"] <= 1


@pytest.mark.skipif(not int8_bf16_rows(), reason="int8 rows stay on torch's kernel on this CPU (no AMX-BF16 or AVX512-BF16)")
def test_the_int8_matmul_bench_times_both_paths_at_each_row_count(tmp_path: Path):
    output = tmp_path / "int8-matmul.json"
    run_script("lab/bench/bench_int8_rows.py", "--matmul", "1,40", "--repeats", "1", "--output", str(output))
    rows = json.loads(output.read_text())["rows"]
    assert [(r["inputs"], r["rows"]) for r in rows] == [(576, 1), (576, 40), (1536, 1), (1536, 40)]
    assert all(r["torch_int8_ms"] > 0 and r["amx_bf16_ms"] > 0 and r["ratio"] > 0 for r in rows)
