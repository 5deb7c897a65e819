"""Event handlers: plain functions of the playground's settings (a dict keyed by field name).

No layout here (app/ui.py wires these to controls) and no transformers internals (the library
behind TextGenerator owns those). Every handler turns a bad setting into a gr.Error with the
reason, before it waits for the model lane.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import AsyncIterator, Callable, Iterator, Sequence

import anyio
import gradio as gr

from app.page import explainer
from app.page.figures import schedule_figure
from app.page.lessons import LESSONS, lesson_values
from app.page.share import IGNORED_QUERY, lesson_in_query, lesson_link, qr_html, settings_from_query, share_link
from app.page.shown_text import as_html, as_markdown
from app.page.views import NO_CHANGE, STREAM_OUTPUTS, RaceRenderer, api_message, layer_ranges, one_line
from app.serving.batcher import LANE as BATCH_LANE
from app.serving.batcher import Batcher, Ticket
from app.serving.frames import FrameClock, NewSteps, frame_interval
from app.serving.job_cost import UNIT_SECONDS, job_cost, session_bytes
from app.serving.sessions import RunHandle, SessionRuns, session_key
from app.settings import (
    EXAMPLE_PROMPTS,
    Limits,
    PlaygroundSettings,
    control_ranges,
    page_defaults,
    trained_defaults,
    within_limits,
)
from app.tasks import (
    STAND_IN_INPUT,
    TASK_LABELS,
    TLDR,
    TaskGenerators,
    check_input,
    example_inputs,
    is_task,
    policy_line,
)
from model.generation.generator import TextGenerator
from model.generation.runs import PreparedRun
from model.race import RaceUpdate, TokenTexts, race
from model.skipdecode.cuda_graphs import CaptureReport
from model.skipdecode.schedule import max_layer_speedup
from model.tasks import tldr

HEATMAP_EVERY_S = 0.25  # the heatmap (and the lines drawn with it) at most 4x a second; the panes every frame
MAX_ERROR_CHARS = 400  # a refusal shown on the page quotes the visitor's value (capped where it is made)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checked:
    """A click that passed every check (``Playground.checked``): its settings, parsed once; the
    model they run; SkipDecode's PreparedRun."""

    settings: PlaygroundSettings
    generator: TextGenerator
    run: PreparedRun

    def race(self, **options) -> Iterator[RaceUpdate]:
        """The race of this click (model/race.py): SkipDecode's run beside the full model's (the same
        tokens under the full schedule), with the lens the settings ask for; ``options`` go to race."""
        generator, settings = self.generator, self.settings
        full = generator.with_schedule(self.run, settings.schedule_request(full=True, num_layers=generator.num_layers))
        return race(generator, self.run, full, lens=settings.lens, lens_kl=settings.lens_kl, **options)


