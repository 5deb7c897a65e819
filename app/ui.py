"""The playground UI: layout and event wiring. Handlers are plain functions over app/playground.

Importing this module loads no model: app.py hands build_demo a generator factory.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import gradio as gr

from app import explainer
from app.figures import schedule_figure
from app.live_plot import live_plot, static_paths
from app.playground import (
    EXAMPLE_PROMPTS,
    Limits,
    PlaygroundSettings,
    RaceUpdate,
    TokenTexts,
    heatmap_for,
    parse_settings,
    prompt_token_texts,
    race,
    skip_output_html,
    stats_markdown,
)
from model.generation import TextGenerator
from model.reporting import quality_figure, speed_figure
from model.schedule import DECAY_DESCRIPTIONS, DECAY_FUNCTIONS, DEFAULT_WARMUP, LAYER_ORDER_DESCRIPTIONS, LAYER_ORDERS, max_layer_speedup

ASSETS = Path(__file__).resolve().parents[1] / "assets"
HEATMAP_EVERY_S = 0.25  # heatmap redraws at most 4x a second; text streams every step
CSS = """
.tokens { line-height: 1.9; font-size: 15px; white-space: pre-wrap; min-height: 120px; }
.tok { border-radius: 3px; padding: 1px 0; }
#status { min-height: 1.5em; }
"""

# Playground inputs, in handler order.
SETTING_NAMES = ("prompt", "target_speedup", "decay", "warmup", "decay_length", "min_layers", "max_layers", "order",
                 "batch_size", "max_new_tokens", "temperature", "top_p", "seed", "prompt_at_full_depth")


@dataclass
class RunHandle:
    """One session's running generation; ``cancelled`` makes the decoder stop at its next step."""

    cancelled: bool = False
    reason: str = ""
    started: float = field(default_factory=time.monotonic)

    def cancel(self, reason: str = "stop") -> None:
        self.cancelled, self.reason = True, reason


class SessionRuns:
    """Per-browser-session run handles: a new run, Stop, a settings restart or a closed tab
    cancels that session's previous run, never another session's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RunHandle] = {}
        self.steppers: dict[str, tuple[PlaygroundSettings, Iterator, "RaceView"]] = {}

    def start(self, session: str) -> RunHandle:
        handle = RunHandle()
        with self._lock:
            previous = self._runs.get(session)
            if previous is not None:
                previous.cancel()
            self._runs[session] = handle
        return handle

    def is_running(self, session: str) -> bool:
        with self._lock:
            handle = self._runs.get(session)
            return handle is not None and not handle.cancelled

    def finish(self, session: str, handle: RunHandle) -> None:
        with self._lock:
            if self._runs.get(session) is handle:
                del self._runs[session]

    def cancel(self, session: str, reason: str = "stop") -> None:
        with self._lock:
            handle = self._runs.pop(session, None)
            self.steppers.pop(session, None)
        if handle is not None:
            handle.cancel(reason)

    def sessions(self) -> list[str]:
        with self._lock:
            return list(self._runs)

    def active_count(self) -> int:
        with self._lock:
            return sum(not h.cancelled for h in self._runs.values())


class RaceView:
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


def _setting_values(scope: dict) -> tuple:
    """A handler's settings parameters (named one by one for gradio) in SETTING_NAMES order."""
    return tuple(scope[name] for name in SETTING_NAMES)


def _session(request: gr.Request | None) -> str:
    """The browser/API session's key. Without one, a key of its own: never share a run handle."""
    return getattr(request, "session_hash", None) or f"no-session-{uuid.uuid4().hex}"


