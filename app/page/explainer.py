"""The "How it works" view: text and teaching figures (no model needed)."""

from __future__ import annotations

import random

import plotly.graph_objects as go

from app.page.figures import (
    CELL_COLOURS,
    batch_exit_figure,
    below_modebar,
    heatmap_legend_html,
    layer_heatmap,
    waiting_layer_steps,
)
from model.skipdecode.schedule import ScheduleConfig

INTRO = """
### Why per-token early exit breaks batching and the KV cache

Early-exit methods let every token leave the network at its own layer once the model is
"confident". In a **batch**, rows exit at different layers for the same position, but the GPU
runs one layer for all rows at a time, so the batch **waits for the deepest row**: the early
exits save nothing (left picture, every number is the layer a row exits after).

Worse, a token that exited at layer 5 never computed the **keys and values** of layers 6 and up.
A later token that does go deeper attends to those layers for every earlier position, and finds
holes: they must be recomputed or copied from below, which costs time and changes the output.

### How SkipDecode fixes both

SkipDecode (Del Corro et al., 2023) gives each **position** one exit for the whole batch, and lets
that exit only **fall** as generation goes on (right picture): n₀ ≥ n₁ ≥ n₂ ≥ … Every row does the
same work, so batching works as usual.

### Why the KV cache stays valid: depths only fall

Each step runs the first *warmup* layers and then the **top** n_k − warmup layers, bypassing the
middle (or, with a ranked order, the layers a measurement found least important). What keeps the
cache valid is not WHICH layers are bypassed but that **n_k never grows** and the layer sets are
**nested**: the layers a step runs are a subset of what every earlier step ran. So whenever a
layer runs, every earlier position already has its keys and values in that layer: each layer's KV
cache is a prefix of the sequence and **nothing is ever recomputed**. The heatmap below shows it:
read any layer row left to right, it runs on a prefix of positions and then stops for good.

Why bypass low/middle layers rather than stop early? Stopping early drops the TOP layers, which
turn the hidden state into the prediction; keeping them (and the first few, which SmolLM2 needs
most, see the Results tab's layer importance) loses the least.

### The schedule and the target speedup

With decay length D, step k runs n_k = round(f(k)) layers, f falling from max to min over D steps
(linear: f(k) = max − (max − min) · k / D; then min). The *target layer speedup* S asks for
L / mean(n_k) = S over the generated steps; the solver picks max and min (the deepest start that
reaches S), and you can override both under Advanced.

### Why the measured speedup is lower than the layer speedup

Every step also runs the embedding, the final norm and the **LM head**, which never skip. In
SmolLM2-135M the head is 28M of 135M parameters, so 2x fewer layers is at most ~1.66x less work
per step (the *cost-model* speedup); the measured wall-clock speedup tracks that, not the layer
count. On the CPU's 4-bit engine (the default there) the skip policy's small extra matrices (a
LoRA kept beside the model's own 4-bit weights) also run in every layer of a skipping step, which
the full model never pays for.

### The paper's setting and this demo

The paper fine-tunes OPT models (1.3B and 2.7B) per task and reports 2-5x speedups with
negligible loss on those tasks. This demo runs a 135M chat model on a CPU with one general skip
policy, distilled from the full model on ~48,000 of its own and SkipDecode's continuations (about
20 GPU minutes and 1.5 CPU hours): the same mechanism, a much harder setting. An untouched model does not expect its middle layers to vanish; toggle "Skip-policy
adapter" to see what the fine-tuning buys.
"""

BATCH_VIEW = """
### Batch view
Run a small batch below at the speedup and decay set here: four different prompts, one shared
exit per step. Each cell shows the token a row produced; its colour is the number of layers that
produced it, and every column has one colour, whatever the row.
"""


def _toy_exits(rows: int = 4, positions: int = 12, num_layers: int = 12, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)  # deterministic: the page always shows the same picture
    return [[rng.randint(3, num_layers) for _ in range(positions)] for _ in range(rows)]


def early_exit_vs_skipdecode(rows: int = 4, positions: int = 12, num_layers: int = 12) -> go.Figure:
    """The two-panel teaching picture."""
    schedule = ScheduleConfig(num_layers, num_layers, 4, decay="linear", warmup=1, decay_length=positions)
    return batch_exit_figure(rows, positions, num_layers, _toy_exits(rows, positions, num_layers),
                             schedule.budgets(positions))


EARLY_EXIT_CAPTION = (
    f"Left: every number is the layer a row exits after; the batch still runs the deepest row at every position "
    f"({waiting_layer_steps(_toy_exits())} layer-steps of waiting in this picture), and rows that exited early have "
    "no keys/values in the layers above their exit. Right: SkipDecode, one exit per position for the whole batch, "
    "falling as generation goes on."
)
KV_PREFIX_LEGEND = heatmap_legend_html(warmup=1, strip=False)


def kv_prefix_figure(num_layers: int = 12, prompt: int = 5, steps: int = 14) -> go.Figure:
    """Layers x positions for a toy schedule: each layer's executed positions form a prefix."""
    schedule = ScheduleConfig(num_layers, 11, 4, decay="linear", warmup=1, decay_length=steps)
    figure = layer_heatmap(num_layers, 1, [f"p{i}" for i in range(prompt)], tuple(range(num_layers)),
                           [f"g{k}" for k in range(steps + 1)], [schedule.step_layers(k) for k in range(steps)],
                           title="Each layer's KV cache is a prefix")
    figure.update_layout(height=320)
    return below_modebar(figure)


def batch_view_figure(row_tokens: list[list[str]], depths: list[int], num_layers: int) -> go.Figure:
    """Rows x generated tokens; colour = layers run (the same down every column). The colour scale
    lies under the plot, so the tokens get the whole width (beside them it took a fifth of a phone's)."""
    width = max((len(r) for r in row_tokens), default=0)
    z = [[depths[k] if k < len(row) else None for k in range(width)] for row in row_tokens]
    text = [[row[k] if k < len(row) else "" for k in range(width)] for row in row_tokens]
    scale = dict(title=dict(text="layers run", side="right"), orientation="h", x=1, xanchor="right", y=-0.22,
                 yanchor="top", len=0.5, thickness=10)
    figure = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", textfont=dict(size=15), zmin=0,
                                  zmax=num_layers, colorscale=[[0, "#eceff4"], [1, CELL_COLOURS[3]]],
                                  colorbar=scale, xgap=2, ygap=2,
                                  hovertemplate="row %{y}, token %{x}: %{z} layers<extra></extra>"))
    figure.update_layout(title=dict(text="One exit per position for the whole batch", x=0.01), height=380,
                         xaxis_title="generated token", yaxis=dict(title="batch row", autorange="reversed"),
                         margin=dict(l=50, r=10, b=95))
    return below_modebar(figure)
