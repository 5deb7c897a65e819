"""The benchmark: end to end on a tiny model (quick mode), and its arithmetic."""

import json
import os
import subprocess
import sys

import pytest
import torch

from model.common.settings import settings
from model.evaluation.bench import (
    NO_CUDA_NOTE,
    BenchConfig,
    BenchReport,
    BenchRow,
    Mode,
    PrefillRow,
    Timing,
    WeightVariant,
    _rows,
    _time_modes,
    add_captures,
    engine_modes,
    int4_kernel,
    parse_llama_bench,
    run_bench,
    scaling_rows,
    split_weight_mode,
)
from model.lowbit.native_kernels import native_module, q4_isa, q4_kernel_selected
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.schedule import CostModel, solve_schedule
from tests.support import NUM_LAYERS, ROOT, left_padded_batch, tiny_model


def _modes(timings: dict[str, list[Timing]]) -> dict[Mode, list[Timing]]:
    """The timings keyed as the bench keys them, from the names its notes write ("graphs:skip@2")."""
    return {Mode.parse(name): runs for name, runs in timings.items()}


def test_a_mode_is_parsed_once_and_names_itself_as_the_reports_do():
    for name, mode, row_mode in (("full", Mode("full"), "full"), ("skip@2", Mode("skip", "", 2.0), "skipdecode"),
                                 ("graphs:skip@1.5", Mode("skip", "graphs", 1.5), "graphs skipdecode"),
                                 ("static:full", Mode("full", "static"), "static full"),
                                 ("hf_static_compile", Mode("hf_static_compile"), "hf_static_compile"),
                                 ("llama.cpp", Mode("llama.cpp"), "llama.cpp")):
        assert Mode.parse(name) == mode and mode.name == name and mode.row_mode == row_mode
    assert [Mode.parse(n).optional for n in ("full", "static:skip@2", "graphs:full", "hf_static_compile",
                                             "llama.cpp", "hf_generate")] == [False, False, True, True, True, False]
    assert Mode.parse("graphs:skip@2").at_full_depth() == Mode.parse("graphs:full")
    with pytest.raises(ValueError, match="target speedup"):
        Mode("full", speedup=2.0)


def test_ratios_and_efficiency_are_taken_between_medians():
    cost = CostModel(layer_cost=1.0, fixed_cost=10.0)
    solved = solve_schedule(20, 2.0, decay_length=10, num_steps=9, cost=cost)
    timings = {
        "hf_generate": [Timing(2.0, 0.1), Timing(4.0, 0.1), Timing(3.0, 0.1)],  # median 3.0
        "full": [Timing(2.0, 0.05), Timing(2.5, 0.05), Timing(9.0, 0.05)],  # median 2.5 (outlier ignored)
        "skip@2": [Timing(1.0, 0.02), Timing(2.0, 0.02), Timing(1.25, 0.03)],  # median 1.25
    }
    rows = {r.mode: r for r in _rows(4, _modes(timings), {}, {2.0: solved}, 20, cost, 10)}
    assert rows["full"].tokens_per_second == pytest.approx(40 / 2.5)
    assert rows["full"].vs_hf_generate == pytest.approx(3.0 / 2.5)
    skip = rows["skipdecode"]
    assert skip.measured_speedup == pytest.approx(2.0)
    assert skip.cost_speedup == pytest.approx((20 + 10) / (sum(solved.budgets) / len(solved.budgets) + 10), rel=1e-3)
    assert skip.efficiency == pytest.approx(2.0 / skip.cost_speedup, rel=1e-3)
    assert skip.step_latency_ms == pytest.approx(20.0)
    assert skip.layer_speedup == pytest.approx(solved.layer_speedup, rel=1e-3)


