"""The playground's settings: ONE list of fields. Each field's metadata carries its label, range
and help; validation, the UI controls, the event wiring and the API all read this list.

Adding a control = one field here + one layout line in app/ui.py that calls controls.control(name).
Two controls are still built by hand in ui.py (seed, a plain number box, and order, a radio whose
choices carry their descriptions); their fields here still drive validation, wiring and the API.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from app.serving.job_cost import DEFAULT_MAX_JOB_COST
from app.tasks import TASK_LABELS, TLDR, examples, post_examples, tldr_shape
from model.common.checks import check_bool, check_choice, check_int, check_number
from model.generation.runs import GenerationRequest
from model.generation.schedules import ScheduleRequest
from model.skipdecode.decoder import SamplingConfig
from model.skipdecode.schedule import DECAY_FUNCTIONS, DEFAULT_WARMUP, LAYER_ORDERS, RANKED
from model.tasks import tldr
from model.tasks.e2e import PlaceSwap, delexicalise_places, place_swaps, task_prompt, training_places
from model.tasks.task_models import task_schedule

# Each checked with the full model (greedy, 48 tokens): a fluent answer, no loops
# (tests/model/test_default_model.py guards this). The first is the default prompt.
EXAMPLE_PROMPTS = [
    "What is photosynthesis?",
    "Why do we have seasons?",
    "What are the benefits of exercise?",
    "Explain what a computer does.",
    "Write a Python function that reverses a string.",
    "List five animals that live in the ocean.",
    "Write a short story about a robot who learns to paint.",
    "What is the capital of France?",
]

MAX_SEED = 2**63 - 1
PAGE_TEXT_SLACK = 4  # Limits.max_page_text_chars: the prompt box holds this many times the prompt's limit


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (deployers set these through app.py's environment)."""

    max_new_tokens: int = 256
    max_batch_size: int = 8
    max_prompt_chars: int = 8000
    max_prompt_tokens: int = 2048  # per row, after the chat template
    max_request_tokens: int = 8192  # batch x (prompt + new tokens): one request's compute budget
    max_step_positions: int = 32768  # KV-cache positions all step-mode sessions keep together (both streams)
    max_step_bytes: int = 1 << 30  # memory all step-mode sessions keep together (estimated: app/serving/job_cost.py)
    max_step_sessions_per_address: int = 4  # step sessions one network address keeps (its oldest go first)
    max_job_cost: int = DEFAULT_MAX_JOB_COST  # one job's model time in units of app/serving/job_cost.py: ~4 s of the one lane

    @property
    def max_page_text_chars(self) -> int:
        """The longest text the page's prompt box holds and a page event may carry (the request guard):
        a few times the prompt's limit, so an over-long paste reaches the checks that name its length
        on the page instead of being refused unseen by the guard."""
        return PAGE_TEXT_SLACK * self.max_prompt_chars


def setting(default: Any, *, label: str, help: str = "", kind: str = "number", low: float | None = None,
            high: float | str | None = None, step: float | None = None, choices: tuple[str, ...] = (),
            integer: bool = False, api: bool = True):
    """A settings field. ``high`` may name a Limits attribute (the deployer's limit); ``api=False``
    for a view-only control the public API leaves out."""
    return field(default=default, metadata=dict(label=label, help=help, kind=kind, low=low, high=high, step=step,
                                                 choices=choices, integer=integer, api=api))


def _delexicalised(mrs: list[str]) -> list[PlaceSwap]:
    """``mrs`` delexicalised; each as it is where it cannot be (an MR the task refuses says why
    elsewhere, and without the E2E data there are no known places to swap in)."""
    try:
        known = training_places()
    except (OSError, ValueError):
        return place_swaps(mrs, None)
    swaps = []
    for mr in mrs:
        try:
            swaps.append(delexicalise_places(mr, known))
        except ValueError:
            swaps.append(PlaceSwap(mr))
    return swaps


