"""The playground UI: layout first, then named events wired to plain handlers (app/handlers.py).

Controls are built from the settings schema (app/settings.py) into a dict keyed by field name;
handlers receive the settings as such a dict. Importing this module loads no model: app.py
hands build_demo a generator factory. The public API function, GPU sizing, the Results tab,
lessons, share links and the page's style live in modules named for them.
"""

from __future__ import annotations

from typing import Callable

import gradio as gr

from app.api import api_function
from app.handlers import Playground
from app.page import explainer
from app.page.controls import control, with_settings
from app.page.lessons import (
    CHAT_LANDING_LINE,
    LANDING_LESSON,
    LANDING_LINE,
    LESSONS,
    Lesson,
    landing_values,
    lesson_by_title,
    lesson_names,
    lesson_settings,
    lesson_text,
)
from app.page.live_plot import live_plot, static_paths
from app.page.results import results_tab
from app.page.style import COPY_JS, GATE_JS, PAGE_URL_JS, SCROLL_TO_OUTPUTS, STOP_BUSY_JS, STOP_IDLE_JS, launch_style
from app.serving import gradio_internals as gi
from app.serving.batcher import LANE as BATCH_LANE
from app.serving.batcher import Batcher, BatchLimits
from app.serving.fair_queue import FairQueue, ServingLimits
from app.serving.gpu import gpu_handler
from app.serving.request_guard import RequestGuard
from app.serving.security_headers import SecurityHeaders
from app.serving.slow_clients import guard_slow_clients
from app.settings import (
    EXAMPLE_PROMPTS,
    Limits,
    PlaygroundSettings,
    control_ranges,
    lowered_defaults,
    trained_defaults,
    within_limits,
)
from app.task_view import full_title, header_for, header_markdown, mr_form, post_box, task_events
from app.tasks import TASK_FIXED, TaskGenerators, task_choices
from model.common.settings import LANDINGS, settings
from model.generation.generator import TextGenerator
from model.skipdecode.schedule import DECAY_DESCRIPTIONS, LAYER_ORDER_DESCRIPTIONS, max_layer_speedup
from model.skipdecode.static_decoder import batch_bucket

__all__ = ["LANDINGS", "api_function", "build_demo", "launch_options"]
SPEEDUP_PRESETS = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0)
# Shown only while a task whose skip policies are trained for them is chosen (model/tasks POLICY_SPEEDUPS;
# TL;DR: where a policy is shipped, TaskGenerators.trained_for); the general chat policy is not, and at 4x
# and 5x it only garbles.
TASK_PRESETS = (4.0, 5.0)
PRIVATE = dict(api_visibility="private")  # every event but the public ``generate`` endpoint
GUIDE = (
    "**What you are seeing.** SkipDecode (coloured tokens: darker = more layers ran) and the full model (plain "
    "text) answer the same prompt, taking turns on one device; the heatmap under them shows which layers ran at each "
    "position. **Step** advances one token at a time. At 1x nothing is skipped: it is the full model."
)


def launch_options(request_read_s: float | None = None) -> dict:
    """Keyword arguments for demo.launch(): the style (CSS, system font stack, the Results link),
    no file uploads (the app takes none), no unauthenticated monitoring dashboard, and the
    request guard (malformed calls get a message) behind the security headers (a Content-Security-
    Policy and friends on every response, the guard's refusals included). Also puts the request-read
    deadline under gradio's server (app/serving/slow_clients.py; ``request_read_s`` None: the setting): a
    half-sent request is closed in time."""
    guard_slow_clients(request_read_s)
    from starlette.middleware import Middleware  # noqa: PLC0415

    style = launch_style()
    return {**style, "max_file_size": "1kb", "enable_monitoring": False,
            "app_kwargs": {"middleware": [Middleware(SecurityHeaders, head=style["head"]), Middleware(RequestGuard)]}}


def analytics_enabled() -> bool:
    """Telemetry and gradio's version check are OFF unless the deployer turns them on
    (GRADIO_ANALYTICS_ENABLED=True): nothing is sent anywhere at run time by default."""
    return settings().analytics_enabled