def test_efficiency_compares_the_decode_steps_time_with_the_cost_model():
    """The cost model counts decode steps; a whole run adds the same prefill to both modes, so its ratio reads
    nearer 1 (batch 8 on a 2-core Zen 3: 1.26x whole, 1.84x decode). Decode times pair round by round."""
    cost = CostModel(layer_cost=1.0, fixed_cost=10.0)
    solved = solve_schedule(20, 2.0, decay_length=10, num_steps=9, cost=cost)
    # each run: 1.0 s of prefill, then the decode steps; the host halves its speed in round two
    timings = {
        "full": [Timing(3.0, 0.2, 2.0), Timing(6.0, 0.4, 4.0), Timing(3.0, 0.2, 2.0)],
        "skip@2": [Timing(2.0, 0.1, 1.0), Timing(4.0, 0.2, 2.0), Timing(2.0, 0.1, 1.0)],
    }
    rows = {r.mode: r for r in _rows(4, _modes(timings), {}, {2.0: solved}, 20, cost, 10)}
    skip = rows["skipdecode"]
    assert skip.measured_speedup == pytest.approx(1.5)  # 3.0 / 2.0: prefill included
    assert skip.decode_speedup == pytest.approx(2.0)  # every round's pair: 2.0
    assert skip.efficiency == pytest.approx(2.0 / skip.cost_speedup, rel=1e-3)
    assert rows["full"].decode_speedup == pytest.approx(1.0)
    # a run without steps (another engine's, a one-token run) keeps the whole-run ratio
    timings["skip@2"][1] = Timing(4.0, 0.2)
    skip = {r.mode: r for r in _rows(4, _modes(timings), {}, {2.0: solved}, 20, cost, 10)}["skipdecode"]
    assert skip.decode_speedup is None and skip.efficiency == pytest.approx(1.5 / skip.cost_speedup, rel=1e-3)


def test_batch_scaling_pairs_each_rounds_run_with_the_first_sizes_run_of_that_round():
    # the host halves its speed in round two: every size slows alike, and the paired ratio stays 3x (batch 2
    # at 2/3 of batch 1's step time); ratios of the medians would read 6x or 1.5x as the rounds fell
    timings = {("int4", 1): [Timing(1.0, 0.03), Timing(2.0, 0.06), Timing(1.0, 0.03)],
               ("int4", 2): [Timing(1.0, 0.02), Timing(2.0, 0.04), Timing(2.0, 0.04)]}
    first, second = scaling_rows(timings, 10)
    assert (first.batch_size, first.vs_first_batch, first.rounds) == (1, 1.0, 3)
    assert second.vs_first_batch == pytest.approx(3.0)  # rounds: 3.0, 3.0, 1.5
    assert second.decode_tokens_per_second == pytest.approx(2 / 0.04)
    assert second.tokens_per_second == pytest.approx(2 * 10 / 2.0)


def test_each_engine_measures_its_skip_rows_against_its_own_full_row():
    cost = CostModel(layer_cost=1.0, fixed_cost=10.0)
    solved = solve_schedule(20, 2.0, decay_length=10, num_steps=9, cost=cost)
    timings = {
        "hf_generate": [Timing(8.0, 0.8)], "hf_static_compile": [Timing(2.0, 0.2)],
        "full": [Timing(4.0, 0.4)], "skip@2": [Timing(2.0, 0.2)],
        "graphs:full": [Timing(1.0, 0.1)], "graphs:skip@2": [Timing(0.8, 0.08)],
    }
    rows = {(r.mode, r.target_speedup): r for r in _rows(4, _modes(timings), {}, {2.0: solved}, 20, cost, 10)}
    assert set(rows) == {("hf_generate", None), ("hf_static_compile", None), ("full", None), ("skipdecode", 2.0),
                         ("graphs full", None), ("graphs skipdecode", 2.0)}
    assert rows["skipdecode", 2.0].measured_speedup == pytest.approx(2.0)  # eager over eager full
    assert rows["graphs skipdecode", 2.0].measured_speedup == pytest.approx(1.25)  # graphs over graphs full
    assert rows["graphs full", None].vs_hf_static_compile == pytest.approx(2.0)
    assert rows["graphs full", None].vs_hf_generate == pytest.approx(8.0)
    assert rows["graphs skipdecode", 2.0].max_layers == solved.config.max_layers
    captures = {("float", Mode.parse("graphs:skip@2")): 1.5, ("float", Mode.parse("hf_static_compile")): 30.0}
    all_rows = list(rows.values())
    for row in all_rows:
        row.weights = "float"
    add_captures(all_rows, 4, captures)
    assert rows["graphs skipdecode", 2.0].capture_seconds == 1.5 and rows["hf_static_compile", None].capture_seconds == 30
    assert rows["graphs full", None].capture_seconds is None and rows["skipdecode", 2.0].capture_seconds is None