def _load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Playground:
    """Handlers bound to one TextGenerator factory (the model is shared; runs are per session)."""

    def __init__(self, get_generator: Callable[[], TextGenerator], limits: Limits) -> None:
        self.get_generator = get_generator
        self.limits = limits
        self.runs = SessionRuns()

    # --- settings ---------------------------------------------------------------------------
    def settings(self, values: tuple) -> PlaygroundSettings:
        return parse_settings(self.limits, **dict(zip(SETTING_NAMES, values)))

    def _validated(self, values: tuple) -> tuple[PlaygroundSettings, TextGenerator]:
        """Settings the solver accepts, or a gr.Error with the reason (before any run starts)."""
        try:
            settings = self.settings(values)
            generator = self.get_generator()
            generator.schedule_for(settings.schedule_request(), settings.max_new_tokens)
        except (ValueError, TypeError) as error:
            raise gr.Error(str(error), print_exception=False) from None
        return settings, generator

    def schedule_preview(self, *values):
        """The schedule plot for the current controls (no model run)."""
        try:
            settings = self.settings(values)
            solved = self.get_generator().schedule_for(settings.schedule_request(), settings.max_new_tokens)
        except ValueError as error:
            return gr.skip(), f"⚠️ {error}"
        return schedule_figure(solved), ""

    # --- streaming generation ---------------------------------------------------------------
    def generate(self, prompt, target_speedup, decay, warmup, decay_length, min_layers, max_layers, order, batch_size,
                 max_new_tokens, temperature, top_p, seed, prompt_at_full_depth,
                 request: gr.Request = None) -> Iterator[tuple]:
        """Stream both outputs side by side: (status, skip html, full text, stats, heatmap json).

        Every setting is a named parameter: gradio injects gr.Request only into a signature
        without *args (with *args every session looked alike and cancelled each other's runs)."""
        values = _setting_values(locals())
        yield from self._generate(values, request)

    def _generate(self, values: tuple, request: gr.Request | None, notice: str = "") -> Iterator[tuple]:
        settings, generator = self._validated(values)
        session = _session(request)
        handle = self.runs.start(session)
        try:
            yield from self._stream(generator, settings, handle, notice)
        finally:
            self.runs.finish(session, handle)

    def request_restart(self, request: gr.Request = None) -> bool:
        """Speedup/decay moved (runs outside the queue, at once): if this session is generating,
        end that run at its next step, which frees the model lane for the restart."""
        session = _session(request)
        if not self.runs.is_running(session):
            return False
        self.runs.cancel(session, reason="restart")
        return True

    def restart_if_running(self, restart, prompt, target_speedup, decay, warmup, decay_length, min_layers, max_layers,
                           order, batch_size, max_new_tokens, temperature, top_p, seed, prompt_at_full_depth,
                           request: gr.Request = None) -> Iterator[tuple]:
        """Second half of a settings change: restart both streams with the new setting."""
        values = _setting_values(locals())
        if not restart:
            yield (gr.skip(),) * 5  # nothing was running: leave the outputs as they are
            return
        settings = dict(zip(SETTING_NAMES, values))
        notice = (f"⟳ Settings changed while generating: restarted both streams at {settings['target_speedup']}x, "
                  f"{settings['decay']} decay.")
        yield from self._generate(values, request, notice)

    def leave(self, request: gr.Request) -> None:
        """A closed tab: cancel that session's run (the decoder stops at its next step)."""
        self.runs.cancel(_session(request))

    def stop(self, request: gr.Request = None) -> str:
        self.runs.cancel(_session(request))
        return "⏹ Stopped."

    def _stream(self, generator: TextGenerator, settings: PlaygroundSettings, handle: RunHandle, notice: str):
        view = RaceView(generator, settings)
        last_plot = 0.0
        status = notice or "Generating… SkipDecode and the full model take turns; each advances by its own measured step time."
        update: RaceUpdate | None = None
        try:
            for update in race(generator, settings, should_cancel=lambda: handle.cancelled):
                now = time.monotonic()
                finished = update.skip.done and update.full.done
                with_plot = finished or now - last_plot >= HEATMAP_EVERY_S
                if with_plot:
                    last_plot = now
                yield view.outputs(status, update, with_plot)
        except ValueError as error:  # e.g. a prompt over the context, found at encoding time
            raise gr.Error(str(error), print_exception=False) from None
        if update is None or handle.reason == "restart":
            return  # a restart's new run writes the status
        final = "⏹ Stopped." if handle.cancelled else (notice + " " if notice else "") + "✅ Done."
        yield (final, gr.skip(), gr.skip(), gr.skip(), gr.skip())

    # --- step mode --------------------------------------------------------------------------
    def step(self, prompt, target_speedup, decay, warmup, decay_length, min_layers, max_layers, order, batch_size,
             max_new_tokens, temperature, top_p, seed, prompt_at_full_depth, request: gr.Request = None) -> tuple:
        """Advance SkipDecode and the full model by one token each; say which layers ran."""
        values = _setting_values(locals())
        session = _session(request)
        try:
            settings = self.settings(values)
            generator = self.get_generator()
            current = self.runs.steppers.get(session)
            if current is None or current[0] != settings:
                current = (settings, self._lockstep(generator, settings), RaceView(generator, settings))
                self.runs.steppers[session] = current
            _, iterator, view = current
            update = next(iterator, None)
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from None
        if update is None:
            self.runs.steppers.pop(session, None)
            return ("✅ Both outputs are complete. Press Step again to start over.",) + (gr.skip(),) * 4
        skip = update.skip
        layers = skip.step_layers[-1] if skip.step_layers else skip.prefill_layers
        which = "prefill (the prompt)" if not skip.step_layers else f"step {len(skip.step_layers) - 1}"
        status = (f"{which}: SkipDecode ran {len(layers)}/{generator.num_layers} layers "
                  f"{_ranges(layers)}; the full model ran all {generator.num_layers}.")
        return view.outputs(status, update, with_plot=True)

    def reset_steps(self, request: gr.Request = None) -> str:
        self.runs.steppers.pop(_session(request), None)
        return "Step mode reset."

    @staticmethod
    def _lockstep(generator: TextGenerator, settings: PlaygroundSettings) -> Iterator[RaceUpdate]:
        """Yield once both streams made one more step (a finished stream just waits)."""
        for update in race(generator, settings, lockstep=True):
            if update.moved == "full" or update.full.done:
                yield update

    # --- batch view -------------------------------------------------------------------------
    def batch_view(self, target_speedup: float, decay: str, request: gr.Request = None):
        try:
            settings = parse_settings(self.limits, EXAMPLE_PROMPTS[0], target_speedup=target_speedup, decay=decay,
                                      batch_size=4, max_new_tokens=20)
            generator = self.get_generator()
            result = generator.generate(settings.request(full=False))
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from None
        depths = [len(result.decode.prefill_layers)] + result.layers_per_step
        rows = [TokenTexts(generator).update(ids) for ids in result.decode.tokens]
        lines = "\n".join(f"{i}. **{p}** → {_one_line(o)}" for i, (p, o) in enumerate(zip(result.prompts, result.outputs), 1))
        return explainer.batch_view_figure(rows, depths, generator.num_layers), lines

    # --- the public API ---------------------------------------------------------------------
    def api_generate(self, prompt: str, target_speedup: float = 2.0, decay: str = "linear", warmup: int = DEFAULT_WARMUP,
                     max_new_tokens: int = 48, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                     batch_size: int = 1, min_layers: int = 0, max_layers: int = 0, decay_length: int = 0,
                     order: str = "warmup_top", prompt_at_full_depth: bool = True,
                     request: gr.Request = None) -> Iterator[dict]:
        """Stream SkipDecode and the full model side by side. Each message: both texts so far,
        the layers each SkipDecode step ran, and the live figures. The last has "done": true."""
        settings, generator = self._validated(_setting_values(locals()))
        session = _session(request)
        handle = self.runs.start(session)
        try:
            for update in race(generator, settings, should_cancel=lambda: handle.cancelled):
                yield _api_message(generator, update, settings)
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from None
        finally:
            self.runs.finish(session, handle)