class Playground:
    """Handlers bound to one TextGenerator factory (the model is shared; runs are per session)."""

    def __init__(self, get_generator: Callable[[], TextGenerator], limits: Limits, concurrency: int = 1,
                 tasks: TaskGenerators | None = None) -> None:
        self.get_generator = get_generator
        self.tasks = tasks or TaskGenerators()  # a task's models, loaded when first chosen
        self.limits = limits
        self.runs = SessionRuns(limits.max_step_positions, limits.max_step_bytes, limits.max_step_sessions_per_address)
        # Set by the fair queue: a request's client address (step mode's sessions are bounded per address).
        self.address_of: Callable[[object], str] = lambda request: getattr(getattr(request, "client", None), "host",
                                                                             None) or "unknown"
        # Set by the fair queue (app/serving/fair_queue.py): called in a queued handler, it returns a check
        # that says when that handler's client has gone (result stream closed or never opened).
        self.client_gone: Callable[[], Callable[[], bool]] = lambda: (lambda: False)
        # Set by the fair queue: what pushing a request's next job would be refused with (a full queue,
        # its share), or None; the page's checks (``refusal``) say it before the job is pushed.
        self.queue_refusal: Callable[[object], str | None] = lambda request: None
        # Set by build_demo: the jobs that can share a schedule run as one batch (None: each alone).
        self.batcher: Batcher | None = None
        self.previewing = threading.Semaphore(1)  # one schedule preview computes at a time (outside the queue)
        # Held for each model step of any run: a cancelled run's step that is still computing (a
        # long prefill) keeps the model busy, so the next run waits for it instead of overlapping.
        self.compute = threading.BoundedSemaphore(max(1, concurrency))
        # What a visit without a link query sets on load (app/page/lessons.py LANDING_LESSON), or None: chat as built.
        self.landing: dict | None = None
        self.preparing_gpu = threading.Event()  # set while prepare_gpu compiles and captures

    def preload_landing(self) -> threading.Thread | None:
        """Load the landing's task model and policy in a thread (app.py waits for it before serving),
        so the first visitor's Generate does not wait seconds for it; None when the page lands on chat."""
        if self.landing is None:
            return None
        task, speedup = self.landing["task"], self.landing["target_speedup"]

        def load() -> None:
            try:
                self.tasks.get(task, speedup)
            except (OSError, ValueError) as error:  # the first Generate says it again, on the page
                log.warning("the landing's %s model did not load: %s", task, error)

        thread = threading.Thread(target=load, name="landing-preload", daemon=True)
        thread.start()
        return thread

    def warm_up(self) -> threading.Thread:
        """Admit one example job of each task now, in the background: it reads what sizing a task's
        job needs once (the tasks' tokenizer where it must be compared, the places the task model
        trained on), so no visitor's request pays that second."""
        def admit_examples() -> None:
            for task in TASK_LABELS:
                if is_task(task) and example_inputs(task):
                    self.admission_problem("generate", {"task": task, "prompt": example_inputs(task)[0],
                                                        "max_new_tokens": 1})

        thread = threading.Thread(target=admit_examples, name="warm-up", daemon=True)
        thread.start()
        return thread

    def prepare_gpu(self, batch_sizes: Sequence[int] = (1,)) -> threading.Thread | None:
        """On a GPU with CUDA graphs: race the page's first settings (the landing's, else chat's) once per
        batch size in the background, so the compiled layers and the default schedule's graphs are ready
        before the first visitors (pages opened meanwhile say so); None elsewhere."""
        generator = self.get_generator()
        if generator.loaded.graph_runner is None:
            return None
        values = dict(self.landing) if self.landing is not None else {"prompt": GPU_WARM_UP_PROMPT}
        if "prompt" not in values or not values["prompt"]:
            values["prompt"] = example_inputs(values.get("task", ""))[0] if is_task(values.get("task", "")) \
                else GPU_WARM_UP_PROMPT

        def warm() -> None:
            start = time.perf_counter()
            try:
                checked = self.checked(values)
                if checked is None:
                    return
                settings, skip = checked.settings, checked.run
                full = checked.generator.with_schedule(
                    skip, settings.schedule_request(full=True, num_layers=checked.generator.num_layers))
                made = checked.generator.warm_up([skip, full], batch_sizes, self.compute)
                log.info("prepared the GPU in %.1f s (%d runs: batch sizes %s)", time.perf_counter() - start, made,
                         list(batch_sizes))
            except Exception as error:  # noqa: BLE001 (a failed warm-up leaves each run to prepare its own steps)
                log.warning("preparing the GPU failed: %s", error)
            finally:
                self.preparing_gpu.clear()

        self.preparing_gpu.set()
        thread = threading.Thread(target=warm, name="gpu-warm-up", daemon=True)
        thread.start()
        return thread

    # --- settings ---------------------------------------------------------------------------
    def settings(self, values: dict) -> PlaygroundSettings:
        """Validated settings; a field the caller left out takes the loaded skip policy's default.
        A task's prompt must be its input (E2E: an MR; TL;DR: a post under its title), or a ValueError
        names the problem."""
        settings = PlaygroundSettings.from_values(self.limits, **(trained_defaults(self.get_generator()) | values))
        check_input(settings.task, settings.prompt)
        return settings

    def generator_for(self, settings: PlaygroundSettings, load: bool = True) -> TextGenerator | None:
        """The model these settings run: the general one, or the task's for this speedup (its skip
        policy; loaded on first use, so only from a queued handler; None if ``load`` is False and
        it is not loaded yet)."""
        if not is_task(settings.task):  # general chat: the general model and its shared skip policy
            return self.get_generator()
        return self.tasks.get(settings.task, settings.target_speedup, load=load, general=self.get_generator())

    def policy_line(self, settings: PlaygroundSettings) -> str:
        """The status line's word on which model and skip policy each pane of a task runs."""
        policy = self.tasks.policy(settings.task, settings.target_speedup, self.get_generator())
        return policy_line(settings.task, settings.target_speedup, policy)

    def validated(self, values: dict, page: bool = True) -> Checked:
        """``checked`` for a run that starts now, or a gr.Error with the reason (before any run
        starts); ``page``: the reason is shown in the page's toast (escaped), not read by an API client."""
        try:
            checked = self.checked(values)
        except (ValueError, TypeError) as error:
            raise (page_error(error) if page else gr.Error(str(error), print_exception=False)) from None
        assert checked is not None  # load=True: the model is there
        return checked

    def checked(self, values: dict, load: bool = True, solve: bool = True) -> Checked | None:
        """The one check every model run passes (Generate, Step, the API; and the fair queue's
        admission when the job is pushed): the settings parsed once, then ``prepared``. A
        ValueError names the first problem."""
        return self.prepared(self.settings(values), load, solve)

    def prepared(self, settings: PlaygroundSettings, load: bool = True, solve: bool = True) -> Checked | None:
        """Parsed settings -> the model they run and their PreparedRun (prompts tokenized, context
        checked, schedule solved: TextGenerator.prepare), within this server's limits (``check_size``
        reads the run's ids). ``load=False``: None when a task's model is not loaded yet.
        ``solve=False`` (admission, in milliseconds): the schedule is checked, not solved."""
        generator = self.generator_for(settings, load=load)
        if generator is None:
            self.check_unloaded(settings)
            return None
        # a TL;DR policy runs in the shape it was trained in: the one this generator holds
        request = settings.request(full=False, num_layers=generator.num_layers,
                                   shape=tldr.shape_of(generator.loaded.adapter_path))
        run = generator.prepare(request, solve=solve, limits=lambda run: self.check_size(run, settings.lens, settings.task))
        return Checked(settings, generator, run)

    def check_unloaded(self, settings: PlaygroundSettings) -> None:
        """The sizes and cost of a task's job whose policy is not loaded, from a loaded model that
        tokenizes as the task's does (``TaskGenerators.sizer``): an over-limit job is refused when it
        is pushed and never loads a policy in the model lane. Its schedule is checked when it runs."""
        sizer = self.tasks.sizer(settings.task, self.get_generator())
        if sizer is not None:
            request = settings.request(full=True, num_layers=sizer.num_layers)
            sizer.sized(request, limits=lambda run: self.check_size(run, settings.lens, settings.task))

    def check_size(self, run: PreparedRun, lens: bool, task: str = "chat") -> None:
        """Refuse, before waiting for the model, a request whose compute exceeds the limits: prompt
        tokens per row, (prompt + new tokens) x batch for the whole request (the KV-cache positions
        of one stream), and the job's model time."""
        longest, limits, new_tokens = run.longest_prompt, self.limits, run.request.max_new_tokens
        if longest > limits.max_prompt_tokens:
            raise ValueError(f"the prompt is {longest} tokens; the limit is {limits.max_prompt_tokens} tokens")
        if run.positions > limits.max_request_tokens:
            raise ValueError(
                f"this request needs {run.positions} token positions (batch {run.batch} x ({run.prompt_width} "
                f"prompt + {new_tokens} new)); the limit per request is {limits.max_request_tokens}: "
                "shorten the prompt, the batch or max new tokens")
        self.check_cost(run.batch, run.prompt_width, new_tokens, lens, task)

    def check_cost(self, batch: int, prompt_tokens: int, new_tokens: int, lens: bool, task: str = "chat") -> None:
        """Refuse a job whose model time (app/serving/job_cost.py) is over the deployer's bound:
        the one lane serves everyone, so no admitted job may hold it for more than a few seconds."""
        cost = job_cost(batch, prompt_tokens, new_tokens, lens)
        limit = self.limits.max_job_cost
        if cost > limit:
            with_lens = " with the logit lens" if lens else ""
            if task == TLDR:  # the post is what a visitor can change: say so first
                raise ValueError(
                    f"the post is too long for one job here: its {prompt_tokens}-token prompt with max_new_tokens "
                    f"{new_tokens} x batch_size {batch}{with_lens} costs {cost} units of model time; the limit per job "
                    f"is {limit} units (about {limit * UNIT_SECONDS:.0f} s of the one model): shorten the post"
                    + (", lower batch_size" if batch > 1 else "") + (", or turn the lens off" if lens else ""))
            raise ValueError(
                f"max_new_tokens {new_tokens} x batch_size {batch}{with_lens} after a {prompt_tokens}-token "
                f"prompt costs {cost} units of model time; the limit per job is {limit} units (about "
                f"{limit * UNIT_SECONDS:.0f} s of the one model): lower max_new_tokens, batch_size or the prompt"
                + (", or turn the lens off" if lens else ""))

    def schedule_preview(self, values: dict):
        """The schedule plot for the current controls (no model run)."""
        try:
            settings = self.settings(values)
            figure = self.preview(settings)
        except ValueError as error:
            return gr.skip(), f"**Check the settings:** {as_markdown(error, MAX_ERROR_CHARS)}"
        return figure, ""

    def preview_shape(self, settings: PlaygroundSettings) -> tldr.TaskShape | None:
        """The shape a TL;DR run at these settings' speedup runs in: its policy's (``TaskGenerators.policy``:
        the shipped one where the general model is the default one); None for other tasks and chat."""
        if settings.task != TLDR:
            return None
        return tldr.shape_of(self.tasks.policy(TLDR, settings.target_speedup, self.get_generator()))

    def preview(self, settings: PlaygroundSettings):
        """The schedule plot, outside the queue: cached on pure inputs, and one solve at a time so
        a script looping on the preview cannot starve a generation of the CPU; a preview that cannot
        start within 2 s is refused (ValueError) rather than piling up."""
        # a task's model loads in the queue (Generate or choosing the task), never here; TL;DR's layers are the
        # general model's (its policy, where one is shipped, is the same model's)
        generator = (self.tasks.any(settings.task) or (self.get_generator() if settings.task == TLDR else None)
                     if is_task(settings.task) else self.generator_for(settings, load=False))
        if generator is None:
            raise ValueError(f"the {settings.task.upper()} schedule appears once its model has loaded")
        if not self.previewing.acquire(timeout=2.0):
            raise ValueError("the server is busy drawing other schedules; move a control again in a moment")
        try:
            return preview_figure(generator, settings.schedule_request(num_layers=generator.num_layers,
                                                                       shape=self.preview_shape(settings)),
                                  settings.max_new_tokens)
        finally:
            self.previewing.release()

    def load_note(self, waiting: int) -> str:
        """One line on how busy the server is, so a queued visitor knows what they wait for; the
        wait only while someone waits (a finished run leaves no stale estimate behind)."""
        running = self.runs.active_count()
        typical = self.runs.typical_seconds()
        if not waiting:  # no wait to estimate: a finished run leaves no stale "busy" line behind
            return "Server free: a run starts at once." if not running else "Generating; nobody is waiting."
        line = f"Server busy: {running} run(s) generating, {waiting} waiting (one model serves everyone)"
        if typical is not None:
            line += f"; a run here takes ~{typical:.0f} s, so expect to wait ~{typical * (waiting + 1):.0f} s"
        return line + "."

    def from_link(self, request: gr.Request | None = None) -> list:
        """On page load: settings named in the URL query (the API's names) set the controls;
        a bad value is named in the status line and left out. A visit without a link (gradio's own
        query parameters aside) gets the landing's settings; the page was built with its line."""
        names = PlaygroundSettings.api_names()
        query = dict(request.query_params) if request is not None and request.query_params else {}
        if not set(query) - IGNORED_QUERY:
            landing = self.landing or {}
            return [landing.get(name, gr.skip()) for name in names] + [gr.skip()]
        generator = self.get_generator()
        ranges = control_ranges(generator.num_layers, self.limits, max_layer_speedup(generator.num_layers, 1))
        values, problems = settings_from_query(query, self.limits, page_defaults(generator, self.limits), ranges)
        lesson, start, lesson_problem = lesson_in_query(query, len(LESSONS))
        problems = "; ".join(problem for problem in (lesson_problem, problems) if problem)
        # The query is anyone's text: escaped for the Markdown status line (app/page/shown_text.py).
        if problems:
            status = f"**The link has a problem:** {as_markdown(problems, len(problems))}"
        elif lesson is not None:
            status = lesson_loaded_line(lesson, start)
        else:
            status = "Settings loaded from the link."
        if lesson is not None:  # the lesson's controls (within a deployer's limits), then what else the link names
            controls = lesson_values(LESSONS[lesson], trained_defaults(generator))
            values = controls | within_limits(controls, self.limits) | values
        return [values.get(name, gr.skip()) for name in names] + [status]

    def lesson_from_link(self, request: gr.Request | None = None) -> tuple:
        """On page load, after ``from_link``: (the lesson a link names for the lessons list, or a skip;
        whether the link starts it: ``?lesson=N&run=1``)."""
        query = dict(request.query_params) if request is not None and request.query_params else {}
        lesson, start, problem = lesson_in_query(query, len(LESSONS))
        if lesson is None or problem:
            return gr.skip(), False
        return LESSONS[lesson].title, start

    def lesson_share(self, page: str, title: str) -> tuple[str, str]:
        """(link, QR code html) that opens the lesson ``title`` and runs it: the whole class opens
        one link from the projector and the lesson starts on every page."""
        if not isinstance(page, str) or not page.strip():  # said where the link goes, not as an error
            return "", no_page_address()
        number = next((i for i, lesson in enumerate(LESSONS, 1) if lesson.title == title), 1)
        link = lesson_link(page, number, start=True)
        return link, qr_html(link, caption=f"Scan to open and run the lesson {as_html(LESSONS[number - 1].title)}")

    def share(self, page: str, values: dict) -> tuple[str, str]:
        """(link, QR code html) of the current settings: only those that differ from the page's
        defaults, so the link stays short enough to type from a projector."""
        if not isinstance(page, str) or not page.strip():  # said where the link goes, not as an error
            return "", no_page_address()
        try:
            link = share_link(page, values, page_defaults(self.get_generator(), self.limits), self.limits)
        except ValueError as error:
            raise page_error(f"cannot share these settings: {error}") from None
        return link, qr_html(link)

    # --- streaming generation ---------------------------------------------------------------
    def generate(self, values: dict, request: gr.Request | None = None, notice: str = "") -> Iterator[tuple]:
        """Stream both outputs side by side: (status, skip html, full text, stats, heatmap json)."""
        try:
            checked = self.validated(values)
        except gr.Error:
            self.no_batch_job()
            raise
        settings = checked.settings
        if is_task(settings.task) and not notice:  # say which model each pane runs
            notice = self.policy_line(settings)
        session = session_key(request)
        self.runs.steppers.pop(session, None)  # a Step after this run starts afresh
        handle = self.runs.start(session)
        gone = self.client_gone()
        try:
            if handle.cancelled:  # Stop was pressed while this run waited in the queue
                self.no_batch_job()
                yield ("Stopped.",) + NO_CHANGE[1:]
                return
            yield from self._stream(checked, handle, notice, gone)
        finally:
            self.runs.finish(session, handle)

    def load_task(self, values: dict) -> str:
        """Choosing a task (queued, in the model lane): load its model for the current speedup now,
        so the first Generate does not wait for it; the status line says what each pane runs."""
        try:  # the prompt box may not hold the task's input yet: Generate names that problem, loading does not need it
            settings = self.settings(values | {"prompt": STAND_IN_INPUT.get(str(values.get("task")), "x")})
            if not is_task(settings.task):
                return "General chat: the general model and its skip policy."
            self.generator_for(settings)
        except ValueError as error:
            return f"**{as_markdown(error)}**"
        return self.policy_line(settings)

    def arm(self, request: gr.Request | None = None) -> None:
        """A Generate click, before its run joins the queue (outside the queue, at once): a Stop
        pressed while the run waits ends it as it starts."""
        self.runs.arm(session_key(request))

    def request_restart(self, request: gr.Request | None = None) -> bool:
        """Speedup/decay moved (runs outside the queue, at once): if this session is generating,
        end that run at its next step, which frees the model lane for the restart."""
        session = session_key(request)
        if not self.runs.is_running(session):
            return False
        self.runs.cancel(session, reason="restart")
        return True

    def restart_if_running(self, restart: bool, values: dict, request: gr.Request | None = None) -> Iterator[tuple]:
        """Second half of a settings change: restart both streams with the new setting."""
        if not restart:
            self.no_batch_job()
            yield NO_CHANGE  # nothing was running: leave the outputs as they are
            return
        notice = (f"Settings changed while generating: restarted both streams at "
                  f"{as_markdown(values['target_speedup'], 20)}x, {as_markdown(values['decay'], 20)} decay.")
        yield from self.generate(values, request, notice)

    def leave(self, request: gr.Request) -> None:
        """A closed tab: cancel that session's run (the decoder stops at its next step)."""
        self.runs.cancel(session_key(request))

    def stop(self, request: gr.Request | None = None) -> str:
        self.runs.cancel(session_key(request))
        return "Stopped."

    def _stream(self, checked: Checked, handle: RunHandle, notice: str, gone: Callable[[], bool] | None = None):
        """The page's stream: one message per frame (app/serving/frames.py), each drawing every step since
        the one before (the panes and the heatmap are drawn from the whole race so far)."""
        renderer, plot_clock, frame_clock = RaceRenderer(checked.settings), FrameClock(HEATMAP_EVERY_S), FrameClock()
        status = notice or "Generating… SkipDecode and the full model take turns; each advances by its own measured step time."
        runner = checked.generator.loaded.graph_runner  # CUDA graphs (model/loading.py with_cuda_graphs), or None
        before = runner.report() if runner is not None else None
        update: RaceUpdate | None = None
        unsent = False  # steps raced since the last message
        try:
            for update in self.race_of(checked, cancel_when_gone(handle, gone)):
                frame_clock.every_s = frame_interval(update)
                unsent = not frame_clock.due(last=update.done)
                if not unsent:
                    shown = preparing_line(before, runner.report()) + status if runner is not None else status
                    if self.preparing_gpu.is_set():
                        shown = GPU_PREPARING + shown
                    yield renderer.outputs(shown, update, with_plot=plot_clock.due(last=update.done))
        except ValueError as error:  # e.g. a prompt over the context, found at encoding time
            raise page_error(error) from None
        if update is None:
            return
        if handle.reason == "restart":  # the new run writes the status; this run's last message changes nothing
            yield NO_CHANGE  # (gradio's completion message repeats the last values: the whole heatmap, megabytes)
            return
        final = "Stopped." if handle.cancelled else (notice + " " if notice else "") + "**Done.**"
        if runner is not None:
            final += prepared_line(before, runner.report())
        # A stopped run's last frame: the steps it raced since its last message are drawn too.
        yield renderer.outputs(final, update, with_plot=True) if unsent else (final,) + NO_CHANGE[1:]

    def race_of(self, checked: Checked, should_cancel: Callable[[], bool]) -> Iterator[RaceUpdate]:
        """A Generate's or an API job's race: through the batcher where one is installed (shared with the
        waiting jobs of its kind, app/serving/batcher.py), else alone, as step mode always runs."""
        if self.batcher is None:
            return checked.race(should_cancel=should_cancel, compute_lock=self.compute)
        settings, generator, run = checked.settings, checked.generator, checked.run
        ticket = Ticket(generator, run, settings.schedule_request(full=True, num_layers=generator.num_layers),
                        checked.race, shareable=not settings.lens, should_cancel=should_cancel)
        return self.batcher.race(ticket)

    # --- step mode --------------------------------------------------------------------------
    def step(self, values: dict, request: gr.Request | None = None) -> tuple:
        """Advance SkipDecode and the full model by one token each; say which layers ran.
        Returns the five stream outputs and the schedule plot with this step marked."""
        session = session_key(request)
        try:
            settings = self.settings(values)
            current = self.runs.steppers.get(session)
            if current is None or current[0] != settings:
                current = self._step_session(session, settings, request)
            _, iterator, renderer = current
            update = next(iterator, None)
        except ValueError as error:
            raise page_error(error) from None
        if update is None:
            self.runs.steppers.pop(session, None)
            return ("**Both outputs are complete.** Press Step again to start over.",) + NO_CHANGE[1:] + (gr.skip(),)
        skip = update.skip
        layers = skip.step_layers[-1] if skip.step_layers else skip.prefill_layers
        position = len(update.prompt.texts) + max(0, len(skip.step_layers) - 1)
        which = (f"prefill (the prompt, up to position {position - 1})" if not skip.step_layers
                 else f"step {len(skip.step_layers) - 1} (position {position})")
        status = (f"{which}: SkipDecode ran {len(layers)}/{update.num_layers} layers "
                  f"{layer_ranges(layers)}; the full model ran all {update.num_layers}.")
        schedule = schedule_figure(update.solved, show_steps=settings.max_new_tokens,
                                   current_step=len(skip.step_layers) - 1 if skip.step_layers else None)
        return renderer.outputs(status, update, with_plot=True, step_mode=True) + (schedule,)

    def reset_steps(self, request: gr.Request | None = None) -> tuple:
        """Forget this session's step run and clear the panes, the figures and the heatmap."""
        self.runs.steppers.pop(session_key(request), None)
        return ("Step mode reset: press Step to start again.",) + ("",) * (STREAM_OUTPUTS - 1)

    def _step_session(self, session: str, settings: PlaygroundSettings, request: gr.Request | None) -> tuple:
        """A new step-mode run of these settings, kept for the session (bounded in KV-cache positions
        and bytes): (settings, its lockstep race, its renderer)."""
        checked = self.prepared(settings)
        assert checked is not None  # load=True: the model is there
        positions = 2 * checked.run.positions  # both streams keep a KV cache
        nbytes = session_bytes(checked.generator.loaded.model.config, positions, settings.max_new_tokens,
                               settings.lens)
        current = (settings, self._lockstep(checked, self.compute), RaceRenderer(settings))
        self.runs.steppers.put(session, current, positions, self.address_of(request), nbytes)
        return current

    @staticmethod
    def _lockstep(checked: Checked, compute) -> Iterator[RaceUpdate]:
        """Yield once both streams made one more step (a finished stream just waits)."""
        for update in checked.race(lockstep=True, compute_lock=compute):
            if update.moved == "full" or update.full.done:
                yield update

    # --- batch view -------------------------------------------------------------------------
    def batch_view(self, target_speedup: float, decay: str, request: gr.Request | None = None):
        try:
            settings = self.settings(dict(prompt=EXAMPLE_PROMPTS[0], target_speedup=target_speedup, decay=decay,
                                          batch_size=4, max_new_tokens=12))
            generator = self.get_generator()
            result = generator.generate(settings.request(full=False))
        except ValueError as error:
            raise page_error(error) from None
        depths = [len(result.decode.prefill_layers)] + result.layers_per_step
        rows = [TokenTexts(generator.text).update(ids) for ids in result.decode.tokens]
        lines = "\n".join(f"{i}. **{p}** → {one_line(o)}" for i, (p, o) in enumerate(zip(result.prompts, result.outputs), 1))
        return explainer.batch_view_figure(rows, depths, generator.num_layers), lines

    # --- the public API ---------------------------------------------------------------------
    async def api_stream_async(self, values: dict, request: gr.Request | None = None) -> AsyncIterator[dict]:
        """``api_stream`` for gradio: each step runs in a worker thread. When the client cancels the
        job (gradio cancels this coroutine) the run's handle is cancelled FIRST and the worker thread
        is abandoned, not awaited: the decoder stops within one layer, even inside a long prefill,
        and the next run waits for that layer on ``self.compute``. A dropped connection cancels the
        run the same way (the decoder's cancel check reads the client's liveness)."""
        run_key = f"{session_key(request)}:api:{uuid.uuid4().hex}"
        handle = self.runs.start(run_key)
        stream = self.api_stream(values, request, run=(run_key, handle), gone=self.client_gone())
        finished = object()
        try:
            while True:
                message = await anyio.to_thread.run_sync(next, stream, finished, abandon_on_cancel=True)
                if message is finished:
                    return
                yield message
        finally:
            if not handle.cancelled:
                handle.cancel("the client cancelled the job")
            self.runs.finish(run_key, handle)

    def api_stream(self, values: dict, request: gr.Request | None = None,
                   run: tuple[str, RunHandle] | None = None, gone: Callable[[], bool] | None = None) -> Iterator[dict]:
        """The API's stream: one message per frame (app/serving/frames.py: the steps since the previous
        message, at most 20 messages a second), the last with "done": true. Each message has the
        texts so far and the live figures; the steps come as deltas (``new_steps``: every step of
        both streams since the previous message, in the order they ran, with its tokens, layers and
        seconds; ``new_step_layers``: SkipDecode's decode steps' layers) and whole (``step_layers``,
        ``layers_per_step``, and with lens=true the ``lens``) in the last message only, so a long
        batch job streams a few kilobytes per frame, not its whole state. Every request is its own run (two submits from one
        client never cancel each other); a cancelled run ends with a message that says so
        ("cancelled": true and the reason)."""
        if run is None:
            run_key = f"{session_key(request)}:api:{uuid.uuid4().hex}"
            run = (run_key, self.runs.start(run_key))
        run_key, handle = run
        try:
            checked = self.validated(values, page=False)
        except gr.Error:
            self.runs.finish(run_key, handle)
            self.no_batch_job()
            raise
        settings = checked.settings
        light = replace(settings, lens=False)  # the lens is sent once, in the last message
        update, sent, clock, steps = None, 0, FrameClock(), NewSteps()
        try:
            for update in self.race_of(checked, cancel_when_gone(handle, gone)):
                steps.add(update)
                clock.every_s = frame_interval(update)
                if update.done:
                    yield api_message(update, settings) | {"new_steps": steps.take()}
                elif clock.due():
                    message, sent = delta_message(api_message(update, light), sent)
                    yield message | {"new_steps": steps.take()}
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from None
        finally:
            self.runs.finish(run_key, handle)
        if handle.cancelled and update is not None and not update.done:
            yield {**api_message(update, settings), "new_steps": steps.take(), "cancelled": True,
                   "error": f"the run was cancelled ({handle.reason})"}

    # --- a click's checks, on the page --------------------------------------------------------
    def refusal(self, values: dict, request: gr.Request | None = None) -> tuple:
        """A Generate or lesson click's checks before its job is pushed (``click_refusal``); a click that
        passes tells the batcher its job is coming (``Batcher.announce``: it reaches the batcher ~0.3 s
        later, and a class's batch being gathered waits for it)."""
        status, allowed = self.click_refusal(values, request)
        session = getattr(request, "session_hash", None)  # without one, no push will ever match it
        if allowed and self.batcher is not None and session:
            self.batcher.announce(session)
        return status, allowed

    def click_refusal(self, values: dict, request: gr.Request | None = None) -> tuple:
        """A Generate, Step or lesson click's checks before its job is pushed (outside the queue, in
        milliseconds: the same checks as the push's, ``admission_problem``, and the queue's own):
        (status line, True) to go on, or (the reason on the status line, False). A push the queue
        refuses shows nothing on the page, so the page asks first and says the server's words."""
        problem = self.admission_problem("generate", values)
        reason = problem[1] if problem is not None else self.queue_refusal(request)
        if reason is None:
            return gr.skip(), True
        return refusal_line(reason), False

    def step_refusal(self, values: dict, request: gr.Request | None = None) -> tuple:
        """``click_refusal`` for a Step click (a step runs in the model lane: nothing to announce); an accepted
        first step (or the first after a settings change) says at once what it waits for: both models read
        the prompt before the first token."""
        status, allowed = self.click_refusal(values, request)
        if not allowed:
            return status, allowed
        current = self.runs.steppers.get(session_key(request))
        if current is not None and current[0] == self.settings(values):
            return gr.skip(), True
        return ("Step mode: both models read the prompt first (its prefill, a few seconds on a CPU), then each "
                "Step advances one token. A click while a step computes waits for it."), True

    def no_batch_job(self) -> None:
        """A batch-lane handler ends without handing the batcher a job: it stops waiting for one."""
        if self.batcher is not None:
            self.batcher.came_without_job()

    def pushed(self, lane: str | None, session: str | None = None, api_name: str | None = None) -> None:
        """The fair queue admitted a job of ``lane`` for ``session``: one of the batch lane is on its way to
        the batcher (it gathers a class's clicks; a page's click it was told of at its checks counts once).
        A restart (a settings change's push, ``ui_restart_``) counts on its own: it must not take the place
        of the same page's announced click, whose push may come after it."""
        if self.batcher is not None and lane == BATCH_LANE:
            restart = (api_name or "").startswith(RESTART_RUNS)
            self.batcher.expect(None if restart else session)

    # --- admission (the fair queue asks when a job is pushed) -------------------------------------
    def admission_problem(self, api_name: str, values: dict) -> tuple[str, str] | None:
        """(parameter, message) when a job that runs the model asks for settings or sizes over a
        limit; None to admit it. The same check as the run's (``checked``), when the job is pushed
        and in milliseconds (the schedule checked over one step, not solved), so it is refused at
        once instead of after waiting for the model; a task whose policy is not loaded yet is sized
        and costed from a model with its tokenizer (``check_unloaded``), its schedule checked when
        its job starts."""
        if not api_name.startswith(MODEL_RUNS):
            return None
        try:
            self.checked(values, load=False, solve=False)
        except (ValueError, TypeError) as error:
            return parameter_named(str(error)), str(error)
        return None