# --- layout and wiring -----------------------------------------------------------------------
def build_demo(get_generator: Callable[[], TextGenerator], limits: Limits | None = None,
               concurrency_limit: int = 1, queue_size: int = 32, max_queued_per_session: int = 2,
               serving: ServingLimits | None = None, tasks: TaskGenerators | None = None,
               landing: str = "auto", batching: BatchLimits | None = None) -> gr.Blocks:
    """The whole app, its queue configured. ``get_generator`` is called per request (app.py
    caches the loaded model). Only the queued, documented endpoints run generations: the REST
    routes that bypass the queue are closed (api_open=False). ``tasks`` loads a task's models
    (default: the shipped ones, when a visitor first picks the task). ``landing``: what a visit
    without a link shows, "auto" (the paper's task at 3x where its models are there for this
    model, else general chat) or "chat". ``batching``: how large a batch of jobs that share a schedule
    grows (app/serving/batcher.py; default: BatchLimits(); rows=1 runs every job alone)."""
    limits = limits or Limits()
    batching = batching or BatchLimits()
    gr.set_static_paths(static_paths())
    playground = Playground(get_generator, limits, concurrency_limit, tasks)
    if batching.rows > 1:
        playground.batcher = Batcher(batching, playground.compute)
    generator = get_generator()
    if landing not in LANDINGS:
        raise ValueError(f"landing must be {' or '.join(LANDINGS)}; got {landing!r}")
    if landing == "auto":
        values = landing_values(trained_defaults(generator))
        if playground.tasks.can_land(values["task"], generator):
            playground.landing = values | within_limits(values, limits)  # a deployer's lower limit wins
    playground.warm_up()  # a first task job is sized in milliseconds, before its policy loads
    # a GPU's compiled layers and graphs, for one visitor and a full batch, before the first visitors
    playground.prepare_gpu(sorted({1, batch_bucket(batching.rows)}))
    with gr.Blocks(title="SkipDecode Playground", analytics_enabled=analytics_enabled(),
                   delete_cache=(600, 600)) as demo:
        header = gr.Markdown(header_markdown(generator), elem_id="page-header")  # follows the task chosen
        with gr.Tabs():
            with gr.Tab("Playground"):
                ui = _playground_tab(generator, limits, playground.landing is not None) | {"header": header}
            with gr.Tab("How it works"):
                ui |= _how_it_works_tab()
            with gr.Tab("Results"):
                results_tab()
        _wire(demo, playground, ui, trained_defaults(generator), concurrency_limit, batching.rows)
    demo.playground = playground  # tests and the load script inspect active runs
    demo.queue(api_open=False, max_size=queue_size)
    gi.fix_streaming_diffs()  # a frame's lists of steps reach the client whole (app/serving/gradio_internals.py)
    gi.make_session_configs_on_demand()  # a new session (every API call) starts in microseconds, not ~10 ms
    # The fair queue (app/serving/fair_queue.py): admission and place by client; ``serving`` sets its other limits.
    held = playground.batcher.waiting_count if playground.batcher is not None else (lambda: 0)
    fair = FairQueue((serving or ServingLimits()).sized(queue_size, max_queued_per_session),
                     playground.admission_problem, held).install(demo)
    playground.client_gone = fair.client_gone_check
    playground.queue_refusal = fair.refusal_for
    fair.admitted = playground.pushed  # the batcher gathers the jobs a class pushes together
    playground.address_of = fair.address_of
    return demo


def _playground_tab(generator: TextGenerator, limits: Limits, lands_on_task: bool) -> dict:
    """The controls (ui["c"], by setting name) and every other component, by name. The two answers
    and the heatmap under them share one screen with Generate, Step and the lessons. (A visit
    without a link then sets the landing lesson's controls on load: ``lands_on_task``.)"""
    num_layers = generator.num_layers
    ranges = control_ranges(num_layers, limits, max_layer_speedup(num_layers, 1))
    c: dict[str, gr.components.Component] = {}
    ui: dict = {"c": c}
    gr.Markdown(GUIDE, elem_id="guide")
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            _prompt_column(generator, limits, ranges, ui, LANDING_LESSON if lands_on_task else LESSONS[0].title)
        with gr.Column(scale=3):
            _answers_column(ui, LANDING_LINE if lands_on_task else CHAT_LANDING_LINE)
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            _schedule_column(generator, limits, ranges, ui)
        with gr.Column(scale=3):
            _share_column(ui)
    return ui


