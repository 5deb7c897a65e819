"""The Reddit TL;DR task's evaluation: greedy summaries of the reported posts at 1x and each speedup,
scored against the references, and the measured speed with the long prompt counted.

The task model is the default model prompted for a TL;DR (no training split is available here); at each
speedup SkipDecode runs the task's own policy for it where one is shipped (tldr_training.py), else the
default skip policy (the general one); every report says which ran. Per arm: ROUGE-1/2/L F1 (means over posts), each as a share of the 1x
arm's with a 95% paired bootstrap interval over posts, how often the text repeats itself (word 4-grams
that repeat an earlier one), and the share of summaries that name the post's main subject (tldr.py).

The prompt's depth: each speedup in ``prompt_depth_speedups`` runs twice, the prompt at full depth (the
paper's choice) and at the schedule's first budget, so the time to the first token and the ROUGE share
are read side by side. Speed: SkipDecode against the 1x arm over the SAME steps (EOS ignored), arms
alternated (task_eval.measure_speed): the decode speedup, and the whole request's (prefill included).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

from model.evaluation.evaluation import repetition_rate
from model.generation.generator import TextGenerator
from model.generation.runs import GenerationRequest
from model.generation.schedules import ScheduleRequest
from model.skipdecode.decoder import SamplingConfig
from model.skipdecode.schedule import depth_share_floor
from model.tasks.task_eval import SpeedRow, measure_speed
from model.tasks.tldr import (
    DECAY_LENGTH,
    FLOOR_SHARE,
    LINEAR,
    MAX_NEW_TOKENS,
    ROUGE_TYPES,
    SPEEDUPS,
    STOP,
    TaskShape,
    TldrPost,
    clean_summary,
    main_subject,
    mean,
    names_main_subject,
    rouge_scores,
    shape_of,
    share_interval,
    task_prompt,
)

POLICY_CHOICES = ("task", "general", "none")
SPLITS = ("reported", "heldout")
ArmModels = Callable[[float], TextGenerator]  # the model an arm runs, by its speedup (1.0: the task model)


@dataclass(frozen=True)
class TldrEvalConfig:
    posts: int | None = None  # the first N reported posts (quick runs); None: all 400
    weights: str = "default"  # "default": the CPU default (low-bit) weights; "float32"
    device: str = "auto"
    threads: int | None = None
    output: str = "assets/eval"  # writes tldr.json, tldr.md and tldr-outputs.jsonl there
    speedups: tuple[float, ...] = SPEEDUPS
    prompt_depth_speedups: tuple[float, ...] = (2.0, 3.0)  # also run with the prompt at the first budget
    max_new_tokens: int = MAX_NEW_TOKENS
    # the linear shape's decay, decay length and floor (below); a policy trained in another shape (tldr.SHAPES)
    # runs its own
    decay: str = "linear"
    decay_length: int = DECAY_LENGTH
    batch_size: int = 8
    speed_posts: int = 8  # posts the speed rows time, at batch 1 (a visitor's request)
    speed_steps: int = 32
    speed_repeats: int = 2
    warmup: int | None = None  # None: the skip policy's trained warmup
    floor_share: float = FLOOR_SHARE  # the least layers a step keeps, as a share of the average depth (0: none)
    # "task": each speedup's TL;DR policy where one is shipped (tldr_training.shipped_policy), else the
    # general one; "general": the default skip policy everywhere; "none": the untouched model skips the same layers
    policy: str = "task"
    policy_root: str | None = None  # a folder holding tldr/skip-<S>x policies (a run's exports); None: the shipped
    split: str = "reported"  # or "heldout": the 100 posts kept for choosing checkpoints (writes tldr-heldout.*)
    # Only these speedups' arms (both prompt depths) and speed rows run again, where their policies changed
    # since the report in --output was made; every other arm's summaries are read back from that report's
    # outputs and scored again, and its speed row kept (a policy's weights do not change its speed). (): all.
    rerun: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.weights not in ("default", "float32"):
            raise ValueError(f"--weights must be default or float32; got {self.weights!r}")
        if not self.speedups or any(not 1 < s <= 6 for s in (*self.speedups, *self.prompt_depth_speedups)):
            raise ValueError(f"--speedups and --prompt-depth-speedups must be targets in (1, 6]; got "
                             f"{self.speedups} and {self.prompt_depth_speedups}")
        if self.posts is not None and self.posts < 1:
            raise ValueError("--posts must be >= 1")
        if self.policy not in POLICY_CHOICES:
            raise ValueError(f"--policy must be one of {', '.join(POLICY_CHOICES)}; got {self.policy!r}")
        if self.split not in SPLITS:
            raise ValueError(f"--split must be one of {', '.join(SPLITS)}; got {self.split!r}")
        if not 0 <= self.floor_share < 1:
            raise ValueError(f"--floor-share must be in [0, 1); got {self.floor_share}")
        if not set(self.rerun) <= set(self.speedups):
            raise ValueError(f"--rerun must name speedups among --speedups {self.speedups}; got {self.rerun}")


@dataclass
class TldrArm:
    label: str  # "1x", "2x", "3x, prompt at budget", ...
    speedup: float
    prompt_at_full_depth: bool
    outputs: list[str]
    rouge: dict[str, list[float]]  # per post, per ROUGE type
    subject_named: list[bool | None]  # per post; None where the check sees no subject
    layers_per_step: float  # the mean n_k over the decode steps that ran
    prefill_layers: int  # the layers the prompt ran (all at full depth; the first budget otherwise)
    shape: str = LINEAR.name  # the schedule's shape (tldr.SHAPES): the one its policy was trained in

    def summary(self, full: "TldrArm | None") -> dict:
        """The arm's scores, and its shares of the 1x arm's (``full``) with intervals."""
        known = [flag for flag in self.subject_named if flag is not None]
        row: dict = {"label": self.label, "speedup": self.speedup, "prompt_at_full_depth": self.prompt_at_full_depth,
                     "scores": {name: round(100 * mean(values), 2) for name, values in self.rouge.items()},
                     "repetition": round(repetition_rate(self.outputs), 4),
                     "names_main_subject": round(mean(known), 3) if known else None,
                     "mean_layers_per_step": round(self.layers_per_step, 2), "prefill_layers": self.prefill_layers,
                     "shape": self.shape}
        if full is not None:
            intervals = {name: share_interval(self.rouge[name], full.rouge[name]) for name in ROUGE_TYPES}
            row["shares"] = {name: {"share": round(i.share, 3), "low": round(i.low, 3), "high": round(i.high, 3)}
                             for name, i in intervals.items()}
        return row


def schedule_request(config: TldrEvalConfig, speedup: float, num_layers: int,
                     prompt_at_full_depth: bool = True, shape: TaskShape = LINEAR) -> ScheduleRequest:
    """The task's schedule at ``speedup`` (the one its policies train on: tldr_training.train_config): the
    config's decay, decay length and floor for a policy of the linear shape, a policy's own other shape
    (tldr.shape_of) as it was trained."""
    if speedup == 1.0:
        return ScheduleRequest(target_speedup=1.0, full=True)
    decay, decay_length, floor_share, steps = (
        (config.decay, config.decay_length, config.floor_share, config.decay_length) if shape == LINEAR
        else (shape.decay, shape.decay_length, shape.floor_share, DECAY_LENGTH))  # as train_config holds it
    floor = depth_share_floor(num_layers, speedup, floor_share) if floor_share else None
    return ScheduleRequest(target_speedup=speedup, decay=decay, warmup=config.warmup,
                           decay_length=decay_length, speedup_steps=steps, min_layers_floor=floor,
                           prompt_at_full_depth=prompt_at_full_depth, skip_policy=config.policy != "none")


def summarise(generator: TextGenerator, posts: Sequence[TldrPost], schedule: ScheduleRequest, max_new_tokens: int,
              batch_size: int, template: str | None = None) -> tuple[list[str], list[int], int]:
    """(each post's greedy TL;DR, every decode step's n_k, the layers the prompts ran) in batches of
    ``batch_size``; ``template``: one of tldr.PROMPTS (default: the chosen one)."""
    outputs: list[str] = []
    layers: list[int] = []
    prefill_layers = 0
    for start in range(0, len(posts), batch_size):
        prompts = tuple(task_prompt(post, template) for post in posts[start:start + batch_size])
        result = generator.generate(GenerationRequest(prompts=prompts, schedule=schedule, max_new_tokens=max_new_tokens,
                                                      sampling=SamplingConfig(), stop=STOP))
        outputs += [clean_summary(text) for text in result.outputs]
        layers += result.layers_per_step
        prefill_layers = len(result.decode.prefill_layers)
    return outputs, layers, prefill_layers


def policy_shape(generator: TextGenerator) -> TaskShape:
    """The shape the generator's TL;DR policy was trained in (LINEAR without one)."""
    return shape_of(generator.loaded.adapter_path)