GPU_WARM_UP_PROMPT = "Explain how a bicycle gear works."  # the chat page's first run, prepared at start
GPU_PREPARING = ("The server is preparing the GPU for its first runs (compiling each kind of layer once, "
                 "capturing the default schedule's CUDA graphs): runs now wait between its steps. ")

RESTART_RUNS = "ui_restart_"  # api names (prefix) of a settings change's restart
MODEL_RUNS = ("generate", "ui_generate", "ui_step", RESTART_RUNS)  # api names (prefixes) of model runs


def preparing_line(before: CaptureReport | None, now: CaptureReport) -> str:
    """While a run captures CUDA graphs (a layer set's first step on this server), the status line says
    so: the first runs are slower, not stuck. Empty once every layer set it meets has its graph."""
    graphs, seconds = _captured_since(before, now)
    if not graphs:
        return ""
    return (f"Preparing the GPU: {_compiles(before, now)}{_graph_count(graphs)}, {seconds:.1f} s (once per layer set; "
            "later steps and runs replay them). ")


def prepared_line(before: CaptureReport | None, now: CaptureReport) -> str:
    """A finished run's word on the graphs it captured (nothing when it only replayed)."""
    graphs, seconds = _captured_since(before, now)
    if not graphs:
        return ""
    return (f" This run prepared the GPU: {_compiles(before, now)}{_graph_count(graphs)} captured in {seconds:.1f} s; "
            "later runs replay them.")


