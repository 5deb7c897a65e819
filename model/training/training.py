"""Skip-policy fine-tuning (the paper's recipe), with accelerate.

The student runs the teacher-forced SkipDecode forward (decoder.masked_forward) under a
schedule drawn per batch, so one checkpoint serves every speedup and decay the playground
offers (or one fixed schedule, as the paper trained).

Data:
* default, no data set needed: SELF-DISTILLATION. The full (original) model writes greedy
  continuations of a prompt set; the student learns to match the full model's next-token
  distribution (KL) on the generated positions under skipping.
* a user JSONL (prompt/completion or text records): cross-entropy under the skip policy.

The same code runs on CPU, one GPU, or several through `accelerate launch -m model train`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from model.common.checks import check_choice, check_int, check_number
from model.generation.generator import TextGenerator
from model.loading import load_model, resolve_device
from model.skipdecode.architectures import adapter_for
from model.skipdecode.schedule import (
    DECAY_FUNCTIONS,
    DEFAULT_WARMUP,
    LAYER_ORDERS,
    RANKED,
    ScheduleConfig,
    depth_share_floor,
    full_schedule,
    max_layer_speedup,
    solve_schedule,
)
from model.skipdecode.skip_policy import EntryBridge, install_lora_gate
from model.training.checkpoints import load_initial_adapter, resume_checkpoint, save_checkpoint
from model.training.data import (
    DEFAULT_TRAIN_PROMPTS,
    Example,
    cached_examples,
    collate,
    load_sequences,
    read_prompts,
    sequence_folders,
    teacher_continuations,
    trim_loop,
    user_examples,
)
from model.training.heldout import heldout_scores, heldout_set
from model.training.losses import cross_entropy_loss, hidden_matching_loss, loop_masks, unlikelihood_loss
from model.training.prompt_store import PromptStore
from model.training.scoring import distillation_loss, skip_policy_logits

SCHEDULE_MIXES = ("broad", "focused")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",  # Llama family
                "out_proj", "fc1", "fc2",  # OPT
                "c_attn", "c_proj", "c_fc")  # GPT-2


@dataclass
class TrainConfig:
    model: str | None = None  # None: the embedded default model
    task_adapter: str | None = None  # a task's LoRA merged into the model first (model/tasks/): the 1x
    output_dir: str = "runs/skipdecode"
    data: str | None = None  # JSONL prompt/completion or text; None = self-distillation
    prompts: str = str(DEFAULT_TRAIN_PROMPTS)  # self-distillation prompt set
    sequences: str | None = None  # a make-data folder: its stored continuations replace --prompts
    max_sequences: int | None = None  # use only the first N unique sequences (the data-scaling curve)
    # One share per --sequences folder (their order): a batch row comes from folder i with
    # probability shares[i] / sum, whatever the folders' sizes — so a fact set's dose stays what
    # it was set to while a general set grows between sessions. () = uniform over all sequences.
    sequence_shares: tuple[float, ...] = ()
    max_steps: int = 200
    max_minutes: float | None = None  # stop after this much CPU time of this process (equal-budget study arms)
    batch_size: int = 8
    grad_accum: int = 1
    learning_rate: float = 3e-4
    warmup_steps: int = 10
    continuation_tokens: int = 64  # teacher continuation length (self-distillation)
    max_target_tokens: int | None = None  # train on only the first N target tokens (cheaper steps)
    trim_loops: bool = False  # cut each target where it starts to loop (model/training/data.py trim_loop)
    # True: a batch is a random window of the examples sorted by target length, so a short reply
    # (a fact answer) trains under the steep decay of its own length, not a long neighbour's
    length_grouped: bool = False
    # > 0: keep each target's loop, the KL stopping where it starts (as trim_loops), and push down
    # the student's probability of every token there that repeats a 4-gram: weight x -log(1 - p)
    unlikelihood: float = 0.0
    # > 0: each target position's KL weighs 1 + flip_weight where the student's argmax is not the
    # teacher's (a flipped token: what agreement counts and a lost fact answer is), 1 elsewhere; with
    # --data, the cross-entropy where the student's argmax is not the text's token
    flip_weight: float = 0.0
    samples_per_prompt: int = 0  # sampled teacher continuations per prompt, besides the greedy one
    sample_temperature: float = 0.8
    max_prompt_tokens: int = 128
    max_length: int = 256  # user data: longest sequence kept
    speedup_range: tuple[float, float] = (1.5, 4.0)
    decays: tuple[str, ...] = DECAY_FUNCTIONS
    schedule_mix: str = "broad"  # broad: uniform speedup and decay; focused: 1.5-3x, mostly linear
    fixed_speedup: float | None = None  # train ONE schedule (the paper) instead of random ones
    fixed_decay: str = "linear"
    # the schedule's decay length in steps (a task's typical output length); None: each batch's target length
    fixed_decay_length: int | None = None
    # the steps the fixed speedup holds over; None: the decay length (a step decay over 16 tokens can hold
    # its speedup over 32: its first 8 tokens run deep, the rest pays for them)
    fixed_speedup_steps: int | None = None
    # a floor keeping this share of the average depth at each drawn speedup (schedule.depth_share_floor)
    floor_share: float | None = None
    # > 0 with --data: cross-entropy on the text + this weight x KL to the model without the adapter
    kl_weight: float = 0.0
    warmup_layers: int = DEFAULT_WARMUP
    order: str = "warmup_top"
    ranking: tuple[int, ...] = ()  # order "ranked": layers most important first (model.studies.study measures it)
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_modules: tuple[str, ...] = ()  # () = every linear of the layers
    gate_lora: bool = True  # LoRA acts only where a position bypasses layers (1x == the full model)
    bridge_rank: int = 0  # > 0: a learned entry bridge of this rank
    hidden_weight: float = 0.0  # > 0: add hidden-state matching (entry and final) to the KL
    full_finetune: bool = False
    seed: int = 0
    save_every: int = 50
    keep_adapters: bool = False  # also keep each save's adapter as adapter-step-N (to choose among them later)
    eval_every: int = 50  # held-out curve every N steps (0 = off)
    eval_prompts: int = 16  # first N prompts of the held-out set
    eval_tokens: int = 48
    resume: bool = False
    init_adapter: str | None = None  # start from a trained adapter's weights (e.g. a GPU run's export)
    device: str = "auto"
    mixed_precision: str = "auto"  # auto: bf16 on GPU, none on CPU
    teacher_batch_size: int = 16
    max_prompts: int | None = None  # use only the first N prompts (quick trials, tests)
    threads: int | None = None  # CPU threads for torch (default: torch's choice)

    def __post_init__(self) -> None:
        """Refuse a bad config at once (ValueError naming the field), in this order; tuples from JSON lists."""
        self._check_numbers()
        self._check_loss_options()
        self._check_schedule_options()
        self._normalise_lists()

    def _check_numbers(self) -> None:
        """Counts are integers (>= 1 or >= 0), the learning rate positive, loss weights finite and >= 0."""
        positive = ("max_steps", "batch_size", "grad_accum", "continuation_tokens", "max_prompt_tokens",
                    "max_length", "lora_rank", "lora_alpha", "save_every", "teacher_batch_size", "eval_prompts",
                    "eval_tokens")
        for name in positive:
            check_int(name, getattr(self, name), low=1)
        for name in ("samples_per_prompt", "bridge_rank", "eval_every", "warmup_layers"):
            check_int(name, getattr(self, name), low=0)
        check_number("learning_rate", self.learning_rate, above=0)
        for name in ("hidden_weight", "unlikelihood", "flip_weight", "kl_weight"):  # loss weights: finite numbers >= 0
            check_number(name, getattr(self, name), low=0)

    def _check_loss_options(self) -> None:
        """Loss options that need (or exclude) distillation data, and the CPU-time budget."""
        if self.unlikelihood and self.data:
            raise ValueError("unlikelihood acts on distillation targets (a user's --data text is its own target): "
                             "leave out --data")
        if self.unlikelihood and self.max_target_tokens:
            # the loop must be found on the whole target, and a cap would cut it first
            raise ValueError("unlikelihood finds each loop on the whole target: leave out --max-target-tokens")
        if self.max_minutes is not None:
            check_number("max_minutes", self.max_minutes, above=0)

    def _check_schedule_options(self) -> None:
        """The schedules training draws: speedups, decays, mix and layer order (and --data's KL weight)."""
        low, high = self.speedup_range
        if not (1.0 <= low <= high):
            raise ValueError(f"speedup_range must satisfy 1 <= low <= high; got {self.speedup_range}")
        for decay in self.decays:
            check_choice("decays", decay, DECAY_FUNCTIONS)
        check_choice("fixed_decay", self.fixed_decay, DECAY_FUNCTIONS)
        if self.kl_weight and not self.data:
            raise ValueError("kl_weight adds KL to cross-entropy on --data text (distillation without --data is all KL)")
        if self.fixed_decay_length is not None:
            check_int("fixed_decay_length", self.fixed_decay_length, low=1)
        if self.fixed_speedup_steps is not None:
            check_int("fixed_speedup_steps", self.fixed_speedup_steps, low=1)
        if self.fixed_speedup is not None:
            check_number("fixed_speedup", self.fixed_speedup, low=1)
        check_choice("schedule_mix", self.schedule_mix, SCHEDULE_MIXES)
        check_choice("order", self.order, (*LAYER_ORDERS, RANKED))

    def _normalise_lists(self) -> None:
        """ranking and sequence_shares as tuples of numbers; one share per --sequences folder."""
        self.ranking = tuple(int(i) for i in self.ranking)
        self.sequence_shares = tuple(float(v) for v in self.sequence_shares)
        if self.sequence_shares:
            folders = sequence_folders(self.sequences or "")
            if len(folders) != len(self.sequence_shares):
                raise ValueError(f"sequence_shares: one share per --sequences folder ({len(folders)}); "
                                 f"got {len(self.sequence_shares)}")
            if not all(math.isfinite(v) and v >= 0 for v in self.sequence_shares) or not sum(self.sequence_shares) > 0:
                raise ValueError(f"sequence_shares must be >= 0 with a positive sum; got {self.sequence_shares!r}")
            if self.length_grouped:
                raise ValueError("sequence_shares and length_grouped draw batches in two different ways: pick one")

# --- data ----------------------------------------------------------------------------------


def distillation_examples(generator, prompts: Sequence[str], config: TrainConfig, cache_file: Path) -> list[Example]:
    """The full model's continuations of ``prompts`` (greedy + ``samples_per_prompt`` sampled),
    computed once and cached: the teacher is deterministic for a given seed."""
    return cached_examples(cache_file, lambda: teacher_continuations(
        generator, prompts, max_new_tokens=config.continuation_tokens, max_prompt_tokens=config.max_prompt_tokens,
        batch_size=config.teacher_batch_size, samples=config.samples_per_prompt,
        temperature=config.sample_temperature, seed=config.seed))


# --- schedules -------------------------------------------------------------------------------


# The ``focused`` mix weights the draw towards what visitors use most: speedups up to 3x and the
# linear decay (the app's default) 60% of the time. Decay lengths spread around the generated
# length because the app's decay length is max_new_tokens and generations end earlier or later.
FOCUSED_MAX_SPEEDUP = 3.0
FOCUSED_LINEAR_SHARE = 0.6
DECAY_LENGTH_SPREAD = (0.5, 1.5)


def draw_schedule(num_layers: int, num_steps: int, config: TrainConfig, rng: random.Random) -> ScheduleConfig:
    """The schedule of one batch: fixed, or a random speedup and decay from the app's range
    (``focused``: capped at FOCUSED_MAX_SPEEDUP, linear FOCUSED_LINEAR_SHARE of the time)."""
    warmup = config.warmup_layers
    common = dict(warmup=warmup, order=config.order, ranking=config.ranking)
    if config.fixed_speedup == 1:  # a task model's own fine-tuning: every layer, every position
        return full_schedule(num_layers, max(1, num_steps))
    if config.fixed_speedup is not None:
        decay_length = config.fixed_decay_length or max(1, num_steps)
        return solve_schedule(num_layers, config.fixed_speedup, decay=config.fixed_decay, decay_length=decay_length,
                              num_steps=config.fixed_speedup_steps or decay_length, min_layers_floor=_share_floor(num_layers, config.fixed_speedup, config), **common).config
    low, high = config.speedup_range
    if config.schedule_mix == "focused":
        high = min(high, FOCUSED_MAX_SPEEDUP)
    high = min(high, max_layer_speedup(num_layers, warmup))
    speedup = rng.uniform(min(low, high), high)
    if config.schedule_mix == "focused" and "linear" in config.decays and rng.random() < FOCUSED_LINEAR_SHARE:
        decay = "linear"
    else:
        decay = rng.choice(config.decays)
    decay_length = config.fixed_decay_length or max(1, int(num_steps * rng.uniform(*DECAY_LENGTH_SPREAD)))
    return solve_schedule(num_layers, speedup, decay=decay, decay_length=decay_length,
                          num_steps=config.fixed_decay_length or max(1, num_steps), min_layers_floor=_share_floor(num_layers, speedup, config),
                          **common).config


def _share_floor(num_layers: int, speedup: float, config: TrainConfig) -> int | None:
    return None if config.floor_share is None else depth_share_floor(num_layers, speedup, config.floor_share)


def draw_batch(examples: Sequence[Example], by_length: Sequence[int] | None, batch_size: int,
               rng: random.Random, by_source: Sequence[Sequence[Example]] = (),
               shares: Sequence[float] = ()) -> list[Example]:
    """``batch_size`` examples drawn at random; with ``by_length`` (example indices sorted by target
    length) a random window of it: one batch, one reply length, one decay horizon; with
    ``by_source`` (the examples of each source) and ``shares`` (one weight per source) each row's
    source first, by those weights, then an example of it."""
    if shares:
        drawn = rng.choices(range(len(shares)), weights=shares, k=batch_size)
        return [by_source[s][rng.randrange(len(by_source[s]))] for s in drawn]
    if by_length is None or len(by_length) <= batch_size:
        return [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
    start = rng.randrange(len(by_length) - batch_size + 1)
    return [examples[i] for i in by_length[start:start + batch_size]]


def examples_by_source(examples: Sequence[Example], num_sources: int) -> list[list[Example]]:
    """The examples of each source (``Example.source``), in order."""
    groups: list[list[Example]] = [[] for _ in range(num_sources)]
    for example in examples:
        groups[example.source].append(example)
    return groups


# --- the run ---------------------------------------------------------------------------------


@dataclass
class TrainResult:
    output_dir: str
    steps: int
    seconds: float
    losses: list[float] = field(default_factory=list)
    heldout: list[dict] = field(default_factory=list)


def _has_dropout(model: torch.nn.Module) -> bool:
    """Whether any dropout would act in training (a Dropout module or an attention dropout above 0)."""
    config = getattr(model, "config", None)
    attention = float(getattr(config, "attention_dropout", 0.0) or 0.0)
    return attention > 0 or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


class SkipPolicyModel(torch.nn.Module):
    """The student as one module (LoRA'd model + optional bridge), so accelerate/DDP see the
    masked forward as its forward and checkpoint the bridge with the rest."""

    def __init__(self, lm: torch.nn.Module, bridge: EntryBridge | None = None, prompts: PromptStore | None = None) -> None:
        super().__init__()
        self.lm = lm
        self.bridge = bridge
        self.prompts = prompts  # where nothing trainable acts on a full-depth prompt (scoring.skip_policy_logits)

    def forward(self, ids, mask, schedule: ScheduleConfig, prompt_len: int, hidden_states: list | None = None) -> torch.Tensor:
        return skip_policy_logits(self.lm, ids, mask, schedule, prompt_len, bridge=self.bridge,
                                  hidden_states=hidden_states, prompts=self.prompts)


def wrap_trainable(model, config: TrainConfig):
    """LoRA (peft) on the layers' linears (all, or ``lora_modules``), or the whole model."""
    if config.full_finetune:
        model.train()
        return model
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415

    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    wanted = set(config.lora_modules) if config.lora_modules else set(LORA_TARGETS)
    targets = sorted(names & wanted)
    if not targets:
        raise ValueError(f"no LoRA target modules found among {sorted(names)}")
    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules=targets, task_type="CAUSAL_LM")
    wrapped = get_peft_model(model, lora)
    if config.gate_lora:
        install_lora_gate(wrapped)
    wrapped.train()
    return wrapped


class Teacher:
    """The ORIGINAL model's logits for self-distillation: the LoRA student with its adapter
    switched off (no second copy), or a frozen copy when all weights are trained.

    ``prompts``: the student's prompt store, where it has one. Its prompts were prefilled at full depth
    with no LoRA acting, which is what the original model computes, so the teacher reads them from there
    and runs only the generated positions (a long prompt is not run again every step)."""

    def __init__(self, student, config: TrainConfig, prompts: PromptStore | None = None) -> None:
        self.student = student
        self.frozen = copy.deepcopy(student).eval().requires_grad_(False) if config.full_finetune else None
        self.prompts = prompts if self.frozen is None else None

    @torch.no_grad()
    def logits(self, ids, mask, prompt_len: int, hidden_states: list | None = None) -> torch.Tensor:
        model = self.frozen if self.frozen is not None else self.student
        schedule = full_schedule(adapter_for(model).num_layers)
        if self.frozen is not None:
            return skip_policy_logits(model, ids, mask, schedule, prompt_len, hidden_states=hidden_states)
        with model.disable_adapter():
            return skip_policy_logits(model, ids, mask, schedule, prompt_len, hidden_states=hidden_states,
                                      prompts=self.prompts)


class Budget:
    """The run's clocks in one place: wall seconds and CPU minutes spent TRAINING (held-out
    evaluation excluded), resumed from a checkpoint's seconds. A time budget counts this
    process's CPU time, not wall time: study arms stay comparable while other work shares the machine."""

    def __init__(self, max_minutes: float | None, spent_seconds: float = 0.0) -> None:
        self.max_minutes = max_minutes
        self.spent_before = spent_seconds
        self._wall_start = time.perf_counter() - spent_seconds
        self._cpu_start = time.process_time() - spent_seconds
        self._paused_wall = self._paused_cpu = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self._paused_wall += time.perf_counter() - wall
            self._paused_cpu += time.process_time() - cpu

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._wall_start - self._paused_wall

    @property
    def cpu_minutes(self) -> float:
        return (time.process_time() - self._cpu_start - self._paused_cpu) / 60

    @property
    def exhausted(self) -> bool:
        return self.max_minutes is not None and self.cpu_minutes > self.max_minutes


def training_examples(config: TrainConfig, generator, output: Path, accelerator) -> tuple[list[Example], int]:
    """The sequences to train on and their typical target length (for the progress line)."""
    if config.data:
        examples = user_examples(config.data, generator.loaded.tokenizer, generator.text.format_prompt, config.max_length)
        steps_hint = int(sum(len(e.target) for e in examples) / len(examples))
    elif config.sequences:
        examples = [replace(e, prompt=e.prompt[-config.max_prompt_tokens:])
                    for e in load_sequences(config.sequences, config.max_sequences)]
        steps_hint = config.continuation_tokens
    else:
        prompts = read_prompts(config.prompts, config.max_prompts)
        cache = output / f"teacher_continuations-{config.continuation_tokens}-s{config.samples_per_prompt}.jsonl"
        with accelerator.main_process_first():  # the main process writes the teacher cache
            examples = distillation_examples(generator, prompts, config, cache)
        steps_hint = config.continuation_tokens
    if config.trim_loops and not config.unlikelihood:  # unlikelihood keeps the loops for its own loss
        trimmed = [replace(e, target=trim_loop(e.target)) for e in examples]
        examples = [e for e in trimmed if e.target]  # a target that loops from its start teaches nothing
    if config.max_target_tokens:
        examples = [replace(e, target=e.target[: config.max_target_tokens]) for e in examples]
        steps_hint = min(steps_hint, config.max_target_tokens)
    return examples, steps_hint


def shared_sources(examples: Sequence[Example], config: TrainConfig) -> list[list[Example]]:
    """The examples of each --sequences folder when --sequence-shares is set (draw_batch's
    ``by_source``), else []; a folder given a share with none of its sequences left is an error."""
    if not config.sequence_shares:
        return []
    folders = sequence_folders(config.sequences or "")
    groups = examples_by_source(examples, len(folders))
    for folder, share, group in zip(folders, config.sequence_shares, groups):
        if share > 0 and not group:
            raise ValueError(f"--sequence-shares gives {folder} a share, but none of its sequences "
                             "is left (all duplicates, cut by --max-sequences, or loops from their start)")
    return groups


def make_accelerator(config: TrainConfig):
    from accelerate import Accelerator  # noqa: PLC0415
    from accelerate.utils import DistributedDataParallelKwargs  # noqa: PLC0415

    device = resolve_device(config.device)
    precision = config.mixed_precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "no"
    # Bypassed layers get no gradient in a batch: DDP must not wait for them.
    return Accelerator(gradient_accumulation_steps=config.grad_accum, mixed_precision=precision,
                       cpu=device.type == "cpu",
                       kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])


