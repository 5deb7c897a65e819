"""The playground UI: layout first, then named events wired to plain handlers (app/handlers.py).

Controls are built from the settings schema (app/settings.py) into a dict keyed by field name;
handlers receive the settings as such a dict. Importing this module loads no model: app.py
hands build_demo a generator factory.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator

import gradio as gr

from app import explainer
from app.handlers import Playground
from app.lessons import LESSON_BASE, LESSONS, lesson_values
from app.live_plot import live_plot, static_paths
from app.request_guard import RequestGuard
from app.sessions import cap_queued_per_session, waiting_jobs
from app.settings import EXAMPLE_PROMPTS, Limits, PlaygroundSettings, trained_defaults
from model.generation import TextGenerator
from model.loading import DEFAULT_ADAPTER
from model.reporting import heldout_curve_figure, quality_figure, speed_figure, study_figure
from model.schedule import DECAY_DESCRIPTIONS, LAYER_ORDER_DESCRIPTIONS, max_layer_speedup

ASSETS = Path(__file__).resolve().parents[1] / "assets"
CSS = """
.tokens { line-height: 1.9; font-size: 15px; white-space: pre-wrap; min-height: 120px; max-height: 340px;
          overflow-y: auto; padding: 6px 8px; border: 1px solid var(--border-color-primary); border-radius: 6px; }
.tok { border-radius: 3px; padding: 1px 0; }
.nl { color: #8a8f98; font-size: 0.8em; padding: 0 2px; }
#status { min-height: 1.5em; }
#guide { font-size: 0.95em; }
"""
SPEEDUP_PRESETS = (1.0, 1.5, 2.0, 3.0)
GUIDE = (
    "**What you are seeing.** SkipDecode (left) and the full model (right) answer the same prompt, taking turns "
    "on one device: the faster one pulls ahead.  \n"
    "Token colour = how many layers produced it; SkipDecode runs fewer layers as the answer goes on, the same "
    "for every row of a batch.  \n"
    "The heatmap shows which layers ran at each position (blank = bypassed). At 1x nothing is skipped: it is the full model."
)
# After Generate on a narrow screen the outputs sit below the controls: bring them into view.
SCROLL_TO_OUTPUTS = """() => {
  const target = document.querySelector('#status');
  if (target && target.getBoundingClientRect().top > window.innerHeight * 0.6) {
    target.scrollIntoView({behavior: 'smooth', block: 'start'});
  }
}"""
PYTHON_TYPES = {"str": str, "float": float, "int": int, "bool": bool}


# --- controls from the schema -------------------------------------------------------------------


def control(name: str, low: float | None = None, high: float | None = None, **overrides) -> gr.components.Component:
    """The gradio control of one settings field: its label, default and help come from the schema."""
    meta = PlaygroundSettings.meta(name)
    default = PlaygroundSettings.__dataclass_fields__[name].default
    options = dict(label=meta["label"], value=default, elem_id=f"setting-{name.replace('_', '-')}")
    if meta["help"]:
        options["info"] = meta["help"]
    options.update(overrides)
    kind = meta["kind"]
    if kind == "text":
        return gr.Textbox(**options)
    if kind == "choice":
        return gr.Dropdown(list(meta["choices"]), **options)
    if kind == "bool":
        return gr.Checkbox(**options)
    step = meta["step"] or (1 if meta["integer"] else 0.1)
    return gr.Slider(low if low is not None else meta["low"], high, step=step, **options)


def with_settings(fn: Callable, controls: dict[str, gr.components.Component]) -> Callable:
    """Adapt a handler of (settings dict, request) to gradio's dict input {component: value}.
    The request parameter stays explicit so gradio injects the session into it."""
    names = {component: name for name, component in controls.items()}

    def settings_of(data: dict) -> dict:
        return {names[c]: v for c, v in data.items() if c in names}

    def restart_flag(data: dict):
        return next((v for c, v in data.items() if c not in names), None)

    if inspect.isgeneratorfunction(fn):
        def streaming(data: dict, request: gr.Request = None) -> Iterator:
            flag = restart_flag(data)
            yield from (fn(flag, settings_of(data), request) if flag is not None else fn(settings_of(data), request))
        return streaming

    def plain(data: dict, request: gr.Request = None):
        return fn(settings_of(data), request) if "request" in inspect.signature(fn).parameters else fn(settings_of(data))
    return plain


def api_function(playground: Playground, defaults: dict | None = None) -> Callable:
    """The public ``generate`` endpoint: keyword parameters named and ordered like the settings
    schema (gradio documents them from this signature); it delegates to the handler.
    ``defaults`` overrides schema defaults (the loaded skip policy's placement)."""
    fields = {name: PlaygroundSettings.__dataclass_fields__[name] for name in PlaygroundSettings.api_names()}
    defaults = defaults or {}
    parameters = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=PYTHON_TYPES[str(spec.type)],
                          default=inspect.Parameter.empty if name == "prompt" else defaults.get(name, spec.default))
        for name, spec in fields.items()
    ]
    parameters.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request,
                                        default=None))
    signature = inspect.Signature(parameters, return_annotation=AsyncIterator[dict])

    async def generate(*args, **kwargs) -> AsyncIterator[dict]:
        """Stream SkipDecode and the full model side by side. Each message: both texts so far,
        the layers each SkipDecode step ran, and the live figures. The last has "done": true."""
        bound = signature.bind_partial(*args, **kwargs)
        request = bound.arguments.pop("request", None)
        async for message in playground.api_stream_async(dict(bound.arguments), request):
            yield message

    generate.__signature__ = signature
    generate.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": AsyncIterator[dict]}
    return generate


