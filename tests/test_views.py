"""What the playground shows, as pure functions: newline marks and the live figures' spans."""

from app.figures import NEWLINE_MARK, plain_text_html, tokens_by_depth_html
from app.race import RaceUpdate, StreamProgress
from app.views import MIN_STEPS_FOR_MEASURED, live_figures
from model.decoder import StepEvent
from model.schedule import CostModel, ScheduleConfig, evaluate_schedule


def test_newline_runs_collapse_into_one_visible_mark_and_one_break():
    page = tokens_by_depth_html(["Hi", "\n", "\n", "\n", " there", "\n\n", "end"], [30, 20, 20, 20, 10, 9, 9], 30)
    assert page.count("<br>") == 2
    assert f"{NEWLINE_MARK}×3" in page and f"{NEWLINE_MARK}×2" in page
    assert "Hi" in page and " there" in page and "end" in page
    plain = plain_text_html("a\n\n\n\nb<script>")
    assert f"{NEWLINE_MARK}×4" in plain and plain.count("<br>") == 1 and "&lt;script&gt;" in plain


def _progress(name: str, prefill_seconds: float, step_seconds: list[float], depth: int) -> StreamProgress:
    progress = StreamProgress(name, rows=1)
    progress.apply(StepEvent(-1, [1], [False], tuple(range(30)), prefill_seconds), eos_ids=())
    for step, seconds in enumerate(step_seconds):
        progress.apply(StepEvent(step, [2 + step], [False], tuple(range(30 - depth, 30)), seconds), eos_ids=())
    return progress


def test_live_figures_leave_out_the_prefill_and_compare_the_same_steps():
    cost = CostModel(layer_cost=1.0, fixed_cost=0.0)
    solved = evaluate_schedule(ScheduleConfig(30, 30, 15, warmup=0, decay="constant", decay_length=12), 12, cost)
    # A 5 s prefill (a long prompt) must not drag the decode figure down.
    skip = _progress("skip", 5.0, [0.05] * 12, depth=15)
    full = _progress("full", 5.0, [0.10] * 10, depth=30)
    figures = live_figures(RaceUpdate(skip, full, solved, "skip"), cost)
    assert abs(figures.skip_decode_tps - 20.0) < 1e-6 and abs(figures.full_decode_tps - 10.0) < 1e-6
    assert figures.common_steps == 10
    assert abs(figures.measured_speedup - 2.0) < 1e-6  # over the 10 steps both ran, not 12 vs 10
    assert abs(figures.layer_speedup - 2.0) < 1e-6
    assert figures.exact_match is not None


def test_no_measured_speedup_before_enough_steps():
    cost = CostModel(layer_cost=1.0, fixed_cost=0.0)
    solved = evaluate_schedule(ScheduleConfig(30, 30, 15, warmup=0, decay="constant", decay_length=12), 12, cost)
    steps = MIN_STEPS_FOR_MEASURED - 1
    figures = live_figures(RaceUpdate(_progress("s", 0.1, [0.05] * steps, 15), _progress("f", 0.1, [0.1] * steps, 30),
                                      solved, "skip"), cost)
    assert figures.measured_speedup is None and figures.layer_speedup is None


def test_schedule_labels_never_overprint_and_step_mode_marks_the_step():
    from app.figures import _bound_labels, schedule_figure

    assert _bound_labels(30, 15, 15) == [(15, "max = min = 15", "bottom right"), (30, "L = 30", "top left")]
    assert _bound_labels(30, 30, 8) == [(30, "L = max = 30", "top right"), (8, "min = 8", "bottom right")]
    labels = _bound_labels(30, 27, 5)
    assert len({(value, position) for value, _, position in labels}) == len(labels) == 3
    cost = CostModel(layer_cost=1.0, fixed_cost=0.0)
    solved = evaluate_schedule(ScheduleConfig(30, 24, 5, warmup=4, decay="linear", decay_length=20), 20, cost)
    figure = schedule_figure(solved, show_steps=24, current_step=7)
    marker = [trace for trace in figure.data if trace.name == "this step"]
    assert len(marker) == 1 and list(marker[0].x) == [7] and list(marker[0].y) == [solved.config.budgets(24)[7]]
    assert not [trace for trace in schedule_figure(solved).data if trace.name == "this step"]


def test_gpu_seconds_grow_with_the_request_and_stay_bounded():
    from app.ui import gpu_seconds

    assert gpu_seconds({"max_new_tokens": 48, "batch_size": 1}) == 20
    assert gpu_seconds({"max_new_tokens": 256, "batch_size": 4}) == 112
    assert gpu_seconds({"max_new_tokens": 256, "batch_size": 8}) == 120
    assert gpu_seconds() == 20


def test_study_and_training_curve_figures_plot_every_arm_and_speedup():
    from model.reporting import heldout_curve_figure, study_figure

    curve = [{"cpu_minutes": m, "2x": {"agreement": a}} for m, a in ((0, 0.1), (2, 0.3), (4, 0.4))]
    study = {"budget_minutes": 4, "arms": [
        {"arm": "a", "description": "x", "curve": curve, "heldout": {"2x": {"agreement": 0.4}}},
        {"arm": "b", "description": "y", "curve": curve[:2], "heldout": {"2x": {"agreement": 0.3}}}]}
    figure = study_figure(study)
    assert [trace.name for trace in figure.data] == ["a", "b"]
    assert figure.data[0].line.width > figure.data[1].line.width  # the best arm stands out
    records = [{"step": s, "heldout": {"1x": {"agreement": 1.0}, "2x": {"agreement": a}}} for s, a in ((100, 0.4), (200, 0.5))]
    curve_figure = heldout_curve_figure(records + [{"step": 150, "loss": 1.0}], "run")
    assert [trace.name for trace in curve_figure.data] == ["2x"] and list(curve_figure.data[0].y) == [0.4, 0.5]


def test_heatmap_coloured_by_lens_kl_keeps_the_hover_on_the_cells():
    from app.figures import layer_heatmap

    kl = [{0: 2.0, 5: 0.5}, {0: 1.5, 4: 0.25, 5: 0.1}]
    figure = layer_heatmap(6, 1, ["a", "b"], range(6), ["x", "y"], [(0, 4, 5)], lens_kl=kl)
    base, overlay = figure.data[0], figure.data[1]
    assert overlay.hoverinfo == "skip" and overlay.colorbar.title.text == "lens KL"
    assert overlay.z[5][1] == 0.5 and overlay.z[4][2] == 0.25 and overlay.z[3][2] is None  # bypassed: blank
    assert "lens KL to the full model: 0.250" in base.text[4][2]
