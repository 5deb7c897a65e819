"""``python -m model train-task tldr --speedup S``: a TL;DR skip policy for one target speedup, distilled
from the task model's own summaries of posts that are not test posts.

The task model is the default model itself, prompted (tldr.py: no training split is available here),
so a policy is a GATED LoRA on the default model, trained under ONE schedule, the task's in one of its
shapes (tldr.SHAPES: by default linear decay over DECAY_LENGTH steps, floored at FLOOR_SHARE of the average
depth; the prompt at full depth), as the paper trains one model per target speedup. Its targets are the task model's greedy TL;DRs (float32,
full depth) of the usable distillation posts (``usable_post``): sequence-level distillation, as E2E's
policies were distilled. The targets file is made once and reused by every speedup and every resumed
run; it records what it was made from, and a file made from anything else is made again.

A policy is a 135M-model fine-tune on ~330-token prompts, so on a CPU it trains for hours: checkpoints
every ``save_every`` steps and ``--resume`` continue a stopped run (``--max-minutes`` stops one cleanly).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

from model.common.checks import check_int, check_number
from model.evaluation.evaluation import repetition_rate
from model.generation.generator import TextGenerator
from model.generation.schedules import ScheduleRequest
from model.loading import load_model
from model.skipdecode.skip_policy import export_adapter
from model.tasks.task_models import policy_name, task_assets
from model.tasks.tldr import (
    DECAY_LENGTH,
    MAX_NEW_TOKENS,
    PROMPT,
    SHAPES,
    TLDR_DATA,
    TldrPost,
    content_stems,
    task_prompt,
)
from model.tasks.tldr_data import assert_no_test_post, read_synthetic_posts
from model.tasks.tldr_eval import summarise
from model.training.checkpoints import portable_path
from model.training.prompt_store import PromptStore
from model.training.training import TrainConfig, TrainResult, train

DISTIL_POSTS = TLDR_DATA / "distil-posts.jsonl"
# A written post is kept for distillation when it reads as a post about its title: at most this share of
# its word 4-grams repeat an earlier one (the worst quarter of the 548 loop), and at least this share of
# the title's content words appear in it (a tenth of them wander off into another story).
MAX_POST_REPETITION = 0.15
MIN_TITLE_COVERAGE = 0.3
TARGETS_BATCH = 8
# Prompt (~330 tokens at the median, 420 at most with the template) and TL;DR in one sequence: none cut.
MAX_SEQUENCE_TOKENS = 640
TASK = "tldr"


def title_coverage(post: TldrPost) -> float:
    """The share of the title's content words (stemmed) that the post uses."""
    title = content_stems(post.title)
    return len(title & content_stems(post.post)) / len(title) if title else 0.0


def usable_post(post: TldrPost) -> bool:
    return repetition_rate([post.post]) <= MAX_POST_REPETITION and title_coverage(post) >= MIN_TITLE_COVERAGE


def usable_posts(posts: Sequence[TldrPost]) -> list[TldrPost]:
    return [post for post in posts if usable_post(post)]


@dataclass(frozen=True)
class TargetsSource:
    """What a targets file was made from: a file made from anything else is made again."""

    posts_sha256: str  # the distillation posts file's content
    posts: int  # the first N usable posts (0: all)
    prompt: str = PROMPT
    max_new_tokens: int = MAX_NEW_TOKENS
    max_post_repetition: float = MAX_POST_REPETITION
    min_title_coverage: float = MIN_TITLE_COVERAGE


def targets_source(posts_file: Path, posts: int = 0) -> TargetsSource:
    return TargetsSource(hashlib.sha256(Path(posts_file).read_bytes()).hexdigest()[:16], posts)


def distillation_posts(posts_file: Path, limit: int = 0) -> list[TldrPost]:
    """The usable posts of ``posts_file`` (the first ``limit``; 0: all), checked against the test posts."""
    posts = usable_posts(read_synthetic_posts(posts_file))
    posts = posts[:limit] if limit else posts
    assert_no_test_post(posts)
    return posts


