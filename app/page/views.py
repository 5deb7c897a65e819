"""Views: race updates -> what the page and the API show (token html, stats table, heatmap,
API messages). Plain formatting of model/race.py's RaceUpdate: everything shown (texts, layers,
timings, the lens, the full model's judgement) is computed by the race; nothing here calls the
model. No gradio state lives here.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from app.page.fact_view import (
    FACT_LEGEND,
    PANES,
    facts_line,
    known_answer_line,
    marked_text,
    pane_facts,
    repeated_sentence,
    subject_line,
    token_marks,
)
from app.page.figures import heatmap_figure, heatmap_legend_html
from app.page.live_plot import LiveFigure, figure_json
from app.page.results import e2e_note, eval_row, tldr_note
from app.page.shown_text import as_markdown
from app.page.token_html import marked_text_html, plain_text_html, tokens_by_depth_html
from app.settings import PlaygroundSettings
from app.tasks import TLDR, task_name
from model.race import Judged, RaceUpdate, StreamProgress
from model.skipdecode.schedule import RANKED, StepSpeedup, schedule_json, speedup_summary, step_speedup
from model.tasks.e2e import (
    PlaceSwap,
    added_attributes,
    parse_mr,
    restore_places,
    surrogate_spans,
    task_prompt,
    unmentioned_attributes,
)
from model.tasks.tldr import PostSubject, SubjectVerdict, post_subject, subject_verdict


def rows_html(panes: list[str], prompts: tuple[str, ...]) -> str:
    """One pane's rows: a lone row as it is; a batch with each row under its prompt."""
    if len(panes) == 1:
        return panes[0]
    return "".join(f'<div class="row-label">row {r + 1}: {html.escape(prompts[r])}</div>{pane}'
                   for r, pane in enumerate(panes))


def pane_note(settings: PlaygroundSettings, solved) -> str:
    """Above SkipDecode's text: the skip policy's state and the schedule this run used, and which
    places both models were given in place of ones the task model never trained on."""
    model = "the untouched model" if settings.task in ("chat", TLDR) else "the task model without its policy"
    on = {"chat": "skip policy ON (the fine-tuned adapter)", TLDR: "skip policy ON (the status line names it)"}
    policy = (on.get(settings.task, f"the {task_name(settings.task)} task's skip policy ON") if settings.skip_policy
              else f"skip policy OFF: {model} skips the same layers")
    return (f'<div class="pane-note">{policy} · {settings.target_speedup:g}x target, {solved.config.decay}, '
            f'{solved.config.order}</div>' + swap_note(row_swaps(settings, 0)))


def swap_note(swaps) -> str:
    """A line naming the places swapped in row 0 (none: nothing)."""
    if not swaps:
        return ""
    pairs = "; ".join(f"{html.escape(place)} → {html.escape(surrogate)}" for surrogate, place in swaps)
    return (f'<div class="pane-note">New places swapped for ones the task model trained on, in both panes, and '
            f'written back in the text (the E2E challenge baseline\'s delexicalisation; the heatmap shows the '
            f'tokens the models were given and wrote): {pairs}</div>')


def restored_tokens(tokens: list[str], depths: list[int], swaps) -> tuple[list[str], list[int]]:
    """A row's tokens with each delexicalised place written back: the tokens that spell a surrogate
    become one piece, the original place, coloured by the depth of the first of them."""
    spans = surrogate_spans("".join(tokens), swaps) if swaps else []
    if not spans:
        return list(tokens), list(depths)
    starts = [0]
    for token in tokens:
        starts.append(starts[-1] + len(token))
    pieces, piece_depths, index = [], [], 0
    while index < len(tokens):
        end = starts[index + 1]
        span = next((sp for sp in spans if sp[1] > starts[index]), None)
        if span is None or span[0] >= end:
            pieces.append(tokens[index])
            piece_depths.append(depths[index])
            index += 1
            continue
        last = index
        while last + 1 < len(tokens) and starts[last + 1] < span[1]:
            last += 1
        pieces.append(restore_places("".join(tokens[index:last + 1]), swaps))
        piece_depths.append(depths[index])
        index = last + 1
    return pieces, piece_depths


def token_matches(skip: StreamProgress, full: StreamProgress, row: int = 0) -> list[bool]:
    """Per generated token of SkipDecode (as far as the full model has got): the same token?"""
    a, b = skip.ids(row), full.ids(row)
    return [x == y for x, y in zip(a, b)]