def train_step(model, teacher: Teacher | None, optimizer, accelerator, batch: tuple, schedule: ScheduleConfig,
               config: TrainConfig, trainable: list) -> float:
    """One optimiser step on one collated batch under ``schedule``; returns the loss."""
    ids, mask, target_mask, prompt_len = batch
    negatives = None
    if config.unlikelihood and teacher is not None:
        target_mask, negatives = loop_masks(ids[:, prompt_len:], target_mask)
    with accelerator.accumulate(model):
        with accelerator.autocast():
            student_states = [] if config.hidden_weight and teacher else None
            student = model(ids, mask, schedule, prompt_len, student_states)
            if config.data:  # user data: the text itself is the target (+ KL to the model without the adapter)
                loss = cross_entropy_loss(student, ids, target_mask, prompt_len, flip_weight=config.flip_weight)
                if teacher is not None:
                    loss = loss + config.kl_weight * distillation_loss(
                        student, teacher.logits(ids, mask, prompt_len), target_mask)
            else:
                teacher_states = [] if student_states is not None else None
                loss = distillation_loss(student, teacher.logits(ids, mask, prompt_len, teacher_states), target_mask,
                                         flip_weight=config.flip_weight)
                if student_states is not None:
                    loss = loss + config.hidden_weight * hidden_matching_loss(
                        student_states, teacher_states, schedule, prompt_len, target_mask)
                if negatives is not None and bool(negatives.any()):
                    loss = loss + config.unlikelihood * unlikelihood_loss(student, ids, negatives, prompt_len)
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return float(loss.detach())


