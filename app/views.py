"""Views: race updates -> what the page and the API show (token html, stats table, heatmap,
API messages). No gradio state lives here; RaceRenderer only caches token texts per run."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass

import gradio as gr

from app.figures import Judged, heatmap_legend_html, layer_heatmap
from app.race import RaceUpdate, StreamProgress
from app.results import e2e_note, eval_row
from app.settings import PlaygroundSettings
from app.shown_text import as_markdown
from app.token_html import plain_text_html, tokens_by_depth_html
from model.generation import TextGenerator
from model.skipdecode.schedule import RANKED, CostModel, schedule_json, speedup_summary

INCOMPLETE = "\ufffd"  # what decoding shows for a character whose bytes have not all arrived yet


class TokenTexts:
    """Each token's text as it reads inside the whole output (byte-level BPE needs context),
    extended incrementally: one decode per new token. A character split over several tokens (a
    CJK character is often 2-3 byte tokens) belongs to the token that completes it; the tokens
    carrying its first bytes get "" (decoding them alone would show replacement marks)."""

    def __init__(self, generator: TextGenerator) -> None:
        self.generator = generator
        self.texts: list[str] = []
        self.decoded = ""

    def update(self, ids: list[int]) -> list[str]:
        for end in range(len(self.texts) + 1, len(ids) + 1):
            stable = self.generator.decode_text(ids[:end]).rstrip(INCOMPLETE)
            common = len(os.path.commonprefix([stable, self.decoded]))
            self.texts.append(stable[common:])
            self.decoded = stable
        return self.texts[: len(ids)]


def rows_html(panes: list[str], prompts: tuple[str, ...]) -> str:
    """One pane's rows: a lone row as it is; a batch with each row under its prompt."""
    if len(panes) == 1:
        return panes[0]
    return "".join(f'<div class="row-label">row {r + 1}: {html.escape(prompts[r])}</div>{pane}'
                   for r, pane in enumerate(panes))


def pane_note(settings: PlaygroundSettings, solved) -> str:
    """Above SkipDecode's text: the skip policy's state and the schedule this run used."""
    model = "the untouched model" if settings.task == "chat" else "the task model without its policy"
    policy = ((f"the {settings.task.upper()} task's skip policy ON" if settings.task != "chat" else
               "skip policy ON (the fine-tuned adapter)") if settings.skip_policy
              else f"skip policy OFF: {model} skips the same layers")
    return (f'<div class="pane-note">{policy} · {settings.target_speedup:g}x target, {solved.config.decay}, '
            f'{solved.config.order}</div>')


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


def live_figures(update: RaceUpdate, cost: CostModel) -> LiveFigures:
    skip, full, solved = update.skip, update.full, update.solved
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
    )


SPEEDUPS_EXPLAINED = (
    "**layer speedup**: layers the full model runs per layer SkipDecode runs (the paper's figure). "
    "**cost-model speedup**: the same for parameters touched per step, LM head included (the head "
    "never skips, so this is lower). **measured speedup**: wall-clock decode step time, full model "
    "over SkipDecode, on the same steps. **exact token match**: share of positions where the two "
    "free-running texts hold the same token; once they part, later positions rarely line up again, "
    "so the headline judges SkipDecode's text with the full model on the same prefix instead."
)


def details_markdown(update: RaceUpdate, cost: CostModel, step_mode: bool = False) -> str:
    """The expander's table. In step mode the two streams take strict turns and wait for the
    button, so tokens/s and the measured speedup would mean nothing: they are left out."""
    figures = live_figures(update, cost)
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


