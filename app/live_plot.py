"""A Plotly figure that updates in place while streaming.

gr.Plot remounts its figure on every payload change (gradio PR #13678 keeps that by design),
which flickers and resets zoom 10+ times a second during generation. This component keeps ONE
div for its whole life and hands each new figure to Plotly.react, which diffs it in place.
plotly.js is served from the installed plotly package (offline; no CDN).
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import plotly

PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"

_JS_ON_LOAD = """
const draw = () => {
  const target = element.querySelector('.plotly-live');
  if (!target || !props.value) return;
  if (typeof Plotly === 'undefined') { setTimeout(draw, 100); return; }
  const figure = JSON.parse(props.value);
  Plotly.react(target, figure.data, figure.layout, {displayModeBar: false, responsive: true});
  target.dataset.updates = String(Number(target.dataset.updates || 0) + 1);
};
draw();
watch('value', draw);
"""


def static_paths() -> list[Path]:
    """Folders the server must expose for this component (passed to gr.set_static_paths)."""
    return [PLOTLY_JS.parent]


def live_plot(elem_id: str, height: int = 380) -> gr.HTML:
    """An output component: give it ``figure.to_json()`` strings."""
    return gr.HTML(
        value="",
        html_template=f'<div class="plotly-live" style="width:100%;height:{height}px"></div>',
        js_on_load=_JS_ON_LOAD,
        head=f'<script src="/gradio_api/file={PLOTLY_JS}"></script>',
        elem_id=elem_id,
        min_height=height,
    )
