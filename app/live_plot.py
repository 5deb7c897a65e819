"""A Plotly figure that updates in place while streaming.

gr.Plot remounts its figure on every payload change (gradio PR #13678 keeps that by design),
which flickers and resets zoom 10+ times a second during generation. This component keeps ONE
div for its whole life and hands each new figure to Plotly.react, which diffs it in place.
plotly.js comes from the installed plotly package (offline; no CDN), copied once next to the app
so the server exposes that ONE file, under a path that names no virtualenv.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gradio as gr
import plotly

PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
SERVED_JS = Path(__file__).resolve().parents[1] / ".cache" / "static" / "plotly.min.js"

_JS_ON_LOAD = """
const draw = () => {
  const target = element.querySelector('.plotly-live');
  if (!target) return;
  if (!props.value) {  // an empty value clears the plot (Reset)
    if (typeof Plotly !== 'undefined') Plotly.purge(target);
    return;
  }
  if (typeof Plotly === 'undefined') { setTimeout(draw, 100); return; }
  const figure = JSON.parse(props.value);
  if (target.clientWidth < 520) {  // a phone: a colour scale under the plot, fewer ticks, smaller title
    let scale = false;
    for (const trace of figure.data) {
      if (trace.type === 'heatmap' && trace.showscale !== false) {
        trace.colorbar = Object.assign(trace.colorbar || {}, {orientation: 'h', x: 0.5, xanchor: 'center', y: -0.55,
                                                               thickness: 10, len: 1});
        scale = true;
      }
    }
    figure.layout.xaxis = Object.assign({}, figure.layout.xaxis, {tickmode: 'auto', nticks: 6, tickangle: 0,
                                                                  title: {text: 'position'}});  // the long title was cut
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
    """An output component: give it ``figure.to_json()`` strings."""
    return gr.HTML(
        value="",
        html_template=f'<div class="plotly-live" style="width:100%;height:{height}px"></div>',
        js_on_load=_JS_ON_LOAD,
        head=f'<script src="{_script_url()}"></script>',
        elem_id=elem_id,
        min_height=height,
    )