def _prompt_column(generator: TextGenerator, limits: Limits, ranges: dict, ui: dict, lesson: str) -> None:
    """Task, prompt, the run buttons, the speedup and its presets, the task's form, lessons and the lens."""
    c = ui["c"]
    # built by hand: its choices carry labels (the value is the API's task name)
    c["task"] = gr.Radio(task_choices(), value="chat", label="Task", elem_id="setting-task")
    # The box holds a few times the prompt's limit: a longer paste is cut there, and Generate names its length.
    c["prompt"] = control("prompt", value=EXAMPLE_PROMPTS[0], lines=2, max_lines=12,
                          max_length=limits.max_page_text_chars)
    ui["mr_problem"] = gr.Markdown(visible=False, elem_id="mr-problem", latex_delimiters=[])  # a task's input, checked as typed
    with gr.Row():
        ui["run"] = gr.Button("Generate", variant="primary", size="md", elem_id="generate-btn", min_width=80)
        # disabled while nothing runs (app/page/style.py's page script turns it on and off with the runs)
        ui["stop"] = gr.Button("Stop", variant="stop", size="md", elem_id="stop-btn", min_width=60,
                               elem_classes=["idle"])
        ui["step"] = gr.Button("Step", size="md", elem_id="step-btn", min_width=60)
        ui["reset"] = gr.Button("Reset", size="md", elem_id="step-reset-btn", min_width=60)
    ui["load_note"] = gr.Markdown(elem_id="load-note")
    c["target_speedup"] = control("target_speedup", *ranges["target_speedup"])
    with gr.Row():
        ui["presets"] = {value: gr.Button(f"{value:g}x", size="sm", min_width=50, visible=value not in TASK_PRESETS,
                                          elem_id=f"speedup-{str(value).replace('.', '-')}")
                         for value in SPEEDUP_PRESETS}
    c["skip_policy"] = control("skip_policy", interactive=bool(generator.loaded.adapter_path))
    ui |= mr_form(c["prompt"])  # the task's examples and form: shown while a task is chosen
    ui |= post_box(c["prompt"])  # TL;DR's example posts: shown while it is chosen
    _lessons(ui, lesson_by_title(lesson))
    c["lens"] = control("lens")
    c["lens_kl"] = control("lens_kl")


def _lessons(ui: dict, shown: Lesson) -> None:
    with gr.Accordion(f"Lessons: {len(LESSONS)} experiments for a class", open=True, elem_id="lessons"):
        with gr.Row(equal_height=True):
            ui["lesson"] = gr.Dropdown([lesson.title for lesson in LESSONS], value=shown.title,
                                       show_label=False, elem_id="lesson-choice", scale=3, container=False)
            ui["lesson_run"] = gr.Button("Run this lesson", variant="primary", size="md", elem_id="lesson-run",
                                         scale=1, min_width=130)
        ui["lesson_text"] = gr.Markdown(shown.markdown(), elem_id="lesson-text")
        with gr.Row():
            ui["lesson_then"] = gr.Button(shown.then_label or "Then", size="sm", elem_id="lesson-then",
                                          visible=bool(shown.then_label))
            # One link (and a QR code under the share button) that opens this lesson and runs it on every page
            ui["lesson_link"] = gr.Button("Link and QR code that run this lesson", size="sm", elem_id="lesson-link")


def _answers_column(ui: dict, landing_line: str) -> None:
    """The status line, the two answers side by side, the headline, the heatmap and the details."""
    # No LaTeX in lines that quote a visitor or a link: KaTeX would read their escaped "$$" again.
    ui["status"] = gr.Markdown(landing_line, elem_id="status", latex_delimiters=[])
    with gr.Row(equal_height=True):
        with gr.Column(min_width=160):
            gr.Markdown("**SkipDecode** (colour = layers run; darker = more)")
            ui["skip_out"] = gr.HTML(elem_id="skip-output")
        with gr.Column(min_width=160):
            ui["full_title"] = gr.Markdown(full_title("chat"), elem_id="full-title")
            ui["full_out"] = gr.HTML(elem_id="full-output")
    ui["headline"] = gr.HTML(elem_id="headline")
    ui["heatmap"] = live_plot("heatmap", height=300)
    ui["heatmap_note"] = gr.HTML(elem_id="heatmap-note")
    with gr.Accordion("Details: speeds, skipped layers, exact token match, schedule", open=False,
                      elem_id="details"):
        ui["details"] = gr.Markdown(elem_id="stats", latex_delimiters=[])