def exact_token_match(skip: StreamProgress, full: StreamProgress, row: int = 0) -> float | None:
    """Share of positions where SkipDecode produced the full model's token (free-running, by
    position, over the shorter output). Not the Results tab's teacher-forced agreement: once
    the two texts differ, later positions rarely line up again."""
    matches = token_matches(skip, full, row)
    return sum(matches) / len(matches) if matches else None


MIN_STEPS_FOR_MEASURED = 8  # fewer decode steps than this: timer noise, no measured speedup yet


@dataclass(frozen=True)
class LiveFigures:
    """The live panel's numbers, each over a stated span: decode-only tokens/s (the prefill is
    shown apart), and measured vs layer vs cost-model speedup over the SAME decode steps."""

    skip_decode_tps: float
    full_decode_tps: float
    skip_prefill_s: float
    full_prefill_s: float
    common_steps: int  # decode steps both streams have run
    measured_speedup: float | None  # full / SkipDecode mean step time over the common steps
    layer_speedup: float | None  # over the same common steps
    cost_model_speedup: float | None
    planned_layer_speedup: float
    planned_cost_model_speedup: float
    skipped_share: float
    exact_match: float | None
    steady: StepSpeedup | None = None  # the median step's speedup and its middle half, over the common steps


def live_figures(update: RaceUpdate) -> LiveFigures:
    skip, full, solved, cost = update.skip, update.full, update.solved, update.cost
    common = min(len(skip.step_seconds), len(full.step_seconds))
    planned = speedup_summary(solved, [len(layers) for layers in skip.step_layers], cost)
    measured = layer = cost_speed = None
    if common >= MIN_STEPS_FOR_MEASURED:
        skip_time, full_time = sum(skip.step_seconds[:common]), sum(full.step_seconds[:common])
        measured = full_time / skip_time if skip_time > 0 else None
        same_steps = speedup_summary(solved, [len(layers) for layers in skip.step_layers[:common]], cost)
        layer, cost_speed = same_steps.achieved_layer_speedup, same_steps.achieved_cost_model_speedup
    return LiveFigures(
        skip_decode_tps=skip.decode_tokens_per_second, full_decode_tps=full.decode_tokens_per_second,
        skip_prefill_s=skip.prefill_seconds, full_prefill_s=full.prefill_seconds, common_steps=common,
        measured_speedup=measured, layer_speedup=layer, cost_model_speedup=cost_speed,
        planned_layer_speedup=planned.planned_layer_speedup,
        planned_cost_model_speedup=planned.planned_cost_model_speedup,
        skipped_share=planned.skipped_share, exact_match=exact_token_match(skip, full),
        steady=step_speedup(update.num_layers, [len(layers) for layers in skip.step_layers[:common]],
                            full.step_seconds[:common], skip.step_seconds[:common], cost),
    )


SPEEDUPS_EXPLAINED = (
    "**layer speedup**: layers the full model runs per layer SkipDecode runs (the paper's figure). "
    "**cost-model speedup**: the same for parameters touched per step, LM head included (the head "
    "never skips, so this is lower). **measured speedup**: wall-clock decode step time, full model "
    "over SkipDecode, on the same steps. **exact token match**: share of positions where the two "
    "free-running texts hold the same token; once they part, later positions rarely line up again, "
    "so the headline judges SkipDecode's text with the full model on the same prefix instead."
)


def details_markdown(update: RaceUpdate, step_mode: bool = False) -> str:
    """The expander's table. In step mode the two streams take strict turns and wait for the
    button, so tokens/s and the measured speedup would mean nothing: they are left out."""
    figures = live_figures(update)
    config = update.solved.config
    pending = f"… (after {MIN_STEPS_FOR_MEASURED} steps)"
    over = f" over the {figures.common_steps} steps both ran" if figures.common_steps else ""
    cells = [] if step_mode else [
        ("SkipDecode decode", f"{figures.skip_decode_tps:.1f} tok/s (prefill {figures.skip_prefill_s:.2f} s)"),
        ("full model decode", f"{figures.full_decode_tps:.1f} tok/s (prefill {figures.full_prefill_s:.2f} s)"),
        ("measured speedup", f"{figures.measured_speedup:.2f}x{over}" if figures.measured_speedup else pending),
    ]
    cells += [
        ("layer speedup", (f"{figures.layer_speedup:.2f}x{over}" if figures.layer_speedup else pending)
         + f" · planned {figures.planned_layer_speedup:.2f}x"),
        ("cost-model speedup", (f"{figures.cost_model_speedup:.2f}x{over}" if figures.cost_model_speedup else pending)
         + f" · planned {figures.planned_cost_model_speedup:.2f}x"),
        ("layer computations skipped", f"{100 * figures.skipped_share:.0f}%"),
        ("exact token match (free-running, by position)",
         f"{100 * figures.exact_match:.0f}%" if figures.exact_match is not None else "…"),
        ("schedule", f"{config.decay}, {config.max_layers}→{config.min_layers} layers, "
                     f"warmup {config.warmup}, {config.order}, D = {config.decay_length}"),
    ]
    table = "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | **{v}** |" for k, v in cells)
    return table + "\n\n" + SPEEDUPS_EXPLAINED


