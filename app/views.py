"""Views: race updates -> what the page and the API show (token html, stats table, heatmap,
API messages). No gradio state lives here; RaceRenderer only caches token texts per run."""

from __future__ import annotations

import gradio as gr

from app.figures import layer_heatmap, tokens_by_depth_html
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


def agreement(skip: StreamProgress, full: StreamProgress, row: int = 0) -> float | None:
    """Share of positions where SkipDecode produced the full model's token (over the shorter output)."""
    a, b = skip.ids(row), full.ids(row)
    common = min(len(a), len(b))
    if common == 0:
        return None
    return sum(x == y for x, y in zip(a[:common], b[:common])) / common


def stats_markdown(update: RaceUpdate, num_layers: int, cost: CostModel) -> str:
    skip, full, solved = update.skip, update.full, update.solved
    measured = skip.tokens_per_second / full.tokens_per_second if full.tokens_per_second and skip.tokens_per_second else None
    figures = speedup_summary(solved, [len(layers) for layers in skip.step_layers], cost)
    agree = agreement(skip, full)
    cells = [
        ("SkipDecode", f"{skip.tokens_per_second:.1f} tok/s"),
        ("full model", f"{full.tokens_per_second:.1f} tok/s"),
        ("measured speedup", f"{measured:.2f}x" if measured else "…"),
        ("layer speedup", f"{figures.achieved_layer_speedup:.2f}x (planned {figures.planned_layer_speedup:.2f}x)"),
        ("cost-model speedup", f"{figures.achieved_cost_model_speedup:.2f}x (planned {figures.planned_cost_model_speedup:.2f}x)"),
        ("layer computations skipped", f"{100 * figures.skipped_share:.0f}%"),
        ("agreement with full output", f"{100 * agree:.0f}%" if agree is not None else "…"),
        ("schedule", f"{solved.config.decay}, {solved.config.max_layers}→{solved.config.min_layers} layers, "
                     f"warmup {solved.config.warmup}, D = {solved.config.decay_length}"),
    ]
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | **{v}** |" for k, v in cells)


def prompt_token_texts(generator: TextGenerator, settings: PlaygroundSettings, row: int = 0) -> list[str]:
    ids, _ = generator.encode([settings.prompts()[row]])
    return [generator.loaded.tokenizer.decode([t]) for t in ids[0].tolist()]


def heatmap_for(generator: TextGenerator, view: StreamProgress, settings: PlaygroundSettings, prompt_tokens: list[str],
                generated: list[str], row: int = 0, title: str | None = None):
    return layer_heatmap(
        generator.num_layers, settings.warmup, prompt_tokens, view.prefill_layers, generated, view.step_layers,
        title=title or f"{view.name}: layers executed per position (row {row})",
    )


class RaceRenderer:
    """Turns race updates of one run into the playground's five outputs; token texts are
    extended incrementally across updates."""

    def __init__(self, generator: TextGenerator, settings: PlaygroundSettings) -> None:
        self.generator, self.settings = generator, settings
        self.prompt_tokens = prompt_token_texts(generator, settings)
        self.skip_texts, self.full_texts = TokenTexts(generator), TokenTexts(generator)

    def outputs(self, status: str, update: RaceUpdate, with_plot: bool) -> tuple:
        """(status, SkipDecode html, full-model text, stats, heatmap json or gr.skip())."""
        generator = self.generator
        plot = gr.skip()
        if with_plot:
            generated = self.skip_texts.update(update.skip.ids(0))
            plot = heatmap_for(generator, update.skip, self.settings, self.prompt_tokens, generated).to_json()
        return (status, skip_output_html(generator, update.skip, self.skip_texts),
                "".join(self.full_texts.update(update.full.ids(0))),
                stats_markdown(update, generator.num_layers, generator.cost), plot)


def api_message(generator: TextGenerator, update: RaceUpdate, settings: PlaygroundSettings) -> dict:
    skip, full, solved = update.skip, update.full, update.solved
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
        **speedup_summary(solved, [len(layers) for layers in skip.step_layers], generator.cost).to_json(),
        "schedule": schedule_json(solved.config),
        "done": skip.done and full.done,
    }


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