def _schedule_column(generator: TextGenerator, limits: Limits, ranges: dict, ui: dict) -> None:
    """The schedule's settings (decay, warmup, decay length; the rest under Advanced) and the example prompts."""
    c = ui["c"]
    defaults = trained_defaults(generator)
    limited = lowered_defaults(generator, limits)  # a deployer's limit under a default
    ui["task_note"] = gr.Markdown(elem_id="task-note", visible=False)
    c["decay"] = control("decay", info="; ".join(f"{k}: {v}" for k, v in DECAY_DESCRIPTIONS.items()))
    c["warmup"] = control("warmup", *ranges["warmup"], value=min(defaults["warmup"], ranges["warmup"][1]))
    c["decay_length"] = control("decay_length", *ranges["decay_length"])
    with gr.Accordion("Advanced", open=False):
        for name in ("min_layers", "max_layers"):
            c[name] = control(name, *ranges[name])
        c["order"] = gr.Radio(list(LAYER_ORDER_DESCRIPTIONS), value=defaults["order"], label="Layer order",
                              elem_id="setting-order",
                              info=" · ".join(f"{k}: {v}" for k, v in LAYER_ORDER_DESCRIPTIONS.items()))
        for name in ("batch_size", "max_new_tokens", "temperature", "top_p"):
            c[name] = control(name, *ranges[name], **{"value": limited[name]} if name in limited else {})
        c["seed"] = gr.Number(value=0, precision=0, label="Seed", minimum=0, elem_id="setting-seed")
        c["prompt_at_full_depth"] = control("prompt_at_full_depth")
        c["show_template"] = control("show_template")
    with gr.Column(elem_id="chat-examples") as ui["chat_examples"]:
        gr.Examples([[p] for p in EXAMPLE_PROMPTS], inputs=[c["prompt"]],
                    label="Example prompts: a click puts one in the prompt box, Generate runs it",
                    cache_examples=False)


def _share_column(ui: dict) -> None:
    """The schedule's figure and note, and the share link with its QR code."""
    ui["schedule_plot"] = gr.Plot(show_label=False, elem_id="schedule-plot")  # the figure's title names it
    ui["schedule_note"] = gr.Markdown(latex_delimiters=[])
    with gr.Row():
        ui["share_btn"] = gr.Button("Copy a link to these settings", size="sm", elem_id="share-btn")
        ui["page_url"] = gr.Textbox(visible=False)
        ui["share_link"] = gr.Textbox(show_label=False, placeholder="the link appears here",
                                      elem_id="share-link", interactive=False)
    ui["share_note"] = gr.Markdown(elem_id="share-note", latex_delimiters=[])
    ui["qr"] = gr.HTML(elem_id="share-qr")


def _how_it_works_tab() -> dict:
    gr.Markdown(explainer.INTRO)
    gr.Plot(explainer.early_exit_vs_skipdecode(), show_label=False)
    gr.Markdown(explainer.EARLY_EXIT_CAPTION)
    gr.Plot(explainer.kv_prefix_figure(), show_label=False)
    gr.HTML(explainer.KV_PREFIX_LEGEND)
    gr.Markdown(explainer.BATCH_VIEW)
    with gr.Row():
        speedup = gr.Slider(1.0, 4.0, value=2.0, step=0.1, label="Batch view: target layer speedup",
                            elem_id="batch-speedup")
        decay = gr.Dropdown(list(DECAY_DESCRIPTIONS), value="linear", label="Batch view: decay")
    button = gr.Button("Run a batch of 4 prompts")
    return {"batch": (speedup, decay, button, gr.Plot(show_label=False), gr.Markdown(latex_delimiters=[]))}


def _wire(demo: gr.Blocks, playground: Playground, ui: dict, defaults: dict, concurrency_limit: int,
          batch_rows: int) -> None:
    """Every event: plain handlers, private except the one public ``generate`` endpoint. Generations
    (Generate, lessons, restarts, the API) run in the batch lane: up to a batch's rows of them at once,
    handed to the batcher, which runs them as shared batches; step mode, a task's loading and the
    How-it-works batch view in the model lane, one at a time. Both lanes' model steps take turns on
    the playground's compute lock."""
    settings = set(ui["c"].values())
    stream = [ui[name] for name in ("status", "skip_out", "full_out", "headline", "details", "heatmap", "heatmap_note")]
    lane = dict(concurrency_id="model", concurrency_limit=concurrency_limit)
    # twice a batch's rows: the next batch gathers in full while one runs
    runs = dict(concurrency_id=BATCH_LANE, concurrency_limit=max(concurrency_limit, 2 * batch_rows)) \
        if playground.batcher is not None else lane
    loaded = _wire_sharing(demo, playground, ui)
    note = _wire_runs(demo, playground, ui, defaults, settings, stream, runs, loaded, lane)
    _wire_restarts(playground, ui, settings, stream, runs)
    _wire_steps_and_previews(demo, playground, ui, settings, stream, lane)
    gr.on([gr.Timer(4).tick, demo.load], **(note | dict(api_name="ui_load_note")), **PRIVATE)
    demo.unload(playground.leave)
    gr.api(gpu_handler(api_function(playground, defaults)), api_name="generate", **runs)