def arm_label(speedup: float, prompt_at_full_depth: bool = True) -> str:
    return "1x" if speedup == 1.0 else f"{speedup:g}x" + ("" if prompt_at_full_depth else ", prompt at budget")


def run_arm(generator: TextGenerator, posts: Sequence[TldrPost], config: TldrEvalConfig, speedup: float,
            prompt_at_full_depth: bool = True) -> TldrArm:
    shape = policy_shape(generator)
    schedule = schedule_request(config, speedup, generator.num_layers, prompt_at_full_depth, shape)
    outputs, layers, prefill_layers = summarise(generator, posts, schedule, config.max_new_tokens, config.batch_size)
    return scored_arm(posts, outputs, speedup, prompt_at_full_depth,
                      mean(layers) if layers else float(generator.num_layers), prefill_layers,
                      shape.name if speedup != 1.0 else LINEAR.name)


def scored_arm(posts: Sequence[TldrPost], outputs: list[str], speedup: float, prompt_at_full_depth: bool,
               layers_per_step: float, prefill_layers: int, shape: str = LINEAR.name) -> TldrArm:
    """An arm's summaries of ``posts`` scored: ROUGE against each reference, the main subject named or not."""
    scores = [rouge_scores(text, post.reference) for text, post in zip(outputs, posts)]
    subjects = [main_subject(post) for post in posts]
    return TldrArm(label=arm_label(speedup, prompt_at_full_depth), speedup=speedup,
                   prompt_at_full_depth=prompt_at_full_depth, outputs=outputs,
                   rouge={name: [row[name] for row in scores] for name in ROUGE_TYPES},
                   subject_named=[names_main_subject(text, subject) if subject.known else None
                                  for text, subject in zip(outputs, subjects)],
                   layers_per_step=layers_per_step, prefill_layers=prefill_layers, shape=shape)


