"""Views: race updates -> what the page and the API show (token html, stats table, heatmap,
API messages). No gradio state lives here; RaceRenderer only caches token texts per run."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from app.figures import layer_heatmap, plain_text_html, tokens_by_depth_html
from app.race import RaceUpdate, StreamProgress
from app.settings import PlaygroundSettings
from model.generation import TextGenerator
from model.schedule import CostModel, schedule_json, speedup_summary


class TokenTexts:
    """Each token's text as it reads inside the whole output (byte-level BPE needs context),
    extended incrementally: a streamed output of n tokens costs O(n) decodes, not O(n^2)."""

    def __init__(self, generator: TextGenerator) -> None:
        self.generator = generator
        self.texts: list[str] = []
        self.decoded = ""

    def update(self, ids: list[int]) -> list[str]:
        for end in range(len(self.texts) + 1, len(ids) + 1):
            current = self.generator.decode_text(ids[:end])
            if current.startswith(self.decoded):
                self.texts.append(current[len(self.decoded):])
            else:  # a multi-byte character completed: re-split honestly
                self.texts.append(self.generator.decode_text(ids[end - 1:end]))
            self.decoded = current
        return self.texts[: len(ids)]


def skip_output_html(generator: TextGenerator, view: StreamProgress, texts: TokenTexts, row: int = 0) -> str:
    ids = view.ids(row)
    return tokens_by_depth_html(texts.update(ids), view.depths[: len(ids)], generator.num_layers)


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
    "over SkipDecode, on the same steps."
)


def stats_markdown(update: RaceUpdate, num_layers: int, cost: CostModel) -> str:
    figures = live_figures(update, cost)
    solved = update.solved
    pending = f"… (after {MIN_STEPS_FOR_MEASURED} steps)"
    over = f" over the {figures.common_steps} steps both ran" if figures.common_steps else ""
    cells = [
        ("SkipDecode decode", f"{figures.skip_decode_tps:.1f} tok/s (prefill {figures.skip_prefill_s:.2f} s)"),
        ("full model decode", f"{figures.full_decode_tps:.1f} tok/s (prefill {figures.full_prefill_s:.2f} s)"),
        ("measured speedup", f"{figures.measured_speedup:.2f}x{over}" if figures.measured_speedup else pending),
        ("layer speedup", (f"{figures.layer_speedup:.2f}x{over}" if figures.layer_speedup else pending)
         + f" · planned {figures.planned_layer_speedup:.2f}x"),
        ("cost-model speedup", (f"{figures.cost_model_speedup:.2f}x{over}" if figures.cost_model_speedup else pending)
         + f" · planned {figures.planned_cost_model_speedup:.2f}x"),
        ("layer computations skipped", f"{100 * figures.skipped_share:.0f}%"),
        ("exact token match (free-running)", f"{100 * figures.exact_match:.0f}%" if figures.exact_match is not None else "…"),
        ("schedule", f"{solved.config.decay}, {solved.config.max_layers}→{solved.config.min_layers} layers, "
                     f"warmup {solved.config.warmup}, {solved.config.order}, D = {solved.config.decay_length}"),
    ]
    table = "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | **{v}** |" for k, v in cells)
    return table + "\n\n" + SPEEDUPS_EXPLAINED


TEMPLATE_TAIL = 6  # tokens after the user's text in the chat template ("<|im_end|>", "assistant", ...)


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
    shown = min(len(texts), user_tokens + TEMPLATE_TAIL)
    return texts[len(texts) - shown:], len(texts) - shown


def heatmap_for(generator: TextGenerator, update: RaceUpdate, settings: PlaygroundSettings,
                prompt_tokens: tuple[list[str], int], generated: list[str], row: int = 0, title: str | None = None,
                highlight_last: bool = False, lens_kl: list[dict] | None = None):
    view = update.skip
    shown, hidden = prompt_tokens
    return layer_heatmap(
        generator.num_layers, update.solved.config.warmup, shown, view.prefill_layers, generated, view.step_layers,
        title=title or f"{view.name}: layers executed per position (row {row})",
        hidden_prompt=hidden, lens=view.lens or None, matches=token_matches(update.skip, update.full, row),
        highlight_last=highlight_last, lens_kl=lens_kl,
    )


class RaceRenderer:
    """Turns race updates of one run into the playground's five outputs; token texts are
    extended incrementally across updates."""

    def __init__(self, generator: TextGenerator, settings: PlaygroundSettings) -> None:
        self.generator, self.settings = generator, settings
        self.prompt_tokens = prompt_token_texts(generator, settings)
        self.skip_texts, self.full_texts = TokenTexts(generator), TokenTexts(generator)
        self.kl: list[dict] | None = None

    def lens_kl(self, update: RaceUpdate) -> list[dict] | None:
        """The lens's KL to the full model, once SkipDecode has finished (one full forward), when
        asked for; computed once per run."""
        skip = update.skip
        if not (self.settings.lens_kl and self.settings.lens and skip.done and skip.traces):
            return None
        if self.kl is None:
            self.kl = self.generator.lens_kl(self.settings.prompts()[0], skip.traces, skip.ids(0),
                                             self.settings.schedule_request())
        return self.kl

    def outputs(self, status: str, update: RaceUpdate, with_plot: bool, highlight_last: bool = False) -> tuple:
        """(status, SkipDecode html, full-model text, stats, heatmap json or gr.skip())."""
        generator = self.generator
        plot = gr.skip()
        if with_plot:
            generated = self.skip_texts.update(update.skip.ids(0))
            plot = heatmap_for(generator, update, self.settings, self.prompt_tokens, generated,
                               highlight_last=highlight_last, lens_kl=self.lens_kl(update)).to_json()
        return (status, skip_output_html(generator, update.skip, self.skip_texts),
                plain_text_html("".join(self.full_texts.update(update.full.ids(0)))),
                stats_markdown(update, generator.num_layers, generator.cost), plot)


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
    } | ({"lens": lens_json(skip)} if settings.lens else {})


def lens_json(skip: StreamProgress) -> list[list[dict]]:
    """One entry per generated token of row 0: the lens's top-1 after each executed layer of the
    position that produced that token, in order."""
    return [[reading.top1() for reading in readings] for readings in skip.lens[: len(skip.ids(0))]]


def one_line(text: str, width: int = 120) -> str:
    """Model output as one safe markdown line."""
    flat = " ".join(text.split())[:width]
    return "".join("\\" + ch if ch in "\\`*_[]<>#|" else ch for ch in flat)


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
