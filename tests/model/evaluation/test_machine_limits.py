"""The bench's machine limits and shares (model/evaluation/machine_limits.py) and its llama-batched-bench
parsing: canned output, arithmetic by hand, and the two probes giving positive, plausible figures."""

import json
import shutil

import pytest

from model.evaluation.bench import BenchReport, BenchRow, PrefillRow, add_shares
from model.evaluation.machine_limits import (
    MachineLimits,
    arithmetic_share,
    bandwidth_share,
    huge_page_read_bandwidth,
    multiply_add_peak,
    parse_batched_bench,
    read_bandwidth,
)
from model.lowbit.native_kernels import q4_isa


def test_batched_bench_output_is_parsed_per_batch():
    # llama-batched-bench --output-format jsonl prints one object per npl (canned, abridged)
    output = "\n".join([
        "main: n_kv_max = 1552, n_batch = 2048",
        json.dumps({"pp": 32, "tg": 64, "pl": 1, "t_tg": 0.7, "speed_tg": 91.4, "speed": 95.0}),
        json.dumps({"pp": 32, "tg": 64, "pl": 8, "t_tg": 2.9, "speed_tg": 175.2, "speed": 180.0}),
    ])
    assert parse_batched_bench(output, 8) == pytest.approx(175.2)
    assert parse_batched_bench(output, 1) == pytest.approx(91.4)
    with pytest.raises(RuntimeError, match="npl 4"):
        parse_batched_bench(output, 4)


def test_shares_are_rates_over_the_measured_limits():
    limits = MachineLimits(read_gb_per_second=25.0, multiply_adds_per_second=100e9, isa="avx512-vnni", threads=2)
    # 200 steps/s x 100M weights x 0.625 bytes = 12.5 GB/s of 25: half
    assert bandwidth_share(limits, 200.0, 100e6) == pytest.approx(0.5)
    # 800 tokens/s x 100M weights = 80G multiply-adds/s of 100G
    assert arithmetic_share(limits, 800.0, 100e6) == pytest.approx(0.8)
    assert arithmetic_share(MachineLimits(25.0, None, None, 2), 800.0, 100e6) is None
    # the limit is the faster kind of page; the slower read is named beside it
    assert "25.0 GB/s on 2 MiB pages (20.5 on 4 KiB pages)" in MachineLimits(25.0, None, None, 2, 20.5).describe()
    assert "pages" not in MachineLimits(25.0, None, None, 2).describe()
    # each instruction set's multiply-add named as its kernels compute it
    assert "two VNNI byte products a multiply-add" in MachineLimits(25.0, 1e11, "avx512-vnni", 2).describe()
    assert "one vpmaddwd 16-bit product a multiply-add" in MachineLimits(25.0, 1e11, "avx2", 2).describe()
    report = BenchReport(model="m", adapter=None, device="cpu", dtype="float32", hardware={"summary": "cpu"}, new_tokens=8,
                         repeats=1, decay="linear")
    report.rows = [BenchRow(mode="full", batch_size=8, target_speedup=None, tokens_per_second=700.0,
                            step_latency_ms=10.0, seconds=1.0, decode_tokens_per_second=800.0),
                   BenchRow(mode="skipdecode", batch_size=8, target_speedup=2.0, tokens_per_second=1300.0,
                            step_latency_ms=5.0, seconds=0.5, decode_tokens_per_second=1600.0, cost_speedup=2.0)]
    report.prefill = [PrefillRow(weights="int4", prompt_tokens=512, tokens_per_second=500.0, ttft_ms=1000.0)]
    add_shares(report, limits, 100e6)
    full, skip = report.rows
    # 100 steps/s x 100M weights x 0.625 bytes = 6.25 GB/s of 25; 800 tokens/s x 100M = 80G of 100G
    assert full.bandwidth_share == pytest.approx(0.25) and full.arithmetic_share == pytest.approx(0.8)
    # half the weights a token at twice the rate: the same multiply-adds a second and bytes a second
    assert skip.arithmetic_share == pytest.approx(0.8) and skip.bandwidth_share == pytest.approx(0.25)
    assert report.prefill[0].arithmetic_share == pytest.approx(0.5)
    assert "of read bandwidth" in report.to_markdown()


def test_the_probes_measure_this_machine():
    assert 0.1 < read_bandwidth(1, megabytes=64, reads=2) < 10_000  # GB/s
    on_huge_pages = huge_page_read_bandwidth(1, megabytes=64, reads=2)
    assert on_huge_pages is None or 0.1 < on_huge_pages < 10_000  # None: no huge pages to ask for here
    if shutil.which("c++") is None or q4_isa() is None:
        pytest.skip("no q4 kernels here")
    peak = multiply_add_peak(1, seconds=0.05)
    assert peak is not None and 1e8 < peak < 1e13  # multiply-adds a second on one thread
