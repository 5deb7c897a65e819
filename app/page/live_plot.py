"""A Plotly figure that updates in place while streaming, sent once and then as changes.

gr.Plot remounts its figure on every payload change (gradio PR #13678 keeps that by design),
which flickers and resets zoom 10+ times a second during generation. This component keeps ONE
div for its whole life and hands each new figure to Plotly.react, which diffs it in place.
plotly.js comes from the installed plotly package (offline; no CDN), copied once next to the app
so the server exposes that ONE file, under a path that names no virtualenv.

**Its value is a growing string** (issue #37): the first line is the run's first figure as JSON,
each later line the patch from the figure before to the next (``figure_patch``: a JSON list of
``["set", path, value]``, ``["extend", path, items]`` and ``["delete", path]``). gradio's generator
streaming sends a string that starts with the previous one as an "append" of its new tail
(gradio/utils.py ``diff``), so a long prompt's figure (megabytes of hover text) crosses the wire
once per run, not at every redraw. The page's script keeps the figure, applies only the lines it
has not applied yet and redraws; a value that does not continue the one it drew (a new run, a
Step, Reset's empty value) starts afresh. One streamed run is one ``LiveFigure``.
"""

from __future__ import annotations

import json
import os
import shutil
from functools import lru_cache
from pathlib import Path

import gradio as gr
import plotly
import plotly.io as pio

PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
SERVED_JS = Path(__file__).resolve().parents[2] / ".cache" / "static" / "plotly.min.js"

_JS_ON_LOAD = """
let applied = '', kept = null;  // the value drawn so far and the figure it describes (first line + patches)
const patched = (figure, patch) => {
  for (const [op, path, value] of patch) {
    if (!path.length) { figure = value; continue; }  // the whole figure set
    let node = figure;
    for (const key of path.slice(0, -1)) node = node[key];
    const last = path[path.length - 1];
    if (op === 'set') node[last] = value;
    else if (op === 'extend') { for (const item of value) node[last].push(item); }
    else if (op === 'delete') delete node[last];
  }
  return figure;
};
const update = (value) => {  // the lines not applied yet; a value that does not continue ours starts afresh
  const fresh = !kept || !value.startsWith(applied);
  const lines = (fresh ? value : value.slice(applied.length)).split('\\n').filter((line) => line);
  if (fresh) kept = JSON.parse(lines.shift());
  for (const line of lines) kept = patched(kept, JSON.parse(line));
  applied = value;
};
const draw = () => {
  const target = element.querySelector('.plotly-live');
  if (!target) return;
  if (!props.value) {  // an empty value clears the plot (Reset)
    applied = ''; kept = null;
    if (typeof Plotly !== 'undefined') Plotly.purge(target);
    return;
  }
  if (typeof Plotly === 'undefined') { setTimeout(draw, 100); return; }
  if (props.value === applied && target.data) return;  // nothing new (an unchanged value)
  update(props.value);
  const figure = typeof structuredClone === 'function' ? structuredClone(kept) : JSON.parse(JSON.stringify(kept));
  if (target.clientWidth < 520) {  // a phone: a colour scale under the plot, fewer ticks, smaller title
    let scale = false;
    for (const trace of figure.data) {
      if (trace.type === 'heatmap' && trace.showscale !== false) {
        trace.colorbar = Object.assign(trace.colorbar || {}, {orientation: 'h', x: 0.5, xanchor: 'center', y: -0.55,
                                                               thickness: 10, len: 1});
        scale = true;
      }
    }
    // Fewer ticks, flat, a short title (the long one was cut); a folded prompt's figure names its own
    // (auto numbers would run through the prompt's band: app/page/figures.py HeatmapAxes).
    const phone = (figure.layout.meta && figure.layout.meta.phone_xaxis) || {tickmode: 'auto', nticks: 6,
                                                                             title: {text: 'position'}};
    figure.layout.xaxis = Object.assign({}, figure.layout.xaxis, phone, {tickangle: 0});
    figure.layout.margin = Object.assign({}, figure.layout.margin, {l: 48, r: 5, b: scale ? 130 : 50});
    if (figure.layout.title) figure.layout.title.font = {size: 12};
  }
  Plotly.react(target, figure.data, figure.layout, {displayModeBar: false, responsive: true});
  target.dataset.updates = String(Number(target.dataset.updates || 0) + 1);
};
draw();
watch('value', draw);
"""