def test_the_static_cache_rows_run_on_the_cpu_and_the_cuda_rows_say_why_they_are_absent():
    """The engine rows' plumbing end to end on a tiny model: the static-cache step run eagerly stands in
    for the graphs (same modes, same table); on the CPU the graph rows are left out, and the compiled
    rows run there only as the static step's (listed here, not timed: inductor's CPU compile takes long)."""
    model = tiny_model("llama")
    full, skip = SkipDecoder(model), SkipDecoder(model)
    variants = {"float": WeightVariant(None, None, full, skip, "float")}  # no model: no hf modes on the CPU
    solved = solve_schedule(NUM_LAYERS, 2.0, decay_length=5)
    ids, mask = left_padded_batch([5, 3])
    captures: dict = {}
    with_compiled = engine_modes(BenchConfig(static=True, new_tokens=6), variants, {2.0: solved}, NUM_LAYERS, ids,
                                 mask, captures)
    assert {(w, mode.name) for w, mode in with_compiled} == {
        ("float", "static:full"), ("float", "static:skip@2"), ("float", "compiled:full"), ("float", "compiled:skip@2")}
    config = BenchConfig(static=True, compiled=False, new_tokens=6)
    modes = engine_modes(config, variants, {2.0: solved}, NUM_LAYERS, ids, mask, captures)
    assert {(w, mode.name) for w, mode in modes} == {("float", "static:full"), ("float", "static:skip@2")}  # no graphs on CPU
    timings, peaks = _time_modes(modes, 1, 2, torch.device("cpu"))
    rows = _rows(2, {name: t for (_, name), t in timings.items()}, {}, {2.0: solved}, NUM_LAYERS,
                 full.adapter.cost_model(), 6)
    assert [(r.mode, r.target_speedup) for r in rows] == [("static full", None), ("static skipdecode", 2.0)]
    assert all(r.tokens_per_second > 0 and r.step_latency_ms > 0 for r in rows) and not captures
    report = BenchReport(model="tiny", adapter=None, device="cpu", dtype="float32", hardware={"summary": "cpu"},
                         new_tokens=6, repeats=1, decay="linear", rows=rows,
                         notes=[NO_CUDA_NOTE.format(device="cpu")])
    table = report.to_markdown()
    assert "| static skip 2x (" in table and "need a CUDA device" in table and "| capture s |" in table
    assert engine_modes(BenchConfig(), variants, {2.0: solved}, NUM_LAYERS, ids, mask, captures) == {}


def test_llama_bench_output_is_parsed_for_the_generation_test():
    # llama-bench -o jsonl prints one object per test; the tg row has n_prompt 0 (canned, abridged).
    output = "\n".join([
        "warming up",
        json.dumps({"model_type": "llama ?B Q4_1", "n_threads": 2, "n_prompt": 512, "n_gen": 0, "avg_ts": 900.1}),
        json.dumps({"model_type": "llama ?B Q4_1", "n_threads": 2, "n_prompt": 0, "n_gen": 64, "avg_ts": 160.25,
                    "stddev_ts": 1.5}),
    ])
    assert parse_llama_bench(output, 64) == pytest.approx(160.25)
    assert parse_llama_bench(output, 0, 512) == pytest.approx(900.1)  # its prompt processing test (pp512)
    with pytest.raises(RuntimeError, match="tg128"):
        parse_llama_bench(output, 128)
    with pytest.raises(RuntimeError, match="pp256"):
        parse_llama_bench(output, 0, 256)


