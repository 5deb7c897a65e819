"""The benchmark: end to end on a tiny model (quick mode), and its arithmetic."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model.evaluation.bench import BenchRow, Timing, _rows, parse_llama_bench
from model.skipdecode.schedule import CostModel, solve_schedule

ROOT = Path(__file__).resolve().parents[1]


def test_ratios_and_efficiency_are_taken_between_medians():
    cost = CostModel(layer_cost=1.0, fixed_cost=10.0)
    solved = solve_schedule(20, 2.0, decay_length=10, num_steps=9, cost=cost)
    timings = {
        "hf_generate": [Timing(2.0, 0.1), Timing(4.0, 0.1), Timing(3.0, 0.1)],  # median 3.0
        "full": [Timing(2.0, 0.05), Timing(2.5, 0.05), Timing(9.0, 0.05)],  # median 2.5 (outlier ignored)
        "skip@2": [Timing(1.0, 0.02), Timing(2.0, 0.02), Timing(1.25, 0.03)],  # median 1.25
    }
    rows = {r.mode: r for r in _rows(4, timings, {}, {2.0: solved}, 20, cost, 10)}
    assert rows["full"].tokens_per_second == pytest.approx(40 / 2.5)
    assert rows["full"].vs_hf_generate == pytest.approx(3.0 / 2.5)
    skip = rows["skipdecode"]
    assert skip.measured_speedup == pytest.approx(2.0)
    assert skip.cost_speedup == pytest.approx((20 + 10) / (sum(solved.budgets) / len(solved.budgets) + 10), rel=1e-3)
    assert skip.efficiency == pytest.approx(2.0 / skip.cost_speedup, rel=1e-3)
    assert skip.step_latency_ms == pytest.approx(20.0)
    assert skip.layer_speedup == pytest.approx(solved.layer_speedup, rel=1e-3)


def test_llama_bench_output_is_parsed_for_the_generation_test():
    # llama-bench -o jsonl prints one object per test; the tg row has n_prompt 0 (canned, abridged).
    output = "\n".join([
        "warming up",
        json.dumps({"model_type": "llama ?B Q4_1", "n_threads": 2, "n_prompt": 512, "n_gen": 0, "avg_ts": 900.1}),
        json.dumps({"model_type": "llama ?B Q4_1", "n_threads": 2, "n_prompt": 0, "n_gen": 64, "avg_ts": 160.25,
                    "stddev_ts": 1.5}),
    ])
    assert parse_llama_bench(output, 64) == pytest.approx(160.25)
    with pytest.raises(RuntimeError, match="tg128"):
        parse_llama_bench(output, 128)


@pytest.mark.slow  # spawns the CLI on a folder made from the default model
def test_bench_runs_end_to_end_and_writes_every_field(tiny_folder, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    raw = tmp_path / "raw.json"
    done = subprocess.run([sys.executable, "-m", "model", "bench", "--model", str(tiny_folder), "--quick",
                           "--speedups", "1.5,2", "--output", str(tmp_path / "out"), "--json", str(raw)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(raw.read_text())
    assert report["hardware"]["summary"] and report["dtype"] == "float32"
    modes = [(r["batch_size"], r["weights"], r["mode"], r["target_speedup"]) for r in report["rows"]]
    assert modes == [(b, w, m, t) for b in (1, 2) for w in ("float", "int8", "int4") for m, t in
                     (("hf_generate", None), ("full", None), ("skipdecode", 1.5), ("skipdecode", 2.0))]
    for row in report["rows"]:  # int8 rows compare with the float full decoder of the same batch
        assert row["vs_float_full"] > 0
        if row["weights"] == "float" and row["mode"] == "full":
            assert row["vs_float_full"] == pytest.approx(1.0, abs=1e-3)  # itself, up to the figures' rounding
    fields = set(BenchRow.__dataclass_fields__)
    for row in report["rows"]:
        assert set(row) == fields
        assert row["tokens_per_second"] > 0 and row["efficiency"] > 0 and row["vs_hf_generate"] > 0
    assert (tmp_path / "out" / "bench.md").read_text().count("| 2 |") == 12
    figure = json.loads((tmp_path / "out" / "speedup.json").read_text())
    assert {trace["name"] for trace in figure["data"]} >= {"layer speedup", "cost-model speedup", "measured, batch 1"}
    assert "| batch | weights | mode |" in done.stdout
