"""What the playground shows, as pure functions: newline marks, token contrast, the live figures'
spans, the heatmap's one position number, the schedule's labels and the honest headline."""

import contextlib
import copy
import json
import re
from dataclasses import replace

import pytest

from app.page.figures import heatmap_legend_html, layer_heatmap
from app.page.token_html import NEWLINE_MARK, TOKEN_TEXT, depth_colour, plain_text_html, tokens_by_depth_html
from app.page.views import MIN_STEPS_FOR_MEASURED, live_figures
from model.race import Judged, RaceUpdate, StreamProgress
from model.skipdecode.decoder import DecodeResult
from model.skipdecode.schedule import CostModel, ScheduleConfig, evaluate_schedule


def test_newline_runs_collapse_into_one_visible_mark_and_one_break():
    page = tokens_by_depth_html(["Hi", "\n", "\n", "\n", " there", "\n\n", "end"], [30, 20, 20, 20, 10, 9, 9], 30)
    assert page.count("<br>") == 2
    assert f"{NEWLINE_MARK}×3" in page and f"{NEWLINE_MARK}×2" in page
    assert "Hi" in page and " there" in page and "end" in page
    plain = plain_text_html("a\n\n\n\nb<script>")
    assert f"{NEWLINE_MARK}×4" in plain and plain.count("<br>") == 1 and "&lt;script&gt;" in plain


def _progress(name: str, prefill_seconds: float, step_seconds: list[float], depth: int) -> StreamProgress:
    """A stream's progress as the decoder records it: the prefill's token, then one per decode step."""
    record = DecodeResult(num_layers=30, prompt_lengths=[3], tokens=[[1, *(2 + k for k in range(len(step_seconds)))]],
                          finish_reasons=["length"], prefill_layers=tuple(range(30)),
                          step_layers=[tuple(range(30 - depth, 30))] * len(step_seconds),
                          prefill_seconds=prefill_seconds, step_seconds=list(step_seconds))
    return StreamProgress(name, rows=1, record=record)


def test_live_figures_leave_out_the_prefill_and_compare_the_same_steps():
    cost = CostModel(layer_cost=1.0, fixed_cost=0.0)
    solved = evaluate_schedule(ScheduleConfig(30, 30, 15, warmup=0, decay="constant", decay_length=12), 12, cost)
    # A 5 s prefill (a long prompt) must not drag the decode figure down.
    skip = _progress("skip", 5.0, [0.05] * 12, depth=15)
    full = _progress("full", 5.0, [0.10] * 10, depth=30)
    figures = live_figures(RaceUpdate(skip, full, solved, "skip", cost))
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
                                      solved, "skip", cost))
    assert figures.measured_speedup is None and figures.layer_speedup is None


def test_schedule_labels_sit_apart_and_step_mode_marks_the_step():
    from app.page.figures import _bound_labels, schedule_figure

    assert _bound_labels(30, 15, 15) == [(15, "max = min = 15"), (30, "L = 30")]
    assert _bound_labels(30, 30, 8) == [(8, "min = 8"), (30, "L = max = 30")]
    cost = CostModel(layer_cost=1.0, fixed_cost=0.0)
    for max_layers, min_layers, warmup in ((28, 1, 0), (30, 29, 2), (24, 5, 4)):
        config = ScheduleConfig(30, max_layers, min_layers, warmup=warmup, decay="linear", decay_length=48)
        figure = schedule_figure(evaluate_schedule(config, 48, cost))
        bounds = sorted(a.y for a in figure.layout.annotations if a.xref == "paper")
        assert len(bounds) == len({30, max_layers, min_layers})
        assert all(high - low >= 0.11 * 31 - 1e-9 for low, high in zip(bounds, bounds[1:])), bounds  # no overprint
        assert all(0 <= y <= 31 for y in bounds), bounds  # inside the axis range: every label is drawn
        assert all(a.xanchor == "left" and a.x == 1.0 for a in figure.layout.annotations if a.xref == "paper")
        names = [trace.name for trace in figure.data]
        assert ("warmup (0)" in names) is False and (f"warmup ({warmup})" in names) == bool(warmup)
    solved = evaluate_schedule(ScheduleConfig(30, 24, 5, warmup=4, decay="linear", decay_length=20), 20, cost)
    figure = schedule_figure(solved, show_steps=24, current_step=7)
    marker = [trace for trace in figure.data if trace.name == "this step"]
    assert len(marker) == 1 and list(marker[0].x) == [7] and list(marker[0].y) == [solved.config.budgets(24)[7]]
    assert not [trace for trace in schedule_figure(solved).data if trace.name == "this step"]


