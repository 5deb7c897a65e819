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
import platform
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from model.architectures import adapter_for
from model.decoder import execution_mask, masked_forward
from model.schedule import DECAY_FUNCTIONS, ScheduleConfig, full_schedule, max_layer_speedup, solve_schedule

DEFAULT_TRAIN_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "train.jsonl"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",  # Llama family
                "out_proj", "fc1", "fc2",  # OPT
                "c_attn", "c_proj", "c_fc")  # GPT-2


@dataclass
class TrainConfig:
    model: str | None = None  # None: the embedded default model
    output_dir: str = "runs/skipdecode"
    data: str | None = None  # JSONL prompt/completion or text; None = self-distillation
    prompts: str = str(DEFAULT_TRAIN_PROMPTS)  # self-distillation prompt set
    max_steps: int = 200
    batch_size: int = 8
    grad_accum: int = 1
    learning_rate: float = 3e-4
    warmup_steps: int = 10
    continuation_tokens: int = 64  # teacher continuation length (self-distillation)
    max_prompt_tokens: int = 128
    max_length: int = 256  # user data: longest sequence kept
    speedup_range: tuple[float, float] = (1.5, 4.0)
    decays: tuple[str, ...] = DECAY_FUNCTIONS
    fixed_speedup: float | None = None  # train ONE schedule (the paper) instead of random ones
    fixed_decay: str = "linear"
    warmup_layers: int = 1
    lora_rank: int = 16
    lora_alpha: int = 32
    full_finetune: bool = False
    seed: int = 0
    save_every: int = 50
    resume: bool = False
    device: str = "auto"
    mixed_precision: str = "auto"  # auto: bf16 on GPU, none on CPU
    teacher_batch_size: int = 16
    max_prompts: int | None = None  # use only the first N prompts (quick trials, tests)
    threads: int | None = None  # CPU threads for torch (default: torch's choice)

    def __post_init__(self) -> None:
        positive = ("max_steps", "batch_size", "grad_accum", "continuation_tokens", "max_prompt_tokens",
                    "max_length", "lora_rank", "lora_alpha", "save_every", "teacher_batch_size")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if not (isinstance(self.learning_rate, (int, float)) and math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be a positive number; got {self.learning_rate!r}")
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


# --- data ----------------------------------------------------------------------------------


@dataclass
class Example:
    """One training sequence: prompt ids (run at full depth) + target ids (run under skipping)."""

    prompt: list[int]
    target: list[int]


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSONL file; a malformed line is an error naming its line number."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data file {str(path)!r} does not exist")
    records = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path.name} line {number}: not valid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path.name} line {number}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
    if not records:
        raise ValueError(f"{path.name} has no records")
    return records


def user_examples(path: str | Path, tokenizer, formatter, max_length: int) -> list[Example]:
    """prompt/completion records (loss on the completion) or text records (loss on all but the first token)."""
    examples = []
    for number, record in enumerate(read_jsonl(path), start=1):
        if "prompt" in record and "completion" in record:
            prompt, completion = record["prompt"], record["completion"]
            if not isinstance(prompt, str) or not isinstance(completion, str) or not completion.strip():
                raise ValueError(f"{Path(path).name} record {number}: prompt and completion must be non-empty text")
            prompt_ids = tokenizer(formatter(prompt), add_special_tokens=False)["input_ids"]
            target_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
            if tokenizer.eos_token_id is not None:
                target_ids.append(tokenizer.eos_token_id)
        elif "text" in record:
            text = record["text"]
            if not isinstance(text, str) or len(text.strip()) == 0:
                raise ValueError(f"{Path(path).name} record {number}: text must be non-empty")
            ids = tokenizer(text)["input_ids"]
            if len(ids) < 2:
                raise ValueError(f"{Path(path).name} record {number}: text is too short to train on")
            prompt_ids, target_ids = ids[:1], ids[1:]
        else:
            raise ValueError(f"{Path(path).name} record {number}: needs 'prompt' and 'completion', or 'text'")
        target_ids = target_ids[: max(1, max_length - len(prompt_ids))]
        examples.append(Example(prompt=prompt_ids[-max_length + 1:], target=target_ids))
    return examples