def headline_html(update: RaceUpdate, cost: CostModel, settings: PlaygroundSettings,
                  judged: list[Judged] | None, step_mode: bool = False) -> str:
    """The one honest line under the panes: measured speedup, the share of SkipDecode's positions
    where the full model (on the same prefix) picks the same token, and the regression eval
    measured at this setting, with the reason and a link to the Results tab."""
    figures = live_figures(update, cost)
    if step_mode:
        speed = "Step mode: speeds are not measured (both models wait for the button)"
    elif figures.measured_speedup:
        speed = f"<b>{figures.measured_speedup:.2f}x faster</b> (measured over {figures.common_steps} decode steps)"
    else:
        speed = f"measured speedup after {MIN_STEPS_FOR_MEASURED} decode steps"
    if judged:
        same = sum(j.same for j in judged)
        share = (f"given SkipDecode's own text, the full model picks the same next token at "
                 f"<b>{same / len(judged):.0%}</b> of its {len(judged)} positions")
    else:
        share = "the full model's verdict on SkipDecode's text comes when SkipDecode finishes"
    return (f'<div class="headline">{speed} · {share}. {regression_note(settings, update.solved)} '
            f'<a href="#results" class="to-results">Results</a></div>')


def regression_note(settings: PlaygroundSettings, solved) -> str:
    """What quality loss remains at this setting, from eval's held-out figures, and why."""
    if solved.layer_speedup <= 1.0 + 1e-9:
        return "1x runs every layer: this IS the full model, no regression."
    if settings.task != "chat":  # the task's own test-set figures, not the chat model's
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