def test_a_weight_mode_names_its_int4_kernel_and_runs_on_it(environment_settings):
    assert split_weight_mode("int4") == ("int4", None) and split_weight_mode("int4@avx2") == ("int4", "avx2")
    for bad in ("int8@avx2", "int4@sse2"):
        with pytest.raises(ValueError, match="int4@"):
            split_weight_mode(bad)
    environment_settings(SKIPDECODE_INT4_KERNEL="")  # the default: auto
    before = q4_isa()
    with int4_kernel("torch"):
        assert not q4_kernel_selected()  # torch's int4 kernel
    assert settings().int4_kernel == "auto"  # put back
    if before is None:
        return  # no q4 kernels on this machine: int4@avx2 cannot run
    with int4_kernel("avx2"):
        assert q4_kernel_selected() and q4_isa() == "avx2"
    assert q4_isa() == before and q4_kernel_selected()  # restored
    if "avx512-vnni" not in native_module().q4_isas():
        with pytest.raises(ValueError, match="cannot run"):
            with int4_kernel("avx512-vnni"):
                pass
    module, rows = native_module(), native_module().q4_amx_rows()
    if module.q4_amx():  # int4@amx: the tiles from 4 rows (the default); int4@avx512-vnni: never; both restored after
        with int4_kernel("amx"):
            assert module.q4_amx_rows() == 4 and q4_isa() == "avx512-vnni"
        with int4_kernel("avx512-vnni"):
            assert module.q4_amx_rows() == 0
        assert module.q4_amx_rows() == rows and q4_isa() == before
    else:
        with pytest.raises(ValueError, match="cannot run"):
            with int4_kernel("amx"):
                pass


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
    markdown = (tmp_path / "out" / "bench.md").read_text().splitlines()
    assert sum(line.startswith("| 2 |") for line in markdown) == 12
    prefill = report["prefill"]  # prompt processing and time to first token, batch 1, every weight variant
    assert [r["weights"] for r in prefill] == ["float", "int8", "int4"]
    assert all(set(r) == set(PrefillRow.__dataclass_fields__) for r in prefill)
    assert all(r["prompt_tokens"] == 16 and r["tokens_per_second"] > 0 and r["ttft_ms"] > 0 for r in prefill)
    assert "time to first token" in done.stdout
    if q4_kernel_selected():  # the bench names the kernel its int4 rows ran: the path this machine takes
        assert any(f"q4 on {q4_isa()}" in note for note in report["notes"])
    figure = json.loads((tmp_path / "out" / "speedup.json").read_text())
    assert {trace["name"] for trace in figure["data"]} >= {"layer speedup", "cost-model speedup", "measured, batch 1"}
    assert "| batch | weights | mode |" in done.stdout
    scaling = report["batch_scaling"]  # full depth, the batch sizes alternated run by run, every weight variant
    assert [(r["weights"], r["batch_size"]) for r in scaling] == [(w, b) for w in ("float", "int8", "int4") for b in (1, 2)]
    assert all(r["rounds"] == 1 and r["decode_tokens_per_second"] > 0 and r["vs_first_batch"] > 0 for r in scaling)
    assert all(r["vs_first_batch"] == 1.0 for r in scaling if r["batch_size"] == 1)
    assert "Batch scaling, full depth, the batch sizes alternated" in (tmp_path / "out" / "bench.md").read_text()


def test_an_optional_mode_that_raises_is_left_out_with_a_note_and_the_others_are_timed():
    def works() -> Timing:
        return Timing(1.0, 0.1)

    def raises() -> Timing:
        raise RuntimeError("the compiler said no")

    notes: list[str] = []
    modes = {(weights, Mode.parse(name)): run for weights, name, run in (
        ("float", "full", works), ("float", "hf_static_compile", raises), ("float", "graphs:skip@2", raises),
        ("Q4_1", "llama.cpp", raises))}
    timings, _ = _time_modes(modes, 2, 8, torch.device("cpu"), notes)
    assert set(timings) == {("float", Mode("full"))} and len(timings["float", Mode("full")]) == 2
    assert notes == [f"batch 8: {weights} {mode} left out, its first call raised RuntimeError: the compiler said no"
                     for weights, mode in (("float", "hf_static_compile"), ("float", "graphs:skip@2"),
                                           ("Q4_1", "llama.cpp"))]
    with pytest.raises(RuntimeError, match="said no"):  # our own modes failing stop the run: that is a bug
        _time_modes({("float", Mode("full")): raises}, 1, 1, torch.device("cpu"), notes)


def test_the_bench_hands_over_its_report_after_every_batch_size(tiny_folder):
    seen: list[list[int]] = []
    config = BenchConfig(model=str(tiny_folder), device="cpu", quick=True, quantize=("none",), include_hf=False,
                         speedups=(2.0,), llama_cpp=False)
    report = run_bench(config, progress=lambda line: None,
                       on_batch=lambda so_far: seen.append(sorted({row.batch_size for row in so_far.rows})))
    assert seen == [[1], [1, 2]] and {row.batch_size for row in report.rows} == {1, 2}