def distillation_examples(generator, prompts: Sequence[str], config: TrainConfig, cache_file: Path) -> list[Example]:
    """The full model's greedy continuations of ``prompts`` (cached: the teacher is deterministic)."""
    if cache_file.is_file():
        cached = [Example(**record) for record in read_jsonl(cache_file)]
        if len(cached) == len(prompts):
            return cached
    examples = []
    tokenizer = generator.loaded.tokenizer
    for start in range(0, len(prompts), config.teacher_batch_size):
        batch = prompts[start:start + config.teacher_batch_size]
        ids, mask = generator.encode(batch)
        ids, mask = ids[:, -config.max_prompt_tokens:], mask[:, -config.max_prompt_tokens:]
        result = generator.full_decoder.generate(ids, mask, full_schedule(generator.num_layers),
                                                 max_new_tokens=config.continuation_tokens)
        for row in range(len(batch)):
            prompt_ids = ids[row][mask[row].bool()].tolist()
            target = list(result.tokens[row])
            if result.finish_reasons[row] == "eos":
                target.append(tokenizer.eos_token_id)  # learn to stop where the full model stops
            examples.append(Example(prompt=prompt_ids, target=target))
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text("".join(json.dumps(asdict(e)) + "\n" for e in examples))
    return examples


def collate(examples: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Prompts LEFT padded to end together at P; targets RIGHT padded after them.

    Returns ids (B, P + N), attention mask (B, P + N), target mask (B, N) and P. Generated
    position P + k is decode step k for every row, exactly as in the lock-step decoder.
    """
    prompt_len = max(len(e.prompt) for e in examples)
    target_len = max(len(e.target) for e in examples)
    batch = len(examples)
    ids = torch.full((batch, prompt_len + target_len), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    target_mask = torch.zeros(batch, target_len, dtype=torch.bool)
    for row, example in enumerate(examples):
        ids[row, prompt_len - len(example.prompt):prompt_len] = torch.tensor(example.prompt)
        mask[row, prompt_len - len(example.prompt):prompt_len + len(example.target)] = 1
        ids[row, prompt_len:prompt_len + len(example.target)] = torch.tensor(example.target)
        target_mask[row, : len(example.target)] = True
    return ids, mask, target_mask, prompt_len


# --- schedules -------------------------------------------------------------------------------


def draw_schedule(num_layers: int, num_steps: int, config: TrainConfig, rng: random.Random) -> ScheduleConfig:
    """The schedule of one batch: fixed, or a random speedup and decay from the app's range."""
    warmup = config.warmup_layers
    if config.fixed_speedup is not None:
        return solve_schedule(num_layers, config.fixed_speedup, decay=config.fixed_decay, warmup=warmup,
                              decay_length=max(1, num_steps)).config
    low, high = config.speedup_range
    high = min(high, max_layer_speedup(num_layers, warmup))
    speedup = rng.uniform(min(low, high), high)
    decay = rng.choice(config.decays)
    # The app's decay length is max_new_tokens; generations are often shorter or longer.
    decay_length = max(1, int(num_steps * rng.uniform(0.5, 1.5)))
    return solve_schedule(num_layers, speedup, decay=decay, warmup=warmup, decay_length=decay_length,
                          num_steps=max(1, num_steps)).config


# --- losses ----------------------------------------------------------------------------------


def skip_policy_logits(model, ids, mask, schedule: ScheduleConfig, prompt_len: int) -> torch.Tensor:
    """Logits (B, N, V) predicting target token k at position P - 1 + k, under ``schedule``."""
    executes = execution_mask(schedule, prompt_len, ids.shape[1])
    return masked_forward(model, ids, mask, executes, logits_from=prompt_len - 1)[:, :-1]


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


# --- the run ---------------------------------------------------------------------------------


@dataclass
class TrainResult:
    output_dir: str
    steps: int
    seconds: float
    losses: list[float] = field(default_factory=list)


class SkipPolicyModel(torch.nn.Module):
    """The student as one module, so accelerate/DDP see the masked forward as its forward
    (gradients of a multi-GPU run are then synchronised as usual)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids, mask, schedule: ScheduleConfig, prompt_len: int) -> torch.Tensor:
        return skip_policy_logits(self.lm, ids, mask, schedule, prompt_len)


def wrap_trainable(model, config: TrainConfig):
    """LoRA (peft) on every linear of the layers, or the whole model for full fine-tuning."""
    if config.full_finetune:
        model.train()
        return model
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415

    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    targets = sorted(names & set(LORA_TARGETS))
    if not targets:
        raise ValueError(f"no LoRA target modules found among {sorted(names)}")
    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules=targets, task_type="CAUSAL_LM")
    wrapped = get_peft_model(model, lora)
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
    def logits(self, ids, mask, prompt_len: int) -> torch.Tensor:
        model = self.frozen if self.frozen is not None else self.student
        num_layers = adapter_for(model).num_layers
        if self.frozen is not None:
            return skip_policy_logits(model, ids, mask, full_schedule(num_layers), prompt_len)
        with model.disable_adapter():
            return skip_policy_logits(model, ids, mask, full_schedule(num_layers), prompt_len)


def train(config: TrainConfig) -> TrainResult:
    from accelerate import Accelerator  # noqa: PLC0415
    from accelerate.utils import set_seed  # noqa: PLC0415
    from tqdm.auto import tqdm  # noqa: PLC0415

    from model.generation import TextGenerator  # noqa: PLC0415
    from model.loading import load_model, resolve_device  # noqa: PLC0415

    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    precision = config.mixed_precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "no"
    from accelerate.utils import DistributedDataParallelKwargs  # noqa: PLC0415

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
    else:
        prompts = [r["prompt"] for r in read_jsonl(config.prompts)][: config.max_prompts]
        with accelerator.main_process_first():  # the main process writes the teacher cache
            examples = distillation_examples(generator, prompts, config, output / "teacher_continuations.jsonl")
        steps_hint = config.continuation_tokens

    lm = wrap_trainable(loaded.model, config)
    teacher = None if config.data else Teacher(lm, config)
    trainable = [p for p in lm.parameters() if p.requires_grad]
    model = SkipPolicyModel(lm)
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    start_step = _resume(accelerator, output) if config.resume else 0
    num_layers = generator.num_layers
    pad_id = loaded.pad_token_id
    losses: list[float] = []
    started = time.perf_counter()
    progress = tqdm(range(start_step, config.max_steps), initial=start_step, total=config.max_steps,
                    disable=not accelerator.is_local_main_process, desc="skip-policy training")
    tokens_seen = 0
    for step in progress:
        # Per-step RNG from (seed, step, rank): resuming replays the same batches and schedules.
        rng = random.Random(hash((config.seed, step, accelerator.process_index)))
        batch = [examples[rng.randrange(len(examples))] for _ in range(config.batch_size)]
        ids, mask, target_mask, prompt_len = (t if isinstance(t, int) else t.to(accelerator.device)
                                              for t in collate(batch, pad_id))
        schedule = draw_schedule(num_layers, target_mask.shape[1], config, rng)
        with accelerator.accumulate(model):
            with accelerator.autocast():
                student = model(ids, mask, schedule, prompt_len)
                if config.data:
                    loss = cross_entropy_loss(student, ids, target_mask, prompt_len)
                else:
                    loss = distillation_loss(student, teacher.logits(ids, mask, prompt_len), target_mask)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        losses.append(float(loss.detach()))
        tokens_seen += int(mask.sum())
        elapsed = time.perf_counter() - started
        progress.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.4f}", tok_s=f"{tokens_seen / elapsed:.0f}",
                             speedup=f"{schedule.num_layers / max(1, sum(schedule.budgets(steps_hint)) / steps_hint):.1f}x")
        _log_step(output, step, losses[-1], schedule, tokens_seen / elapsed, accelerator)
        if (step + 1) % config.save_every == 0 or step + 1 == config.max_steps:
            _checkpoint(accelerator, model, output, step + 1, config, time.perf_counter() - started)
    return TrainResult(output_dir=str(output), steps=config.max_steps, seconds=time.perf_counter() - started,
                       losses=losses)


def _lr_factor(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10%."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _log_step(output: Path, step: int, loss: float, schedule: ScheduleConfig, tokens_per_second: float, accelerator) -> None:
    if not accelerator.is_main_process:
        return
    record = {"step": step + 1, "loss": round(loss, 5), "decay": schedule.decay, "max_layers": schedule.max_layers,
              "min_layers": schedule.min_layers, "tokens_per_second": round(tokens_per_second, 1)}
    with (output / "train_log.jsonl").open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def _checkpoint(accelerator, model, output: Path, step: int, config: TrainConfig, seconds: float) -> None:
    """accelerate state (resume) + the adapter itself (what the app loads)."""
    accelerator.wait_for_everyone()
    accelerator.save_state(str(output / "checkpoints" / f"step-{step:06d}"))
    if accelerator.is_main_process:
        save_adapter(accelerator.unwrap_model(model).lm, output / "adapter", config, step, seconds)


def save_adapter(model, folder: Path, config: TrainConfig, step: int, seconds: float) -> None:
    """The adapter (peft format, float32: a reload gives bit-identical logits) + how it was made."""
    model.save_pretrained(folder)
    info = {"step": step, "seconds": round(seconds, 1), "config": asdict(config),
            "hardware": {"machine": platform.machine(), "processor": platform.processor(),
                         "cpus": torch.get_num_threads(), "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}
    (folder / "training_info.json").write_text(json.dumps(info, indent=2, default=str))


def _resume(accelerator, output: Path) -> int:
    checkpoints = sorted((output / "checkpoints").glob("step-*"))
    if not checkpoints:
        raise ValueError(f"--resume: no checkpoint under {output / 'checkpoints'}")
    accelerator.load_state(str(checkpoints[-1]))
    return int(checkpoints[-1].name.split("-")[1])