def _compiles(before: CaptureReport | None, now: CaptureReport) -> str:
    """"2 layers compiled (41.0 s), ": the compiled layers' share of a capture, where there is one."""
    count = now.compiled - (before.compiled if before else 0)
    if count <= 0:
        return ""
    seconds = now.compile_seconds - (before.compile_seconds if before else 0.0)
    return f"{count} kind{'s' if count != 1 else ''} of layer compiled ({seconds:.1f} s), "


def _graph_count(graphs: int) -> str:
    return f"{graphs} CUDA graph{'s' if graphs != 1 else ''}"


def _captured_since(before: CaptureReport | None, now: CaptureReport) -> tuple[int, float]:
    if before is None:
        return now.graphs, now.seconds
    return now.graphs - before.graphs, now.seconds - before.seconds


@lru_cache(maxsize=64)
def preview_figure(generator: TextGenerator, request, max_new_tokens: int):
    return schedule_figure(generator.schedules.schedule_for(request, max_new_tokens))


def no_page_address() -> str:
    """Where the QR code goes, when a share button's call came without the page's address."""
    return '<div class="qr">No link: this page\'s address did not come with the request (the page\'s script sends it).</div>'


def lesson_loaded_line(lesson: int, start: bool) -> str:
    """The status line of a page opened from a lesson's link."""
    title = as_markdown(LESSONS[lesson].title)
    then = "running it now." if start else "press **Run this lesson** to start it."
    return f"Lesson {lesson + 1}, *{title}*, loaded from the link: {then}"