def headline_html(update: RaceUpdate, settings: PlaygroundSettings, step_mode: bool = False) -> str:
    """The one honest line under the panes: the target, the cost model's and the measured speedup
    in one sentence, the share of SkipDecode's positions where the full model (on the same prefix)
    picks the same token, and the regression eval measured at this setting, with the reason and a
    link to the Results tab. A task's finished run leads with the legend of its panes' fact marks."""
    figures = live_figures(update)
    judged = update.judged
    speed = speed_phrase(figures, settings.target_speedup, update.done, step_mode)
    if judged:
        same = sum(j.same for j in judged)
        share = (f"given SkipDecode's own text, the full model picks the same next token at "
                 f"<b>{same / len(judged):.0%}</b> of its {len(judged)} positions")
    else:
        share = "the full model's verdict on SkipDecode's text comes when SkipDecode finishes"
    checked = fact_check(update, settings)
    facts = facts_note(checked) + known_answer_note(update, settings) + subject_note(subject_check(update, settings),
                                                                                    settings.target_speedup)
    legend = FACT_LEGEND if update.done and checked is not None else ""  # the marks are drawn on finished text only
    return (f'<div class="headline">{legend}{batch_line(update)}{speed}.{prompt_note(update, settings, step_mode)}'
            f'{facts} {share[0].upper() + share[1:]}. {regression_note(settings, update.solved)} '
            f'<a href="#results" class="to-results">Results</a></div>')


def batch_line(update: RaceUpdate) -> str:
    """A run that shared its batch with other visitors says so first (every row ran the same layers:
    the method), with this run's speed beside the batch's; "" for a run alone."""
    share = update.batch
    if share is None:
        return ""
    return (f'<div class="batch-line"><b>One batch of {share.requests} visitors</b> ({share.rows} rows): every row '
            f"ran these layers, one exit depth per position for the whole batch. Your row: SkipDecode "
            f"{update.skip.tokens_per_second:.1f} tokens/s, the full model {update.full.tokens_per_second:.1f}; the "
            f"batch: {share.skip_tokens_per_second:.1f} and {share.full_tokens_per_second:.1f} tokens/s.</div>")


NO_FASTER_BELOW = 1.05  # a measured median under this is within a step's timer noise of 1x: "no faster"
SLOWER_BELOW = 0.95  # ... and under this, SkipDecode's steps took longer: "slower"


def measured_words(speedup: float) -> str:
    """The measured median in words: '1.34x faster', or 'no faster' and 'slower' where it is (never "0.99x faster")."""
    if speedup < SLOWER_BELOW:
        return "slower"
    if speedup < NO_FASTER_BELOW:
        return "no faster"
    return f"{speedup:.2f}x faster"


def expected_clause(target_speedup: float, cost_model: float) -> str:
    """'Target 2x fewer layers; the cost model expects 1.20x here': what was asked and what the
    parameters each step touches (the LM head never skips) make of it on this model."""
    target = "Target 1x: every layer runs" if target_speedup <= 1 else f"Target {target_speedup:g}x fewer layers"
    return f"{target}; the cost model expects {cost_model:.2f}x here"


