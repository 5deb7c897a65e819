"""The Results tab (plots and tables from assets/, written by the library's commands) and the
held-out figures the playground quotes under its panes."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Callable

import gradio as gr

from model.evaluation.reporting import heldout_curve_figure, quality_figure, speed_figure, study_figure
from model.loading import DEFAULT_ADAPTER
from model.training.heldout import stage_notes

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def load_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@lru_cache(maxsize=1)
def _eval_results() -> dict | None:
    data = load_json(ASSETS / "eval" / "eval.json")
    return data if isinstance(data, dict) and isinstance(data.get("rows"), list) else None


def eval_row(target_speedup: float, skip_policy: bool) -> tuple[dict | None, int]:
    """(eval's row nearest this target speedup for this skip-policy state, held-out prompt count);
    (None, 0) when there is no eval (python -m model eval --output assets/eval writes it)."""
    data = _eval_results()
    variant = "adapter" if skip_policy else "no adapter"
    rows = [r for r in (data or {}).get("rows", []) if r.get("variant") == variant
            and isinstance(r.get("agreement"), (int, float)) and isinstance(r.get("perplexity_ratio"), (int, float))]
    if not rows:
        return None, 0
    return min(rows, key=lambda r: abs(r["target_speedup"] - target_speedup)), int(data.get("num_prompts", 0))


def results_tab() -> None:
    """Quality (eval), the shipped adapter's held-out curve, the recipe study, speed (bench).
    Tables sit in a container that scrolls sideways on a phone (CSS class results-table)."""
    _results_section("Quality under skipping (held-out prompts)", "eval", "eval", quality_figure)
    _training_curve()
    _results_section("Which recipe: the skip-policy study", "study", "study", study_figure)
    _results_section("Measured speed", "bench", "bench", speed_figure)


def narrow_safe(figure, width: int = 26):
    """A Results figure that reads on a phone as well: titles and subplot titles wrapped onto short
    lines (side by side they overprinted at 390 px), the legend in a row under the plot."""
    title = figure.layout.title.text
    if title:
        figure.update_layout(title=dict(text=_wrap(title, width + 14), font=dict(size=14)))
    for annotation in figure.layout.annotations or ():
        subplot_title = annotation.yref == "paper" and (annotation.yanchor == "bottom" or (annotation.y or 0) >= 1)
        if annotation.text and subplot_title:  # every row's subplot titles (a 2x2 grid has them at y < 1)
            annotation.text = _wrap(annotation.text, width)
            annotation.font = dict(size=12)
    lines = max([1] + [(a.text or "").count("<br>") + 1 for a in figure.layout.annotations or ()])
    figure.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.25, x=0),
                         margin=dict(t=40 + 16 * lines + (20 if title else 0), b=90))
    return figure


def _wrap(text: str, width: int) -> str:
    """Plotly text broken into lines of at most ``width`` characters at spaces."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join(lines + [line])


def _training_curve() -> None:
    """The shipped adapter's held-out curve (heldout_curve.json next to the adapter: its training
    runs' held-out rows, one run continuing the last, written by scripts/adapter_lineage.py)."""
    records = load_json(DEFAULT_ADAPTER / "heldout_curve.json")
    if records:
        gr.Markdown("### How the shipped skip policy was trained (held-out agreement; each dotted line "
                    "starts a run that continued the last one's adapter)")
        gr.Plot(narrow_safe(heldout_curve_figure(records, "Shipped adapter: held-out agreement")), show_label=False)
        notes = stage_notes(records)
        if notes:
            gr.Markdown("\n".join(f"* **{stage}**: {note}" for stage, note in notes))


def _results_section(title: str, folder: str, command: str, figure: Callable[[dict], object]) -> None:
    """One results block from assets/<folder>/<folder>.json and .md, written by `python -m model <command>`."""
    data = load_json(ASSETS / folder / f"{folder}.json")
    gr.Markdown(f"### {title} (`python -m model {command}`)")
    if not data:
        gr.Markdown(f"_No results under assets/{folder} yet: run `python -m model {command} --output assets/{folder}`._")
        return
    gr.Plot(narrow_safe(figure(data)), show_label=False)
    table = ASSETS / folder / f"{folder}.md"
    gr.Markdown(table.read_text() if table.is_file() else "", elem_classes=["results-table"])