@dataclass
class _Run:
    """One training run's parts, prepared once (``_prepare_run``) and used by every step."""

    config: TrainConfig
    accelerator: Any
    output: Path
    pad_token_id: int
    examples: list[Example]
    steps_hint: int
    by_source: Any
    heldout: Any
    num_layers: int
    model: Any
    optimizer: Any
    teacher: Teacher | None
    trainable: list


def _prepare_run(config: TrainConfig, prompts: PromptStore | None = None) -> _Run:
    """Threads, seed, the output folder, the model, its data, the held-out set, the trainable skip
    policy (LoRA or full weights, the bridge, an initial adapter) and the optimiser, in this order."""
    from accelerate.utils import set_seed  # noqa: PLC0415

    if config.threads:
        torch.set_num_threads(config.threads)
    accelerator = make_accelerator(config)
    set_seed(config.seed)
    output = Path(config.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    loaded = load_model(config.model, device=str(accelerator.device), dtype="float32", adapter=None,
                        task_adapter=config.task_adapter)
    generator = TextGenerator(loaded)
    examples, steps_hint = training_examples(config, generator, output, accelerator)
    by_source = shared_sources(examples, config)  # before any model work: a bad share fails at once
    heldout = heldout_set(generator, config, output / f"heldout-{config.eval_prompts}-{config.eval_tokens}.jsonl")
    num_layers = generator.num_layers

    lm = wrap_trainable(loaded.model, config)
    hidden_size = adapter_for(loaded.model).hidden_size  # architectures.py owns the config's names
    bridge = EntryBridge(num_layers, hidden_size, config.bridge_rank).to(accelerator.device) if config.bridge_rank else None
    if config.init_adapter and not config.resume:  # a resumed run's checkpoint already holds the weights
        load_initial_adapter(lm, bridge, config.init_adapter, config)
    # the prompt's keys never change: nothing trainable acts on it and no dropout redraws it (GPT-2's, OPT's)
    frozen_prompts = config.gate_lora and not config.full_finetune and not _has_dropout(lm)
    store = (prompts or PromptStore()) if frozen_prompts else None
    teacher = None if config.data and not config.kl_weight else Teacher(lm, config, store)
    model = SkipPolicyModel(lm, bridge, store)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    return _Run(config, accelerator, output, loaded.pad_token_id, examples, steps_hint, by_source, heldout,
                num_layers, model, optimizer, teacher, trainable)


def _heldout_now(run: _Run, budget: Budget) -> dict:
    """The held-out scores of the policy as it is now (not counted against a time budget)."""
    with budget.paused():
        unwrapped = run.accelerator.unwrap_model(run.model)
        return heldout_scores(unwrapped.lm, unwrapped.bridge, run.heldout, run.config, run.num_layers)


def _one_step(run: _Run, step: int, budget: Budget, by_length: list[int] | None) -> tuple[float, ScheduleConfig, int]:
    """One optimiser step: the learning rate, a batch and a schedule drawn from (seed, step, rank)
    (so resuming replays the same ones), the step. Returns its loss, its schedule and the target
    tokens it saw."""
    config, accelerator = run.config, run.accelerator
    for group in run.optimizer.param_groups:
        group["lr"] = config.learning_rate * _lr_factor(step, budget.cpu_minutes * 60, config)
    rng = random.Random(hash((config.seed, step, accelerator.process_index)))
    batch = tuple(t if isinstance(t, int) else t.to(accelerator.device) for t in collate(
        draw_batch(run.examples, by_length, config.batch_size, rng, run.by_source, config.sequence_shares),
        run.pad_token_id))
    schedule = draw_schedule(run.num_layers, batch[2].shape[1], config, rng)
    loss = train_step(run.model, run.teacher, run.optimizer, accelerator, batch, schedule, config, run.trainable)
    return loss, schedule, int(batch[1].sum())


def _step_record(run: _Run, step: int, loss: float, schedule: ScheduleConfig, budget: Budget) -> dict:
    return {"step": step + 1, "loss": round(loss, 5), "decay": schedule.decay,
            "max_layers": schedule.max_layers, "min_layers": schedule.min_layers,
            "seconds": round(budget.seconds, 1), "cpu_minutes": round(budget.cpu_minutes, 2)}


def _postfix(run: _Run, losses: list[float], tokens_seen: int, budget: Budget, schedule: ScheduleConfig) -> dict:
    steps_hint = run.steps_hint
    return {"loss": f"{sum(losses[-10:]) / len(losses[-10:]):.4f}",
            "tok_s": f"{tokens_seen / max(budget.seconds - budget.spent_before, 1e-9):.0f}",
            "speedup": f"{run.num_layers / max(1, sum(schedule.budgets(steps_hint)) / steps_hint):.1f}x"}


def train(config: TrainConfig, prompts: PromptStore | None = None) -> TrainResult:
    """The training run ``config`` describes. ``prompts``: a PromptStore to share with other runs on the same
    frozen model and prompts (policies for several speedups prefill each prompt once between them)."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    run = _prepare_run(config, prompts)
    accelerator, output = run.accelerator, run.output
    start_step, spent = resume_checkpoint(accelerator, output) if config.resume else (0, 0.0)
    budget = Budget(config.max_minutes, spent)
    losses: list[float] = []
    curve: list[dict] = []
    progress = tqdm(range(start_step, config.max_steps), initial=start_step, total=config.max_steps,
                    disable=not accelerator.is_local_main_process, desc="skip-policy training")
    if run.heldout is not None and start_step == 0:
        curve.append({"step": 0, "seconds": 0.0, "cpu_minutes": 0.0, **_heldout_now(run, budget)})
        progress.write("untrained held-out: " + _heldout_line(curve[0]))
    examples = run.examples
    by_length = sorted(range(len(examples)), key=lambda i: len(examples[i].target)) if config.length_grouped else None
    tokens_seen, step = 0, start_step
    for step in progress:
        if budget.exhausted:
            break
        loss, schedule, tokens = _one_step(run, step, budget, by_length)
        losses.append(loss)
        tokens_seen += tokens
        record = _step_record(run, step, loss, schedule, budget)
        done = step + 1 == config.max_steps or budget.exhausted
        postfix = _postfix(run, losses, tokens_seen, budget, schedule)
        if run.heldout is not None and ((step + 1) % config.eval_every == 0 or done):
            record["heldout"] = _heldout_now(run, budget)
            curve.append({"step": step + 1, "seconds": record["seconds"], "cpu_minutes": record["cpu_minutes"],
                          **record["heldout"]})
            postfix["agree@2x"] = record["heldout"].get("2x", {}).get("agreement")
            progress.write(f"step {step + 1} ({budget.seconds / 60:.1f} min) held-out: " + _heldout_line(record["heldout"]))
        progress.set_postfix(postfix)
        if accelerator.is_main_process:
            with (output / "train_log.jsonl").open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        if (step + 1) % config.save_every == 0 or done:
            save_checkpoint(accelerator, run.model, output, step + 1, config, budget.seconds)
        if done:
            break
    return TrainResult(output_dir=str(output), steps=step + 1, seconds=budget.seconds, losses=losses, heldout=curve)


def _heldout_line(scores: dict) -> str:
    return ", ".join(f"{k} agree {v['agreement']:.3f} KL {v['kl']:.3f}" for k, v in scores.items() if isinstance(v, dict))


def _lr_factor(step: int, elapsed: float, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10% over the steps or the time budget, whichever ends first."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    if config.max_minutes is not None:
        progress = max(progress, elapsed / (config.max_minutes * 60))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