def test_gpu_seconds_grow_with_the_request_and_stay_bounded():
    from app.serving.gpu import gpu_seconds

    assert gpu_seconds({"max_new_tokens": 48, "batch_size": 1}) == 20
    assert gpu_seconds({"max_new_tokens": 256, "batch_size": 4}) == 112
    assert gpu_seconds({"max_new_tokens": 256, "batch_size": 8}) == 120
    assert gpu_seconds() == 20


def _luminance(rgb: tuple[int, int, int]) -> float:
    channels = [c / 255 for c in rgb]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_token_text_keeps_wcag_aa_contrast_at_every_depth():
    text = tuple(int(TOKEN_TEXT[i:i + 2], 16) for i in (1, 3, 5))
    ratios = [contrast(tuple(map(int, re.findall(r"\d+", depth_colour(depth, 30)))), text) for depth in range(31)]
    assert min(ratios) >= 7.0, min(ratios)  # AA asks 4.5; a projector washes colours out
    assert depth_colour(30, 30) != depth_colour(1, 30)  # the depth is still visible
    assert f"color:{TOKEN_TEXT}" in tokens_by_depth_html(["a"], [30], 30)


def test_heatmap_uses_one_position_number_and_judges_each_token_under_itself():
    # 3 hidden template tokens, 2 prompt tokens shown, 3 generated tokens (the last not fed back yet).
    judged = [Judged(True, "x"), Judged(False, "q"), Judged(True, "z")]
    figure = layer_heatmap(6, 0, ["a", "b"], range(6), ["x", "y", "z"], [(0, 4, 5), (0, 5)],
                           hidden_prompt=3, judged=judged)
    cells, strip = figure.data[0], figure.data[1]
    assert list(cells.x) == [3, 4, 5, 6, 7] and list(figure.layout.xaxis.range) == [2.5, 7.5]
    assert list(strip.x) == [5, 6, 7]  # each square under the generated token it judges
    assert "position 6 'y'" in strip.hovertext[1] and "'q'" in strip.hovertext[1]
    assert cells.text[0][3].startswith("position 6 'y'")  # the hover names the same number
    assert all(row[4] is None for row in cells.z) and "not fed back" in cells.text[0][4]
    assert [shape.x0 for shape in figure.layout.shapes if shape.line.color == "#d64545"] == [6]
    assert not figure.layout.annotations  # no label drawn over the cells
    assert list(figure.layout.yaxis.ticktext)[0] == "match" and cells.showscale is False


def test_the_legend_names_only_what_the_picture_can_show():
    assert "warmup layer" not in heatmap_legend_html(0) and "warmup layer" in heatmap_legend_html(2)
    assert "full model picks the same token" in heatmap_legend_html(0)
    assert "full model" not in heatmap_legend_html(1, strip=False)


def test_study_and_training_curve_figures_plot_every_arm_and_speedup():
    from model.evaluation.reporting import heldout_curve_figure, study_figure

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