REFUSED = "Not run:"  # a refusal's status line starts so (the page's script then turns Stop off)


def refusal_line(reason: object) -> str:
    """A refused click's status line: the server's own words, escaped, on one readable line."""
    return f"**{REFUSED}** {as_markdown(reason, MAX_ERROR_CHARS)}"


def page_error(error: object) -> gr.Error:
    """A refusal for the page's toast, which renders its message as (sanitised) HTML: the message
    may quote the visitor's own value, so it is escaped and capped."""
    return gr.Error(as_html(error, MAX_ERROR_CHARS), print_exception=False)


def cancel_when_gone(handle: RunHandle, gone: Callable[[], bool] | None) -> Callable[[], bool]:
    """The decoder's cancel check: the run's handle, which the client going away also cancels."""
    def should_cancel() -> bool:
        if not handle.cancelled and gone is not None and gone():
            handle.cancel("the client went away")
        return handle.cancelled
    return should_cancel


def delta_message(message: dict, sent: int) -> tuple[dict, int]:
    """An intermediate API message without the whole per-step lists, with the layers of the steps
    not sent before as ``new_step_layers``; and the number of steps sent so far."""
    steps = message.pop("step_layers")
    message.pop("layers_per_step")
    return {**message, "new_step_layers": steps[sent:]}, len(steps)


def parameter_named(message: str) -> str:
    """The setting a refusal names, for gradio_client's message: the API name that comes first in
    it as a whole word ("order must be one of warmup_top, ..." names order, not warmup)."""
    found = [(match.start(), name) for name in PlaygroundSettings.api_names()
             for match in [re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", message)] if match]
    return min(found)[1] if found else "settings"
