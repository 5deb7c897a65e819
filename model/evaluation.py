"""Quality under skipping, on the held-out prompt set (never trained on).

For each layer speedup (linear decay by default), with and without the skip-policy adapter:
* agreement: teacher-forced, the share of positions where SkipDecode's argmax equals the full
  model's next token (the full model's greedy continuation IS its argmax at each position);
* perplexity of the full model's greedy continuation under the skipping model, and its ratio to
  the full model's own perplexity of that text;
* free-running ROUGE-L (F1 over words) and BLEU (sacrebleu) of SkipDecode's greedy output
  against the full model's output.
The full model is always the ORIGINAL model (adapter off).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from model.decoder import SkipDecoder
from model.schedule import ScheduleConfig, full_schedule, solve_schedule
from model.training import Example, collate, read_jsonl, skip_policy_logits

DEFAULT_EVAL_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "eval.jsonl"
EVAL_SPEEDUPS = (1.5, 2.0, 3.0, 4.0)


@dataclass
class EvalConfig:
    model: str | None = None
    adapter: str | None = "auto"
    prompts: str = str(DEFAULT_EVAL_PROMPTS)
    max_prompts: int | None = None
    continuation_tokens: int = 48
    speedups: tuple[float, ...] = EVAL_SPEEDUPS
    decay: str = "linear"
    warmup: int = 1
    batch_size: int = 16
    device: str = "auto"
    free_running: bool = True


@dataclass
class EvalRow:
    variant: str  # "adapter" or "no adapter"
    target_speedup: float
    layer_speedup: float
    max_layers: int
    min_layers: int
    agreement: float
    perplexity: float
    perplexity_ratio: float
    rouge_l: float | None = None
    bleu: float | None = None


@dataclass
class EvalReport:
    model: str
    adapter: str | None
    device: str
    num_prompts: int
    continuation_tokens: int
    decay: str
    full_perplexity: float
    rows: list[EvalRow] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        lines = [
            f"Held-out prompts: {self.num_prompts}, {self.continuation_tokens}-token greedy continuations of the "
            f"full model ({self.model}, {self.device}); decay {self.decay}; full-model perplexity of its own "
            f"continuations {self.full_perplexity:.3f}.",
            "",
            "| variant | target | layer speedup | max→min layers | agreement | perplexity | ppl ratio | ROUGE-L | BLEU |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            rouge = "–" if r.rouge_l is None else f"{r.rouge_l:.3f}"
            bleu = "–" if r.bleu is None else f"{r.bleu:.1f}"
            lines.append(
                f"| {r.variant} | {r.target_speedup:g}x | {r.layer_speedup:.2f}x | {r.max_layers}→{r.min_layers} | "
                f"{r.agreement:.3f} | {r.perplexity:.3f} | {r.perplexity_ratio:.2f} | {rouge} | {bleu} |"
            )
        return "\n".join(lines)


# --- metrics -----------------------------------------------------------------------------------


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 over lower-cased whitespace words (longest common subsequence)."""
    cand, ref = candidate.lower().split(), reference.lower().split()
    if not cand or not ref:
        return 1.0 if cand == ref else 0.0
    previous = [0] * (len(ref) + 1)
    for word in cand:
        current = [0]
        for j, ref_word in enumerate(ref):
            current.append(previous[j] + 1 if word == ref_word else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(cand), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def corpus_bleu(candidates: Sequence[str], references: Sequence[str]) -> float:
    import sacrebleu  # noqa: PLC0415

    return float(sacrebleu.corpus_bleu(list(candidates), [list(references)]).score)


def teacher_forced_scores(model, batches, schedule_for_batch) -> tuple[float, float]:
    """(agreement, mean NLL) of ``model`` over batches of (ids, mask, target_mask, P)."""
    agree = nll = count = 0.0
    with torch.inference_mode():
        for ids, mask, target_mask, prompt_len in batches:
            schedule = schedule_for_batch(target_mask.shape[1])
            logits = skip_policy_logits(model, ids, mask, schedule, prompt_len).float()  # (B, N, V)
            targets = ids[:, prompt_len:]
            losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
            agree += float(((logits.argmax(-1) == targets) & target_mask).sum())
            nll += float((losses * target_mask).sum())
            count += float(target_mask.sum())
    return agree / count, nll / count


# --- the run -------------------------------------------------------------------------------------


def evaluate(config: EvalConfig, progress=print) -> EvalReport:
    from model.generation import TextGenerator  # noqa: PLC0415
    from model.loading import load_model  # noqa: PLC0415

    loaded = load_model(config.model, device=config.device, adapter=config.adapter)
    generator = TextGenerator(loaded)
    num_layers = generator.num_layers
    prompts = [r["prompt"] for r in read_jsonl(config.prompts)][: config.max_prompts]
    if not prompts:
        raise ValueError("the evaluation prompt set is empty")
    n = config.continuation_tokens

    # 1. The full (original) model's greedy continuations: the reference for every metric.
    examples, references, prompt_batches = [], [], []
    tokenizer = loaded.tokenizer
    for start in range(0, len(prompts), config.batch_size):
        ids, mask = generator.encode(prompts[start:start + config.batch_size])
        prompt_batches.append((ids, mask))
        result = generator.full_decoder.generate(ids, mask, full_schedule(num_layers), max_new_tokens=n)
        for row in range(ids.shape[0]):
            target = list(result.tokens[row])
            if result.finish_reasons[row] == "eos":
                target.append(tokenizer.eos_token_id)
            examples.append(Example(prompt=ids[row][mask[row].bool()].tolist(), target=target))
            references.append(generator.decode_text(result.tokens[row]))
    device = loaded.device
    batches = [
        tuple(t.to(device) if isinstance(t, torch.Tensor) else t
              for t in collate(examples[i:i + config.batch_size], loaded.pad_token_id))
        for i in range(0, len(examples), config.batch_size)
    ]
    _, full_nll = teacher_forced_scores(loaded.model, batches, lambda steps: full_schedule(num_layers))
    report = EvalReport(model=loaded.name, adapter=loaded.adapter_path, device=str(device), num_prompts=len(prompts),
                        continuation_tokens=n, decay=config.decay, full_perplexity=math.exp(full_nll))
    progress(f"full model: perplexity {report.full_perplexity:.3f} on {len(prompts)} prompts")

    variants = [("adapter", loaded.skip_model)] if loaded.adapter_path else []
    variants.append(("no adapter", loaded.model))
    for variant, model in variants:
        for speedup in config.speedups:
            solved = solve_schedule(num_layers, speedup, decay=config.decay, warmup=config.warmup,
                                    decay_length=n, num_steps=max(1, n - 1))

            def schedule_for(_steps: int, solved=solved) -> ScheduleConfig:
                return solved.config

            agreement, nll = teacher_forced_scores(model, batches, schedule_for)
            row = EvalRow(variant=variant, target_speedup=speedup, layer_speedup=round(solved.layer_speedup, 4),
                          max_layers=solved.config.max_layers, min_layers=solved.config.min_layers,
                          agreement=round(agreement, 4), perplexity=round(math.exp(nll), 4),
                          perplexity_ratio=round(math.exp(nll - full_nll), 4))
            if config.free_running:
                outputs = _free_running(generator, model, prompt_batches, solved.config, n)
                row.rouge_l = round(sum(rouge_l(o, r) for o, r in zip(outputs, references)) / len(outputs), 4)
                row.bleu = round(corpus_bleu(outputs, references), 2)
            report.rows.append(row)
            progress(f"{variant} {speedup}x: agreement {row.agreement:.3f}, ppl ratio {row.perplexity_ratio:.2f}, "
                     f"ROUGE-L {row.rouge_l}, BLEU {row.bleu}")
    return report


def _free_running(generator, model, prompt_batches, schedule: ScheduleConfig, max_new_tokens: int) -> list[str]:
    decoder = SkipDecoder(model, eos_token_ids=generator.loaded.eos_token_ids, pad_token_id=generator.loaded.pad_token_id)
    outputs = []
    for ids, mask in prompt_batches:
        result = decoder.generate(ids, mask, schedule, max_new_tokens=max_new_tokens)
        outputs.extend(generator.decode_text(tokens) for tokens in result.tokens)
    return outputs


def write_report(report: EvalReport, folder: str | Path) -> tuple[Path, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / "eval.json", folder / "eval.md"
    json_path.write_text(json.dumps(report.to_json(), indent=2))
    md_path.write_text(report.to_markdown() + "\n")
    return json_path, md_path