def speed_phrase(figures: LiveFigures, target_speedup: float, done: bool, step_mode: bool = False) -> str:
    """The headline's speed, one plain sentence: the target, the cost model's figure over the steps
    measured, and the median decode step's measured speedup in words, with how many steps it rests
    on (a finished run always gets one, flagged when under MIN_STEPS_FOR_MEASURED steps) and the
    middle half of the steps as its range; then a sentence where it and the cost model disagree."""
    steady = figures.steady
    expected = expected_clause(target_speedup, steady.cost_model if steady else figures.planned_cost_model_speedup)
    if step_mode:
        return f"{expected}. Step mode: speeds are not measured (both models wait for the button)"
    if steady is None or (steady.steps < MIN_STEPS_FOR_MEASURED and not done):
        return f"{expected}; measured speedup after {MIN_STEPS_FOR_MEASURED} decode steps"
    few = ", too few to trust" if steady.steps < MIN_STEPS_FOR_MEASURED else ""
    figure = "" if steady.median >= NO_FASTER_BELOW else f"{steady.median:.2f}x, "  # "faster" already says it
    phrase = (f"{expected}; measured <b>{measured_words(steady.median)}</b> per decode step ({figure}the median of "
              f"{steady.steps} steps{few}; middle half {steady.low:.2f}x–{steady.high:.2f}x)")
    return phrase + disagreement(steady)


def disagreement(steady: StepSpeedup) -> str:
    """A plain sentence when the measured median and the cost model part by more than a fifth ("" otherwise)."""
    ratio = steady.median / steady.cost_model
    if ratio > 1.2:
        return (". Measured beats the cost model: the full model's steps ran slower than their parameter count says "
                "(on a CPU a few layers' weights can stay in its cache while all of them cannot, and other work on the "
                "machine slows the longer steps more)")
    if ratio < 0.8:
        return (". Measured falls short of the cost model: every step also pays costs that do not shrink with the "
                "layers skipped (sampling, Python, the page's own work), and they weigh most when few layers run")
    return ""


def fact_check(update: RaceUpdate, settings: PlaygroundSettings) -> dict | None:
    """A task's row-0 MR (as written) checked against each pane's text so far (model/tasks/e2e.py):
    {"facts": how many the MR gives, pane: {"unmentioned": attributes the text does not mention,
    "made_up": attributes the MR does not give that the text mentions}}; None in chat or for an MR
    the task cannot read."""
    swaps = settings.place_swaps()
    if settings.task != "e2e" or not swaps:
        return None
    mr = swaps[0].as_written
    try:
        facts = len(parse_mr(mr))
    except ValueError:
        return None
    texts = {pane: restore_places(stream.text(0), row_swaps(settings, 0))
             for pane, stream in (("SkipDecode", update.skip), ("full model", update.full))}
    checked = pane_facts(mr, texts) or {}
    return {"facts": facts, "mr": mr, **{pane: {"unmentioned": unmentioned_attributes(mr, text),
                                      "made_up": added_attributes(mr, text),
                                      "wrong": [f.attribute for f in checked.get(pane, []) if f.state == "wrong"],
                                      "checked": checked.get(pane, [])} for pane, text in texts.items()}}


def facts_note(checked: dict | None) -> str:
    """The headline's facts: each pane's stated / WRONG / made-up / missing facts (app/page/fact_view.py),
    worst first ("" in chat)."""
    if checked is None:
        return ""
    return facts_line({pane: checked[pane]["checked"] for pane in PANES})


def subject_check(update: RaceUpdate, settings: PlaygroundSettings) -> tuple[PostSubject, dict] | None:
    """A TL;DR's row-0 post's main subject (model/tasks/tldr.py post_subject: its reference's for a test
    post, its title's for a visitor's) and, per pane ("full model", "SkipDecode"), whether its finished
    summary names it (None while the pane still writes); None for another task."""
    if settings.task != TLDR:
        return None
    try:
        subject = post_subject(settings.posts()[0])
    except ValueError:  # not a post (refused before any run; a stand-in renderer may still ask)
        return None
    streams = {"full model": update.full, "SkipDecode": update.skip}
    return subject, {pane: subject_verdict(stream.text(0), subject) if stream.done else None
                     for pane, stream in streams.items()}


def subject_note(checked: tuple[PostSubject, dict] | None, speedup: float) -> str:
    """The headline's subject line (app/page/fact_view.py subject_line): the full model first (what SkipDecode
    is held to), then SkipDecode at its target speedup."""
    if checked is None:
        return ""
    subject, verdicts = checked
    return subject_line(subject, {"Full model": verdicts["full model"], f"SkipDecode {speedup:g}x": verdicts["SkipDecode"]})