def kept_targets(path: Path, made: dict | None, source: TargetsSource) -> dict[tuple[str, str], dict]:
    """The rows of an earlier targets file that still hold, by (post id, prompt): only where it was made with
    the same prompt, length and filters (its posts file may have been shorter), else none."""
    if made is None:
        return {}
    same = {key: value for key, value in made.items() if key != "posts_sha256"} == \
        {key: value for key, value in asdict(source).items() if key != "posts_sha256"}
    if not same:
        return {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {(row["post_id"], row["prompt"]): row for row in rows}


def task_model_summaries(generator: TextGenerator, posts: Sequence[TldrPost], max_new_tokens: int,
                         batch_size: int = TARGETS_BATCH) -> list[dict]:
    """prompt/completion records: the task model's greedy TL;DR of each post at full depth. Empty
    summaries are left out: they teach nothing."""
    outputs, _, _ = summarise(generator, posts, ScheduleRequest(full=True), max_new_tokens, batch_size)
    return [{"post_id": post.post_id, "prompt": task_prompt(post), "completion": text}
            for post, text in zip(posts, outputs) if text]


def write_targets(path: Path, posts_file: Path = DISTIL_POSTS, posts: int = 0, model: str | None = None,
                  device: str = "auto") -> Path:
    """The targets file at ``path`` (with ``path``.source.json beside it), made with the float32 task model
    unless one made from the same source is already there. Where the posts file grew (more posts written),
    the TL;DRs of the posts the file already holds are kept, provided it was made with the same prompt,
    length and filters, and only the new posts are summarised."""
    path, source = Path(path), targets_source(posts_file, posts)
    record = path.with_suffix(".source.json")
    made = json.loads(record.read_text()) if path.is_file() and record.is_file() else None
    if made == asdict(source):
        return path
    wanted = distillation_posts(posts_file, posts)
    kept = kept_targets(path, made, source)
    todo = [post for post in wanted if (post.post_id, task_prompt(post)) not in kept]
    fresh: list[dict] = []
    if todo:
        generator = TextGenerator(load_model(model, device=device, dtype="float32", quantize="none", adapter=None))
        fresh = task_model_summaries(generator, todo, source.max_new_tokens)
    by_post = {**kept, **{(row["post_id"], row["prompt"]): row for row in fresh}}
    rows = [by_post[key] for post in wanted if (key := (post.post_id, task_prompt(post))) in by_post]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    record.write_text(json.dumps(asdict(source), indent=2))
    return path


@dataclass
class TldrRun:
    """One TL;DR policy's training run: which speedup, how long, where."""

    speedup: float = 3.0
    # more speedups trained after this one in the same process, each its own run folder, sharing the
    # prompts' prefill (training.PromptStore: a prompt's keys are the same at every speedup)
    then: tuple[float, ...] = ()
    steps: int = 300
    batch_size: int = 8
    learning_rate: float = 5e-4
    lora_rank: int = 16
    # > 0: cross-entropy on the targets + this weight x KL to the task model's own distribution at every
    # target position (what the greedy text leaves out: how sure the full model was, and its second choices)
    kl_weight: float = 0.0
    # > 0: a target token the policy's greedy choice gets wrong weighs 1 + this in the cross-entropy (training's
    # flip_weight): a wrong greedy token early in a summary sends the rest of it off the post (the subject lost)
    flip_weight: float = 0.0
    # start each speedup from its shipped policy (assets/adapters/tldr/skip-<S>x) instead of a fresh LoRA:
    # a second round goes on from the first round's choice
    from_shipped: bool = False
    shape: str = "linear"  # the schedule's shape (tldr.SHAPES): "front" runs a summary's first 8 tokens deep
    warmup: int | None = None  # layers every position runs first; None: the training default (the app's)
    posts: int = 0  # the first N usable distillation posts (quick runs); 0: all
    posts_file: str = str(DISTIL_POSTS)
    summaries_file: str = "runs/tldr-summaries.jsonl"  # made once, shared by every speedup
    output_dir: str | None = None  # None: runs/tldr-skip-<S>x
    export: str | None = None  # a folder to export the final adapter to (bfloat16), e.g. assets/adapters/tldr/skip-3x
    resume: bool = False
    save_every: int = 25
    max_minutes: float | None = None  # stop after this much CPU time of the process (a later --resume goes on)
    device: str = "auto"
    threads: int | None = None
    seed: int = 0
    model: str | None = None  # None: the embedded default model (a test passes a tiny one)

    def __post_init__(self) -> None:
        check_number("--speedup", self.speedup, above=1, high=6)
        check_int("--steps", self.steps, low=1)
        check_int("--batch-size", self.batch_size, low=1, high=256)
        check_int("--lora-rank", self.lora_rank, low=1, high=256)
        check_int("--posts", self.posts, low=0)
        check_int("--save-every", self.save_every, low=1)
        check_number("--lr", self.learning_rate, above=0, high=1)
        check_number("--kl-weight", self.kl_weight, low=0, high=100)
        check_number("--flip-weight", self.flip_weight, low=0, high=100)
        if self.shape not in SHAPES:
            raise ValueError(f"--shape must be one of {', '.join(SHAPES)}; got {self.shape!r}")
        for speedup in self.then:
            check_number("--then", speedup, above=1, high=6)
        if self.then and (self.output_dir or self.export):
            raise ValueError("--then trains several speedups, each in runs/tldr-skip-<S>x: leave out --output-dir "
                             "and --export (pick-policy exports the chosen checkpoint)")

    @property
    def folder(self) -> Path:
        return Path(self.output_dir or f"runs/{TASK}-{policy_name(self.speedup)}")


def policy_folder(speedup: float, root: Path | None = None) -> Path:
    """Where the shipped policy for ``speedup`` lives: <task adapters>/tldr/skip-<S>x."""
    return Path(root if root is not None else task_assets()) / TASK / policy_name(speedup)


def shipped_policy(speedup: float, root: Path | None = None) -> Path | None:
    """The TL;DR policy for ``speedup`` where one was trained and shipped, else None."""
    folder = policy_folder(speedup, root)
    return folder if (folder / "adapter_config.json").is_file() else None


def train_config(run: TldrRun, targets: Path) -> TrainConfig:
    """The TrainConfig of a TL;DR policy run (model/training/training.py does the training)."""
    shape = SHAPES[run.shape]
    config = TrainConfig(
        model=run.model, output_dir=str(run.folder), data=str(targets), max_steps=run.steps, batch_size=run.batch_size,
        learning_rate=run.learning_rate, lora_rank=run.lora_rank, lora_alpha=2 * run.lora_rank,
        save_every=run.save_every, eval_every=0, resume=run.resume, device=run.device, threads=run.threads,
        seed=run.seed, max_length=MAX_SEQUENCE_TOKENS, warmup_steps=min(20, run.steps // 10),
        max_minutes=run.max_minutes, fixed_speedup=run.speedup, fixed_decay=shape.decay,
        fixed_decay_length=shape.decay_length, fixed_speedup_steps=DECAY_LENGTH, floor_share=shape.floor_share,
        decays=(shape.decay,), gate_lora=True, keep_adapters=True, kl_weight=run.kl_weight,
        flip_weight=run.flip_weight,
        init_adapter=str(start) if (start := starting_policy(run)) else None)
    return config if run.warmup is None else replace(config, warmup_layers=run.warmup)


def starting_policy(run: TldrRun) -> Path | None:
    """The shipped policy a --from-shipped run starts from (None: a fresh LoRA); there must be one."""
    if not run.from_shipped:
        return None
    shipped = shipped_policy(run.speedup)
    if shipped is None:
        raise ValueError(f"--from-shipped: no shipped TL;DR policy for {run.speedup:g}x in {policy_folder(run.speedup)}")
    return shipped


def train_tldr_policy(run: TldrRun) -> list[TrainResult]:
    """Targets (made once), the training run of each speedup (``run.speedup``, then ``run.then``) and the
    export when asked; writes each run's summary.json."""
    targets = write_targets(Path(run.summaries_file), Path(run.posts_file), run.posts, model=run.model, device=run.device)
    prompts = PromptStore()
    results = []
    for speedup in (run.speedup, *run.then):
        one = replace(run, speedup=speedup, then=())
        result = train(train_config(one, targets), prompts)
        exported = None
        if one.export and result.steps >= one.steps:  # a run stopped by --max-minutes is not a policy yet
            export_adapter(one.folder / "adapter", one.export)
            exported = one.export
        recorded = {key: portable_path(value) for key, value in asdict(one).items()}  # no machine's paths
        summary = {"run": recorded, "steps": result.steps, "seconds": result.seconds, "targets": str(targets),
                   "exported": exported, "last_losses": result.losses[-10:]}
        (one.folder / "summary.json").write_text(json.dumps(summary, indent=2))
        results.append(result)
    return results