def _api_message(generator: TextGenerator, update: RaceUpdate, settings: PlaygroundSettings) -> dict:
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
        "planned_layer_speedup": round(solved.layer_speedup, 4),
        "cost_model_speedup": round(solved.cost_speedup, 4),
        "schedule": {"decay": solved.config.decay, "max_layers": solved.config.max_layers,
                     "min_layers": solved.config.min_layers, "warmup": solved.config.warmup,
                     "decay_length": solved.config.decay_length},
        "done": skip.done and full.done,
    }


def _one_line(text: str, width: int = 120) -> str:
    """Model output as one safe markdown line."""
    flat = " ".join(text.split())[:width]
    return "".join("\\" + ch if ch in "\\`*_[]<>#|" else ch for ch in flat)


def _ranges(layers) -> str:
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


def gpu_handler(fn: Callable) -> Callable:
    """spaces.GPU on a ZeroGPU Space (the GPU is attached per call); the function itself elsewhere."""
    if not os.environ.get("SPACES_ZERO_GPU"):
        return fn
    try:
        import spaces  # noqa: PLC0415
    except ImportError:
        return fn
    return spaces.GPU(fn)


def launch_options() -> dict:
    """Keyword arguments for demo.launch() that the UI needs (CSS; plotly.js is served via static paths)."""
    return {"css": CSS}


