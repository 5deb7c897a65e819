"""Plotly figures of the playground. Pure functions of plain data (no model, no gradio)."""

from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go

from model.schedule import SolvedSchedule, decay_value

# One colour per cell kind of the layer heatmap (z value = index).
CELL_KINDS = ("bypassed", "prompt", "warmup layer", "upper layer")
CELL_COLOURS = ("#eceff4", "#7aa6d8", "#f0a35e", "#3f9c6d")
MAX_AXIS_LABELS = 48  # token text on the x axis only when it stays readable


def _discrete_colorscale(colours: Sequence[str]) -> list[list]:
    """Plotly colourscale with flat bands for integer z values 0 .. len-1."""
    scale, count = [], len(colours)
    for index, colour in enumerate(colours):
        scale.append([index / count, colour])
        scale.append([(index + 1) / count, colour])
    return scale


def layer_heatmap(
    num_layers: int,
    warmup: int,
    prompt_tokens: Sequence[str],
    prefill_layers: Sequence[int],
    generated_tokens: Sequence[str],
    step_layers: Sequence[Sequence[int]],
    title: str = "Layers executed per position",
    *,
    hidden_prompt: int = 0,
    lens: Sequence[Sequence] | None = None,
    matches: Sequence[bool] | None = None,
    highlight_last: bool = False,
    lens_kl: Sequence[dict] | None = None,
) -> go.Figure:
    """x = position (prompt, then generated tokens fed back), y = layer (0 at the bottom).

    Column of generated token k shows the layers decode step k ran for it; the newest token
    has not been fed yet, so it has no column until the next step. ``prompt_tokens`` are the
    prompt's LAST tokens shown (``hidden_prompt`` earlier ones, the chat template, are left out).
    ``lens``: per generated token t, the logit-lens readings (layer, top-k) of the position that
    produced t; hovering an executed cell shows them. ``matches``: per generated token, whether
    it equals the full model's, drawn as a strip under layer 0 with the first difference marked.
    On a narrow screen the page's script moves the legend under the plot (app/live_plot.py).
    """
    columns = [("prompt", token, list(prefill_layers)) for token in prompt_tokens]
    columns += [("generated", generated_tokens[k], list(layers)) for k, layers in enumerate(step_layers)
                if k < len(generated_tokens)]
    readings = _by_column([{r.layer: r for r in entry} for entry in lens] if lens else None,
                          len(prompt_tokens), len(columns))
    kl_by_column = _by_column(lens_kl, len(prompt_tokens), len(columns))
    z = [[0] * len(columns) for _ in range(num_layers)]
    hover = [[""] * len(columns) for _ in range(num_layers)]
    for x, (kind, token, layers) in enumerate(columns):
        ran = set(layers)
        position = x + hidden_prompt
        for layer in range(num_layers):
            if layer in ran:
                z[layer][x] = 1 if kind == "prompt" else (2 if layer < warmup else 3)
            state = "ran" if layer in ran else "BYPASSED (hidden state passes through unchanged)"
            text = f"pos {position} {html.escape(repr(token))} ({kind})<br>layer {layer}: {state}<br>{len(ran)}/{num_layers} layers"
            kl = kl_by_column[x].get(layer) if layer in ran else None
            if kl is not None:
                text += f"<br>lens KL to the full model: {kl:.3f}"
            reading = readings[x].get(layer) if layer in ran else None
            if reading is not None:
                text += "<br>lens (next token if the model stopped here):<br>" + "<br>".join(
                    f"  {html.escape(repr(t))} {p:.0%}" for t, p in zip(reading.tokens, reading.probs))
            hover[layer][x] = text
    colourbar = dict(tickvals=list(range(len(CELL_KINDS))), ticktext=list(CELL_KINDS), title="")
    figure = go.Figure(go.Heatmap(
        z=z, text=hover, hoverinfo="text", zmin=-0.5, zmax=len(CELL_KINDS) - 0.5,
        colorscale=_discrete_colorscale(CELL_COLOURS), xgap=1, ygap=1, colorbar=colourbar,
    ))
    if lens_kl:  # executed cells of the positions that produced tokens, coloured by KL; hover stays below
        kl_z = [[kl_by_column[x].get(layer) for x in range(len(columns))] for layer in range(num_layers)]
        figure.update_traces(showscale=False, selector=dict(type="heatmap"))  # one legend: the KL's
        figure.add_trace(go.Heatmap(z=kl_z, colorscale="Magma", reversescale=True, zmin=0, hoverinfo="skip",
                                    xgap=1, ygap=1, colorbar=dict(title="lens KL")))
    if matches:
        _add_match_strip(figure, matches, len(prompt_tokens), len(columns))
    labels = [token for _, token, _ in columns]
    xaxis = dict(title="position (prompt | generated)")
    if hidden_prompt:
        xaxis["title"] = f"position (last {len(prompt_tokens)} prompt tokens; {hidden_prompt} template tokens hidden | generated)"
    if 0 < len(labels) <= MAX_AXIS_LABELS:
        xaxis.update(tickmode="array", tickvals=list(range(len(labels))), ticktext=[_short(t) for t in labels], tickangle=-60)
    if prompt_tokens and step_layers:
        figure.add_vline(x=len(prompt_tokens) - 0.5, line=dict(color="#333", width=2, dash="dot"))
    if highlight_last and columns:  # step mode: the column the last step ran
        last = len(columns) - 1
        figure.add_shape(type="rect", x0=last - 0.5, x1=last + 0.5, y0=-0.5, y1=num_layers - 0.5,
                         line=dict(color="#d64545", width=2))
    figure.update_layout(
        title=dict(text=title, x=0.01), xaxis=xaxis,
        yaxis=dict(title="layer", dtick=max(1, num_layers // 10), range=[-2.5 if matches else -0.5, num_layers - 0.5]),
        margin=dict(l=50, r=10, t=40, b=70), height=380, uirevision="heatmap",
    )
    return figure


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


def _add_match_strip(figure: go.Figure, matches: Sequence[bool], prompt_columns: int, columns: int) -> None:
    """A strip under layer 0: green where SkipDecode's token equals the full model's, red where
    not, at the column that produced the token; a line at the first difference."""
    xs = [prompt_columns - 1 + t for t in range(len(matches)) if prompt_columns - 1 + t < columns]
    colours = ["#2e9e5b" if matches[t] else "#d64545" for t in range(len(xs))]
    figure.add_trace(go.Scatter(
        x=xs, y=[-1.7] * len(xs), mode="markers", marker=dict(symbol="square", size=7, color=colours),
        hovertext=[f"token {t}: {'same as' if matches[t] else 'differs from'} the full model" for t in range(len(xs))],
        hoverinfo="text", showlegend=False,
    ))
    first = next((t for t, same in enumerate(matches) if not same), None)
    if first is not None and prompt_columns - 1 + first < columns:
        figure.add_vline(x=prompt_columns - 1 + first, line=dict(color="#d64545", width=1.5),
                         annotation_text=f"first difference (token {first})", annotation_position="top left",
                         annotation_font=dict(color="#d64545", size=11))
    figure.add_annotation(x=-0.5, y=-1.7, text="= full?", showarrow=False, xanchor="right", font=dict(size=10))


def _short(token: str, width: int = 8) -> str:
    text = token.replace("\n", "⏎").replace(" ", "·")
    return text if len(text) <= width else text[: width - 1] + "…"


def schedule_figure(solved: SolvedSchedule, show_steps: int | None = None, current_step: int | None = None) -> go.Figure:
    """n_k against step k: the rounded, monotone budget and the raw decay curve, with bounds.
    ``current_step`` (step mode): a marker on the step that just ran."""
    config = solved.config
    steps = show_steps or max(len(solved.budgets), config.decay_length + 4)
    ks = list(range(steps))
    budgets = config.budgets(steps)
    raw = [float(decay_value(config.decay, k, config.max_layers, config.min_layers, config.decay_length)) for k in ks]
    figure = go.Figure()
    figure.add_hrect(y0=0, y1=config.warmup, fillcolor=CELL_COLOURS[2], opacity=0.25, line_width=0,
                     annotation_text=f"warmup ({config.warmup})", annotation_position="bottom left")
    figure.add_trace(go.Scatter(x=ks, y=raw, name="f(k)", line=dict(dash="dot", color="#888")))
    figure.add_trace(go.Scatter(x=ks, y=budgets, name="n_k (layers run)", line=dict(shape="hv", color=CELL_COLOURS[3], width=3)))
    for value, text, position in _bound_labels(config.num_layers, config.max_layers, config.min_layers):
        figure.add_hline(y=value, line=dict(dash="dash", color="#bbb", width=1), annotation_text=text,
                         annotation_position=position, annotation_font=dict(size=11))
    figure.add_vline(x=config.decay_length, line=dict(dash="dot", color="#bbb"), annotation_text=f"D = {config.decay_length}",
                     annotation_position="top left", annotation_font=dict(size=11))
    if current_step is not None and 0 <= current_step < steps:
        figure.add_vline(x=current_step, line=dict(color="#d64545", width=2))
        figure.add_trace(go.Scatter(x=[current_step], y=[budgets[current_step]], mode="markers", name="this step",
                                    marker=dict(color="#d64545", size=11)))
    figure.update_layout(
        title=dict(text=f"{config.decay} decay: layer speedup {solved.layer_speedup:.2f}x, "
                        f"cost-model {solved.cost_speedup:.2f}x", x=0.01),
        xaxis_title="generated step k", yaxis=dict(title="layers", range=[0, config.num_layers + 1]),
        margin=dict(l=50, r=10, t=40, b=40), height=300, legend=dict(orientation="h", y=-0.25),
    )
    return figure


def _bound_labels(num_layers: int, max_layers: int, min_layers: int) -> list[tuple[int, str, str]]:
    """Lines for L, max and min with labels that never sit on top of each other: equal values
    share one label; max and L are labelled on opposite sides, min below its line."""
    if max_layers == min_layers:
        bounds = [(max_layers, f"max = min = {max_layers}", "bottom right")]
    else:
        bounds = [(max_layers, f"max = {max_layers}", "top right"), (min_layers, f"min = {min_layers}", "bottom right")]
    if num_layers == max_layers:
        bounds[0] = (num_layers, "L = " + bounds[0][1], bounds[0][2])
    else:
        bounds.append((num_layers, f"L = {num_layers}", "top left"))
    return bounds


def depth_colour(layers: int, num_layers: int) -> str:
    """Background for a token produced with ``layers`` of ``num_layers``: deeper = greener."""
    share = max(0.0, min(1.0, layers / max(1, num_layers)))
    light = int(235 - 120 * share)
    return f"rgb({light - 40},{min(255, light + 10)},{light - 20})"


NEWLINE_MARK = "↵"


def _newline_mark(count: int) -> str:
    """A visible mark for a run of newlines, then ONE line break (a run of 30 newlines must not
    push the pane down by 30 lines)."""
    label = NEWLINE_MARK if count == 1 else f"{NEWLINE_MARK}×{count}"
    return f'<span class="nl" title="{count} newline(s)">{label}</span><br>'


def _text_html(text: str) -> str:
    """Escaped text with each run of newlines drawn as one mark + one break."""
    parts, index = [], 0
    while index < len(text):
        if text[index] == "\n":
            end = index
            while end < len(text) and text[end] == "\n":
                end += 1
            parts.append(_newline_mark(end - index))
            index = end
            continue
        end = text.find("\n", index)
        end = len(text) if end < 0 else end
        parts.append(html.escape(text[index:end]))
        index = end
    return "".join(parts)


def _merge_newline_runs(tokens: Sequence[str], depths: Sequence[int]) -> list[tuple[str, int, int]]:
    """(text, depth, token count): consecutive newline-only tokens become one entry."""
    merged: list[tuple[str, int, int]] = []
    for token, depth in zip(tokens, depths):
        newline_only = token != "" and set(token) == {"\n"}
        if newline_only and merged and merged[-1][0] and set(merged[-1][0]) == {"\n"}:
            text, first_depth, count = merged[-1]
            merged[-1] = (text + token, first_depth, count + 1)
        else:
            merged.append((token, depth, 1))
    return merged


def tokens_by_depth_html(tokens: Sequence[str], depths: Sequence[int], num_layers: int) -> str:
    """Generated tokens as spans coloured by the depth that produced them (hover: the count).
    Newlines are drawn as marks; runs of them collapse into one mark."""
    spans = []
    for token, depth, count in _merge_newline_runs(tokens, depths):
        title = f"{depth}/{num_layers} layers" + (f" (first of {count} tokens)" if count > 1 else "")
        spans.append(f'<span class="tok" title="{title}" '
                     f'style="background:{depth_colour(depth, num_layers)}">{_text_html(token)}</span>')
    return '<div class="tokens">' + "".join(spans) + "</div>"


def plain_text_html(text: str) -> str:
    """The full model's output in the same box style, newlines drawn like SkipDecode's."""
    return '<div class="tokens">' + _text_html(text) + "</div>"


def batch_exit_figure(rows: int, positions: int, num_layers: int, exits_per_token: Sequence[Sequence[int]],
                      skip_exits: Sequence[int]) -> go.Figure:
    """Two panels: per-token early exit (rows differ, the batch waits for the deepest) vs SkipDecode."""
    from plotly.subplots import make_subplots  # noqa: PLC0415

    figure = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, subplot_titles=(
        "Per-token early exit: each row exits at its own layer", "SkipDecode: one exit per position, falling"))
    deepest = [max(exits_per_token[r][p] for r in range(rows)) for p in range(positions)]
    wasted = sum(deepest[p] - exits_per_token[r][p] for r in range(rows) for p in range(positions))
    text_left = [[f"{exits_per_token[r][p]}" for p in range(positions)] for r in range(rows)]
    figure.add_trace(go.Heatmap(z=[list(row) for row in exits_per_token], text=text_left, texttemplate="%{text}",
                                zmin=0, zmax=num_layers, colorscale="Greens", showscale=False,
                                hovertemplate="row %{y}, position %{x}: exits after layer %{z}<extra></extra>"), 1, 1)
    figure.add_trace(go.Heatmap(z=[list(skip_exits) for _ in range(rows)], texttemplate="%{z}", zmin=0, zmax=num_layers,
                                colorscale="Greens", showscale=False,
                                hovertemplate="row %{y}, position %{x}: runs %{z} layers<extra></extra>"), 1, 2)
    figure.update_xaxes(title_text="position")
    figure.update_yaxes(title_text="batch row", autorange="reversed")
    figure.update_layout(
        height=300, margin=dict(l=50, r=10, t=60, b=40),
        annotations=list(figure.layout.annotations) + [dict(
            text=f"the batch runs the deepest row at every position: {wasted} layer-steps of waiting; "
                 "rows that exited early have no keys/values in the layers above their exit",
            x=0.0, y=-0.28, xref="paper", yref="paper", showarrow=False, font=dict(size=11))],
    )
    return figure
