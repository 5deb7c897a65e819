"""The playground's logic, free of gradio: settings -> requests -> a side-by-side race -> views.

SkipDecode and the full model share one device, so they cannot both run flat out at once
without slowing each other. They are interleaved step by step instead, and the stream that has
used LESS measured compute time goes next. The race on screen therefore shows each at its own
measured speed (the faster one pulls ahead), and the tokens/s figures are measured per stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

from app.figures import layer_heatmap, tokens_by_depth_html
from model.decoder import SamplingConfig, StepEvent
from model.generation import GenerationRequest, GenerationResult, ScheduleRequest, TextGenerator
from model.schedule import DECAY_FUNCTIONS, DEFAULT_WARMUP, LAYER_ORDERS, CostModel, SolvedSchedule, cost_speedup

EXAMPLE_PROMPTS = [
    "Name three colours.",
    "Explain why the sky is blue in two sentences.",
    "Write a haiku about autumn.",
    "Give me three tips for learning to cook.",
    "What is the capital of France?",
    "Write a short story about a robot who learns to paint.",
    "Write a Python function that reverses a string.",
    "List five animals that live in the ocean.",
]


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (deployers set these; see app/limits in the README)."""

    max_new_tokens: int = 256
    max_batch_size: int = 8
    max_prompt_chars: int = 8000


@dataclass(frozen=True)
class PlaygroundSettings:
    """Every control of the playground, validated and normalised."""

    prompt: str
    target_speedup: float = 2.0
    decay: str = "linear"
    warmup: int = DEFAULT_WARMUP
    decay_length: int = 0  # 0 = max_new_tokens
    min_layers: int = 0  # 0 = chosen by the solver
    max_layers: int = 0
    order: str = "warmup_top"
    batch_size: int = 1
    max_new_tokens: int = 48
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    prompt_at_full_depth: bool = True

    def prompts(self) -> tuple[str, ...]:
        """Row 0 is the user's prompt; further rows take example prompts (a real, mixed batch)."""
        others = [p for p in EXAMPLE_PROMPTS if p != self.prompt]
        return (self.prompt, *others[: self.batch_size - 1])

    def schedule_request(self, full: bool = False) -> ScheduleRequest:
        return ScheduleRequest(
            target_speedup=self.target_speedup, decay=self.decay, warmup=self.warmup,
            min_layers=self.min_layers or None, max_layers=self.max_layers or None,
            decay_length=self.decay_length or None, order=self.order,
            prompt_at_full_depth=self.prompt_at_full_depth, full=full,
        )

    def request(self, full: bool) -> GenerationRequest:
        return GenerationRequest(
            prompts=self.prompts(), schedule=self.schedule_request(full), max_new_tokens=self.max_new_tokens,
            sampling=SamplingConfig(temperature=self.temperature, top_p=self.top_p, seed=self.seed),
        )