def test_an_adapters_lineage_is_one_curve_over_the_sequences_its_runs_saw():
    from model.evaluation.reporting import heldout_curve_figure
    from model.training.heldout import Stage, lineage_curve, parse_heldout_log, stage_notes

    first = ("untrained held-out: 1x agree 1.000 KL 0.000, 2x agree 0.314 KL 4.645\n"
             "skip-policy training:  5%|  | 9/200 [00:01<00:20, loss=1.2]\r"
             "step 200 (3.7 min) held-out: 1x agree 1.000 KL 0.000, 2x agree 0.564 KL 1.278\n")
    second = ("untrained held-out: 1x agree 1.000 KL 0.000, 2x agree 0.564 KL 1.278\n"
              "step 100 (25.5 min) held-out: 1x agree 1.000 KL 0.000, 2x agree 0.596 KL 1.086\n")
    assert parse_heldout_log(first)[1] == {"step": 200, "heldout": {"1x": {"agreement": 1.0, "kl": 0.0},
                                                                   "2x": {"agreement": 0.564, "kl": 1.278}}}
    curve = lineage_curve([Stage("gpu", 64, first), Stage("cpu", 8, second, note="unlikelihood")])
    assert [(row["stage"], row["step"], row["sequences"]) for row in curve] == [
        ("gpu", 0, 0), ("gpu", 200, 12800), ("cpu", 100, 13600)]  # the second run's step 0 repeats the first's end
    figure = heldout_curve_figure(curve, "lineage")
    assert list(figure.data[0].x) == [0, 12.8, 13.6] and figure.layout.xaxis.title.text.startswith("training sequences")
    assert [shape.x0 for shape in figure.layout.shapes] == [12.8]  # where the second run began
    assert {annotation.text.strip() for annotation in figure.layout.annotations} == {"gpu", "cpu"}
    assert stage_notes(curve) == [("cpu", "unlikelihood")]  # the caption names what each run changed
    with pytest.raises(ValueError, match="no held-out lines"):
        lineage_curve([Stage("empty", 8, "no curve here")])


def test_heatmap_coloured_by_lens_kl_keeps_the_hover_on_the_cells():
    from app.page.figures import layer_heatmap

    kl = [{0: 2.0, 5: 0.5}, {0: 1.5, 4: 0.25, 5: 0.1}]
    figure = layer_heatmap(6, 1, ["a", "b"], range(6), ["x", "y"], [(0, 4, 5)], lens_kl=kl)
    base, overlay = figure.data[0], figure.data[1]
    assert overlay.hoverinfo == "skip" and overlay.colorbar.title.text == "lens KL"
    assert overlay.z[5][1] == 0.5 and overlay.z[4][2] == 0.25 and overlay.z[3][2] is None  # bypassed: blank
    assert "lens KL to the full model: 0.250" in base.text[4][2]


def test_the_headline_says_what_each_number_means_and_step_mode_hides_speeds():
    from app.page.views import details_markdown, headline_html
    from app.settings import Limits, PlaygroundSettings

    cost = CostModel(layer_cost=1.0, fixed_cost=0.0)
    solved = evaluate_schedule(ScheduleConfig(30, 30, 15, warmup=0, decay="constant", decay_length=12), 12, cost)
    judged = [Judged(True, "a"), Judged(True, "b"), Judged(False, "c")]
    update = RaceUpdate(_progress("s", 0.1, [0.05] * 12, 15), _progress("f", 0.1, [0.1] * 12, 30), solved, "skip",
                        cost, judged=judged)
    settings = PlaygroundSettings.from_values(Limits(), prompt="hi", target_speedup=2.0)
    line = headline_html(update, settings)
    assert "2.00x faster" in line and "<b>67%</b> of its 3 positions" in line and "to-results" in line
    assert "faster" not in headline_html(update, settings, step_mode=True)
    assert "comes when SkipDecode finishes" in headline_html(replace(update, judged=None), settings)
    assert "tok/s" in details_markdown(update) and "tok/s" not in details_markdown(update, step_mode=True)
    assert "exact token match" in details_markdown(update)
    full_depth = evaluate_schedule(ScheduleConfig(30, 30, 30, warmup=0, decay="constant", decay_length=12), 12, cost)
    assert "no regression" in headline_html(replace(update, solved=full_depth), settings)