def prompt_note(update: RaceUpdate, settings: PlaygroundSettings, step_mode: bool = False) -> str:
    """For a TL;DR (a long prompt, a short output): the prompt's tokens, the depth each model read it at,
    each model's measured time to the first token (its prefill) and, once both have finished, the whole
    request's tokens/s, prefill included, beside the decode steps' speedup the line already gives."""
    skip, full = update.skip, update.full
    if settings.task != TLDR or skip.record is None:
        return ""
    layers, depth = update.num_layers, len(skip.prefill_layers)
    shared = full.record is not None and full.prefill_seconds == skip.prefill_seconds  # model/race.py: read once
    read = ("once at full depth for both models (the same computation, so the same time)" if depth >= layers and shared
            else "at full depth by both models" if depth >= layers else
            f"by SkipDecode through the schedule's first budget ({depth} of {layers} layers), by the full model at full depth")
    line = f" The prompt: {skip.record.prompt_lengths[0]} tokens, read {read}"
    if step_mode:
        return line + "."
    first = f"SkipDecode {skip.prefill_seconds:.2f} s"
    first += f", the full model {full.prefill_seconds:.2f} s" if full.record is not None else ""
    line += f"; time to the first token: {first}"
    common = min(len(skip.step_seconds), len(full.step_seconds))  # the same tokens of each: the eval's rule
    skip_s, full_s = (stream.prefill_seconds + sum(stream.step_seconds[:common]) for stream in (skip, full))
    if skip.done and full.done and skip_s > 0:
        line += (f"; the whole request over the first {common + 1} tokens both wrote, prefill included: SkipDecode "
                 f"{skip_s:.2f} s, the full model {full_s:.2f} s, <b>{measured_words(full_s / skip_s)}</b>")
    return line + "."


def known_answer_note(update: RaceUpdate, settings: PlaygroundSettings) -> str:
    """In chat, for a prompt with one known answer (a lesson's or an example's): does each pane state it?"""
    if settings.task != "chat":
        return ""
    return known_answer_line(settings.prompt, {"SkipDecode": update.skip.text(0), "full model": update.full.text(0)})


def regression_note(settings: PlaygroundSettings, solved) -> str:
    """What quality loss remains at this setting, from eval's held-out figures, and why."""
    if solved.layer_speedup <= 1.0 + 1e-9:
        return "1x runs every layer: this IS the full model, no regression."
    if settings.task == TLDR:  # the task's own test-set figures, not the chat model's
        return tldr_note(settings.target_speedup, settings.skip_policy, settings.prompt_at_full_depth)
    if settings.task != "chat":
        return e2e_note(settings.target_speedup, settings.skip_policy)
    row, count = eval_row(settings.target_speedup, settings.skip_policy)
    if row is None:
        return ""
    who = "skip policy on" if settings.skip_policy else "skip policy OFF"
    why = ("one general skip policy for a 135M model, trained for minutes of GPU time, cannot fully replace the bypassed layers"
           if settings.skip_policy else "the untouched model was never trained to run with layers missing")
    return (f"Regression remains ({count} held-out prompts, {row['target_speedup']:g}x, {who}): next-token agreement "
            f"{row['agreement']:.2f}, perplexity ratio {row['perplexity_ratio']:.1f} (1 = no loss); {why}.")


def heatmap_note_html(settings: PlaygroundSettings, solved, judged: list[Judged] | None, first_generated: int,
                      ranking: tuple[int, ...]) -> str:
    """Under the heatmap: its legend, the first position the full model would have written
    differently, and why the ranked order scatters the bypassed cells."""
    parts = [heatmap_legend_html(solved.config.warmup, settings.lens_kl and settings.lens)]
    first_red = next((t for t, j in enumerate(judged or []) if not j.same), None)
    if first_red is not None:
        parts.append(f"<p>Red line: position {first_generated + first_red}, the first token the full model "
                     f"would have chosen differently ({html.escape(repr(judged[first_red].full_choice))}).</p>")
    if solved.config.order == RANKED and ranking:
        parts.append("<p><b>Why the bypassed cells are scattered:</b> layer order <i>ranked</i> keeps the layers "
                     "a measurement found most important first (" + ", ".join(map(str, ranking[:6])) + ", …), not one "
                     "top block as in the paper's picture (How it works; the lesson <i>The paper's layer order</i> "
                     "runs it). The sets are still nested, so every layer's KV cache is still a prefix.</p>")
    return "".join(parts)