@dataclass(frozen=True)
class StoredRun:
    """A report's arms and speed rows, and every arm's summaries (for ``TldrEvalConfig.rerun``)."""

    arms: list[dict]  # the report's "arms"
    speed: list[dict]  # its "speed" rows
    outputs: dict[str, list[str]]  # label -> the summaries, in post order

    def arm(self, posts: Sequence[TldrPost], speedup: float, prompt_at_full_depth: bool = True) -> TldrArm:
        """The stored arm, its summaries scored again against ``posts`` (the same posts, in the same order)."""
        label = arm_label(speedup, prompt_at_full_depth)
        summary = next((arm for arm in self.arms if arm["label"] == label), None)
        outputs = self.outputs.get(label)
        if summary is None or outputs is None or len(outputs) != len(posts):
            raise ValueError(f"the stored report has no summaries of these {len(posts)} posts for {label}: run it again")
        return scored_arm(posts, outputs, speedup, prompt_at_full_depth, summary["mean_layers_per_step"],
                          summary["prefill_layers"], summary.get("shape", LINEAR.name))  # before shapes: linear

    def speed_row(self, speedup: float, prompt_at_full_depth: bool = True) -> dict:
        for row in self.speed:
            if row["speedup"] == speedup and row["prompt_at_full_depth"] == prompt_at_full_depth:
                return row
        raise ValueError(f"the stored report has no speed row for {arm_label(speedup, prompt_at_full_depth)}")


def speed_row(generator: TextGenerator, posts: Sequence[TldrPost], config: TldrEvalConfig, speedup: float,
              prompt_at_full_depth: bool = True) -> dict:
    """SkipDecode against the 1x arm at batch 1 on the first ``speed_posts`` posts: decode and whole-request
    speedups, and the time to the first token (the prefill) of each."""
    chosen = [task_prompt(post) for post in posts[:config.speed_posts]]
    row: SpeedRow = measure_speed(generator, chosen, schedule_request(config, 1.0, generator.num_layers),
                                  schedule_request(config, speedup, generator.num_layers, prompt_at_full_depth,
                                                   policy_shape(generator)),
                                  speedup, batch_size=1,
                                  steps=config.speed_steps, repeats=config.speed_repeats, prompt_for=lambda text: text)
    tokens = len(chosen) * config.speed_steps * config.speed_repeats
    runs = len(chosen) * config.speed_repeats

    def first_token_s(total_tps: float, decode_tps: float) -> float:
        return round((tokens / total_tps - tokens / decode_tps) / runs, 4)

    return {**dataclasses.asdict(row), "prompt_at_full_depth": prompt_at_full_depth,
            "full_first_token_s": first_token_s(row.full_total_tps, row.full_decode_tps),
            "skip_first_token_s": first_token_s(row.skip_total_tps, row.skip_decode_tps)}


def evaluate(models: ArmModels, posts: Sequence[TldrPost], config: TldrEvalConfig, stored: StoredRun | None = None) -> dict:
    """Every arm's scores and shares, and the speed rows: the report's body (the caller adds the run's facts).
    ``models(speedup)`` is the model an arm runs (a speedup's own policy, or one model for all). With
    ``stored`` and ``config.rerun``, only the rerun speedups run; the rest come from ``stored``."""
    def fresh(speedup: float) -> bool:
        return stored is None or not config.rerun or speedup in config.rerun

    def arm(speedup: float, prompt_at_full_depth: bool = True) -> TldrArm:
        if fresh(speedup):  # the 1x arm never reruns with --rerun: it runs no policy
            return run_arm(models(speedup), posts, config, speedup, prompt_at_full_depth)
        assert stored is not None
        return stored.arm(posts, speedup, prompt_at_full_depth)

    def speed(speedup: float, prompt_at_full_depth: bool = True) -> dict:
        if fresh(speedup):
            return speed_row(models(speedup), posts, config, speedup, prompt_at_full_depth)
        assert stored is not None
        return stored.speed_row(speedup, prompt_at_full_depth)

    full = arm(1.0)
    arms = [full] + [arm(speedup) for speedup in config.speedups]
    arms += [arm(speedup, prompt_at_full_depth=False) for speedup in config.prompt_depth_speedups]
    speed_rows = [speed(speedup) for speedup in config.speedups]
    speed_rows += [speed(speedup, prompt_at_full_depth=False) for speedup in config.prompt_depth_speedups]
    return {"posts": len(posts), "config": dataclasses.asdict(config),
            "arms": [one.summary(None if one is full else full) for one in arms], "speed": speed_rows,
            "outputs": {one.label: one.outputs for one in arms}}