def build_demo(get_generator: Callable[[], TextGenerator], limits: Limits | None = None,
               concurrency_limit: int = 1) -> gr.Blocks:
    """The whole app. ``get_generator`` is called per request (app.py caches the loaded model)."""
    limits = limits or Limits()
    gr.set_static_paths(static_paths())
    playground = Playground(get_generator, limits)
    generator = get_generator()
    num_layers = generator.num_layers
    top_speedup = round(max_layer_speedup(num_layers, 1), 2)

    with gr.Blocks(title="SkipDecode Playground") as demo:
        gr.Markdown(
            "# ⏭️ SkipDecode Playground\n"
            f"Layer-skipping decoding that keeps batching and the KV cache (arXiv 2307.02628), on "
            f"**{generator.loaded.name}** ({num_layers} layers, {generator.loaded.device}). "
            + ("SkipDecode runs with the skip-policy adapter; the full model is the original. "
               if generator.loaded.adapter_path else "No skip-policy adapter loaded: skipping will hurt quality. ")
        )
        with gr.Tabs():
            with gr.Tab("Playground"):
                with gr.Row():
                    with gr.Column(scale=2, min_width=320):
                        prompt = gr.Textbox(label="Prompt", value=EXAMPLE_PROMPTS[0], lines=3, max_lines=12)
                        gr.Examples([[p] for p in EXAMPLE_PROMPTS], inputs=[prompt], label="Example prompts",
                                    cache_examples=False)
                        speedup = gr.Slider(1.0, top_speedup, value=2.0, step=0.1, label="Target layer speedup",
                                            info="1 = full model; the solver picks max/min layers")
                        decay = gr.Dropdown(list(DECAY_FUNCTIONS), value="linear", label="Decay function",
                                            info="; ".join(f"{k}: {v}" for k, v in list(DECAY_DESCRIPTIONS.items())[:2]))
                        warmup = gr.Slider(0, num_layers - 2, value=min(DEFAULT_WARMUP, num_layers - 2), step=1, label="Warmup layers (always run)")
                        decay_length = gr.Slider(0, limits.max_new_tokens, value=0, step=1,
                                                 label="Decay length D (0 = max new tokens)")
                        with gr.Accordion("Advanced", open=False):
                            min_layers = gr.Slider(0, num_layers, value=0, step=1, label="Min layers (0 = solver)")
                            max_layers = gr.Slider(0, num_layers, value=0, step=1, label="Max layers (0 = solver)")
                            order = gr.Radio(list(LAYER_ORDERS), value="warmup_top", label="Layer order",
                                             info=" · ".join(f"{k}: {v}" for k, v in LAYER_ORDER_DESCRIPTIONS.items()))
                            batch_size = gr.Slider(1, limits.max_batch_size, value=1, step=1,
                                                   label="Batch size (row 0 is your prompt, others are examples)")
                            max_new_tokens = gr.Slider(1, limits.max_new_tokens, value=48, step=1, label="Max new tokens")
                            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                            seed = gr.Number(value=0, precision=0, label="Seed", minimum=0)
                            prompt_full = gr.Checkbox(value=True, label="Prompt at full depth")
                        with gr.Row():
                            run = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                            stop = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                        with gr.Row():
                            step_btn = gr.Button("Step ▶ (one token)", elem_id="step-btn")
                            step_reset = gr.Button("Reset steps")
                        schedule_plot = gr.Plot(label="Schedule: layers per generated step", elem_id="schedule-plot")
                        schedule_note = gr.Markdown()
                    with gr.Column(scale=3):
                        status = gr.Markdown(elem_id="status")
                        with gr.Row(equal_height=True):
                            with gr.Column():
                                gr.Markdown("**SkipDecode** (tokens coloured by the depth that produced them; "
                                            "darker = more layers)")
                                skip_out = gr.HTML(elem_id="skip-output", min_height=140)
                            with gr.Column():
                                gr.Markdown("**Full model** (original, every layer)")
                                full_out = gr.Textbox(show_label=False, lines=7, max_lines=20, elem_id="full-output")
                        stats = gr.Markdown(elem_id="stats")
                        heatmap = live_plot("heatmap", height=380)
            with gr.Tab("How it works"):
                gr.Markdown(explainer.INTRO)
                gr.Plot(explainer.early_exit_vs_skipdecode(), show_label=False)
                gr.Plot(explainer.kv_prefix_figure(), show_label=False)
                gr.Markdown(explainer.BATCH_VIEW)
                batch_btn = gr.Button("Run a batch of 4 prompts")
                batch_plot = gr.Plot(show_label=False)
                batch_text = gr.Markdown()
            with gr.Tab("Results"):
                _results_tab()

        settings_inputs = [prompt, speedup, decay, warmup, decay_length, min_layers, max_layers, order, batch_size,
                           max_new_tokens, temperature, top_p, seed, prompt_full]
        stream_outputs = [status, skip_out, full_out, stats, heatmap]
        model_lane = dict(concurrency_id="model", concurrency_limit=concurrency_limit)

        gen_event = run.click(gpu_handler(playground.generate), settings_inputs, stream_outputs, api_name="ui_generate",
                              api_visibility="private", **model_lane)
        # A settings change while generating: end the running stream at once (outside the queue),
        # then restart in the model lane, which that ending has just freed.
        restart_flag = gr.State(False)
        restart_events = [
            control_event(playground.request_restart, None, [restart_flag], queue=False, api_name=f"ui_request_restart_{i}",
                          api_visibility="private").then(
                gpu_handler(playground.restart_if_running), [restart_flag, *settings_inputs], stream_outputs,
                api_name=f"ui_restart_{i}", api_visibility="private", **model_lane)
            for i, control_event in enumerate((speedup.release, decay.change))
        ]
        stop.click(playground.stop, None, [status], cancels=[gen_event, *restart_events], queue=False,
                   api_name="ui_stop", api_visibility="private")
        step_btn.click(gpu_handler(playground.step), settings_inputs, stream_outputs, api_name="ui_step", api_visibility="private",
                       **model_lane)
        step_reset.click(playground.reset_steps, None, [status], queue=False, api_name="ui_reset_steps",
                         api_visibility="private")
        preview_triggers = [speedup.change, decay.change, warmup.change, decay_length.change, min_layers.change,
                            max_layers.change, order.change, max_new_tokens.change, demo.load]
        gr.on(preview_triggers, playground.schedule_preview, settings_inputs, [schedule_plot, schedule_note],
              queue=False, api_name="ui_schedule", api_visibility="private", trigger_mode="always_last")
        batch_btn.click(gpu_handler(playground.batch_view), [speedup, decay], [batch_plot, batch_text], api_name="ui_batch_view",
                        api_visibility="private", **model_lane)
        demo.unload(playground.leave)
        gr.api(gpu_handler(playground.api_generate), api_name="generate", **model_lane)
    demo.playground = playground  # tests and the load script inspect active runs
    return demo


def _results_tab() -> None:
    _results_section("Quality under skipping (held-out prompts)", "eval", "eval", quality_figure)
    _results_section("Measured speed", "bench", "bench", speed_figure)


def _results_section(title: str, folder: str, command: str, figure: Callable[[dict], object]) -> None:
    """One results block from assets/<folder>/<folder>.json and .md, written by `python -m model <command>`."""
    data = _load_json(ASSETS / folder / f"{folder}.json")
    gr.Markdown(f"### {title} (`python -m model {command}`)")
    if not data:
        gr.Markdown(f"_No results under assets/{folder} yet: run `python -m model {command} --output assets/{folder}`._")
        return
    gr.Plot(figure(data), show_label=False)
    table = ASSETS / folder / f"{folder}.md"
    gr.Markdown(table.read_text() if table.is_file() else "")