def share_link_js(names: list[str]) -> str:
    """Browser-side: the page's URL with the given controls' values as its query, copied to the
    clipboard where the browser allows it."""
    return f"""(...values) => {{
  const names = {json.dumps(names)};
  const query = new URLSearchParams();
  names.forEach((name, i) => query.set(name, String(values[i])));
  const url = window.location.origin + window.location.pathname + '?' + query.toString();
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {{}});
  return url;
}}"""


def gpu_seconds(*args, **_kwargs) -> int:
    """ZeroGPU's per-call duration, from the request's size: the settings dict a handler gets
    (batch x new tokens, two streams), bounded to 20-120 s."""
    values = next((a for a in args if isinstance(a, dict)), {})
    tokens = _setting_value(values, "max_new_tokens", 0)
    batch = _setting_value(values, "batch_size", 1)
    return int(min(120, max(20, 10 + 0.1 * batch * tokens)))


def _setting_value(values: dict, name: str, default: int) -> int:
    """A numeric setting from a handler's input dict, keyed by setting name or by the control
    (whose elem_id is setting-<name with dashes>)."""
    wanted = (name, f"setting-{name.replace('_', '-')}")
    for key, value in values.items():
        if getattr(key, "elem_id", key) in wanted and isinstance(value, (int, float)):
            return int(value)
    return default


def gpu_handler(fn: Callable) -> Callable:
    """spaces.GPU on a ZeroGPU Space (the GPU is attached per call, for a duration estimated from
    the request's size); the function itself elsewhere."""
    if not os.environ.get("SPACES_ZERO_GPU"):
        return fn
    try:
        import spaces  # noqa: PLC0415
    except ImportError:
        return fn
    return spaces.GPU(duration=gpu_seconds)(fn)


def launch_options() -> dict:
    """Keyword arguments for demo.launch(): the CSS, no file uploads (the app takes none), no
    unauthenticated monitoring dashboard, and the request guard (malformed calls get a message)."""
    from starlette.middleware import Middleware  # noqa: PLC0415

    return {"css": CSS, "max_file_size": "1kb", "enable_monitoring": False,
            "app_kwargs": {"middleware": [Middleware(RequestGuard)]}}


