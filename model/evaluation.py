"""Quality under skipping, on the held-out prompt set (never trained on).

For each layer speedup (linear decay by default), with and without the skip-policy adapter, plus a
1.0x row (adapter loaded, nothing skipped: a gated adapter gives exactly the full model):
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

from model.data import DEFAULT_EVAL_PROMPTS, batches_of, read_prompts, teacher_continuations
from model.decoder import SkipDecoder
from model.schedule import ScheduleConfig, full_schedule, solve_schedule
from model.training import skip_policy_logits

EVAL_SPEEDUPS = (1.0, 1.5, 2.0, 3.0, 4.0)


@dataclass
class EvalConfig:
    model: str | None = None
    adapter: str | None = "auto"
    prompts: str = str(DEFAULT_EVAL_PROMPTS)
    max_prompts: int | None = None
    continuation_tokens: int = 48
    speedups: tuple[float, ...] = EVAL_SPEEDUPS
    decay: str = "linear"
    warmup: int | None = None  # None: the adapter's trained placement, else default_warmup(L)
    order: str | None = None  # None: the adapter's trained order, else warmup_top
    batch_size: int = 16
    device: str = "auto"
    free_running: bool = True
    free_running_speedups: tuple[float, ...] | None = None  # None: every speedup
    include_no_adapter: bool = True
    quantize: tuple[str, ...] = ()  # weight modes to measure against the float full model (e.g. "int8")


@dataclass
class QuantizationRow:
    """The quantised FULL model against the float one, on the same held-out continuations."""

    weights: str
    agreement: float  # teacher-forced next-token agreement with the float model's greedy text
    perplexity_ratio: float  # perplexity of the float model's text, quantised over float
    token_match: float  # free-running greedy: share of positions with the float model's token
    identical_outputs: float  # share of prompts whose whole continuation is identical


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
    warmup: int = 1
    order: str = "warmup_top"
    rows: list[EvalRow] = field(default_factory=list)
    quantization: list[QuantizationRow] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        lines = [
            f"Held-out prompts: {self.num_prompts}, {self.continuation_tokens}-token greedy continuations of the "
            f"full model ({self.model}, {self.device}); decay {self.decay}, warmup {self.warmup}, order {self.order}; "
            f"full-model perplexity of its own continuations {self.full_perplexity:.3f}.",
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
        if self.quantization:
            lines += ["", "Quantised weights, full model against the float full model (same prompts):", "",
                      "| weights | teacher-forced agreement | ppl ratio | greedy token match | identical outputs |",
                      "|---|---|---|---|---|"]
            lines += [f"| {q.weights} | {q.agreement:.3f} | {q.perplexity_ratio:.3f} | {q.token_match:.3f} | "
                      f"{q.identical_outputs:.3f} |" for q in self.quantization]
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


def teacher_forced_scores(model, batches, schedule_for_batch, bridge=None) -> tuple[float, float]:
    """(agreement, mean NLL) of ``model`` over batches of (ids, mask, target_mask, P)."""
    agree = nll = count = 0.0
    with torch.inference_mode():
        for ids, mask, target_mask, prompt_len in batches:
            schedule = schedule_for_batch(target_mask.shape[1])
            logits = skip_policy_logits(model, ids, mask, schedule, prompt_len, bridge=bridge).float()  # (B, N, V)
            targets = ids[:, prompt_len:]
            losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
            agree += float(((logits.argmax(-1) == targets) & target_mask).sum())
            nll += float((losses * target_mask).sum())
            count += float(target_mask.sum())
    return agree / count, nll / count


# --- the run -------------------------------------------------------------------------------------


def evaluate(config: EvalConfig, progress=print) -> EvalReport:
    from model.generation import TextGenerator  # noqa: PLC0415
    from model.loading import gated_peft_copy, load_model  # noqa: PLC0415

    loaded = load_model(config.model, device=config.device, adapter=config.adapter)
    generator = TextGenerator(loaded)
    num_layers = generator.num_layers
    prompts = read_prompts(config.prompts, config.max_prompts)
    if not prompts:
        raise ValueError("the evaluation prompt set is empty")
    n = config.continuation_tokens
    # The adapter's trained placement unless the caller chose one (the same defaults as generate).
    warmup = config.warmup if config.warmup is not None else generator.default_warmup
    order = config.order or generator.default_order
    ranking = generator.ranking_for(order)

    # 1. The full (original) model's greedy continuations: the reference for every metric.
    examples = teacher_continuations(generator, prompts, max_new_tokens=n, max_prompt_tokens=10**9,
                                     batch_size=config.batch_size)
    references = [generator.decode_text([t for t in e.target if t != loaded.tokenizer.eos_token_id]) for e in examples]
    prompt_batches = [generator.encode(prompts[i:i + config.batch_size]) for i in range(0, len(prompts), config.batch_size)]
    device = loaded.device
    batches = batches_of(examples, config.batch_size, loaded.pad_token_id, device)
    _, full_nll = teacher_forced_scores(loaded.model, batches, lambda steps: full_schedule(num_layers))
    report = EvalReport(model=loaded.name, adapter=_display_path(loaded.adapter_path), device=str(device),
                        num_prompts=len(prompts), continuation_tokens=n, decay=config.decay,
                        full_perplexity=math.exp(full_nll), warmup=warmup, order=order)
    progress(f"full model: perplexity {report.full_perplexity:.3f} on {len(prompts)} prompts")

    for weights in config.quantize:
        report.quantization.append(_quantization_row(config, weights, prompts, examples, batches, full_nll, num_layers))
        q = report.quantization[-1]
        progress(f"{weights} full model vs float: agreement {q.agreement:.3f}, ppl ratio {q.perplexity_ratio:.3f}, "
                 f"greedy token match {q.token_match:.3f}, identical outputs {q.identical_outputs:.3f}")

    # variant -> (teacher-forced model, bridge, free-running decoder)
    variants = []
    if loaded.adapter_path:
        variants.append(("adapter", gated_peft_copy(loaded), loaded.bridge, generator.skip_decoder))
    if config.include_no_adapter or not loaded.adapter_path:
        variants.append(("no adapter", loaded.model, None, generator.full_decoder))
    for variant, model, bridge, decoder in variants:
        for speedup in config.speedups:
            if speedup == 1.0:
                solved_config, layer_speedup, bounds = full_schedule(num_layers, n), 1.0, (num_layers, num_layers)
            else:
                solved = solve_schedule(num_layers, speedup, decay=config.decay, warmup=warmup, order=order,
                                        ranking=ranking, decay_length=n, num_steps=max(1, n - 1))
                solved_config, layer_speedup = solved.config, solved.layer_speedup
                bounds = (solved_config.max_layers, solved_config.min_layers)
            agreement, nll = teacher_forced_scores(model, batches, lambda _steps, c=solved_config: c, bridge)
            row = EvalRow(variant=variant, target_speedup=speedup, layer_speedup=round(layer_speedup, 4),
                          max_layers=bounds[0], min_layers=bounds[1],
                          agreement=round(agreement, 4), perplexity=round(math.exp(nll), 4),
                          perplexity_ratio=round(math.exp(nll - full_nll), 4))
            if config.free_running and (config.free_running_speedups is None or speedup in config.free_running_speedups):
                outputs = _free_running(generator, decoder, prompt_batches, solved_config, n)
                row.rouge_l = round(sum(rouge_l(o, r) for o, r in zip(outputs, references)) / len(outputs), 4)
                row.bleu = round(corpus_bleu(outputs, references), 2)
            report.rows.append(row)
            progress(f"{variant} {speedup}x: agreement {row.agreement:.3f}, ppl ratio {row.perplexity_ratio:.2f}, "
                     f"ROUGE-L {row.rouge_l}, BLEU {row.bleu}")
    return report


def _quantization_row(config: EvalConfig, weights: str, prompts, examples, batches, full_nll: float,
                      num_layers: int) -> QuantizationRow:
    """Load the model again with ``weights`` and compare its full depth with the float reference."""
    from model.generation import TextGenerator  # noqa: PLC0415
    from model.loading import load_model  # noqa: PLC0415

    quantized = load_model(config.model, device=config.device, adapter=None, quantize=weights)
    agreement, nll = teacher_forced_scores(quantized.model, batches, lambda steps: full_schedule(num_layers))
    mine = teacher_continuations(TextGenerator(quantized), prompts,
                                 max_new_tokens=config.continuation_tokens, max_prompt_tokens=10**9,
                                 batch_size=config.batch_size)
    same = total = identical = 0
    for reference, candidate in zip(examples, mine):
        length = max(len(reference.target), len(candidate.target))
        same += sum(a == b for a, b in zip(reference.target, candidate.target))
        total += length
        identical += reference.target == candidate.target
    return QuantizationRow(weights=weights, agreement=round(agreement, 4),
                           perplexity_ratio=round(math.exp(nll - full_nll), 4),
                           token_match=round(same / max(1, total), 4), identical_outputs=round(identical / len(examples), 4))


def _display_path(path: str | None) -> str | None:
    """A path inside the repository as a relative path (reports carry no machine's absolute paths)."""
    if not path:
        return path
    root = Path(__file__).resolve().parents[1]
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return path


def _free_running(generator, decoder: SkipDecoder, prompt_batches, schedule: ScheduleConfig, max_new_tokens: int) -> list[str]:
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