@dataclass(frozen=True)
class PlaygroundSettings:
    """Every control of the playground, validated and normalised (build with ``from_values``).
    Field order = the public API's parameter order (README, "API", and docs/SERVING.md document it)."""

    prompt: str = setting("", label="Prompt", kind="text")
    target_speedup: float = setting(2.0, label="Target layer speedup", low=1.0, high=1000.0, step=0.1,
                                    help="layers of the full model per layer SkipDecode runs; 1 = no skipping")
    decay: str = setting("linear", label="Decay function", kind="choice", choices=DECAY_FUNCTIONS)
    warmup: int = setting(DEFAULT_WARMUP, label="Warmup layers (always run)", low=0, high=1000, integer=True)
    max_new_tokens: int = setting(48, label="Max new tokens", low=1, high="max_new_tokens", integer=True)
    temperature: float = setting(0.0, label="Temperature (0 = greedy)", low=0.0, high=10.0, step=0.05)
    top_p: float = setting(1.0, label="Top-p", low=1e-6, high=1.0, step=0.05)
    seed: int = setting(0, label="Seed", low=0, high=MAX_SEED, integer=True)
    batch_size: int = setting(1, label="Batch size (row 0 is your prompt, others are examples)", low=1,
                              high="max_batch_size", integer=True)
    min_layers: int = setting(0, label="Min layers (0 = solver)", low=0, high=1000, integer=True)
    max_layers: int = setting(0, label="Max layers (0 = solver)", low=0, high=1000, integer=True)
    decay_length: int = setting(0, label="Decay length D (0 = max new tokens)", low=0, high=100000, integer=True)
    order: str = setting("warmup_top", label="Layer order", kind="choice", choices=(*LAYER_ORDERS, RANKED))
    prompt_at_full_depth: bool = setting(True, label="Prompt at full depth", kind="bool")
    skip_policy: bool = setting(True, label="Skip-policy adapter on", kind="bool",
                                help="off: the untouched model skips the same layers (see why fine-tuning matters)")
    show_template: bool = setting(False, label="Show the chat template in the heatmap", kind="bool", api=False)
    lens: bool = setting(False, label="Logit lens (hover a heatmap cell: top-5 next tokens after that layer)",
                         kind="bool", help="costs a little time between steps; not counted in tokens/s")
    lens_kl: bool = setting(False, label="Colour the heatmap by the lens's KL to the full model (with the lens; "
                            "drawn when the run ends)", kind="bool", api=False)
    # Last: the API's earlier parameters keep their positions. A task (model/tasks) replaces both
    # models, the prompt's format and the schedule (app/tasks.py says which controls it fixes).
    task: str = setting("chat", label="Task", kind="choice", choices=tuple(TASK_LABELS),
                        help="chat: the general model; e2e: the paper's E2E task (the prompt is an MR); tldr: "
                             "Reddit TL;DR (the prompt is a post: its title on the first line, the post under it)")

    # --- the schema -------------------------------------------------------------------------
    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def api_names(cls) -> tuple[str, ...]:
        """The public API's parameters, in schema order (view-only controls left out)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata["api"])

    @classmethod
    def meta(cls, name: str) -> dict:
        return next(f.metadata for f in dataclasses.fields(cls) if f.name == name)

    @classmethod
    def from_values(cls, limits: Limits, **values) -> "PlaygroundSettings":
        """The same rules for the UI and the API: every value checked, or a ValueError naming it."""
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}; the settings are {', '.join(cls.names())}")
        checked = {}
        for spec in dataclasses.fields(cls):
            value = values.get(spec.name, spec.default)
            meta = spec.metadata
            if meta["kind"] == "text":
                checked[spec.name] = clean_prompt(value, limits, EMPTY_PROMPT.get(str(values.get("task")), EMPTY))
            elif meta["kind"] == "choice":
                checked[spec.name] = check_choice(spec.name, value, meta["choices"])
            elif meta["kind"] == "bool":
                checked[spec.name] = check_bool(spec.name, value)
            else:
                high = getattr(limits, meta["high"]) if isinstance(meta["high"], str) else meta["high"]
                check = check_int if meta["integer"] else check_number
                checked[spec.name] = check(spec.name, value, low=meta["low"], high=high, text=True)
        return cls(**checked)

    # --- what the settings ask the library for ----------------------------------------------
    def prompts(self) -> tuple[str, ...]:
        """What the model sees. Row 0 is the user's prompt; further rows take example prompts (a
        real, mixed batch). A task wraps each MR in its fixed instruction (test-set MRs as the rows),
        its places delexicalised (place_swaps)."""
        if self.task == "chat":
            others = [p for p in EXAMPLE_PROMPTS if p != self.prompt]
            return (self.prompt, *others[: self.batch_size - 1])
        if self.task == TLDR:
            return tuple(tldr.task_prompt(post) for post in self.posts())
        return tuple(task_prompt(swap.mr) for swap in self.place_swaps())

    def posts(self) -> tuple[tldr.TldrPost, ...]:
        """TL;DR's rows: the visitor's post (a ValueError says what it lacks), then test-set example posts;
        none for another task."""
        if self.task != TLDR:
            return ()
        post = tldr.parse_post(self.prompt)
        others = [other for other in post_examples() if (other.title, other.post) != (post.title, post.post)]
        return (post, *others[: self.batch_size - 1])

    def place_swaps(self) -> tuple[PlaceSwap, ...]:
        """Per row of a task's batch: its MR with every place the task model never trained on
        swapped for one it did (the E2E challenge baseline's delexicalisation: a skip policy's few
        late layers copy a new name badly, and so would lose the fact for a reason that is not the
        schedule's), and how to write each back in the text shown. Chat: none."""
        return self._place_swaps

    @functools.cached_property
    def _place_swaps(self) -> tuple[PlaceSwap, ...]:  # every streamed update reads it: made once
        if self.task == "chat":
            return tuple(PlaceSwap(prompt) for prompt in self.prompts())
        if self.task == TLDR:  # a post names no places to swap
            return ()
        others = [mr for mr in examples() if mr != self.prompt.strip()]
        return tuple(_delexicalised([self.prompt.strip(), *others[: self.batch_size - 1]]))

    def schedule_request(self, full: bool = False, num_layers: int | None = None,
                         shape: tldr.TaskShape | None = None) -> ScheduleRequest:
        """The schedule these settings ask for. A task's is the one its policies were trained on
        (task_schedule: it needs the model's ``num_layers``); its fixed controls are not read (TL;DR
        keeps the prompt's depth: app/tasks.py KEPT_BY_TASK; its ``shape`` is the running policy's,
        ``tldr.shape_of``; None: the shipped policy's at the speedup)."""
        if self.task != "chat":
            if num_layers is None:
                raise ValueError("a task's schedule needs the model's number of layers")
            if self.task == TLDR:
                return tldr.task_schedule(self.target_speedup, num_layers, full=full, skip_policy=self.skip_policy,
                                          prompt_at_full_depth=self.prompt_at_full_depth,
                                          shape=shape or tldr_shape(self.target_speedup))
            return task_schedule(self.task, self.target_speedup, num_layers, full=full, skip_policy=self.skip_policy)
        return ScheduleRequest(
            target_speedup=self.target_speedup, decay=self.decay, warmup=self.warmup,
            min_layers=self.min_layers or None, max_layers=self.max_layers or None,
            decay_length=self.decay_length or None, order=self.order,
            prompt_at_full_depth=self.prompt_at_full_depth, full=full, skip_policy=self.skip_policy,
        )

    def request(self, full: bool, num_layers: int | None = None,
                shape: tldr.TaskShape | None = None) -> GenerationRequest:
        # a task decodes greedily, as its policies were trained and evaluated
        sampling = (SamplingConfig(temperature=self.temperature, top_p=self.top_p, seed=self.seed)
                    if self.task == "chat" else SamplingConfig())
        return GenerationRequest(prompts=self.prompts(), schedule=self.schedule_request(full, num_layers, shape),
                                 max_new_tokens=self.max_new_tokens, sampling=sampling,
                                 stop=tldr.STOP if self.task == TLDR else ())  # a TL;DR is one line


def trained_defaults(generator) -> dict:
    """The defaults that depend on the loaded skip policy: the placement it was trained for
    (warmup and layer order). The app's controls and the API start from these."""
    return {"warmup": generator.schedules.default_warmup, "order": generator.schedules.default_order}


def control_ranges(num_layers: int, limits: Limits, top_speedup: float) -> dict[str, tuple[float, float]]:
    """Each slider's range on the page (narrower than what the API accepts). The controls are
    built with these, and a shared link may only set a value inside them."""
    return {
        # up to 5x: the E2E task ships a policy for each of 2x, 3x, 4x and 5x (the paper's table)
        "target_speedup": (1.0, round(min(5.0, top_speedup), 2)), "warmup": (0, num_layers - 2),
        "decay_length": (0, limits.max_new_tokens), "min_layers": (0, num_layers), "max_layers": (0, num_layers),
        "batch_size": (1, limits.max_batch_size), "max_new_tokens": (1, limits.max_new_tokens),
        "temperature": (0.0, 2.0), "top_p": (0.05, 1.0),
    }


def page_defaults(generator, limits: Limits | None = None) -> dict:
    """What the page shows before anyone touches it: the schema's defaults, the loaded skip
    policy's placement, and the first example prompt. A shared link leaves these out. Under a
    deployer's ``limits`` lower than a default (SKIPDECODE_MAX_NEW_TOKENS=16), the default is the
    limit: a share link of an untouched page must still pass the settings check."""
    defaults = {spec.name: spec.default for spec in dataclasses.fields(PlaygroundSettings)}
    if limits is not None:
        defaults |= within_limits(defaults, limits)
    return defaults | trained_defaults(generator) | {"prompt": EXAMPLE_PROMPTS[0]}


def lowered_defaults(generator, limits: Limits) -> dict:
    """The page's defaults that a deployer's limit lowers (the controls start at the limit)."""
    return within_limits(page_defaults(generator), limits)


def within_limits(values: dict, limits: Limits) -> dict:
    """The settings of ``values`` whose upper bound is a deployer's limit, lowered to it."""
    lowered = {}
    for spec in dataclasses.fields(PlaygroundSettings):
        high = spec.metadata["high"]
        if isinstance(high, str) and spec.name in values:
            lowered[spec.name] = min(values[spec.name], getattr(limits, high))
    return lowered


def parse_settings(limits: Limits, prompt, **values) -> PlaygroundSettings:
    """PlaygroundSettings.from_values with the prompt first (the common call)."""
    return PlaygroundSettings.from_values(limits, prompt=prompt, **values)


# --- the prompt (every other value: model/common/checks.py, the checks every entry point uses) ---


EMPTY = "the prompt is empty: type something for the model to continue"
EMPTY_PROMPT = {TLDR: "the post is empty: write its title on the first line, the post under it"}  # by task


def clean_prompt(prompt, limits: Limits, empty: str = EMPTY) -> str:
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be text; got {type(prompt).__name__}")
    if len(prompt) > limits.max_prompt_chars:  # before any pass over a pasted novel
        raise ValueError(f"the prompt is {len(prompt)} characters; the limit is {limits.max_prompt_chars}")
    # Lone surrogates cannot be encoded; control characters (except newline/tab) are noise.
    prompt = prompt.encode("utf-8", "replace").decode("utf-8")
    prompt = "".join(ch for ch in prompt if ch in "\n\t" or ch.isprintable())
    if not prompt.strip():
        raise ValueError(empty)
    if len(prompt) > limits.max_prompt_chars:
        raise ValueError(f"the prompt is {len(prompt)} characters; the limit is {limits.max_prompt_chars}")
    return prompt