def test_a_character_split_over_byte_tokens_is_shown_whole_never_as_replacement_marks():
    from model.race import TokenTexts

    class Bytes:  # a byte-level tokenizer: one token per UTF-8 byte
        def decode_text(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    text = "a是作b"
    ids = list(text.encode())
    texts = TokenTexts(Bytes()).update(ids)
    assert texts == ["a", "", "", "是", "", "", "作", "b"] and "".join(texts) == text
    streamed = TokenTexts(Bytes())
    for end in range(1, len(ids) + 1):  # token by token, as the race streams them
        parts = streamed.update(ids[:end])
    assert parts == texts and "\ufffd" not in "".join(parts)


def test_progress_is_the_decoders_own_record_not_a_twin():
    """A stream's progress reads the DecodeResult the decoder extends in place (StepEvent.record):
    a row ended at EOS (left out) or by a stop string (its last token kept) is whatever the
    decoder recorded, and a step recorded later shows without being applied anywhere."""
    record = DecodeResult(num_layers=2, prompt_lengths=[1, 1], tokens=[[5], [6, 7]], finish_reasons=["eos", "stop"],
                          prefill_layers=(0, 1), step_layers=[(0, 1)], prefill_seconds=0.1, step_seconds=[0.1])
    progress = StreamProgress("SkipDecode", rows=2, record=record)
    assert progress.ids(0) == [5] and progress.ids(1) == [6, 7] and progress.generated == 3
    assert progress.depths == [2, 2] and progress.seconds == pytest.approx(0.2)
    record.step_layers.append((1,))
    record.step_seconds.append(0.3)
    assert progress.depths == [2, 2, 1] and progress.seconds == pytest.approx(0.5)
    assert StreamProgress("full model", rows=1).ids(0) == [] and StreamProgress("x", rows=1).depths == []


class Forbidden:
    """Stands in for a part of the model while a view runs: any use of it fails the test."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str):
        raise AssertionError(f"a view called the model: {self.name}.{attr}")


@contextlib.contextmanager
def model_forbidden(generator):
    """The generator's model, tokenizer and decoders, and its parts that hold them (the text codec, the
    lens, the judge), replaced by Forbidden stand-ins."""
    parts = ("loaded", "full_decoder", "skip_decoder", "text", "lens", "judge")
    saved = {part: generator.__dict__[part] for part in parts}
    generator.__dict__.update({part: Forbidden(part) for part in parts})
    try:
        yield
    finally:
        generator.__dict__.update(saved)


@pytest.fixture(scope="module")
def tiny_generator(tiny_folder):
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    return TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))


@pytest.mark.slow
@pytest.mark.parametrize("lockstep", [False, True])
def test_views_only_format_the_race_and_never_call_the_model(tiny_generator, lockstep):
    """The race produces everything shown (texts, layers, timings, the lens and its KL, the full
    model's judgement); the page's outputs and the API's messages are made with the model's parts
    replaced by stand-ins that fail on any use."""
    from app.handlers import Playground
    from app.page.views import RaceRenderer, api_message
    from app.settings import Limits

    generator = tiny_generator
    checked = Playground(lambda: generator, Limits()).checked(dict(
        prompt="Name a fruit.", target_speedup=1.5, max_new_tokens=6, batch_size=2, lens=True, lens_kl=True))
    renderer = RaceRenderer(checked.settings)
    with model_forbidden(generator), pytest.raises(AssertionError, match="a view called the model"):
        generator.text.decode_text([1])  # the stand-ins catch a call
    rendered = 0
    for update in checked.race(lockstep=lockstep):
        with model_forbidden(generator):
            page = renderer.outputs("", update, with_plot=True, step_mode=lockstep)
            message = api_message(update, checked.settings)
        rendered += 1
    assert rendered > 4 and update.done and update.judged and update.lens_kl
    ids = update.skip.ids(0)
    assert len(update.judged) == len(ids) == len(message["lens"]) and f"of its {len(ids)} positions" in page[3]
    assert message["full_model_same_next_token"] == round(sum(j.same for j in update.judged) / len(ids), 4)
    assert message["skipdecode"] == [generator.text.decode_text(update.skip.ids(r)) for r in range(2)]
    assert message["full"] == [generator.text.decode_text(update.full.ids(r)) for r in range(2)]


@pytest.mark.slow
def test_one_json_shape_prefill_layers_lists_the_layers_the_prompt_ran(tiny_generator):
    """The CLI's JSON (GenerationResult.to_json) and the API's messages write ``prefill_layers`` alike:
    the layer indices the prompt ran (here the first step's budget, not all layers)."""
    from app.handlers import Playground
    from app.page.views import api_message
    from app.settings import Limits

    generator = tiny_generator
    checked = Playground(lambda: generator, Limits()).checked(dict(
        prompt="Name a fruit.", target_speedup=1.5, max_new_tokens=4, prompt_at_full_depth=False))
    final = api_message(list(checked.race())[-1], checked.settings)
    cli = generator.generate(checked.run.request).to_json()
    layers = list(checked.run.schedule.config.prefill_layers())
    assert cli["prefill_layers"] == final["prefill_layers"] == layers and len(layers) < generator.num_layers


@pytest.mark.slow
def test_the_heatmap_hides_the_templates_head_read_from_the_runs_ids(tiny_generator):
    """The prompt's shown tokens are the user's text and the template's tail, as the user's text
    tokenized alone counts them; the texts are the run's own ids (no second tokenization)."""
    from model.generation.runs import GenerationRequest

    generator = tiny_generator
    for prompt in ("Name a fruit.", "Why is the sky blue? Answer in one line."):
        run = generator.prepare(GenerationRequest(prompts=(prompt, "Hi"), max_new_tokens=2))
        texts, hidden = generator.text.prompt_tokens(run.prompt_ids(), run.request.raw)
        user = len(generator.loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert len(texts) == len(run.prompt_ids(0)) and len(texts) - hidden == user + generator.text.template_tail_tokens
        assert "".join(texts[hidden:]).startswith(prompt)


@pytest.mark.slow
def test_admission_and_the_run_refuse_with_one_check(tiny_generator):
    """The fair queue's admission and the run's own check are one helper: the same message, and
    admission only checks the schedule (no solve for the run), in milliseconds."""
    import gradio as gr

    from app.handlers import Playground
    from app.settings import Limits

    playground = Playground(lambda: tiny_generator, Limits(max_prompt_tokens=60))
    for values in (dict(prompt="sea " * 40), dict(prompt="hi", target_speedup=9.0)):
        parameter, message = playground.admission_problem("generate", values)
        with pytest.raises(gr.Error) as refused:
            playground.validated(values, page=False)
        assert refused.value.message == message, (message, refused.value.message)
    assert playground.admission_problem("generate", dict(prompt="hi", max_new_tokens=6)) is None
    admitted = playground.checked(dict(prompt="hi", max_new_tokens=6), solve=False)
    assert admitted.run.schedule is None


# --- the page's stream: sent once, then changes ---------------------------------------------------

def test_a_figure_patch_turns_one_figure_into_the_next():
    from app.page.live_plot import apply_patch, figure_patch

    old = {"data": [{"x": [1, 2], "z": [[1, None], [0, None]], "text": [["a", "b"], ["c", "d"]]}],
           "layout": {"range": [0.5, 2.5], "title": {"text": "t"}, "gone": 1}}
    new = {"data": [{"x": [1, 2, 3], "z": [[1, 3, None], [0, 0, None]], "text": [["a", "B", "e"], ["c", "D", "f"]]},
                    {"type": "scatter", "x": [2]}],
           "layout": {"range": [0.5, 3.5], "title": {"text": "t"}, "shapes": [{"x0": 2}]}}
    patch = figure_patch(old, new)
    assert apply_patch(copy.deepcopy(old), patch) == new
    assert ["extend", ["data", 0, "x"], [3]] in patch and ["delete", ["layout", "gone"]] in patch
    assert ["set", ["data", 0, "z", 0, 1], 3] in patch  # one changed leaf, not its row
    assert not [edit for edit in patch if edit[1] and edit[1][-1] == "title"]  # unchanged: not sent
    assert figure_patch(new, new) == []
    for before, after in (([1, 2, 3], [1]), ({"a": 1}, [1]), (list(range(20)), [-n for n in range(20)]), (1, 1.5)):
        assert apply_patch(copy.deepcopy(before), figure_patch(before, after)) == after  # shrunk, retyped, all new


def test_a_live_figure_grows_its_value_and_describes_the_last_figure():
    from app.page.live_plot import LiveFigure, figure_from_value, figure_json

    live, values = LiveFigure(), []
    figures = [{"data": [{"x": list(range(n)), "z": [[k % 3 for k in range(n)]]}], "layout": {"range": [0, n]}}
               for n in (3, 3, 5, 9)]
    for figure in figures:
        values.append(live.update(copy.deepcopy(figure)))
    assert "\n" not in values[0] and values[1] == values[0]  # an unchanged figure adds nothing
    assert all(later.startswith(earlier) for earlier, later in zip(values, values[1:]))
    assert values[-1].count("\n") == 2 and len(values[-1]) < 2 * len(values[0]) + 200
    assert figure_from_value(values[-1]) == json.loads(figure_json(figures[-1]))  # with plotly's template
    assert json.loads(figure_json(figures[0]))["layout"]["template"]["data"]  # drawn as go.Figure would draw it
    assert figure_from_value("") is None


def _wire_bytes(outputs: list[tuple]) -> tuple[int, list]:
    """What gradio's generator streaming sends for these successive outputs (gradio.utils.diff
    after the first: an unchanged value is nothing, a value that extends the last one its tail)."""
    from gradio.utils import diff

    sent = [len(json.dumps(list(outputs[0])))]
    for before, after in zip(outputs, outputs[1:]):
        sent.append(len(json.dumps([diff(a, b) for a, b in zip(before, after)])))
    return sum(sent), sent


@pytest.mark.slow
def test_a_streamed_run_sends_its_heatmap_and_lens_once_then_changes(tiny_generator):
    """The page's stream (RaceRenderer over one run, the heatmap redrawn every third step as the
    4-a-second throttle would): the heatmap's value only ever grows, the figure it describes at the
    end is the final figure, and gradio's diffs cost a fraction of sending each redrawn figure whole."""
    from app.handlers import Playground
    from app.page.live_plot import figure_from_value, figure_json
    from app.page.views import RaceRenderer
    from app.settings import Limits

    prompt = "Tell me about the sea and the ships that sail on it. " * 12
    checked = Playground(lambda: tiny_generator, Limits()).checked(dict(
        prompt=prompt, target_speedup=1.5, max_new_tokens=24, lens=True, lens_kl=True))
    renderer = RaceRenderer(checked.settings)
    outputs = []
    for i, update in enumerate(checked.race()):  # rendered as each step comes (the update is the race's live state)
        outputs.append(renderer.outputs("Generating", update, with_plot=i % 3 == 0 or update.done))
    plots = [output[5] for output in outputs]
    assert all(later.startswith(earlier) for earlier, later in zip(plots, plots[1:]))
    final = renderer.heatmap(update, highlight_last=False)
    assert figure_from_value(plots[-1]) == json.loads(figure_json(final))
    assert update.done and len(final["data"]) == 4  # the cells, the lens's KL, the match strip, the folded prompt
    whole = sum(len(figure_json(figure_from_value(b))) for a, b in zip([""] + plots, plots) if a != b)
    heatmap_sent, _ = _wire_bytes([(plot,) for plot in plots])  # the prompt folded, a figure is small: count its own bytes
    assert heatmap_sent < whole / 3, (heatmap_sent, whole)
    skip_panes = [output[1] for output in outputs]  # one row: each pane starts with the one before
    assert sum(b.startswith(a) for a, b in zip(skip_panes, skip_panes[1:])) >= 0.8 * (len(skip_panes) - 1)


@pytest.mark.slow
def test_a_restarted_run_ends_on_no_change(tiny_generator):
    """gradio's completion message repeats a stream's last values: a run ended by a settings
    restart ends on an update that changes nothing, so it neither resends the heatmap nor draws
    over the new run."""
    from app.handlers import Playground
    from app.page.views import NO_CHANGE
    from app.settings import Limits

    class Session:
        session_hash = "restarted"

    playground = Playground(lambda: tiny_generator, Limits())
    stream = playground.generate(dict(prompt="Name a fruit.", max_new_tokens=12), Session())
    first = next(stream)
    assert first[5].startswith("{")  # the heatmap's first figure
    playground.runs.cancel("restarted", reason="restart")
    rest = list(stream)
    assert rest and rest[-1] == NO_CHANGE


# --- a finished pane's end notes and the task's marks legend --------------------------------------

E2E_MR = "name[The Eagle], eatType[pub], area[city centre], familyFriendly[no]"


def _finished(pieces: list[str], depth: int, reason: str = "length", done: bool = True,
              cancelled: bool = False) -> StreamProgress:
    """A stream whose row 0 wrote ``pieces`` (one token each) and ended for ``reason`` (the decoder's
    finish reason: "length" at max_new_tokens, "eos" at an end of text)."""
    from model.race import TokenTexts

    steps = len(pieces) - 1
    record = DecodeResult(num_layers=30, prompt_lengths=[3], tokens=[list(range(1, len(pieces) + 1))],
                          finish_reasons=[reason], prefill_layers=tuple(range(30)),
                          step_layers=[tuple(range(30 - depth, 30))] * steps, prefill_seconds=0.1,
                          step_seconds=[0.0033 * depth] * steps, cancelled=cancelled)
    texts = TokenTexts(None)
    texts.texts, texts.text = list(pieces), "".join(pieces)
    return StreamProgress("s", rows=1, record=record, texts=[texts], done=done)


def _race(skip: StreamProgress, full: StreamProgress) -> RaceUpdate:
    cost = CostModel(layer_cost=1.0, fixed_cost=0.0)
    solved = evaluate_schedule(ScheduleConfig(30, 30, 15, warmup=0, decay="constant", decay_length=12), 12, cost)
    return RaceUpdate(skip, full, solved, "skip", cost)


def _panes(update: RaceUpdate, **values) -> tuple[str, str]:
    """(SkipDecode's pane, the full model's pane) as the page draws them."""
    from app.page.views import RaceRenderer
    from app.settings import Limits, PlaygroundSettings

    outputs = RaceRenderer(PlaygroundSettings.from_values(Limits(), **values)).outputs("", update, with_plot=False)
    return outputs[1], outputs[2]


POEM = ["The", " sea", " is", " wide", " and", " the", " ships", " sail", " on", " through", " the", " night", " and"]


def test_a_pane_that_reached_the_token_limit_says_so_and_one_that_ended_does_not():
    limit = f"stopped at the {len(POEM)}-token limit"
    skip, full = _panes(_race(_finished(POEM, 15), _finished(POEM[:6] + ["."], 30, reason="eos")),
                        prompt="Write a poem.", max_new_tokens=len(POEM))
    assert limit in skip and "not at an end of text" in skip and "stopped at" not in full
    skip, _ = _panes(_race(_finished(POEM, 15, done=False), _finished(POEM, 30, done=False)),
                     prompt="Write a poem.", max_new_tokens=len(POEM))
    assert "stopped at" not in skip  # still running: its text is the pane's last element
    skip, _ = _panes(_race(_finished(POEM, 15, cancelled=True), _finished(POEM, 30)), prompt="Write a poem.",
                     max_new_tokens=len(POEM))
    assert "stopped at" not in skip  # Stop ended it, not the limit
    assert skip.count('class="end-note"') == 0


LOOPED = ["The", " Eagle", " is", " a", " pub", ".", " It", " is", " not", " kid", " friendly", ".",
          " It", " is", " not", " kid", " friendly", "."]


@pytest.mark.parametrize("values", [dict(prompt="Describe The Eagle."), dict(prompt=E2E_MR, task="e2e")])
def test_a_repeated_sentence_is_flagged_under_its_pane_in_chat_and_in_the_task(values):
    plain = ["The", " Eagle", " is", " a", " pub", " in", " the", " city", " centre", "."]
    skip, full = _panes(_race(_finished(LOOPED, 15, reason="eos"), _finished(plain, 30, reason="eos")), **values)
    assert '<div class="end-note">repeats a sentence (“It is not kid friendly.”)</div>' in skip + "</div>"
    assert "repeats a sentence" not in full


def test_a_finished_task_run_marks_words_in_one_box_and_leads_its_headline_with_the_legend():
    from app.page.fact_view import FACT_LEGEND
    from app.page.views import headline_html
    from app.settings import Limits, PlaygroundSettings
    from tests.app.page.test_fact_view import marked_words

    wrong = ["The", " Eagle", " is", " a", " pub", " by", " the", " rivers", "ide", "."]
    update = _race(_finished(wrong, 15, reason="eos"), _finished(wrong, 30, reason="eos"))
    skip, full = _panes(update, prompt=E2E_MR, task="e2e", target_speedup=3.0)
    assert marked_words(skip + "</div>", "fact-wrong") == ["riverside"]  # "rivers|ide": one box
    assert marked_words(full + "</div>", "fact-wrong") == ["riverside"]
    task = PlaygroundSettings.from_values(Limits(), prompt=E2E_MR, task="e2e", target_speedup=3.0)
    assert headline_html(update, task).startswith(f'<div class="headline">{FACT_LEGEND}')
    running = replace(update, full=_finished(wrong, 30, done=False))
    assert FACT_LEGEND not in headline_html(running, task)  # no marks drawn yet: nothing to explain
    chat = PlaygroundSettings.from_values(Limits(), prompt="Describe The Eagle.")
    assert FACT_LEGEND not in headline_html(update, chat)


def test_the_headline_says_the_target_the_cost_model_and_the_measured_figure_in_one_sentence():
    from app.page.views import headline_html
    from app.settings import Limits, PlaygroundSettings

    cost = CostModel(layer_cost=1.0, fixed_cost=60.0)  # the head's cost: 2x fewer layers, 1.2x fewer parameters
    solved = evaluate_schedule(ScheduleConfig(30, 30, 15, warmup=0, decay="constant", decay_length=12), 12, cost)
    update = RaceUpdate(_progress("s", 0.1, [0.075] * 12, 15), _progress("f", 0.1, [0.1] * 12, 30), solved, "skip", cost)
    line = headline_html(update, PlaygroundSettings.from_values(Limits(), prompt="hi", target_speedup=2.0))
    assert line.startswith('<div class="headline">Target 2x fewer layers; the cost model expects 1.20x here; measured '
                           '<b>1.33x faster</b> per decode step (the median of 12 steps; middle half 1.33x–1.33x).')
    even = replace(update, skip=_progress("s", 0.1, [0.101] * 12, 15))
    assert "measured <b>no faster</b> per decode step (0.99x," in headline_html(
        even, PlaygroundSettings.from_values(Limits(), prompt="hi", target_speedup=2.0))