def served_plotly() -> Path:
    """plotly.min.js at SERVED_JS (copied from the package when missing or outdated)."""
    if not SERVED_JS.is_file() or SERVED_JS.stat().st_size != PLOTLY_JS.stat().st_size:
        SERVED_JS.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PLOTLY_JS, SERVED_JS)
    return SERVED_JS


def static_paths() -> list[Path]:
    """The one file the server must expose for this component (passed to gr.set_static_paths)."""
    return [served_plotly()]


def _script_url() -> str:
    """The file route with a path relative to the working directory (no absolute machine paths)."""
    return "/gradio_api/file=" + Path(os.path.relpath(served_plotly())).as_posix()


def live_plot(elem_id: str, height: int = 380) -> gr.HTML:
    """An output component: give it a ``LiveFigure``'s values (or one figure's JSON, a value of its own)."""
    return gr.HTML(
        value="",
        html_template=f'<div class="plotly-live" style="width:100%;height:{height}px"></div>',
        js_on_load=_JS_ON_LOAD,
        head=f'<script src="{_script_url()}"></script>',
        elem_id=elem_id,
        min_height=height,
    )


@lru_cache(maxsize=1)
def _template_json() -> str:
    return json.dumps(pio.templates[pio.templates.default].to_plotly_json(), separators=(",", ":"))


def figure_json(figure: dict) -> str:
    """One figure (``{"data", "layout"}``, plain JSON) as the component draws it, on one line:
    with plotly's default template, which a go.Figure carries (plotly.js alone would draw it plain)."""
    layout = {**figure.get("layout", {}), "template": json.loads(_template_json())}
    return json.dumps({**figure, "layout": layout}, separators=(",", ":"))


class LiveFigure:
    """The live plot's value over one streamed run: the first figure, then one patch a figure.
    Each ``update`` returns the whole value so far, which starts with the value before it."""

    def __init__(self) -> None:
        self.figure: dict | None = None
        self.value = ""

    def update(self, figure: dict) -> str:
        if self.figure is None:
            self.value = figure_json(figure)
        else:
            patch = figure_patch(self.figure, figure)
            if patch:
                self.value += "\n" + json.dumps(patch, separators=(",", ":"))
        self.figure = figure
        return self.value


def figure_patch(old, new, path: tuple = ()) -> list:
    """The edits that turn JSON value ``old`` into ``new``: lists that grew are extended by their
    new tail, changed leaves and keys set, removed keys deleted (a list that shrank, or a list of
    leaves with most of them changed, is set whole). ``apply_patch`` (and the page's script) apply them."""
    if type(old) is not type(new):
        return [["set", list(path), new]]
    if isinstance(new, dict):
        edits = [edit for key, value in new.items()
                 for edit in (figure_patch(old[key], value, (*path, key)) if key in old else [["set", [*path, key], value]])]
        return edits + [["delete", [*path, key]] for key in old if key not in new]
    if isinstance(new, list):
        if len(new) < len(old):
            return [["set", list(path), new]]
        changed = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
        if len(changed) > max(8, len(old) // 2) and not any(isinstance(new[i], (dict, list)) for i in changed):
            return [["set", list(path), new]]  # most leaves changed: the list is shorter than its edits
        edits = [edit for i in changed for edit in figure_patch(old[i], new[i], (*path, i))]
        return edits + ([["extend", list(path), new[len(old):]]] if len(new) > len(old) else [])
    return [] if old == new else [["set", list(path), new]]


def apply_patch(figure, patch: list):
    """``figure`` with ``patch`` applied (in place where it can be), as the page's script does."""
    for op, path, *value in patch:
        if not path:
            figure = value[0]
            continue
        node = figure
        for key in path[:-1]:
            node = node[key]
        if op == "set":
            node[path[-1]] = value[0]
        elif op == "extend":
            node[path[-1]].extend(value[0])
        elif op == "delete":
            del node[path[-1]]
    return figure


def figure_from_value(value: str) -> dict | None:
    """The figure a live plot's value describes (what the page draws), None for an empty value."""
    lines = [line for line in value.split("\n") if line]
    if not lines:
        return None
    figure = json.loads(lines[0])
    for line in lines[1:]:
        figure = apply_patch(figure, json.loads(line))
    return figure