def shown_prompt(update: RaceUpdate, settings: PlaygroundSettings) -> tuple[tuple[str, ...], int]:
    """The prompt's tokens the heatmap shows and how many leading ones it hides: unless the user
    asked for the chat template, only the user's text and the template's tail (the system prompt
    would take most of the width)."""
    texts, hidden = update.prompt.texts, update.prompt.hidden
    return (texts, 0) if settings.show_template else (texts[hidden:], hidden)


class RaceRenderer:
    """Turns race updates of one run into the playground's stream outputs (STREAM_OUTPUTS of them).

    Streamed, each output's value changes only when it must, and grows where it can: gradio's
    generator streaming sends an unchanged value as nothing and a value that starts with the one
    before as its new tail (issue #37). So the heatmap is a LiveFigure (its first figure, then
    patches), the headline, details and heatmap note change with the heatmap (at most 4 times a
    second, and at the end), and a single row's pane leaves its last element open, so the next
    step's pane starts with this one's (the browser closes it). Use one renderer per streamed run."""

    def __init__(self, settings: PlaygroundSettings) -> None:
        self.settings = settings
        self.live = LiveFigure()
        self.shown: tuple[str, str, str] = ("", "", "")  # headline, details, heatmap note: as last drawn

    def heatmap(self, update: RaceUpdate, highlight_last: bool) -> dict:
        view = update.skip
        shown, hidden = shown_prompt(update, self.settings)
        return heatmap_figure(
            update.num_layers, update.solved.config.warmup, shown, view.prefill_layers, view.token_texts(0),
            view.step_layers, hidden_prompt=hidden, lens=view.lens or None, judged=update.judged,
            highlight_last=highlight_last, lens_kl=update.lens_kl,
        )

    def outputs(self, status: str, update: RaceUpdate, with_plot: bool, step_mode: bool = False) -> tuple:
        """(status, SkipDecode html, full-model html, headline, details, heatmap value, heatmap note).
        Without ``with_plot`` the heatmap and the lines drawn with it keep their last values. Step
        mode (one event a step, nothing to continue) sends the figure whole, one line."""
        settings, layers = self.settings, update.num_layers
        skip, full = update.skip, update.full
        checked = fact_check(update, settings) if update.done else None  # marks on the finished text only
        skip_panes = [skip_pane_html(update, settings, r, checked) for r in range(skip.rows)]
        full_panes = [full_pane_html(update, settings, r, checked) for r in range(full.rows)]
        if with_plot:
            figure = self.heatmap(update, highlight_last=step_mode)
            plot = figure_json(figure) if step_mode else self.live.update(figure)
            self.shown = (headline_html(update, settings, step_mode), details_markdown(update, step_mode),
                          heatmap_note_html(settings, update.solved, update.judged, len(update.prompt.texts),
                                            update.solved.config.ranking))
        else:
            plot = self.live.value
        headline, details, note = self.shown
        model = {"chat": "the original model", TLDR: "the default model prompted for a TL;DR"}.get(
            settings.task, f"the {task_name(settings.task)} task model")
        full_note = f'<div class="pane-note">{model}: all {layers} layers at every position</div>'
        prompts = row_labels(update, settings)
        return (status, open_end(pane_note(settings, update.solved) + rows_html(skip_panes, prompts)),
                open_end(full_note + rows_html(full_panes, prompts)), headline, details, plot, note)


def skip_pane_html(update: RaceUpdate, settings: PlaygroundSettings, row: int, checked: dict | None = None) -> str:
    """SkipDecode's row ``row``: tokens by depth, places written back; row 0's facts marked when
    ``checked`` (fact_check of the finished run) is given; its end note once it has finished."""
    skip = update.skip
    pieces, depths = restored_tokens(skip.token_texts(row), skip.depths[: len(skip.ids(row))], row_swaps(settings, row))
    text = "".join(pieces)
    facts = pane_facts(checked["mr"], {"SkipDecode": text}) if checked and row == 0 else None
    marks = token_marks(pieces, facts["SkipDecode"]) if facts else ()
    return tokens_by_depth_html(pieces, depths, update.num_layers, marks) + end_note(skip, row, text, settings)


