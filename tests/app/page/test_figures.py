"""The page's figures as the eye meets them (issue 70): the heatmap gives the generated positions
most of its width, a long prompt folded into one honestly labelled band, and no title or panel
title sits in the band plotly's toolbar takes at the top of a gr.Plot."""

import pytest

from app.page import explainer
from app.page.figures import MODEBAR_PX, TITLE_LINE_PX, layer_heatmap, round_ticks, schedule_figure
from app.page.live_plot import _JS_ON_LOAD
from model.skipdecode.schedule import CostModel, ScheduleConfig, evaluate_schedule

LAYERS = 6
STEP_LAYERS = (0, 4, 5)  # what each generated step ran in these pictures


def run_heatmap(prompt: int, generated: int, hidden: int = 0, **options):
    """The heatmap of a run: ``prompt`` shown prompt tokens (after ``hidden`` template tokens), all
    layers on them, ``generated`` tokens, the last one not fed back yet."""
    return layer_heatmap(LAYERS, 1, [f"p{i}" for i in range(prompt)], range(LAYERS),
                         [f"g{k}" for k in range(generated)], [STEP_LAYERS] * max(0, generated - 1),
                         hidden_prompt=hidden, **options)


def generated_share(figure, first_generated: int) -> float:
    """The share of the x axis's extent the generated positions' columns take."""
    left, right = figure.layout.xaxis.range
    return (right - (first_generated - 0.5)) / (right - left)


def test_a_long_prompt_folds_so_the_generated_positions_get_most_of_the_width():
    figure = run_heatmap(60, 20, hidden=3)
    assert generated_share(figure, 63) >= 0.6  # unfolded, the 60 prompt columns took 75% of it
    cells, band = figure.data[0], figure.data[1]  # the band second: the traces a run adds later come after it
    assert list(cells.x) == list(range(62, 83))  # the prompt's last token (it produced g0) and the generated
    assert band.name == "prompt (folded)" and len(band.x) == 2 and band.x[1] == 61.5  # edges: up to position 62
    assert [row[0] for row in band.z] == [1] * LAYERS  # every prompt position ran every layer
    assert "positions 3-61: 59 prompt tokens" in band.text[0][0]
    assert "folded, all 6 layers each" in figure.layout.xaxis.title.text
    values, texts = figure.layout.xaxis.tickvals, figure.layout.xaxis.ticktext
    assert values[0] == pytest.approx(sum(band.x) / 2) and texts[0] == "prompt (59)"  # under the band's middle
    assert dict(zip(values[1:], texts[1:]))[63] == "g0"
    assert [shape.x0 for shape in figure.layout.shapes if shape.line.dash == "dot"] == [62.5]  # prompt | generated


def test_step_mode_gives_its_few_steps_most_of_the_width():
    figure = run_heatmap(60, 3, highlight_last=True)
    assert generated_share(figure, 60) >= 0.5  # unfolded: 3 columns of 63
    step = [shape for shape in figure.layout.shapes if shape.type == "rect"]
    assert [(s.x0, s.x1) for s in step] == [(60.5, 61.5)]  # the column the last step ran, at its position


def test_a_folded_prompt_keeps_the_lens_on_the_position_that_produced_the_first_token():
    figure = run_heatmap(60, 3, lens_kl=[{5: 0.5}, {4: 0.25}])
    overlay = next(trace for trace in figure.data if trace.hoverinfo == "skip")
    assert overlay.x[0] == 59 and overlay.z[5][0] == 0.5 and overlay.z[4][1] == 0.25


def test_a_short_prompt_keeps_one_column_a_position():
    figure = run_heatmap(5, 15)  # the How-it-works picture's shape: each layer's prefix is seen whole
    assert len(figure.data) == 1 and list(figure.data[0].x) == list(range(20))
    assert "folded" not in figure.layout.xaxis.title.text and not figure.layout.meta


def test_a_folded_axis_names_real_positions_only():
    """Past the token labels' limit the axis numbers positions itself (automatic numbers would run
    through the band); the phone's axis (the page's script draws it) too, with fewer numbers."""
    figure = run_heatmap(400, 100, hidden=20)
    band_centre = sum(figure.data[1].x) / 2
    for values, texts in ((figure.layout.xaxis.tickvals, figure.layout.xaxis.ticktext),
                          (figure.layout.meta["phone_xaxis"]["tickvals"], figure.layout.meta["phone_xaxis"]["ticktext"])):
        assert values[0] == pytest.approx(band_centre) and texts[0].startswith("prompt")
        assert all(text == str(value) and 419 <= value <= 519 for value, text in zip(values[1:], texts[1:]))
        assert len(values) >= 3
    assert len(figure.layout.meta["phone_xaxis"]["tickvals"]) <= 6 and "phone_xaxis" in _JS_ON_LOAD


def test_round_ticks_are_few_round_positions_inside_the_range():
    assert round_ticks(419, 519, 10) == list(range(420, 520, 10))
    assert round_ticks(419, 519, 5) == [420, 440, 460, 480, 500]
    assert round_ticks(61, 64, 5) == [61, 62, 63, 64]
    assert round_ticks(7, 7, 5) == [7]


def schedule():
    cost = CostModel(layer_cost=1.0, fixed_cost=0.0)
    return schedule_figure(evaluate_schedule(ScheduleConfig(30, 30, 8, warmup=2, decay="linear", decay_length=20),
                                             20, cost))


def titled_figures():
    return {"schedule": schedule(), "kv prefix": explainer.kv_prefix_figure(),
            "batch view": explainer.batch_view_figure([["a", "b"], ["c", "d"]], [30, 12], 30)}


@pytest.mark.parametrize("name", ["schedule", "kv prefix", "batch view"])
def test_a_title_starts_below_plotlys_toolbar_and_the_plot_below_the_title(name):
    figure = titled_figures()[name]
    title, height = figure.layout.title, figure.layout.height
    top = (1 - title.y) * height if title.yref == "container" else (1 - (title.y or 1)) * height
    if title.yanchor == "top":
        top += title.pad.t or 0
    assert top >= MODEBAR_PX, (name, top)
    assert figure.layout.margin.t >= top + TITLE_LINE_PX, name


def test_panel_titles_sit_below_plotlys_toolbar():
    figure = explainer.early_exit_vs_skipdecode()
    panel_titles = [a for a in figure.layout.annotations if a.yref == "paper" and a.yanchor == "bottom"]
    assert len(panel_titles) == 2 and figure.layout.margin.t - TITLE_LINE_PX >= MODEBAR_PX


def test_the_batch_views_colour_scale_leaves_the_width_to_the_tokens():
    scale = explainer.batch_view_figure([["a", "b"]], [30, 12], 30).data[0].colorbar
    assert scale.orientation == "h" and scale.y < 0