def _wire_runs(demo: gr.Blocks, playground: Playground, ui: dict, defaults: dict, settings: set, stream: list,
               lane: dict, loaded, model_lane: dict) -> dict:
    """Generate, the lessons' runs (a click, or a lesson's link that starts it once the page has
    ``loaded`` the link's settings) and the task's events; returns the load note's event (the timer reuses it)."""
    c = ui["c"]
    generate = gpu_handler(with_settings(playground.generate, c))
    for button in (ui["run"], ui["lesson_run"], ui["lesson_then"]):
        button.click(None, None, None, js=SCROLL_TO_OUTPUTS, queue=False, api_name=False)
    note = dict(fn=lambda: playground.load_note(demo.fair_queue.waiting()), inputs=None, outputs=[ui["load_note"]],
                queue=False, show_progress="hidden", api_name=False)
    # arm first (outside the queue): a Stop while the run waits in the queue ends it as it starts
    # the schedule plot again after a run: a task's model may have loaded only for it
    preview = dict(fn=with_settings(playground.schedule_preview, c), inputs=settings,
                   outputs=[ui["schedule_plot"], ui["schedule_note"]], queue=False, api_name=False)
    header = dict(fn=lambda task: header_for(playground, task), inputs=[c["task"]], outputs=[ui["header"]],
                  queue=False, api_name=False)  # a task's model may have loaded for the run: its own facts
    checks = _click_checks(playground, ui, settings)
    checked = ui["run"].click(playground.arm, None, None, queue=False, api_name=False).then(**checks["refusal"])
    _gated(checked, checks).success(generate, settings, stream, api_name="ui_generate", **PRIVATE, **lane).then(
        **note).then(**preview).then(**header)
    # A lesson sets every control it names, then generates with them (its second run: "then").
    lesson_controls = [c[name] for name in lesson_names()]
    for i, then in enumerate((False, True)):
        checked = ui["lesson_then" if then else "lesson_run"].click(
            playground.arm, None, None, queue=False, api_name=False).then(
            lambda title, then=then: lesson_settings(title, defaults, then), [ui["lesson"]], lesson_controls,
            queue=False, api_name=False).then(**checks["refusal"])
        _gated(checked, checks).success(generate, settings, stream, api_name=f"ui_lesson_{i}", **PRIVATE,
                                        **lane).then(**note).then(**preview).then(**header)  # fresh at the end
    # a lesson's link asks to start it (?lesson=N&run=1); read by the page's gate (GATE_JS): not a State
    start = gr.Checkbox(False, visible=False, elem_id="link-starts")
    linked = loaded.then(playground.lesson_from_link, None, [ui["lesson"], start], queue=False, api_name=False).then(
        None, [start], None, js=GATE_JS, queue=False, api_name=False, show_progress="hidden").success(
        playground.arm, None, None, js=STOP_BUSY_JS, queue=False, api_name=False).then(**checks["refusal"])
    _gated(linked, checks).success(generate, settings, stream, api_name="ui_lesson_link", **PRIVATE, **lane).then(
        **note).then(**preview).then(**header)
    task_events(demo, playground, ui, [c[name] for name in TASK_FIXED], settings, model_lane)
    c["task"].change(lambda task: [gr.update(visible=playground.tasks.trained_for(task, value)) for value in TASK_PRESETS],
                     [c["task"]], [ui["presets"][value] for value in TASK_PRESETS], queue=False, api_name=False)
    ui["lesson"].change(lesson_text, [ui["lesson"]], [ui["lesson_text"], ui["lesson_then"]], queue=False,
                        api_name=False)
    return note


def _click_checks(playground: Playground, ui: dict, settings: set) -> dict:
    """The two events before a click's job is pushed, both outside the queue: the checks (a refusal's
    reason on the status line, at once) and the gate that ends a refused click's chain there."""
    # a hidden checkbox, not a State: the gate runs in the page, and a State's value stays on the server
    allowed = gr.Checkbox(False, visible=False, elem_id="click-allowed")
    quick = dict(queue=False, api_name=False, show_progress="hidden")
    return {"refusal": dict(fn=with_settings(playground.refusal, ui["c"]), inputs=settings,
                            outputs=[ui["status"], allowed], **quick),
            "gate": dict(fn=None, inputs=[allowed], outputs=None, js=GATE_JS, **quick)}