def full_pane_html(update: RaceUpdate, settings: PlaygroundSettings, row: int, checked: dict | None = None) -> str:
    """The full model's row ``row`` as plain text, places written back; row 0's facts marked when
    ``checked`` is given; its end note once it has finished."""
    text = restore_places("".join(update.full.token_texts(row)), row_swaps(settings, row))
    facts = pane_facts(checked["mr"], {"full model": text}) if checked and row == 0 else None
    body = marked_text_html(marked_text(text, facts["full model"])) if facts else plain_text_html(text)
    return body + end_note(update.full, row, text, settings)


def stopped_at_limit(stream: StreamProgress, row: int) -> bool:
    """Whether row ``row`` of a finished stream ended because it reached max_new_tokens, not at an end
    of text or a stop string (a stream that Stop cancelled did not stop by itself)."""
    record = stream.record
    return (stream.done and record is not None and not record.cancelled and row < len(record.finish_reasons)
            and record.finish_reasons[row] == "length")


def end_note(stream: StreamProgress, row: int, text: str, settings: PlaygroundSettings) -> str:
    """Under a finished row's text, in either pane and either task: that it stopped at the token
    limit (a text cut mid-line reads as the model's own end otherwise), and a sentence it repeats.
    Nothing while the stream runs: its text still grows, and the pane's last element must be the text."""
    if not stream.done:
        return ""
    notes = []
    if stopped_at_limit(stream, row):
        notes.append(f"stopped at the {settings.max_new_tokens}-token limit (max new tokens), not at an end of text")
    repeated = repeated_sentence(text)
    if repeated is not None:
        notes.append(f"repeats a sentence (“{html.escape(repeated)}”)")
    return f'<div class="end-note">{" · ".join(notes)}</div>' if notes else ""


def row_swaps(settings: PlaygroundSettings, row: int) -> tuple[tuple[str, str], ...]:
    """Row ``row``'s (surrogate, place) swaps (none past the rows the settings make)."""
    swaps = settings.place_swaps()
    return swaps[row].swaps if row < len(swaps) else ()


def shown_prompts(prompts: tuple[str, ...], place_swaps: tuple[PlaceSwap, ...]) -> tuple[str, ...]:
    """The rows' prompts as the visitor wrote them: a row whose places were swapped shows its MR as
    written, character for character (clients compare it with what they sent)."""
    return tuple(task_prompt(place_swaps[r].as_written) if r < len(place_swaps) and place_swaps[r].swaps else prompt
                 for r, prompt in enumerate(prompts))


def row_labels(update: RaceUpdate, settings: PlaygroundSettings) -> tuple[str, ...]:
    """What a batch's rows are labelled with: each row's prompt as written; a TL;DR row's post by its
    title (the whole prompt is a few hundred words)."""
    if settings.task == TLDR:
        return tuple(f"“{post.title}”" for post in settings.posts())
    return shown_prompts(update.prompts, settings.place_swaps())


def open_end(pane: str) -> str:
    """A pane whose last element (the growing text) is left open: the browser closes it, and the
    next step's pane, one token longer, starts with this one, so gradio sends just the new token."""
    return pane.removesuffix("</div>")


STREAM_OUTPUTS = 7  # status, SkipDecode, full model, headline, details, heatmap, heatmap note
NO_CHANGE = (gr.skip(),) * STREAM_OUTPUTS