def prompt_token_texts(generator: TextGenerator, settings: PlaygroundSettings, row: int = 0) -> tuple[list[str], int]:
    """The prompt's tokens the heatmap shows and how many leading ones it hides: unless the user
    asked for the chat template, only the user's text and the template's tail (the system prompt
    would take most of the width)."""
    prompt = settings.prompts()[row]
    ids, _ = generator.encode([prompt])
    texts = [generator.token_text(t) for t in ids[0].tolist()]
    if settings.show_template:
        return texts, 0
    user_tokens = len(generator.loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    shown = min(len(texts), user_tokens + generator.template_tail_tokens)
    return texts[len(texts) - shown:], len(texts) - shown


class RaceRenderer:
    """Turns race updates of one run into the playground's stream outputs (STREAM_OUTPUTS of
    them); token texts are extended incrementally across updates."""

    def __init__(self, generator: TextGenerator, settings: PlaygroundSettings) -> None:
        self.generator, self.settings = generator, settings
        self.prompt_tokens = prompt_token_texts(generator, settings)
        rows = len(settings.prompts())
        self.skip_texts = [TokenTexts(generator) for _ in range(rows)]
        self.full_texts = [TokenTexts(generator) for _ in range(rows)]
        self.judged_ids: list[int] | None = None
        self.judged: list[Judged] | None = None
        self.kl: list[dict] | None = None

    def judge(self, update: RaceUpdate, step_mode: bool) -> list[Judged] | None:
        """The full model's verdict on SkipDecode's row 0: one full-depth forward over the prompt
        and SkipDecode's own tokens, once it has finished (every step in step mode, where no
        timing can suffer). The same pass gives the lens's KL when asked for."""
        skip = update.skip
        ids = skip.ids(0)
        if not ids or not (skip.done or step_mode) or ids == self.judged_ids:
            return self.judged
        generator = self.generator
        full = generator.full_model_log_probs(self.settings.prompts()[0], ids)
        self.judged_ids = ids
        self.judged = [Judged(choice == token, generator.token_text(choice))
                       for choice, token in zip(generator.full_model_choices(full), ids)]
        if self.settings.lens_kl and self.settings.lens and skip.traces:
            self.kl = generator.lens_kl(skip.traces, full, self.settings.schedule_request(num_layers=generator.num_layers))
        return self.judged

    def heatmap(self, update: RaceUpdate, judged: list[Judged] | None, highlight_last: bool) -> str:
        view = update.skip
        shown, hidden = self.prompt_tokens
        generated = self.skip_texts[0].update(view.ids(0))
        return layer_heatmap(
            self.generator.num_layers, update.solved.config.warmup, shown, view.prefill_layers, generated,
            view.step_layers, hidden_prompt=hidden, lens=view.lens or None, judged=judged,
            highlight_last=highlight_last, lens_kl=self.kl if self.judged_ids else None,
        ).to_json()

    def outputs(self, status: str, update: RaceUpdate, with_plot: bool, step_mode: bool = False) -> tuple:
        """(status, SkipDecode html, full-model html, headline, details, heatmap json or gr.skip(),
        heatmap note)."""
        generator, settings = self.generator, self.settings
        judged = self.judge(update, step_mode)
        skip, full = update.skip, update.full
        prompts = settings.prompts()
        skip_panes = [tokens_by_depth_html(self.skip_texts[r].update(skip.ids(r)), skip.depths[: len(skip.ids(r))],
                                           generator.num_layers) for r in range(skip.rows)]
        full_panes = [plain_text_html("".join(self.full_texts[r].update(full.ids(r)))) for r in range(full.rows)]
        plot = note = gr.skip()
        if with_plot:
            plot = self.heatmap(update, judged, highlight_last=step_mode)
            first_generated = self.prompt_tokens[1] + len(self.prompt_tokens[0])
            note = heatmap_note_html(settings, update.solved, judged, first_generated, update.solved.config.ranking)
        model = "the original model" if settings.task == "chat" else f"the {settings.task.upper()} task model"
        full_note = f'<div class="pane-note">{model}: all {generator.num_layers} layers at every position</div>'
        return (status, pane_note(settings, update.solved) + rows_html(skip_panes, prompts),
                full_note + rows_html(full_panes, prompts),
                headline_html(update, generator.cost, settings, judged, step_mode),
                details_markdown(update, generator.cost, step_mode), plot, note)


STREAM_OUTPUTS = 7  # status, SkipDecode, full model, headline, details, heatmap, heatmap note
NO_CHANGE = (gr.skip(),) * STREAM_OUTPUTS


def api_message(generator: TextGenerator, update: RaceUpdate, settings: PlaygroundSettings) -> dict:
    skip, full, solved = update.skip, update.full, update.solved
    figures = live_figures(update, generator.cost)
    return {
        "prompts": list(settings.prompts()),  # what these outputs answer (clients can check isolation)
        "skipdecode": [generator.decode_text(skip.ids(r)) for r in range(skip.rows)],
        "full": [generator.decode_text(full.ids(r)) for r in range(full.rows)],
        "prefill_layers": list(skip.prefill_layers),
        "step_layers": [list(layers) for layers in skip.step_layers],
        "layers_per_step": [len(layers) for layers in skip.step_layers],
        "num_layers": generator.num_layers,
        "skipdecode_tokens_per_second": round(skip.tokens_per_second, 3),
        "full_tokens_per_second": round(full.tokens_per_second, 3),
        "skipdecode_decode_tokens_per_second": round(figures.skip_decode_tps, 3),
        "full_decode_tokens_per_second": round(figures.full_decode_tps, 3),
        "skipdecode_prefill_seconds": round(skip.prefill_seconds, 4),
        "full_prefill_seconds": round(full.prefill_seconds, 4),
        "measured_speedup": None if figures.measured_speedup is None else round(figures.measured_speedup, 4),
        "measured_over_steps": figures.common_steps,
        "exact_token_match": None if figures.exact_match is None else round(figures.exact_match, 4),
        **speedup_summary(solved, [len(layers) for layers in skip.step_layers], generator.cost).to_json(),
        "schedule": schedule_json(solved.config),
        "done": skip.done and full.done,
    } | ({"lens": lens_json(skip)} if settings.lens else {}) | (
        {"full_model_same_next_token": full_model_share(generator, settings, skip)} if skip.done and full.done else {})


def full_model_share(generator: TextGenerator, settings: PlaygroundSettings, skip: StreamProgress) -> float | None:
    """Share of SkipDecode's row-0 positions where the full model, on the same prefix, picks the
    same next token (the page's headline; one full-depth forward)."""
    ids = skip.ids(0)
    if not ids:
        return None
    choices = generator.full_model_choices(generator.full_model_log_probs(settings.prompts()[0], ids))
    return round(sum(c == t for c, t in zip(choices, ids)) / len(ids), 4)


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