def _gated(checked, checks: dict):
    """The gate after a click's checks (``_click_checks``); a refused click turns Stop idle there."""
    gate = checked.then(**checks["gate"])
    gate.failure(None, None, None, js=STOP_IDLE_JS, queue=False, api_name=False)
    return gate


def _wire_restarts(playground: Playground, ui: dict, settings: set, stream: list, lane: dict) -> None:
    """A settings change by hand while generating: end the running stream at once (outside the
    queue), then restart in the model lane, which that ending has just freed. (.select, not
    .change: a lesson or a link setting the controls must not restart anything.)"""
    c = ui["c"]
    restart_flag = gr.State(False)
    preset_events = [button.click(lambda value=value: value, None, [c["target_speedup"]], queue=False,
                                  api_name=f"ui_preset_{i}", **PRIVATE)
                     for i, (value, button) in enumerate(ui["presets"].items())]
    triggers = (c["target_speedup"].release, c["decay"].select, c["skip_policy"].select,
                *(event.then for event in preset_events))
    for i, trigger in enumerate(triggers):
        trigger(playground.request_restart, None, [restart_flag], queue=False, api_name=f"ui_request_restart_{i}",
                **PRIVATE).then(gpu_handler(with_settings(playground.restart_if_running, c)), {restart_flag, *settings},
                                stream, api_name=f"ui_restart_{i}", **PRIVATE, **lane)


def _wire_steps_and_previews(demo: gr.Blocks, playground: Playground, ui: dict, settings: set, stream: list,
                             lane: dict) -> None:
    """Stop, Step and Reset; the schedule preview on every schedule setting; the How-it-works batch view."""
    c = ui["c"]
    # Stop ends the run through its handle: the stream finishes at its next step and says
    # "Stopped". (gradio's cancels= would kill the task mid-yield and paint an "Error" badge.)
    ui["stop"].click(playground.stop, None, [ui["status"]], queue=False, api_name="ui_stop", **PRIVATE)
    checks = _click_checks(playground, ui, settings)
    step_checks = checks["refusal"] | dict(fn=with_settings(playground.step_refusal, c))
    # A click while a step computes is kept (the last one) and runs after it, never dropped unseen.
    _gated(ui["step"].click(**step_checks, trigger_mode="always_last"), checks).success(
        gpu_handler(with_settings(playground.step, c)), settings, [*stream, ui["schedule_plot"]], api_name="ui_step",
        trigger_mode="always_last", **PRIVATE, **lane)
    ui["reset"].click(playground.reset_steps, None, stream, queue=False, api_name="ui_reset_steps", **PRIVATE)
    previews = [c[name].change for name in ("task", "target_speedup", "decay", "warmup", "decay_length", "min_layers",
                                            "max_layers", "order", "max_new_tokens")]
    gr.on([*previews, demo.load], with_settings(playground.schedule_preview, c), settings,
          [ui["schedule_plot"], ui["schedule_note"]], queue=False, api_name="ui_schedule", trigger_mode="always_last",
          **PRIVATE)
    speedup, decay, button, plot, text = ui["batch"]
    button.click(gpu_handler(playground.batch_view), [speedup, decay], [plot, text], api_name="ui_batch_view",
                 **PRIVATE, **lane)


def _wire_sharing(demo: gr.Blocks, playground: Playground, ui: dict):
    """The share links (the settings', a lesson's; copied, with its QR code) and the settings a link
    carries, set on page load (the returned event)."""
    c = ui["c"]
    shared = list(PlaygroundSettings.api_names())
    ui["share_btn"].click(lambda page, *values: playground.share(page, dict(zip(shared, values))),
                          [ui["page_url"], *(c[name] for name in shared)], [ui["share_link"], ui["qr"]],
                          js=PAGE_URL_JS, queue=False, api_name="ui_share", **PRIVATE).then(
        None, [ui["share_link"]], [ui["share_note"]], js=COPY_JS, api_name=False)
    ui["lesson_link"].click(playground.lesson_share, [ui["page_url"], ui["lesson"]], [ui["share_link"], ui["qr"]],
                            js=PAGE_URL_JS, queue=False, api_name="ui_lesson_share", **PRIVATE).then(
        None, [ui["share_link"]], [ui["share_note"]], js=COPY_JS, api_name=False)
    return demo.load(playground.from_link, None, [*(c[name] for name in shared), ui["status"]], queue=False,
                     api_name="ui_from_link", **PRIVATE)