def _number(name: str, value, *, integer: bool = False, low: float | None = None, high: float | None = None):
    """One parameter from the UI or the API: a finite number within bounds, or a clear ValueError."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{name} must be a number; got {value!r}"[:300])
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number; got {value!r}"[:300]) from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number; got {value!r}")
    if integer:
        if number != int(number):
            raise ValueError(f"{name} must be a whole number; got {value!r}")
        number = int(number)
    if low is not None and number < low:
        raise ValueError(f"{name} must be >= {low:g}; got {value!r}")
    if high is not None and number > high:
        raise ValueError(f"{name} must be <= {high:g}; got {value!r}")
    return number


def _choice(name: str, value, options: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {value!r}"[:300])


def clean_prompt(prompt, limits: Limits) -> str:
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be text; got {type(prompt).__name__}")
    # Lone surrogates cannot be encoded; control characters (except newline/tab) are noise.
    prompt = prompt.encode("utf-8", "replace").decode("utf-8")
    prompt = "".join(ch for ch in prompt if ch in "\n\t" or ch.isprintable())
    if not prompt.strip():
        raise ValueError("the prompt is empty: type something for the model to continue")
    if len(prompt) > limits.max_prompt_chars:
        raise ValueError(f"the prompt is {len(prompt)} characters; the limit is {limits.max_prompt_chars}")
    return prompt


def parse_settings(limits: Limits, prompt, target_speedup=2.0, decay="linear", warmup=DEFAULT_WARMUP, decay_length=0,
                   min_layers=0, max_layers=0, order="warmup_top", batch_size=1, max_new_tokens=48,
                   temperature=0.0, top_p=1.0, seed=0, prompt_at_full_depth=True) -> PlaygroundSettings:
    """The same rules for the UI and the API."""
    _choice("decay", decay, DECAY_FUNCTIONS)
    _choice("order", order, tuple(LAYER_ORDERS))
    return PlaygroundSettings(
        prompt=clean_prompt(prompt, limits),
        target_speedup=_number("target_speedup", target_speedup, low=1.0, high=1000.0),
        decay=decay,
        warmup=_number("warmup", warmup, integer=True, low=0, high=1000),
        decay_length=_number("decay_length", decay_length, integer=True, low=0, high=100000),
        min_layers=_number("min_layers", min_layers, integer=True, low=0, high=1000),
        max_layers=_number("max_layers", max_layers, integer=True, low=0, high=1000),
        order=order,
        batch_size=_number("batch_size", batch_size, integer=True, low=1, high=limits.max_batch_size),
        max_new_tokens=_number("max_new_tokens", max_new_tokens, integer=True, low=1, high=limits.max_new_tokens),
        temperature=_number("temperature", temperature, low=0.0, high=10.0),
        top_p=_number("top_p", top_p, low=1e-6, high=1.0),
        seed=_number("seed", seed, integer=True, low=0, high=2**63 - 1),
        prompt_at_full_depth=bool(prompt_at_full_depth),
    )


# --- the race ----------------------------------------------------------------------------------


@dataclass
class StreamView:
    """What the UI shows of one stream (SkipDecode or full)."""

    name: str
    rows: int
    tokens: list[list[int]] = field(default_factory=list)  # generated ids per row (EOS excluded)
    depths: list[int] = field(default_factory=list)  # layers that produced each generated token
    step_layers: list[tuple[int, ...]] = field(default_factory=list)  # decode step k -> layers
    prefill_layers: tuple[int, ...] = ()
    seconds: float = 0.0
    done: bool = False
    result: GenerationResult | None = None

    def __post_init__(self) -> None:
        self.tokens = [[] for _ in range(self.rows)]

    def apply(self, event: StepEvent, eos_ids: tuple[int, ...]) -> None:
        self.seconds += event.seconds
        if event.step < 0:
            self.prefill_layers = event.layers
        else:
            self.step_layers.append(event.layers)
        self.depths.append(len(event.layers))
        for row, token in enumerate(event.token_ids):
            was_done = len(self.tokens[row]) and self.tokens[row][-1] is None
            if not was_done:
                self.tokens[row].append(None if token in eos_ids else token)

    def ids(self, row: int) -> list[int]:
        return [t for t in self.tokens[row] if t is not None]

    @property
    def generated(self) -> int:
        return sum(len(self.ids(r)) for r in range(self.rows))

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.seconds if self.seconds > 0 else 0.0


@dataclass
class RaceUpdate:
    skip: StreamView
    full: StreamView
    solved: SolvedSchedule
    moved: str  # which stream advanced ("skip" or "full")


def race(generator: TextGenerator, settings: PlaygroundSettings,
         should_cancel: Callable[[], bool] | None = None, *, lockstep: bool = False) -> Iterator[RaceUpdate]:
    """Advance SkipDecode and the full model step by step, the one with less compute time first
    (``lockstep``: the one that has taken fewer steps first, so they alternate: step mode)."""
    skip_request, full_request = settings.request(full=False), settings.request(full=True)
    solved = generator.schedule_for(skip_request.schedule, settings.max_new_tokens)  # ValueError on bad settings
    rows = len(skip_request.prompts)
    views = {"skip": StreamView("SkipDecode", rows), "full": StreamView("full model", rows)}
    streams = {"skip": generator.stream(skip_request, should_cancel), "full": generator.stream(full_request, should_cancel)}
    eos = generator.loaded.eos_token_ids
    while not all(v.done for v in views.values()):
        if should_cancel is not None and should_cancel():
            for stream in streams.values():
                stream.close()
            return
        progress = (lambda k: len(views[k].depths)) if lockstep else (lambda k: views[k].seconds)
        key = min((k for k, v in views.items() if not v.done), key=lambda k: (progress(k), k != "skip"))
        try:
            views[key].apply(next(streams[key]), eos)
        except StopIteration as stop:
            views[key].done, views[key].result = True, stop.value
        yield RaceUpdate(views["skip"], views["full"], solved, key)


# --- views ---------------------------------------------------------------------------------------


class TokenTexts:
    """Each token's text as it reads inside the whole output (byte-level BPE needs context),
    extended incrementally: a streamed output of n tokens costs O(n) decodes, not O(n^2)."""

    def __init__(self, generator: TextGenerator) -> None:
        self.generator = generator
        self.texts: list[str] = []
        self.decoded = ""

    def update(self, ids: list[int]) -> list[str]:
        for end in range(len(self.texts) + 1, len(ids) + 1):
            current = self.generator.decode_text(ids[:end])
            if current.startswith(self.decoded):
                self.texts.append(current[len(self.decoded):])
            else:  # a multi-byte character completed: re-split honestly
                self.texts.append(self.generator.decode_text(ids[end - 1:end]))
            self.decoded = current
        return self.texts[: len(ids)]


def skip_output_html(generator: TextGenerator, view: StreamView, texts: TokenTexts, row: int = 0) -> str:
    ids = view.ids(row)
    return tokens_by_depth_html(texts.update(ids), view.depths[: len(ids)], generator.num_layers)


def agreement(skip: StreamView, full: StreamView, row: int = 0) -> float | None:
    """Share of positions where SkipDecode produced the full model's token (over the shorter output)."""
    a, b = skip.ids(row), full.ids(row)
    common = min(len(a), len(b))
    if common == 0:
        return None
    return sum(x == y for x, y in zip(a[:common], b[:common])) / common