def analytics_enabled() -> bool:
    """Telemetry and gradio's version check are OFF unless the deployer turns them on
    (GRADIO_ANALYTICS_ENABLED=True): nothing is sent anywhere at run time by default."""
    return os.environ.get("GRADIO_ANALYTICS_ENABLED", "False").strip().lower() in ("1", "true", "yes")


def _load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --- layout and wiring -----------------------------------------------------------------------


def build_demo(get_generator: Callable[[], TextGenerator], limits: Limits | None = None,
               concurrency_limit: int = 1, queue_size: int = 32, max_queued_per_session: int = 2) -> gr.Blocks:
    """The whole app, its queue configured. ``get_generator`` is called per request (app.py
    caches the loaded model). Only the queued, documented endpoints run generations: the REST
    routes that bypass the queue are closed (api_open=False)."""
    limits = limits or Limits()
    gr.set_static_paths(static_paths())
    playground = Playground(get_generator, limits, concurrency_limit)
    generator = get_generator()
    num_layers = generator.num_layers
    top_speedup = round(max_layer_speedup(num_layers, 1), 2)

    with gr.Blocks(title="SkipDecode Playground", analytics_enabled=analytics_enabled(),
                   delete_cache=(600, 600)) as demo:
        gr.Markdown(
            "# SkipDecode Playground\n"
            f"Layer-skipping decoding that keeps batching and the KV cache (arXiv 2307.02628), on "
            f"**{generator.loaded.name}** ({num_layers} layers, {generator.loaded.device}"
            f"{', int8 weights' if generator.loaded.quantize == 'int8' else ''}). "
            + ("SkipDecode runs with the skip-policy adapter; the full model is the original. "
               if generator.loaded.adapter_path else "No skip-policy adapter loaded: skipping will hurt quality. ")
        )
        c: dict[str, gr.components.Component] = {}
        defaults = trained_defaults(generator)
        with gr.Tabs():
            with gr.Tab("Playground"):
                gr.Markdown(GUIDE, elem_id="guide")
                with gr.Row():
                    with gr.Column(scale=2, min_width=320):
                        c["prompt"] = control("prompt", value=EXAMPLE_PROMPTS[0], lines=2, max_lines=12)
                        with gr.Row():
                            run = gr.Button("Generate", variant="primary", elem_id="generate-btn", min_width=100)
                            stop = gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=80)
                        load_note = gr.Markdown(elem_id="load-note")
                        c["target_speedup"] = control("target_speedup", 1.0, min(4.0, top_speedup))
                        with gr.Row():
                            presets = {value: gr.Button(f"{value:g}x", size="sm", min_width=50,
                                                        elem_id=f"speedup-{str(value).replace('.', '-')}")
                                       for value in SPEEDUP_PRESETS}
                        c["skip_policy"] = control("skip_policy", interactive=bool(generator.loaded.adapter_path))
                        c["lens"] = control("lens")
                        c["lens_kl"] = control("lens_kl")
                        gr.Examples([[p] for p in EXAMPLE_PROMPTS], inputs=[c["prompt"]], label="Example prompts",
                                    cache_examples=False)
                    with gr.Column(scale=3):
                        status = gr.Markdown(elem_id="status")
                        with gr.Row(equal_height=True):
                            with gr.Column(min_width=160):
                                gr.Markdown("**SkipDecode** (colour = layers run; darker = more)")
                                skip_out = gr.HTML(elem_id="skip-output")
                            with gr.Column(min_width=160):
                                gr.Markdown("**Full model** (original, every layer)")
                                full_out = gr.HTML(elem_id="full-output")
                        stats = gr.Markdown(elem_id="stats")
                with gr.Accordion("Lessons: six one-click experiments for a class", open=False, elem_id="lessons"):
                    with gr.Row():
                        lesson_buttons = [gr.Button(lesson.title, size="sm", elem_id=f"lesson-{i}")
                                          for i, lesson in enumerate(LESSONS)]
                    lesson_text = gr.Markdown(elem_id="lesson-text")
                with gr.Row():
                    with gr.Column(scale=2, min_width=320):
                        c["decay"] = control("decay", info="; ".join(f"{k}: {v}" for k, v in DECAY_DESCRIPTIONS.items()))
                        c["warmup"] = control("warmup", 0, num_layers - 2, value=min(defaults["warmup"], num_layers - 2))
                        c["decay_length"] = control("decay_length", 0, limits.max_new_tokens)
                        with gr.Accordion("Advanced", open=False):
                            c["min_layers"] = control("min_layers", 0, num_layers)
                            c["max_layers"] = control("max_layers", 0, num_layers)
                            c["order"] = gr.Radio(list(LAYER_ORDER_DESCRIPTIONS), value=defaults["order"],
                                                  label="Layer order", elem_id="setting-order",
                                                  info=" · ".join(f"{k}: {v}" for k, v in LAYER_ORDER_DESCRIPTIONS.items()))
                            c["batch_size"] = control("batch_size", 1, limits.max_batch_size)
                            c["max_new_tokens"] = control("max_new_tokens", 1, limits.max_new_tokens)
                            c["temperature"] = control("temperature", 0.0, 2.0)
                            c["top_p"] = control("top_p", 0.05, 1.0)
                            c["seed"] = gr.Number(value=0, precision=0, label="Seed", minimum=0)
                            c["prompt_at_full_depth"] = control("prompt_at_full_depth")
                            c["show_template"] = control("show_template")
                        with gr.Row():
                            step_btn = gr.Button("Step ▶ (one token)", elem_id="step-btn")
                            step_reset = gr.Button("Reset steps", elem_id="step-reset-btn")
                        schedule_plot = gr.Plot(label="Schedule: layers per generated step", elem_id="schedule-plot")
                        schedule_note = gr.Markdown()
                        with gr.Row():
                            share_btn = gr.Button("Copy a link to these settings", size="sm", elem_id="share-btn")
                            share_link = gr.Textbox(show_label=False, placeholder="the link appears here",
                                                    elem_id="share-link", interactive=False)
                    with gr.Column(scale=3):
                        heatmap = live_plot("heatmap", height=380)
            with gr.Tab("How it works"):
                gr.Markdown(explainer.INTRO)
                gr.Plot(explainer.early_exit_vs_skipdecode(), show_label=False)
                gr.Plot(explainer.kv_prefix_figure(), show_label=False)
                gr.Markdown(explainer.BATCH_VIEW)
                with gr.Row():
                    batch_speedup = gr.Slider(1.0, 4.0, value=2.0, step=0.1, label="Batch view: target layer speedup",
                                              elem_id="batch-speedup")
                    batch_decay = gr.Dropdown(list(DECAY_DESCRIPTIONS), value="linear", label="Batch view: decay")
                batch_btn = gr.Button("Run a batch of 4 prompts")
                batch_plot = gr.Plot(show_label=False)
                batch_text = gr.Markdown()
            with gr.Tab("Results"):
                _results_tab()

        # --- events -------------------------------------------------------------------------
        settings = set(c.values())
        stream_outputs = [status, skip_out, full_out, stats, heatmap]
        model_lane = dict(concurrency_id="model", concurrency_limit=concurrency_limit)
        private = dict(api_visibility="private")

        run.click(None, None, None, js=SCROLL_TO_OUTPUTS, queue=False, **private)
        run.click(gpu_handler(with_settings(playground.generate, c)), settings, stream_outputs,
                  api_name="ui_generate", **private, **model_lane)
        # A settings change while generating: end the running stream at once (outside the queue),
        # then restart in the model lane, which that ending has just freed.
        restart_flag = gr.State(False)
        preset_events = [button.click(lambda value=value: value, None, [c["target_speedup"]], queue=False,
                                      api_name=f"ui_preset_{i}", **private)
                         for i, (value, button) in enumerate(presets.items())]
        restart_triggers = (c["target_speedup"].release, c["decay"].change, c["skip_policy"].change,
                            *(event.then for event in preset_events))
        for i, trigger in enumerate(restart_triggers):
            trigger(playground.request_restart, None, [restart_flag], queue=False, api_name=f"ui_request_restart_{i}",
                    **private).then(
                gpu_handler(with_settings(playground.restart_if_running, c)), {restart_flag, *settings}, stream_outputs,
                api_name=f"ui_restart_{i}", **private, **model_lane)
        # Stop ends the run through its handle: the stream finishes at its next step and says
        # "Stopped". (gradio's cancels= would kill the task mid-yield and paint every output
        # with an "Error" badge.)
        stop.click(playground.stop, None, [status], queue=False, api_name="ui_stop", **private)
        step_btn.click(gpu_handler(with_settings(playground.step, c)), settings, [*stream_outputs, schedule_plot],
                       api_name="ui_step",
                       **private, **model_lane)
        step_reset.click(playground.reset_steps, None, stream_outputs, queue=False, api_name="ui_reset_steps", **private)
        preview_triggers = [c[name].change for name in ("target_speedup", "decay", "warmup", "decay_length",
                                                         "min_layers", "max_layers", "order", "max_new_tokens")]
        gr.on([*preview_triggers, demo.load], with_settings(playground.schedule_preview, c), settings,
              [schedule_plot, schedule_note], queue=False, api_name="ui_schedule", trigger_mode="always_last", **private)
        batch_btn.click(gpu_handler(playground.batch_view), [batch_speedup, batch_decay], [batch_plot, batch_text],
                        api_name="ui_batch_view", **private, **model_lane)
        lesson_controls = [c[name] for name in LESSON_BASE]
        for lesson, button in zip(LESSONS, lesson_buttons):
            button.click(lambda lesson=lesson: [lesson_values(lesson)[n] for n in LESSON_BASE] + [lesson.markdown()],
                         None, [*lesson_controls, lesson_text], queue=False, api_name=False)
        shared = list(PlaygroundSettings.api_names())
        share_btn.click(None, [c[name] for name in shared], [share_link], js=share_link_js(shared), **private)
        demo.load(playground.from_link, None, [*(c[name] for name in shared), status], queue=False,
                  api_name="ui_from_link", **private)
        busy_timer = gr.Timer(4)
        gr.on([busy_timer.tick, demo.load], lambda: playground.load_note(waiting_jobs(demo._queue)), None, [load_note],
              queue=False, api_name="ui_load_note", **private)
        demo.unload(playground.leave)
        gr.api(gpu_handler(api_function(playground, defaults)), api_name="generate", **model_lane)
    demo.playground = playground  # tests and the load script inspect active runs
    demo.queue(api_open=False, max_size=queue_size)
    cap_queued_per_session(demo._queue, max_queued_per_session)
    return demo


def _results_tab() -> None:
    _results_section("Quality under skipping (held-out prompts)", "eval", "eval", quality_figure)
    _training_curve()
    _results_section("Which recipe: the skip-policy study", "study", "study", study_figure)
    _results_section("Measured speed", "bench", "bench", speed_figure)


def _training_curve() -> None:
    """The shipped adapter's held-out curve (its run's train_log.jsonl held-out rows, copied
    next to the adapter as heldout_curve.json)."""
    records = _load_json(DEFAULT_ADAPTER / "heldout_curve.json")
    if records:
        gr.Markdown("### The shipped skip policy's training run (held-out agreement every 100 steps)")
        gr.Plot(heldout_curve_figure(records, "Shipped adapter: held-out agreement while training"), show_label=False)


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
