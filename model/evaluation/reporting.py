"""Figures of measured results (eval and bench): written by the commands, shown by the app."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # plotly loads where a figure is drawn, not at CLI start
    import plotly.graph_objects as go

SKIP_COLOUR, NO_ADAPTER_COLOUR = "#3f9c6d", "#c0504d"


QUALITY_PANELS = (  # (row key, subplot title, log scale): the last two judge SkipDecode's OWN text
    ("agreement", "next-token agreement with the full model", False),
    ("perplexity_ratio", "perplexity ratio, full model's text (lower is better)", True),
    ("judged_ppl_ratio", "judged perplexity ratio, its own text (lower is better)", True),
    ("fact_retention", "fact answers kept", False),
)


def quality_figure(report: dict) -> go.Figure:
    """Each quality measure against layer speedup, with and without the adapter: the
    teacher-forced pair, and (when the eval measured them) judged fluency and fact retention."""
    import plotly.graph_objects as go  # noqa: PLC0415 (plotly: not at CLI start)
    from plotly.subplots import make_subplots  # noqa: PLC0415

    rows_all = report.get("rows", [])
    panels = [p for p in QUALITY_PANELS if any(r.get(p[0]) is not None for r in rows_all)] or list(QUALITY_PANELS[:2])
    grid_rows = (len(panels) + 1) // 2
    figure = make_subplots(rows=grid_rows, cols=2, subplot_titles=[title for _, title, _ in panels],
                           vertical_spacing=0.28 if grid_rows > 1 else 0.1)
    for variant, colour in (("adapter", SKIP_COLOUR), ("no adapter", NO_ADAPTER_COLOUR)):
        rows = [r for r in rows_all if r["variant"] == variant]
        for index, (key, _, log) in enumerate(panels):
            measured = [r for r in rows if r.get(key) is not None]
            if not measured:
                continue
            figure.add_trace(go.Scatter(x=[r["layer_speedup"] for r in measured], y=[r[key] for r in measured],
                                        name=variant, mode="lines+markers", line=dict(color=colour),
                                        showlegend=index == 0), index // 2 + 1, index % 2 + 1)
            if log:
                figure.update_yaxes(type="log", row=index // 2 + 1, col=index % 2 + 1)
            elif key in ("agreement", "fact_retention"):
                figure.update_yaxes(range=[0, 1.02], row=index // 2 + 1, col=index % 2 + 1)
    figure.update_xaxes(title_text="layer speedup")
    figure.update_layout(height=320 * grid_rows, margin=dict(l=50, r=10, t=50, b=40))
    return figure


def speed_figure(bench: dict) -> go.Figure:
    """Measured speedup against target layer speedup, with the layer and cost-model limits."""
    import plotly.graph_objects as go  # noqa: PLC0415 (plotly: not at CLI start)

    figure = go.Figure()
    rows = [r for r in bench.get("rows", []) if r.get("mode") == "skipdecode"]
    for weights in sorted({r.get("weights", "float") for r in rows}):
        for batch in sorted({r["batch_size"] for r in rows}):
            chosen = sorted((r for r in rows if r["batch_size"] == batch and r.get("weights", "float") == weights),
                            key=lambda r: r["target_speedup"])
            name = f"measured, batch {batch}" + ("" if weights == "float" else f", {weights}")
            figure.add_trace(go.Scatter(x=[r["target_speedup"] for r in chosen], y=[r["measured_speedup"] for r in chosen],
                                        mode="lines+markers", name=name,
                                        line=dict(dash="solid" if weights == "float" else "dashdot")))
    if rows:
        targets = sorted({r["target_speedup"] for r in rows})
        first_batch = min(r["batch_size"] for r in rows)
        by_target = {r["target_speedup"]: r for r in rows if r["batch_size"] == first_batch}
        figure.add_trace(go.Scatter(x=targets, y=[by_target[t]["layer_speedup"] for t in targets], name="layer speedup",
                                    line=dict(dash="dash", color="#888")))
        figure.add_trace(go.Scatter(x=targets, y=[by_target[t]["cost_speedup"] for t in targets], name="cost-model speedup",
                                    line=dict(dash="dot", color="#333")))
    figure.update_layout(title=dict(text=f"Measured speedup over the full model ({bench.get('hardware', {}).get('summary', '')})",
                                    x=0.01), xaxis_title="target layer speedup", yaxis_title="speedup",
                         height=340, margin=dict(l=50, r=10, t=50, b=40))
    return figure


STUDY_SPEEDUP = "2x"


def study_figure(study: dict) -> go.Figure:
    """The recipe study: held-out teacher-forced agreement at 2x against training CPU minutes, one
    line per arm (same budget, same held-out prompts), the best arm drawn thick."""
    import plotly.graph_objects as go  # noqa: PLC0415 (plotly: not at CLI start)

    figure = go.Figure()
    arms = study.get("arms", [])
    best = max(arms, key=lambda a: a["heldout"][STUDY_SPEEDUP]["agreement"], default=None)
    for arm in arms:
        curve = arm.get("curve") or []
        figure.add_trace(go.Scatter(
            x=[point["cpu_minutes"] for point in curve], y=[point[STUDY_SPEEDUP]["agreement"] for point in curve],
            mode="lines+markers", name=arm["arm"], hovertext=arm["description"],
            line=dict(width=4 if arm is best else 1.5)))
    figure.update_layout(title=dict(text=f"Recipe study: held-out agreement at {STUDY_SPEEDUP} per arm "
                                         f"({study.get('budget_minutes', '?')} CPU min each)", x=0.01),
                         xaxis_title="training CPU minutes", yaxis_title=f"agreement at {STUDY_SPEEDUP}",
                         height=380, margin=dict(l=50, r=10, t=50, b=40))
    return figure


def heldout_curve_figure(records: list[dict], title: str) -> go.Figure:
    """A training run's held-out curve (train_log.jsonl rows with "heldout"): agreement per
    speedup against step, to see whether it still improves or has flattened. Rows of an
    adapter's lineage (heldout.lineage_curve: "stage" and "sequences") are drawn against the
    training sequences seen, with a dotted line where each later run began."""
    import plotly.graph_objects as go  # noqa: PLC0415 (plotly: not at CLI start)

    figure = go.Figure()
    rows = [r for r in records if r.get("heldout")]
    lineage = bool(rows) and all("sequences" in r and "stage" in r for r in rows)
    x = [r["sequences"] / 1000 for r in rows] if lineage else [r["step"] for r in rows]
    speedups = [s for s in (rows[0]["heldout"] if rows else {}) if s != "1x"]
    for speedup in speedups:
        points = [(xi, r["heldout"][speedup]["agreement"]) for xi, r in zip(x, rows) if speedup in r["heldout"]]
        figure.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points],
                                    mode="lines+markers", name=speedup))
    if lineage:
        starts = [(x[0], rows[0]["stage"])] + [  # a run that continued began at the previous row
            (previous["sequences"] / 1000, row["stage"]) for previous, row in zip(rows, rows[1:])
            if row["stage"] != previous["stage"]]
        for index, (start, stage) in enumerate(starts):
            if index:
                figure.add_vline(x=start, line_dash="dot", line_color="grey")
            # short labels beside their line; one near the right edge reads to the left of it
            right = start > 0.75 * x[-1]
            figure.add_annotation(x=start, y=0.08, text=f" {stage} " if not right else f"{stage} ",
                                  showarrow=False, xanchor="right" if right else "left",
                                  font=dict(size=11, color="grey"))
    figure.update_layout(title=dict(text=title, x=0.01),
                         xaxis_title="training sequences seen (thousands)" if lineage else "training step",
                         yaxis=dict(title="held-out agreement", range=[0, 1]), height=340,
                         margin=dict(l=50, r=10, t=50, b=40))
    return figure


def write_result_files(folder: str | Path, name: str, data: dict, markdown: str) -> tuple[Path, Path]:
    """A command's results as ``name``.json (the figures) and ``name``.md (the table), in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / f"{name}.json", folder / f"{name}.md"
    json_path.write_text(json.dumps(data, indent=2))
    md_path.write_text(markdown + "\n")
    return json_path, md_path