def stats_markdown(update: RaceUpdate, num_layers: int, cost: CostModel | None = None) -> str:
    skip, full, solved = update.skip, update.full, update.solved
    measured = skip.tokens_per_second / full.tokens_per_second if full.tokens_per_second and skip.tokens_per_second else None
    ran = [len(layers) for layers in skip.step_layers]
    layer_speedup = num_layers * len(ran) / sum(ran) if ran else solved.layer_speedup
    skipped = 1 - sum(ran) / (num_layers * len(ran)) if ran else solved.skipped_fraction
    agree = agreement(skip, full)
    cost_so_far = cost_speedup(num_layers, ran, cost) if ran and cost else solved.cost_speedup
    cells = [
        ("SkipDecode", f"{skip.tokens_per_second:.1f} tok/s"),
        ("full model", f"{full.tokens_per_second:.1f} tok/s"),
        ("measured speedup", f"{measured:.2f}x" if measured else "…"),
        ("layer speedup", f"{layer_speedup:.2f}x (planned {solved.layer_speedup:.2f}x)"),
        ("cost-model speedup", f"{cost_so_far:.2f}x (planned {solved.cost_speedup:.2f}x)"),
        ("layer computations skipped", f"{100 * skipped:.0f}%"),
        ("agreement with full output", f"{100 * agree:.0f}%" if agree is not None else "…"),
        ("schedule", f"{solved.config.decay}, {solved.config.max_layers}→{solved.config.min_layers} layers, "
                     f"warmup {solved.config.warmup}, D = {solved.config.decay_length}"),
    ]
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | **{v}** |" for k, v in cells)


def prompt_token_texts(generator: TextGenerator, settings: PlaygroundSettings, row: int = 0) -> list[str]:
    ids, _ = generator.encode([settings.prompts()[row]])
    return [generator.loaded.tokenizer.decode([t]) for t in ids[0].tolist()]


def heatmap_for(generator: TextGenerator, view: StreamView, settings: PlaygroundSettings, prompt_tokens: list[str],
                generated: list[str], row: int = 0, title: str | None = None):
    return layer_heatmap(
        generator.num_layers, settings.warmup, prompt_tokens, view.prefill_layers, generated, view.step_layers,
        title=title or f"{view.name}: layers executed per position (row {row})",
    )
