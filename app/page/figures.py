"""Plotly figures of the playground. Pure functions of plain data (no model, no gradio)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import plotly.graph_objects as go

from model.skipdecode.schedule import SolvedSchedule, decay_value

if TYPE_CHECKING:  # the race's verdict type (model/race.py); figures read its fields only
    from model.race import Judged

# One colour per cell kind of the layer heatmap (z value = index). The legend is HTML next to the
# plot (heatmap_legend_html): a plotly colourbar lost entries on a phone.
CELL_KINDS = ("bypassed", "prompt", "warmup layer", "upper layer")
CELL_COLOURS = ("#eceff4", "#7aa6d8", "#f0a35e", "#3f9c6d")
MAX_AXIS_LABELS = 48  # token text on the x axis only when it stays readable
SAME, OTHER = "#2058b5", "#d64545"  # the strip: blue and red, apart from the cells' greens and for colour-blind eyes
STRIP_Y = -2.8  # the match strip's row, under layer 0 (far enough for its "match" label to clear "0")
# A prompt wider than FOLD_ABOVE of the heatmap is folded into one band of BAND_SHARE of its width:
# every prompt position runs the same layers, and the generated positions are the point of the picture.
FOLD_ABOVE, BAND_SHARE = 0.25, 0.18
PHONE_TICKS = 5  # numbered x ticks a phone gets beside the folded prompt's (its width holds about that many)
# Plotly's toolbar (modebar): 2 px from the top, 22 px buttons and their padding; gr.Plot shows it, and
# a title or subplot title in that band was drawn under it on a phone (issue 70).
MODEBAR_PX = 32
TITLE_LINE_PX = 20  # one line of a 14 px title
Column = tuple[str, str, list[int] | None]  # a heatmap column: kind, token, the layers that ran on it


def _discrete_colorscale(colours: Sequence[str]) -> list[list]:
    """Plotly colourscale with flat bands for integer z values 0 .. len-1."""
    scale, count = [], len(colours)
    for index, colour in enumerate(colours):
        scale.append([index / count, colour])
        scale.append([(index + 1) / count, colour])
    return scale


def layer_heatmap(*args, **kwargs) -> go.Figure:
    """``heatmap_figure`` as a plotly Figure (the How-it-works tab, tests)."""
    return go.Figure(heatmap_figure(*args, **kwargs))


def heatmap_figure(
    num_layers: int,
    warmup: int,
    prompt_tokens: Sequence[str],
    prefill_layers: Sequence[int],
    generated_tokens: Sequence[str],
    step_layers: Sequence[Sequence[int]],
    title: str = "",
    *,
    hidden_prompt: int = 0,
    lens: Sequence[Sequence] | None = None,
    judged: Sequence[Judged] | None = None,
    highlight_last: bool = False,
    lens_kl: Sequence[dict] | None = None,
) -> dict:
    """x = sequence position (the same number in the axis, the hover and the strip), y = layer.

    Column p is the token AT position p and the layers that ran on it (which predict position
    p + 1). The newest token has not been fed back yet: its column is empty. ``prompt_tokens``
    are the prompt's LAST tokens (``hidden_prompt`` earlier ones, the chat template, are left
    out, but still counted in the positions). ``lens``: per generated token t, the logit-lens
    readings of the position that produced t (hover). ``judged``: per generated token, the
    full model's verdict, drawn as a strip under layer 0, each square under the token it judges.

    A long prompt is folded (``prompt_fold``): all its tokens but the last are one band (the second
    trace) left of the columns; the cells trace (the first) holds the other columns, still at
    their positions, and the x axis names the band and the positions itself.

    A plain JSON figure (``{"data": [...], "layout": {...}}``, plotly's own keys, no template),
    built without plotly's validation: the page streams it while a run goes on, redrawn up to
    4 times a second over thousands of positions (app/page/live_plot.py sends the changes only).
    """
    columns: list[Column] = [("prompt", token, list(prefill_layers)) for token in prompt_tokens]
    columns += [("generated", token, list(step_layers[k]) if k < len(step_layers) else None)
                for k, token in enumerate(generated_tokens)]
    fold = prompt_fold(hidden_prompt, len(prompt_tokens), len(generated_tokens))
    folded = fold.count if fold else 0  # columns[:folded] are the band's; the cells start after them
    first = hidden_prompt + folded  # position of the first column drawn as a column
    readings = _by_column([{r.layer: r for r in entry} for entry in lens] if lens else None,
                          len(prompt_tokens), len(columns))[folded:]
    kl_by_column = _by_column(lens_kl, len(prompt_tokens), len(columns))[folded:]
    drawn = columns[folded:]
    xs = list(range(first, first + len(drawn)))
    data: list[dict] = [_cells(drawn, first, num_layers, warmup, readings, kl_by_column)]
    if fold:  # second, before the traces a run adds later (the strip at its end): the live plot patches by index
        data.append(_prompt_band(fold, prompt_tokens[:folded], list(prefill_layers), num_layers))
    shapes: list[dict] = []
    if lens_kl:  # executed cells of the positions that produced tokens, coloured by KL; hover stays below
        data.append(_kl_overlay(xs, kl_by_column, num_layers))
    first_generated = hidden_prompt + len(prompt_tokens)
    if judged:
        data.append(_match_strip(judged, first_generated, generated_tokens, shapes))
    axes = HeatmapAxes(first, [token for _, token, _ in drawn], first_generated, hidden_prompt, num_layers,
                       len(prefill_layers), fold)
    layout = axes.layout(bool(judged), title, shapes)
    if highlight_last and len(step_layers):  # step mode: the column the last step ran
        shapes.append(_step_box(first_generated + len(step_layers) - 1, num_layers))
    return {"data": data, "layout": layout}


def _kl_overlay(xs: list[int], kl_by_column: list[dict], num_layers: int) -> dict:
    """The cells coloured by the lens's KL to the full model (hover stays with the cells below)."""
    kl_z = [[kl_by_column[x].get(layer) for x in range(len(xs))] for layer in range(num_layers)]
    return dict(type="heatmap", x=xs, z=kl_z, colorscale=_magma(), reversescale=True, zmin=0,
                hoverinfo="skip", xgap=1, ygap=1, colorbar=dict(title=dict(text="lens KL")))


def _step_box(position: int, num_layers: int) -> dict:
    """Step mode's outline of the column its last step ran."""
    return dict(type="rect", x0=position - 0.5, x1=position + 0.5, y0=-0.5, y1=num_layers - 0.5,
                line=dict(color="#d64545", width=2))


def _cells(columns: list[Column], first: int, num_layers: int, warmup: int, readings: list[dict],
           kl_by_column: list[dict]) -> dict:
    """The heatmap trace of ``columns`` from position ``first``: a cell kind and a hover a layer."""
    z: list[list[int | None]] = [[None] * len(columns) for _ in range(num_layers)]
    hover = [[""] * len(columns) for _ in range(num_layers)]
    for x, (kind, token, layers) in enumerate(columns):
        for layer in range(num_layers):
            z[layer][x], hover[layer][x] = _cell(kind, token, layers, layer, warmup, num_layers, first + x,
                                                 readings[x].get(layer), kl_by_column[x].get(layer))
    return dict(type="heatmap", x=list(range(first, first + len(columns))), z=z, text=hover, hoverinfo="text",
                **_cell_style())


def _cell_style() -> dict:
    """The cell kinds' colours (a fresh dict a figure: the live plot diffs one figure against the next)."""
    return dict(zmin=-0.5, zmax=len(CELL_KINDS) - 0.5, colorscale=_discrete_colorscale(CELL_COLOURS), xgap=1, ygap=1,
                showscale=False)


@dataclass(frozen=True)
class PromptFold:
    """The heatmap's folded prompt: ``count`` prompt positions from ``first`` drawn as one band
    ``width`` columns wide, ending where the next position's column begins."""

    first: int
    count: int
    width: float

    @property
    def right(self) -> float:
        return self.first + self.count - 0.5

    @property
    def left(self) -> float:
        return self.right - self.width

    @property
    def centre(self) -> float:
        return self.right - self.width / 2


def prompt_fold(first: int, prompt_columns: int, generated_columns: int) -> PromptFold | None:
    """How a prompt that would take more than FOLD_ABOVE of the heatmap's width folds: all its
    positions but the last (which produced the first generated token: its lens and KL are drawn)
    in one band of BAND_SHARE of the width, at least one column, and never wider than unfolded.
    None when the prompt is narrow enough, or folding would not narrow it."""
    kept = 1 + generated_columns  # the prompt's last column and the generated ones
    if prompt_columns < 2 or prompt_columns <= FOLD_ABOVE * (prompt_columns + generated_columns):
        return None
    width = max(1.0, round(kept * BAND_SHARE / (1 - BAND_SHARE), 2))
    return PromptFold(first, prompt_columns - 1, width) if prompt_columns - 1 > width else None


def _prompt_band(fold: PromptFold, tokens: Sequence[str], prefill_layers: list[int], num_layers: int) -> dict:
    """The folded prompt as one heatmap column between the band's edges (x holds the 2 edges):
    every prompt position ran ``prefill_layers``, so one column tells all of them."""
    last = fold.first + fold.count - 1
    text = "".join(tokens)
    quoted = html.escape(repr(text if len(text) <= 60 else text[:59] + "…"), quote=False)
    where = f"positions {fold.first}-{last}: {fold.count} prompt tokens, folded into one band<br>{quoted}"
    z = [[1 if layer in prefill_layers else 0] for layer in range(num_layers)]
    hover = [[f"{where}<br>layer {layer}: " + ("ran at each" if layer in prefill_layers else "BYPASSED at each")
              + f"<br>{len(prefill_layers)}/{num_layers} layers ran at every prompt position"]
             for layer in range(num_layers)]
    return dict(type="heatmap", x=[fold.left, fold.right], z=z, text=hover, hoverinfo="text", name="prompt (folded)",
                **_cell_style())


@dataclass(frozen=True)
class HeatmapAxes:
    """What the heatmap's axes name: the columns drawn (from position ``first``, their tokens), where
    the generated ones begin, the template tokens hidden, the layers, and the folded prompt if any."""

    first: int
    labels: list[str]
    first_generated: int
    hidden_prompt: int
    num_layers: int
    prefill_count: int
    fold: PromptFold | None

    def layout(self, strip: bool, title: str, shapes: list[dict]) -> dict:
        """Both axes, the prompt | generated line (added to ``shapes``), margins."""
        if self.first < self.first_generated < self.first + len(self.labels):  # prompt and generated columns drawn
            shapes.append(_vline(self.first_generated - 0.5, dict(color="#333", width=2, dash="dot")))
        step = max(1, self.num_layers // 10)
        ticks = list(range(0, self.num_layers, step))
        yaxis = dict(title=dict(text="layer"), range=[(STRIP_Y - 0.9) if strip else -0.5, self.num_layers - 0.5],
                     tickmode="array", tickvals=([STRIP_Y] if strip else []) + ticks,
                     ticktext=(["match"] if strip else []) + [str(t) for t in ticks])
        layout = dict(xaxis=self.xaxis(), yaxis=yaxis, shapes=shapes,
                      margin=dict(l=55, r=10, t=30 if title else 10, b=60), height=300, uirevision="heatmap")
        if self.fold:  # for the page's phone view (app/page/live_plot.py): auto numbers would run through the band
            layout["meta"] = dict(phone_xaxis=dict(tickmode="array", **self.number_ticks(PHONE_TICKS, "prompt"),
                                                   title=dict(text="position (prompt folded | generated)")))
        if title:
            layout["title"] = dict(text=title, x=0.01)
        return layout

    def xaxis(self) -> dict:
        """Token texts under the columns while they stay readable, else position numbers; the folded
        prompt's band named under it, and in the title with the layers its positions ran."""
        last = self.first + len(self.labels) - 1
        xaxis: dict = dict(title=dict(text=self.title()), range=[self.fold.left if self.fold else self.first - 0.5,
                                                                 last + 0.5])
        if 0 < len(self.labels) <= MAX_AXIS_LABELS:
            band = self.band_tick()
            xaxis.update(tickmode="array", tickvals=band[0] + list(range(self.first, last + 1)),
                         ticktext=band[1] + [_short(t) for t in self.labels], tickangle=-60)
        elif self.fold:
            xaxis.update(tickmode="array", **self.number_ticks(10))
        return xaxis

    def title(self) -> str:
        hidden = f"{self.hidden_prompt} chat-template tokens hidden | " if self.hidden_prompt else ""
        if not self.fold:
            return f"position ({hidden}prompt | generated)"
        layers = f"all {self.num_layers}" if self.prefill_count == self.num_layers else \
            f"{self.prefill_count} of {self.num_layers}"
        return f"position ({hidden}prompt: {self.fold.count} tokens folded, {layers} layers each | generated)"

    def band_tick(self, text: str = "") -> tuple[list[float], list[str]]:
        return ([self.fold.centre], [text or f"prompt ({self.fold.count})"]) if self.fold else ([], [])

    def number_ticks(self, most: int, band_text: str = "") -> dict:
        """The band's tick and at most ``most`` round position numbers over the columns drawn."""
        band_values, band_texts = self.band_tick(band_text)
        numbers = round_ticks(self.first, self.first + len(self.labels) - 1, most)
        return dict(tickvals=band_values + numbers, ticktext=band_texts + [str(n) for n in numbers])


def round_ticks(start: int, end: int, most: int) -> list[int]:
    """At most ``most`` round numbers in [start, end]: the multiples of the smallest step of 1, 2
    or 5 times a power of ten that keeps them that few."""
    steps = (unit * 10 ** power for power in range(12) for unit in (1, 2, 5))
    step = next(step for step in steps if (end // step) - ((start - 1) // step) <= most)
    return list(range(-(-start // step) * step, end + 1, step))


def _vline(x: float, line: dict) -> dict:
    """A vertical line across the plot at ``x`` (as plotly's add_vline draws it)."""
    return dict(type="line", x0=x, x1=x, xref="x", y0=0, y1=1, yref="y domain", line=line)


@lru_cache(maxsize=1)
def _magma_scale() -> tuple:
    return tuple((position, colour) for position, colour in go.Heatmap(colorscale="Magma").colorscale)


def _magma() -> list[list]:
    """Plotly's Magma as stops (plotly.js has no Magma by name)."""
    return [list(stop) for stop in _magma_scale()]


def _cell(kind: str, token: str, layers: list[int] | None, layer: int, warmup: int, num_layers: int, position: int,
          reading, kl: float | None) -> tuple[int | None, str]:
    """(z, hover text) of one heatmap cell."""
    where = f"position {position} {html.escape(repr(token), quote=False)} ({kind})"
    if layers is None:
        return None, f"{where}<br>not fed back yet: no layer has run on it"
    ran = layer in layers
    z = (1 if kind == "prompt" else (2 if layer < warmup else 3)) if ran else 0
    state = "ran" if ran else "BYPASSED (hidden state passes through unchanged)"
    text = f"{where}<br>layer {layer}: {state}<br>{len(layers)}/{num_layers} layers ran here"
    if ran and kl is not None:
        text += f"<br>lens KL to the full model: {kl:.3f}"
    if ran and reading is not None:
        text += f"<br>lens: next token (position {position + 1}) if the model stopped here:<br>" + "<br>".join(
            f"  {html.escape(repr(t), quote=False)} {p:.0%}" for t, p in zip(reading.tokens, reading.probs))
    return z, text


def _by_column(per_token: Sequence[dict] | None, prompt_columns: int, columns: int) -> list[dict]:
    """Per generated token t a {layer: value} -> per heatmap column. The last prompt column
    produced generated token 0; the column of generated token k produced token k + 1."""
    by_column: list[dict] = [{} for _ in range(columns)]
    if not per_token or prompt_columns == 0:
        return by_column
    for token_index, values in enumerate(per_token):
        x = prompt_columns - 1 + token_index
        if x < columns:
            by_column[x] = values
    return by_column


def _match_strip(judged: Sequence[Judged], first_generated: int, generated: Sequence[str], shapes: list[dict]) -> dict:
    """A strip under layer 0, each square under the generated token it judges: blue where the
    full model, given the same prefix, picks that token too; red where it picks another (named
    in the hover). A red line (added to ``shapes``) marks the first such position."""
    count = min(len(judged), len(generated))
    xs = [first_generated + t for t in range(count)]
    first_red = next((t for t in range(count) if not judged[t].same), None)
    if first_red is not None:
        shapes.append(_vline(first_generated + first_red, dict(color=OTHER, width=1.5)))
    return dict(
        type="scatter", x=xs, y=[STRIP_Y] * count, mode="markers", showlegend=False, hoverinfo="text",
        marker=dict(symbol="square", size=7, color=[SAME if judged[t].same else OTHER for t in range(count)]),
        hovertext=[f"position {xs[t]} {html.escape(repr(generated[t]), quote=False)}: " + (
            "the full model picks it too" if judged[t].same else
            f"the full model would pick {html.escape(repr(judged[t].full_choice), quote=False)} here") for t in range(count)],
    )


def heatmap_legend_html(warmup: int, lens_kl: bool = False, strip: bool = True) -> str:
    """The cell kinds as coloured squares (only those the picture can show: no warmup swatch at
    warmup 0), and the match strip's two colours."""
    kinds = [(kind, colour) for kind, colour in zip(CELL_KINDS, CELL_COLOURS) if kind != "warmup layer" or warmup]
    items = [f'<span class="swatch" style="background:{colour}"></span>{kind}' for kind, colour in kinds]
    if lens_kl:
        items[-1] = "executed layers coloured by the lens's KL (scale on the plot)"
    if strip:
        items += [f'<span class="swatch" style="background:{SAME}"></span>match: the full model picks the same token',
                  f'<span class="swatch" style="background:{OTHER}"></span>it picks another']
    return '<div class="legend">' + "".join(f"<span>{item}</span>" for item in items) + "</div>"


def _short(token: str, width: int = 8) -> str:
    text = token.replace("\n", "↵").replace(" ", "·")  # ↵ as in the panes (DejaVu Sans has it; ⏎ is rarer)
    return text if len(text) <= width else text[: width - 1] + "…"


def schedule_figure(solved: SolvedSchedule, show_steps: int | None = None, current_step: int | None = None) -> go.Figure:
    """n_k against step k: the rounded, monotone budget and the raw decay curve, with bounds.
    ``current_step`` (step mode): a marker on the step that just ran. The bound labels sit in
    the right margin, spread apart, so no label can land on another or on an axis title."""
    config = solved.config
    steps = show_steps or max(len(solved.budgets), config.decay_length + 4)
    ks = list(range(steps))
    budgets = config.budgets(steps)
    raw = [float(decay_value(config.decay, k, config.max_layers, config.min_layers, config.decay_length)) for k in ks]
    figure = go.Figure()
    if config.warmup:
        figure.add_hrect(y0=0, y1=config.warmup, fillcolor=CELL_COLOURS[2], opacity=0.25, line_width=0)
        figure.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"warmup ({config.warmup})",
                                    marker=dict(symbol="square", size=10, color=CELL_COLOURS[2])))
    figure.add_trace(go.Scatter(x=ks, y=raw, name="f(k)", line=dict(dash="dot", color="#888")))
    figure.add_trace(go.Scatter(x=ks, y=budgets, name="n_k (layers run)", line=dict(shape="hv", color=CELL_COLOURS[3], width=3)))
    labels = _bound_labels(config.num_layers, config.max_layers, config.min_layers)
    for (value, text), y in zip(labels, _spread([v for v, _ in labels], gap=0.11 * (config.num_layers + 1))):
        figure.add_hline(y=value, line=dict(dash="dash", color="#bbb", width=1))
        figure.add_annotation(x=1.0, xref="paper", xanchor="left", y=y, text=text, showarrow=False,
                              font=dict(size=11), xshift=4)
    figure.add_vline(x=config.decay_length, line=dict(dash="dot", color="#bbb"))
    figure.add_annotation(x=config.decay_length, y=1.0, yref="paper", yanchor="bottom", text=f"D = {config.decay_length}",
                          showarrow=False, font=dict(size=11))
    if current_step is not None and 0 <= current_step < steps:
        figure.add_vline(x=current_step, line=dict(color="#d64545", width=2))
        figure.add_trace(go.Scatter(x=[current_step], y=[budgets[current_step]], mode="markers", name="this step",
                                    marker=dict(color="#d64545", size=11)))
    figure.update_layout(
        title=dict(text=f"Schedule ({config.decay}): {solved.layer_speedup:.2f}x layers, "
                        f"{solved.cost_speedup:.2f}x cost model", x=0.01, font=dict(size=14)),
        # No x-axis title (the plot's label names the axis): on a phone it sat under the legend.
        xaxis=dict(range=[-0.5, steps - 0.5]), yaxis=dict(title="layers n_k", range=[0, config.num_layers + 1]),
        margin=dict(l=50, r=90, b=60), height=320,
        legend=dict(orientation="h", yanchor="top", y=-0.12, x=0),
    )
    return below_modebar(figure, above_plot_px=16)  # the "D = ..." label over the plot


def below_modebar(figure: go.Figure, above_plot_px: int = 0) -> go.Figure:
    """``figure`` (shown in a gr.Plot, which draws plotly's toolbar over its top MODEBAR_PX) with its
    title under the toolbar and a top margin that holds the toolbar, the title's lines and
    ``above_plot_px`` of labels over the plot (subplot titles, the schedule's D)."""
    title = figure.layout.title.text or ""
    lines = title.count("<br>") + 1 if title else 0
    if title:
        figure.update_layout(title=dict(yref="container", y=1, yanchor="top", pad=dict(t=MODEBAR_PX)))
    figure.update_layout(margin=dict(t=MODEBAR_PX + lines * TITLE_LINE_PX + above_plot_px))
    return figure


def _bound_labels(num_layers: int, max_layers: int, min_layers: int) -> list[tuple[int, str]]:
    """(value, label) for the lines at L, max and min, lowest first; equal values share a label."""
    names: dict[int, list[str]] = {}
    for name, value in (("L", num_layers), ("max", max_layers), ("min", min_layers)):
        names.setdefault(value, []).append(name)
    return sorted((value, " = ".join(found) + f" = {value}") for value, found in names.items())


def _spread(values: Sequence[float], gap: float) -> list[float]:
    """Label heights for ascending ``values``, each at least ``gap`` below the one above, placed
    from the top down (a label pushed above the axis range would not be drawn)."""
    placed: list[float] = []
    for value in reversed(values):
        placed.append(value if not placed else min(value, placed[-1] - gap))
    return placed[::-1]


def waiting_layer_steps(exits_per_token: Sequence[Sequence[int]]) -> int:
    """Layer-steps a batch with per-token exits spends waiting for its deepest row."""
    positions = len(exits_per_token[0]) if exits_per_token else 0
    deepest = [max(row[p] for row in exits_per_token) for p in range(positions)]
    return sum(deepest[p] - row[p] for row in exits_per_token for p in range(positions))


def batch_exit_figure(rows: int, positions: int, num_layers: int, exits_per_token: Sequence[Sequence[int]],
                      skip_exits: Sequence[int]) -> go.Figure:
    """Two panels: per-token early exit (rows differ, the batch waits for the deepest) vs SkipDecode.
    Short panel titles (they sit side by side on a phone); the explanation is the page's text."""
    from plotly.subplots import make_subplots  # noqa: PLC0415

    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                           subplot_titles=("Per-token early exit", "SkipDecode"))
    text_left = [[f"{exits_per_token[r][p]}" for p in range(positions)] for r in range(rows)]
    figure.add_trace(go.Heatmap(z=[list(row) for row in exits_per_token], text=text_left, texttemplate="%{text}",
                                zmin=0, zmax=num_layers, colorscale="Greens", showscale=False,
                                hovertemplate="row %{y}, position %{x}: exits after layer %{z}<extra></extra>"), 1, 1)
    figure.add_trace(go.Heatmap(z=[list(skip_exits) for _ in range(rows)], texttemplate="%{z}", zmin=0, zmax=num_layers,
                                colorscale="Greens", showscale=False,
                                hovertemplate="row %{y}, position %{x}: runs %{z} layers<extra></extra>"), 1, 2)
    figure.update_xaxes(title_text="position")
    figure.update_yaxes(autorange="reversed")
    figure.update_yaxes(title_text="batch row", row=1, col=1)  # one title: a second one sat on the left panel
    figure.update_layout(height=300, margin=dict(l=50, r=10, b=40))
    return below_modebar(figure, above_plot_px=24)  # the panels' titles