def api_message(update: RaceUpdate, settings: PlaygroundSettings) -> dict:
    skip, full, solved = update.skip, update.full, update.solved
    figures = live_figures(update)
    checked = fact_check(update, settings)
    return {
        "prompts": list(shown_prompts(update.prompts, settings.place_swaps())),  # what these outputs answer (clients can check isolation)
        "skipdecode": [restore_places(skip.text(r), row_swaps(settings, r)) for r in range(skip.rows)],
        "full": [restore_places(full.text(r), row_swaps(settings, r)) for r in range(full.rows)],
        # a task's places the task model never trained on, per row: [written back, given to the models]
        "places_swapped": [[[place, surrogate] for surrogate, place in row_swaps(settings, r)]
                           for r in range(skip.rows)],
        # a task's row 0: the MR's attributes each text does not mention, and the attributes it does not
        # give that each text mentions anyway (cue-word checks); chat: null
        "unmentioned_facts": _api_facts(checked, "unmentioned"),
        "made_up_facts": _api_facts(checked, "made_up"),
        # ... and the MR's attributes each text states with a value that contradicts the MR (app/page/fact_view.py)
        "wrong_facts": _api_facts(checked, "wrong"),
        # a TL;DR's row 0: the post's main subject and whether each finished summary names it; otherwise null
        "main_subject": _api_subject(subject_check(update, settings)),
        "prefill_layers": list(skip.prefill_layers),
        "step_layers": [list(layers) for layers in skip.step_layers],
        "layers_per_step": [len(layers) for layers in skip.step_layers],
        "num_layers": update.num_layers,
        "skipdecode_tokens_per_second": round(skip.tokens_per_second, 3),
        "full_tokens_per_second": round(full.tokens_per_second, 3),
        "skipdecode_decode_tokens_per_second": round(figures.skip_decode_tps, 3),
        "full_decode_tokens_per_second": round(figures.full_decode_tps, 3),
        "skipdecode_prefill_seconds": round(skip.prefill_seconds, 4),
        "full_prefill_seconds": round(full.prefill_seconds, 4),
        "measured_speedup": None if figures.measured_speedup is None else round(figures.measured_speedup, 4),
        "measured_over_steps": figures.common_steps,
        # the median step pair's speedup and the middle half of the steps (robust to one slowed step)
        "measured_step_speedup": None if figures.steady is None else {
            "median": round(figures.steady.median, 4), "low": round(figures.steady.low, 4),
            "high": round(figures.steady.high, 4), "steps": figures.steady.steps},
        "exact_token_match": None if figures.exact_match is None else round(figures.exact_match, 4),
        **speedup_summary(solved, [len(layers) for layers in skip.step_layers], update.cost).to_json(),
        "schedule": schedule_json(solved.config),
        "done": update.done,
        # how many requests shared this run's batch (1: it ran alone) and the batch's own speed
        "batch_requests": update.batch.requests if update.batch else 1,
        "batch_rows": update.batch.rows if update.batch else skip.rows,
        "batch_skipdecode_tokens_per_second": round(update.batch.skip_tokens_per_second if update.batch
                                                    else skip.tokens_per_second, 3),
        "batch_full_tokens_per_second": round(update.batch.full_tokens_per_second if update.batch
                                              else full.tokens_per_second, 3),
    } | ({"lens": lens_json(skip)} if settings.lens else {}) | (
        {"full_model_same_next_token": same_next_token_share(update.judged)} if update.done else {})


def same_next_token_share(judged: list[Judged] | None) -> float | None:
    """Share of SkipDecode's row-0 positions where the full model, on the same prefix, picks the
    same next token (the page's headline), from the race's judgement; None without tokens."""
    return round(sum(j.same for j in judged) / len(judged), 4) if judged else None


def _api_facts(checked: dict | None, kind: str) -> dict | None:
    """One kind of fact_check's result as the API names the panes."""
    return None if checked is None else {"skipdecode": checked["SkipDecode"][kind], "full": checked["full model"][kind]}


def _api_subject(checked: tuple[PostSubject, dict] | None) -> dict | None:
    """subject_check's result as the API names it: where the subject came from, its words, and per pane
    (null while it writes) the summary as checked, whether it names the subject and the kinds it misses."""
    if checked is None:
        return None
    subject, verdicts = checked

    def pane(verdict: SubjectVerdict | None) -> dict | None:
        return None if verdict is None else {"summary": verdict.summary, "names_subject": verdict.names_subject,
                                             "missing": [list(kind) for kind in verdict.missing]}

    return {"from": subject.source, "people": subject.spelled(subject.subject.people),
            "event": subject.spelled(subject.subject.event),
            "skipdecode": pane(verdicts["SkipDecode"]), "full": pane(verdicts["full model"])}


def lens_json(skip: StreamProgress) -> list[list[dict]]:
    """One entry per generated token of row 0: the lens's top-1 after each executed layer of the
    position that produced that token, in order."""
    return [[reading.top1() for reading in readings] for readings in skip.lens[: len(skip.ids(0))]]


def one_line(text: str, width: int = 120) -> str:
    """Model output as one safe markdown line (no link, autolink or markup can come out of it)."""
    return as_markdown(" ".join(text.split()), width)


def layer_ranges(layers) -> str:
    """(0, 16, 17, 18) -> '[0, 16–18]'."""
    parts, run = [], []
    for layer in sorted(layers):
        if run and layer == run[-1] + 1:
            run.append(layer)
            continue
        if run:
            parts.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [layer]
    if run:
        parts.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
    return "[" + ", ".join(parts) + "]"
