"""Data for training and evaluation: JSONL prompt sets, examples, the teacher's continuations,
and lock-step collation. Shared by model/training/training.py and model/evaluation/evaluation.py."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from model.skipdecode.decoder import SamplingConfig
from model.skipdecode.schedule import full_schedule

ASSETS = Path(__file__).resolve().parents[2] / "assets"
DEFAULT_TRAIN_PROMPTS = ASSETS / "prompts" / "train.jsonl"
DEFAULT_EVAL_PROMPTS = ASSETS / "prompts" / "eval.jsonl"
DEFAULT_FACTS = ASSETS / "prompts" / "facts.jsonl"  # short fact questions with accepted answers (held out)


@dataclass
class Example:
    """One training sequence: prompt ids (run at full depth) + target ids (run under skipping)."""

    prompt: list[int]
    target: list[int]
    source: int = 0  # which --sequences folder it came from (their order): the sampler's shares


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


def read_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    return [r["prompt"] for r in read_jsonl(path)][:limit]


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


def continuation_target(tokens: Sequence[int], finish_reason: str, eos_id: int | None) -> list[int]:
    """A generated continuation as a target: its tokens (the decoder leaves EOS out), then EOS
    where the model stopped, so a student learns to stop."""
    return list(tokens) + ([eos_id] if finish_reason == "eos" and eos_id is not None else [])


def teacher_continuations(
    generator,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    max_prompt_tokens: int = 128,
    batch_size: int = 16,
    samples: int = 0,
    temperature: float = 0.8,
    seed: int = 0,
) -> list[Example]:
    """The ORIGINAL model's continuations of ``prompts``: one greedy each, plus ``samples``
    sampled ones (temperature ``temperature``). Sampled continuations show the student the
    states the full model visits when it does not take its argmax: more distinct targets per
    prompt. Targets end with EOS where the full model stopped, so the student learns to stop."""
    examples = []
    eos = generator.loaded.tokenizer.eos_token_id
    schedule = full_schedule(generator.num_layers)
    settings = [SamplingConfig()] + [SamplingConfig(temperature=temperature, seed=seed + i) for i in range(samples)]
    for start in range(0, len(prompts), batch_size):
        ids, mask = generator.text.encode(prompts[start:start + batch_size])
        ids, mask = ids[:, -max_prompt_tokens:], mask[:, -max_prompt_tokens:]
        for sampling in settings:
            result = generator.full_decoder.generate(ids, mask, schedule, max_new_tokens=max_new_tokens,
                                                     sampling=sampling)
            for row in range(ids.shape[0]):
                target = continuation_target(result.tokens[row], result.finish_reasons[row], eos)
                if target:
                    examples.append(Example(prompt=ids[row][mask[row].bool()].tolist(), target=target))
    return examples


def cached_examples(cache_file: Path, make) -> list[Example]:
    """Examples stored in ``cache_file`` (JSONL), or ``make()`` written there first."""
    if cache_file.is_file():
        return [Example(**record) for record in read_jsonl(cache_file)]
    examples = make()
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


def batches_of(examples: Sequence[Example], batch_size: int, pad_id: int, device: torch.device | str = "cpu") -> list[tuple]:
    """Consecutive collated batches (ids, mask, target_mask, P) on ``device``."""
    return [
        tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in collate(examples[i:i + batch_size], pad_id))
        for i in range(0, len(examples), batch_size)
    ]


def sequence_folders(path: str | Path) -> list[str]:
    """The folders of a comma-separated ``--sequences`` value, in order (``Example.source`` indexes it)."""
    return [part.strip() for part in str(path).split(",") if part.strip()]


def load_sequences(path: str | Path, limit: int | None = None) -> list[Example]:
    """The first ``limit`` training sequences of a make-data folder (or its sequences.jsonl) as
    Examples. Several folders, comma-separated (the full model's data and an on-policy set), are
    interleaved record by record, so any prefix mixes them; each Example's ``source`` is the index
    of the folder it came from."""
    per_source = [[(index, r) for r in _sequence_records(Path(folder))]
                  for index, folder in enumerate(sequence_folders(path))]
    # An on-policy writer often repeats the full model's text for the same prompt: keep it once.
    seen: set[str] = set()
    records = []
    for source, record in (r for group in itertools.zip_longest(*per_source) for r in group if r is not None):
        key = sequence_key(record["prompt"], record["target"])
        if key not in seen:
            seen.add(key)
            records.append((source, record))
    if limit is not None:
        records = records[:limit]
    return [Example(prompt=r["prompt"], target=r["target"], source=source) for source, r in records]


LOOP_NGRAM, LOOP_RUN = 4, 8


def repeated_ngram_ends(target: Sequence[int], n: int = LOOP_NGRAM) -> list[bool]:
    """For each position of ``target``: does the token there complete an ``n``-gram already seen
    earlier in the target? (The first n - 1 positions complete none.)"""
    seen: set[tuple[int, ...]] = set()
    flags = [False] * len(target)
    for end in range(n, len(target) + 1):
        gram = tuple(target[end - n:end])
        flags[end - 1] = gram in seen
        seen.add(gram)
    return flags


def loop_start(target: Sequence[int], n: int = LOOP_NGRAM, run: int = LOOP_RUN) -> int:
    """Where ``target`` starts to loop (see trim_loop); its length when it never does."""
    streak = 0
    for position, repeated in enumerate(repeated_ngram_ends(target, n)):
        streak = streak + 1 if repeated else 0
        if streak == run:
            return position + 1 - run
    return len(target)


def trim_loop(target: Sequence[int], n: int = LOOP_NGRAM, run: int = LOOP_RUN) -> list[int]:
    """``target`` up to where it starts to loop: at the first stretch of ``run`` consecutive
    tokens that each complete an ``n``-gram already seen in the target (verbatim copying of
    n + run - 1 tokens or more), the target is cut before that stretch; one that never loops is
    returned whole. Why: the full model's greedy 128-token continuations loop — in the 28k-sequence
    set, 47% of the greedy targets contain such a stretch and loops are a quarter of their tokens
    (sampled ones: 8%, 4%) — and a skip policy distilled on them repeated itself more than the
    shipped one (docs/RESULTS.md, "Quality at scale")."""
    return list(target[: loop_start(target, n, run)])


def sequence_key(prompt: Sequence[int], target: Sequence[int]) -> str:
    """One key per distinct training sequence (prompt ids + target ids): make-data's dedup and
    the loader's, when it interleaves folders, agree on what "the same" means."""
    return hashlib.sha1(json.dumps([list(prompt), list(target)]).encode()).hexdigest()


def _sequence_records(path: Path) -> list[dict]:
    if path.is_dir():
        path = path / "sequences.jsonl"
    records = read_jsonl(path) if path.is_file() else []
    if not records:
        raise ValueError(f"{path} has no sequences: run `python -m model make-data` first")
    return records
