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

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from model.architectures import adapter_for
from model.bench import hardware_info
from model.data import (
    DEFAULT_EVAL_PROMPTS,
    DEFAULT_TRAIN_PROMPTS,
    Example,
    cached_examples,
    collate,
    read_jsonl,
    read_prompts,
    teacher_continuations,
    user_examples,
)
from model.decoder import execution_mask, masked_forward
from model.schedule import (
    DECAY_FUNCTIONS,
    DEFAULT_WARMUP,
    LAYER_ORDERS,
    RANKED,
    ScheduleConfig,
    full_schedule,
    max_layer_speedup,
    solve_schedule,
)
from model.skip_policy import EntryBridge, entry_layers, gated, install_lora_gate

__all__ = ["Example", "collate", "read_jsonl", "user_examples", "TrainConfig", "train", "draw_schedule",
           "skip_policy_logits", "DEFAULT_TRAIN_PROMPTS"]

SCHEDULE_MIXES = ("broad", "focused")
HELDOUT_SPEEDUPS = (1.5, 2.0, 3.0)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",  # Llama family
                "out_proj", "fc1", "fc2",  # OPT
                "c_attn", "c_proj", "c_fc")  # GPT-2


@dataclass
class TrainConfig:
    model: str | None = None  # None: the embedded default model
    output_dir: str = "runs/skipdecode"
    data: str | None = None  # JSONL prompt/completion or text; None = self-distillation
    prompts: str = str(DEFAULT_TRAIN_PROMPTS)  # self-distillation prompt set
    sequences: str | None = None  # a make-data folder: its stored continuations replace --prompts
    max_sequences: int | None = None  # use only the first N unique sequences (the data-scaling curve)
    max_steps: int = 200
    max_minutes: float | None = None  # stop after this much CPU time of this process (equal-budget study arms)
    batch_size: int = 8
    grad_accum: int = 1
    learning_rate: float = 3e-4
    warmup_steps: int = 10
    continuation_tokens: int = 64  # teacher continuation length (self-distillation)
    max_target_tokens: int | None = None  # train on only the first N target tokens (cheaper steps)
    samples_per_prompt: int = 0  # sampled teacher continuations per prompt, besides the greedy one
    sample_temperature: float = 0.8
    max_prompt_tokens: int = 128
    max_length: int = 256  # user data: longest sequence kept
    speedup_range: tuple[float, float] = (1.5, 4.0)
    decays: tuple[str, ...] = DECAY_FUNCTIONS
    schedule_mix: str = "broad"  # broad: uniform speedup and decay; focused: 1.5-3x, mostly linear
    fixed_speedup: float | None = None  # train ONE schedule (the paper) instead of random ones
    fixed_decay: str = "linear"
    warmup_layers: int = DEFAULT_WARMUP
    order: str = "warmup_top"
    ranking: tuple[int, ...] = ()  # order "ranked": layers most important first (model.study measures it)
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_modules: tuple[str, ...] = ()  # () = every linear of the layers
    gate_lora: bool = True  # LoRA acts only where a position bypasses layers (1x == the full model)
    bridge_rank: int = 0  # > 0: a learned entry bridge of this rank
    hidden_weight: float = 0.0  # > 0: add hidden-state matching (entry and final) to the KL
    full_finetune: bool = False
    seed: int = 0
    save_every: int = 50
    eval_every: int = 50  # held-out curve every N steps (0 = off)
    eval_prompts: int = 16  # first N prompts of the held-out set
    eval_tokens: int = 48
    resume: bool = False
    device: str = "auto"
    mixed_precision: str = "auto"  # auto: bf16 on GPU, none on CPU
    teacher_batch_size: int = 16
    max_prompts: int | None = None  # use only the first N prompts (quick trials, tests)
    threads: int | None = None  # CPU threads for torch (default: torch's choice)

    def __post_init__(self) -> None:
        positive = ("max_steps", "batch_size", "grad_accum", "continuation_tokens", "max_prompt_tokens",
                    "max_length", "lora_rank", "lora_alpha", "save_every", "teacher_batch_size", "eval_prompts",
                    "eval_tokens")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        for name in ("samples_per_prompt", "bridge_rank", "eval_every", "warmup_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0; got {value!r}")
        if not (isinstance(self.learning_rate, (int, float)) and math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be a positive number; got {self.learning_rate!r}")
        if not (math.isfinite(self.hidden_weight) and self.hidden_weight >= 0):
            raise ValueError(f"hidden_weight must be >= 0; got {self.hidden_weight!r}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"max_minutes must be > 0; got {self.max_minutes!r}")
        low, high = self.speedup_range
        if not (1.0 <= low <= high):
            raise ValueError(f"speedup_range must satisfy 1 <= low <= high; got {self.speedup_range}")
        for decay in self.decays:
            if decay not in DECAY_FUNCTIONS:
                raise ValueError(f"decays: {decay!r} is not one of {', '.join(DECAY_FUNCTIONS)}")
        if self.fixed_decay not in DECAY_FUNCTIONS:
            raise ValueError(f"fixed_decay must be one of {', '.join(DECAY_FUNCTIONS)}; got {self.fixed_decay!r}")
        if self.fixed_speedup is not None and self.fixed_speedup < 1:
            raise ValueError(f"fixed_speedup must be >= 1; got {self.fixed_speedup}")
        if self.schedule_mix not in SCHEDULE_MIXES:
            raise ValueError(f"schedule_mix must be one of {', '.join(SCHEDULE_MIXES)}; got {self.schedule_mix!r}")
        if self.order not in LAYER_ORDERS and self.order != RANKED:
            raise ValueError(f"order must be one of {', '.join(LAYER_ORDERS)}, {RANKED}; got {self.order!r}")
        self.ranking = tuple(int(i) for i in self.ranking)


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
    if config.fixed_speedup is not None:
        return solve_schedule(num_layers, config.fixed_speedup, decay=config.fixed_decay,
                              decay_length=max(1, num_steps), **common).config
    low, high = config.speedup_range
    if config.schedule_mix == "focused":
        high = min(high, FOCUSED_MAX_SPEEDUP)
    high = min(high, max_layer_speedup(num_layers, warmup))
    speedup = rng.uniform(min(low, high), high)
    if config.schedule_mix == "focused" and "linear" in config.decays and rng.random() < FOCUSED_LINEAR_SHARE:
        decay = "linear"
    else:
        decay = rng.choice(config.decays)
    decay_length = max(1, int(num_steps * rng.uniform(*DECAY_LENGTH_SPREAD)))
    return solve_schedule(num_layers, speedup, decay=decay, decay_length=decay_length,
                          num_steps=max(1, num_steps), **common).config


# --- losses ----------------------------------------------------------------------------------


def skip_policy_logits(model, ids, mask, schedule: ScheduleConfig, prompt_len: int, *,
                       bridge: EntryBridge | None = None, hidden_states: list | None = None) -> torch.Tensor:
    """Logits (B, N, V) predicting target token k at position P - 1 + k, under ``schedule``.

    A gated LoRA (skip_policy.install_lora_gate) acts only at positions that bypass layers.
    """
    executes = execution_mask(schedule, prompt_len, ids.shape[1])
    with gated(model, executes, ids.shape[0]):
        logits = masked_forward(model, ids, mask, executes, logits_from=prompt_len - 1, bridge=bridge,
                                hidden_states=hidden_states)
    return logits[:, :-1]


def distillation_loss(student_logits, teacher_logits, target_mask) -> torch.Tensor:
    """KL(teacher || student) per target position, averaged over real targets."""
    teacher = F.log_softmax(teacher_logits.float(), dim=-1)
    student = F.log_softmax(student_logits.float(), dim=-1)
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # (B, N)
    return (kl * target_mask).sum() / target_mask.sum().clamp(min=1)


def cross_entropy_loss(student_logits, ids, target_mask, prompt_len: int) -> torch.Tensor:
    targets = ids[:, prompt_len:]
    losses = F.cross_entropy(student_logits.float().transpose(1, 2), targets, reduction="none")
    return (losses * target_mask).sum() / target_mask.sum().clamp(min=1)


def _relative_error(student: torch.Tensor, teacher: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean over weighted positions of ||s - t||^2 / ||t||^2. student/teacher (B, T, C), weight (B, T)."""
    error = (student.float() - teacher.float()).pow(2).sum(-1) / teacher.float().pow(2).sum(-1).clamp(min=1e-6)
    return (error * weight).sum() / weight.sum().clamp(min=1)


def hidden_matching_loss(student_states: list, teacher_states: list, schedule: ScheduleConfig,
                         prompt_len: int, target_mask: torch.Tensor) -> torch.Tensor:
    """Relative error of the hidden state where a generated position ENTERS the upper block
    (after the bridge) and of the final hidden state, against the full model's at the same layer.

    states: L + 1 tensors (B, T, C), the input of every layer then the final output.
    """
    weight = target_mask.float()  # generated positions P .. P + N - 1
    generated = slice(prompt_len, prompt_len + target_mask.shape[1])
    loss = _relative_error(student_states[-1][:, generated], teacher_states[-1][:, generated], weight)
    by_entry: dict[int, list[int]] = {}
    for k in range(target_mask.shape[1]):
        for layer in entry_layers(schedule.step_layers(k)):
            by_entry.setdefault(layer, []).append(k)
    for layer, steps in by_entry.items():
        columns = torch.tensor([prompt_len + k for k in steps], device=target_mask.device)
        loss = loss + _relative_error(student_states[layer][:, columns], teacher_states[layer][:, columns],
                                      weight[:, steps]) * len(steps) / target_mask.shape[1]
    return loss


# --- the run ---------------------------------------------------------------------------------


@dataclass
class TrainResult:
    output_dir: str
    steps: int
    seconds: float
    losses: list[float] = field(default_factory=list)
    heldout: list[dict] = field(default_factory=list)


class SkipPolicyModel(torch.nn.Module):
    """The student as one module (LoRA'd model + optional bridge), so accelerate/DDP see the
    masked forward as its forward and checkpoint the bridge with the rest."""

    def __init__(self, lm: torch.nn.Module, bridge: EntryBridge | None = None) -> None:
        super().__init__()
        self.lm = lm
        self.bridge = bridge

    def forward(self, ids, mask, schedule: ScheduleConfig, prompt_len: int, hidden_states: list | None = None) -> torch.Tensor:
        return skip_policy_logits(self.lm, ids, mask, schedule, prompt_len, bridge=self.bridge,
                                  hidden_states=hidden_states)


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
    switched off (no second copy), or a frozen copy when all weights are trained."""

    def __init__(self, student, config: TrainConfig) -> None:
        import copy  # noqa: PLC0415

        self.student = student
        self.frozen = copy.deepcopy(student).eval().requires_grad_(False) if config.full_finetune else None

    @torch.no_grad()
    def logits(self, ids, mask, prompt_len: int, hidden_states: list | None = None) -> torch.Tensor:
        model = self.frozen if self.frozen is not None else self.student
        schedule = full_schedule(adapter_for(model).num_layers)
        if self.frozen is not None:
            return skip_policy_logits(model, ids, mask, schedule, prompt_len, hidden_states=hidden_states)
        with model.disable_adapter():
            return skip_policy_logits(model, ids, mask, schedule, prompt_len, hidden_states=hidden_states)


@dataclass
class HeldOut:
    """A fixed held-out subset: the full model's greedy continuations and its logits on them."""

    batches: list[tuple]
    teacher_logits: list[torch.Tensor]  # (B, N, V) per batch
    tokens: int


def heldout_set(generator, config: TrainConfig, cache_file: Path) -> HeldOut | None:
    if not config.eval_every or config.data:
        return None
    from model.data import batches_of  # noqa: PLC0415

    prompts = read_prompts(DEFAULT_EVAL_PROMPTS, config.eval_prompts)
    examples = cached_examples(cache_file, lambda: teacher_continuations(
        generator, prompts, max_new_tokens=config.eval_tokens, batch_size=config.teacher_batch_size))
    batches = batches_of(examples, 8, generator.loaded.pad_token_id, generator.loaded.device)
    model = generator.loaded.model
    num_layers = generator.num_layers
    with torch.inference_mode():
        teacher = [skip_policy_logits(model, ids, mask, full_schedule(num_layers), p).float()
                   for ids, mask, _, p in batches]
    return HeldOut(batches=batches, teacher_logits=teacher, tokens=config.eval_tokens)


def heldout_scores(model, bridge, heldout: HeldOut, config: TrainConfig, num_layers: int) -> dict:
    """Teacher-forced agreement, KL and perplexity ratio at 1.5x, 2x and 3x (linear decay over
    the held-out continuation length, the app's default placement), plus 1.0x agreement."""
    scores: dict = {}
    was_training = model.training
    model.eval()
    speedups = (1.0,) + HELDOUT_SPEEDUPS
    try:
        with torch.no_grad():
            for speedup in speedups:
                if speedup > max_layer_speedup(num_layers, config.warmup_layers):
                    continue  # unreachable on a shallow model
                if speedup == 1.0:
                    schedule = full_schedule(num_layers)
                else:
                    schedule = solve_schedule(num_layers, speedup, decay="linear", warmup=config.warmup_layers,
                                              order=config.order, ranking=config.ranking, decay_length=heldout.tokens,
                                              num_steps=max(1, heldout.tokens - 1)).config
                agree = kl = nll = teacher_nll = count = 0.0
                for (ids, mask, target_mask, p), teacher in zip(heldout.batches, heldout.teacher_logits):
                    logits = skip_policy_logits(model, ids, mask, schedule, p, bridge=bridge).float()
                    targets = ids[:, p:]
                    weight = target_mask.float()
                    agree += float(((logits.argmax(-1) == targets).float() * weight).sum())
                    kl += float(distillation_loss(logits, teacher, target_mask)) * float(weight.sum())
                    nll += float((F.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * weight).sum())
                    teacher_nll += float((F.cross_entropy(teacher.transpose(1, 2), targets, reduction="none") * weight).sum())
                    count += float(weight.sum())
                key = f"{speedup:g}x"
                scores[key] = {"agreement": round(agree / count, 4), "kl": round(kl / count, 4),
                               "perplexity_ratio": round(math.exp((nll - teacher_nll) / count), 4)}
    finally:
        model.train(was_training)
    return scores


def train(config: TrainConfig) -> TrainResult:
    from accelerate import Accelerator  # noqa: PLC0415
    from accelerate.utils import DistributedDataParallelKwargs, set_seed  # noqa: PLC0415
    from tqdm.auto import tqdm  # noqa: PLC0415

    from model.generation import TextGenerator  # noqa: PLC0415
    from model.loading import load_model, resolve_device  # noqa: PLC0415

    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    precision = config.mixed_precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "no"

    # Bypassed layers get no gradient in a batch: DDP must not wait for them.
    accelerator = Accelerator(gradient_accumulation_steps=config.grad_accum, mixed_precision=precision,
                              cpu=device.type == "cpu",
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    set_seed(config.seed)
    output = Path(config.output_dir)
    output.mkdir(parents=True, exist_ok=True)

    loaded = load_model(config.model, device=str(accelerator.device), dtype="float32", adapter=None)
    generator = TextGenerator(loaded)
    if config.data:
        examples = user_examples(config.data, loaded.tokenizer, generator.format_prompt, config.max_length)
        steps_hint = int(sum(len(e.target) for e in examples) / len(examples))
    elif config.sequences:
        from model.make_data import load_sequences  # noqa: PLC0415

        examples = load_sequences(config.sequences, config.max_sequences)
        examples = [Example(prompt=e.prompt[-config.max_prompt_tokens:], target=e.target) for e in examples]
        steps_hint = config.continuation_tokens
    else:
        prompts = read_prompts(config.prompts, config.max_prompts)
        cache = output / f"teacher_continuations-{config.continuation_tokens}-s{config.samples_per_prompt}.jsonl"
        with accelerator.main_process_first():  # the main process writes the teacher cache
            examples = distillation_examples(generator, prompts, config, cache)
        steps_hint = config.continuation_tokens
    if config.max_target_tokens:
        examples = [Example(prompt=e.prompt, target=e.target[: config.max_target_tokens]) for e in examples]
        steps_hint = min(steps_hint, config.max_target_tokens)
    heldout = heldout_set(generator, config, output / f"heldout-{config.eval_prompts}-{config.eval_tokens}.jsonl")
    num_layers = generator.num_layers

    lm = wrap_trainable(loaded.model, config)
    hidden_size = int(getattr(loaded.model.config, "hidden_size", 0) or loaded.model.config.n_embd)
    bridge = EntryBridge(num_layers, hidden_size, config.bridge_rank).to(accelerator.device) if config.bridge_rank else None
    teacher = None if config.data else Teacher(lm, config)
    model = SkipPolicyModel(lm, bridge)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)

    start_step, spent = _resume(accelerator, output) if config.resume else (0, 0.0)
    # A time budget counts this process's CPU time, not wall time: arms of a study stay
    # comparable while other work shares the machine.
    cpu_started = time.process_time() - spent
    pad_id = loaded.pad_token_id
    losses: list[float] = []
    curve: list[dict] = []
    started = time.perf_counter() - spent
    progress = tqdm(range(start_step, config.max_steps), initial=start_step, total=config.max_steps,
                    disable=not accelerator.is_local_main_process, desc="skip-policy training")
    tokens_seen = 0
    step = start_step
    eval_seconds = eval_cpu_seconds = 0.0  # held-out evaluation does not count against a time budget

    def evaluate_heldout() -> dict:
        nonlocal eval_seconds, eval_cpu_seconds
        begun, cpu_begun = time.perf_counter(), time.process_time()
        unwrapped = accelerator.unwrap_model(model)
        scores = heldout_scores(unwrapped.lm, unwrapped.bridge, heldout, config, num_layers)
        eval_seconds += time.perf_counter() - begun
        eval_cpu_seconds += time.process_time() - cpu_begun
        return scores

    if heldout is not None and start_step == 0:
        curve.append({"step": 0, "seconds": 0.0, "cpu_minutes": 0.0, **evaluate_heldout()})
        progress.write("untrained held-out: " + ", ".join(
            f"{k} agree {v['agreement']:.3f}" for k, v in curve[0].items() if isinstance(v, dict)))
    def cpu_minutes() -> float:
        return (time.process_time() - cpu_started - eval_cpu_seconds) / 60

    for step in progress:
        elapsed = time.perf_counter() - started - eval_seconds
        if config.max_minutes is not None and cpu_minutes() > config.max_minutes:
            break
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate * _lr_factor(step, cpu_minutes() * 60, config)
        # Per-step RNG from (seed, step, rank): resuming replays the same batches and schedules.
        rng = random.Random(hash((config.seed, step, accelerator.process_index)))
        batch = [examples[rng.randrange(len(examples))] for _ in range(config.batch_size)]
        ids, mask, target_mask, prompt_len = (t if isinstance(t, int) else t.to(accelerator.device)
                                              for t in collate(batch, pad_id))
        schedule = draw_schedule(num_layers, target_mask.shape[1], config, rng)
        with accelerator.accumulate(model):
            with accelerator.autocast():
                student_states = [] if config.hidden_weight and teacher else None
                student = model(ids, mask, schedule, prompt_len, student_states)
                if config.data:
                    loss = cross_entropy_loss(student, ids, target_mask, prompt_len)
                else:
                    teacher_states = [] if student_states is not None else None
                    loss = distillation_loss(student, teacher.logits(ids, mask, prompt_len, teacher_states), target_mask)
                    if student_states is not None:
                        loss = loss + config.hidden_weight * hidden_matching_loss(
                            student_states, teacher_states, schedule, prompt_len, target_mask)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(float(loss.detach()))
        tokens_seen += int(mask.sum())
        elapsed = time.perf_counter() - started - eval_seconds
        postfix = {"loss": f"{sum(losses[-10:]) / len(losses[-10:]):.4f}", "tok_s": f"{tokens_seen / max(elapsed - spent, 1e-9):.0f}",
                   "speedup": f"{schedule.num_layers / max(1, sum(schedule.budgets(steps_hint)) / steps_hint):.1f}x"}
        record = {"step": step + 1, "loss": round(losses[-1], 5), "decay": schedule.decay,
                  "max_layers": schedule.max_layers, "min_layers": schedule.min_layers,
                  "seconds": round(elapsed, 1), "cpu_minutes": round(cpu_minutes(), 2)}
        done = step + 1 == config.max_steps or (config.max_minutes is not None and cpu_minutes() > config.max_minutes)
        if heldout is not None and ((step + 1) % config.eval_every == 0 or done):
            record["heldout"] = evaluate_heldout()
            curve.append({"step": step + 1, "seconds": round(elapsed, 1), "cpu_minutes": round(cpu_minutes(), 2),
                          **record["heldout"]})
            postfix["agree@2x"] = record["heldout"].get("2x", {}).get("agreement")
            progress.write(f"step {step + 1} ({elapsed / 60:.1f} min) held-out: " + ", ".join(
                f"{k} agree {v['agreement']:.3f} KL {v['kl']:.3f}" for k, v in record["heldout"].items()))
        progress.set_postfix(postfix)
        if accelerator.is_main_process:
            with (output / "train_log.jsonl").open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        if (step + 1) % config.save_every == 0 or done:
            _checkpoint(accelerator, model, output, step + 1, config, elapsed)
        if done:
            break
    return TrainResult(output_dir=str(output), steps=step + 1, seconds=time.perf_counter() - started,
                       losses=losses, heldout=curve)


def _lr_factor(step: int, elapsed: float, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10% over the steps or the time budget, whichever ends first."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    if config.max_minutes is not None:
        progress = max(progress, elapsed / (config.max_minutes * 60))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _checkpoint(accelerator, model, output: Path, step: int, config: TrainConfig, seconds: float) -> None:
    """accelerate state (resume) + the adapter itself (what the app loads)."""
    accelerator.wait_for_everyone()
    folder = output / "checkpoints" / f"step-{step:06d}"
    accelerator.save_state(str(folder))
    if accelerator.is_main_process:
        import shutil  # noqa: PLC0415

        for old in sorted((output / "checkpoints").glob("step-*"))[:-2]:  # full states are large: keep two
            shutil.rmtree(old, ignore_errors=True)
        (folder / "progress.json").write_text(json.dumps({"step": step, "seconds": seconds}))
        unwrapped = accelerator.unwrap_model(model)
        save_adapter(unwrapped.lm, output / "adapter", config, step, seconds, bridge=unwrapped.bridge)


def save_adapter(model, folder: Path, config: TrainConfig, step: int, seconds: float,
                 bridge: EntryBridge | None = None) -> None:
    """The adapter (peft format, float32: a reload gives bit-identical logits), the bridge, and
    how they were made (paths relative to the repository, no machine-specific absolute paths)."""
    model.save_pretrained(folder)
    if bridge is not None:
        bridge.save(folder)
    settings = asdict(config)
    for key in ("prompts", "data", "output_dir", "model"):
        settings[key] = _portable_path(settings[key])
    info = {"step": step, "seconds": round(seconds, 1), "config": settings,
            "skip_policy": {"gated": config.gate_lora, "bridge_rank": config.bridge_rank,
                            "warmup": config.warmup_layers, "order": config.order, "ranking": list(config.ranking)},
            "hardware": hardware_info(torch.device("cuda" if torch.cuda.is_available() else "cpu"))}
    (folder / "training_info.json").write_text(json.dumps(info, indent=2, default=str))


def _portable_path(value):
    """A path inside the repository as a relative path; anything else unchanged."""
    if not isinstance(value, str) or not value:
        return value
    root = Path(__file__).resolve().parents[1]
    try:
        return str(Path(value).resolve().relative_to(root))
    except ValueError:
        return value


def _resume(accelerator, output: Path) -> tuple[int, float]:
    checkpoints = sorted((output / "checkpoints").glob("step-*"))
    if not checkpoints:
        raise ValueError(f"--resume: no checkpoint under {output / 'checkpoints'}")
    accelerator.load_state(str(checkpoints[-1]))
    progress = checkpoints[-1] / "progress.json"
    seconds = json.loads(progress.read_text())["seconds"] if progress.is_file() else 0.0
    return int(checkpoints[-1].name.split("-")[1]), float(seconds)
