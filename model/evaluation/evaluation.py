"""Quality under skipping, on the held-out prompt set (never trained on).

For each layer speedup (linear decay by default), with and without the skip-policy adapter, plus a
1.0x row (adapter loaded, nothing skipped: a gated adapter gives exactly the full model):
* agreement: teacher-forced, the share of positions where SkipDecode's argmax equals the full
  model's next token (the full model's greedy continuation IS its argmax at each position);
* perplexity of the full model's greedy continuation under the skipping model, and its ratio to
  the full model's own perplexity of that text;
* free-running ROUGE-L (F1 over words) and BLEU (sacrebleu) of SkipDecode's greedy output
  against the full model's output;
* judged fluency: the ORIGINAL model's perplexity of SkipDecode's own free-running text given
  the prompt, as a ratio to its perplexity of its own greedy text (a text the full model would
  also have written scores 1.0; ROUGE punishes a good answer worded differently, this does not);
* repetition: the share of word 4-grams that repeat an earlier 4-gram of the same output;
* fact retention: of the short fact questions (assets/prompts/facts.jsonl) the full model
  answers right, the share SkipDecode still answers right;
* fact recall: of the same questions, the share where SkipDecode, teacher-forced on the full
  model's own reply under the same schedule, predicts every token of the answer: the answer
  still known at that depth given the same words before it. A retention loss with the answer
  recalled was lost to drift (SkipDecode's own words led elsewhere), one without it at the answer.
The full model is always the ORIGINAL model (adapter off).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from model.common.checks import check_int
from model.evaluation.paired import Comparison, RowItems, compare_variants, comparison_markdown
from model.evaluation.reporting import write_result_files
from model.generation.generator import TextGenerator
from model.loading import gated_peft_copy, load_model, resolve_adapter
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.schedule import ScheduleConfig, full_schedule, solve_schedule, speedup_reachable
from model.training.checkpoints import portable_path
from model.training.data import (
    DEFAULT_EVAL_PROMPTS,
    DEFAULT_FACTS,
    Example,
    batches_of,
    continuation_target,
    read_jsonl,
    read_prompts,
    teacher_continuations,
)
from model.training.scoring import Scores, skip_policy_logits, teacher_forced_scores

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
    min_layers_floor: int | None = None  # None: the solver may go down to warmup + 1 layers
    warmup: int | None = None  # None: the adapter's trained placement, else default_warmup(L)
    order: str | None = None  # None: the adapter's trained order, else warmup_top
    batch_size: int = 16
    device: str = "auto"
    free_running: bool = True
    free_running_speedups: tuple[float, ...] | None = None  # None: every speedup
    include_no_adapter: bool = True
    quantize: tuple[str, ...] = ()  # weight modes to measure against the float full model (e.g. "int8")
    facts: str | None = str(DEFAULT_FACTS)  # None: no fact-retention measure
    max_facts: int | None = None
    fact_tokens: int = 32  # greedy reply length for a fact question (the schedule decays over it)
    # a second adapter, measured on the same references and compared in pairs
    candidate: str | None = None
    candidate_floor: int | None = None  # or: the SAME adapter with a schedule floor of this many layers
    resamples: int = 2000  # paired bootstrap resamples of the candidate's comparison

    @property
    def compares(self) -> bool:
        """Is a candidate (another adapter, or the same one under a floor) compared in pairs?"""
        return bool(self.candidate) or self.candidate_floor is not None


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
    variant: str  # "adapter", "candidate" (eval --candidate) or "no adapter"
    target_speedup: float
    layer_speedup: float
    max_layers: int
    min_layers: int
    agreement: float
    perplexity: float
    perplexity_ratio: float
    rouge_l: float | None = None
    bleu: float | None = None
    judged_ppl_ratio: float | None = None  # original model's perplexity of this text / of its own text
    repetition: float | None = None  # share of repeated word 4-grams
    fact_retention: float | None = None  # of the facts the full model answers right, share kept
    # of the same, share whose answer it predicts teacher-forced on the full model's reply
    fact_recall: float | None = None
    facts_lost_to_drift: int | None = None  # not kept, though recalled: its own words led elsewhere
    facts_lost_at_answer: int | None = None  # not kept and not recalled: unknown at that depth
    # the same, split by the reply token where the full model's answer starts (FactsByPosition)
    facts_by_position: list[FactsByPosition] = field(default_factory=list)


@dataclass
class FactsByPosition:
    """Fact answers kept among those whose answer (in the full model's reply) starts within a span
    of reply tokens, and the layers this row's schedule runs there: a late answer meets a schedule
    that has already decayed, so the split shows whether answers are lost to the layer budget."""

    tokens: str  # "1-4": the answer starts at the 1st to 4th reply token
    answered: int  # questions the full model answers right with its answer starting there
    kept: int  # of those, still answered right
    layers: float  # mean layers a step runs over the span (the fact reply's schedule)


# Spans of reply tokens (1-based, inclusive) the fact answers are grouped by.
ANSWER_SPANS = ((1, 4), (5, 8), (9, 16), (17, None))


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
    full_repetition: float | None = None
    facts: int = 0  # fact questions asked
    full_fact_accuracy: float | None = None  # share the full model answers right
    rows: list[EvalRow] = field(default_factory=list)
    quantization: list[QuantizationRow] = field(default_factory=list)
    candidate: str | None = None  # the candidate adapter's folder, or the floor candidate's description
    candidate_warmup: int | None = None  # the candidate's own trained placement (its rows use it)
    candidate_order: str | None = None
    comparisons: list[Comparison] = field(default_factory=list)  # candidate − adapter, paired, per measure
    floor_inactive: list[float] = field(default_factory=list)  # speedups where a floor candidate IS the adapter
    schedule_floor: dict | None = None  # the adapter's measured default shape the rows run (None: the solver's)

    def to_json(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        lines = [
            f"Held-out prompts: {self.num_prompts}, {self.continuation_tokens}-token greedy continuations of the "
            f"full model ({self.model}, {self.device}); decay {self.decay}, warmup {self.warmup}, order {self.order}; "
            f"full-model perplexity of its own continuations {self.full_perplexity:.3f}.",
            "",
        ]
        if self.schedule_floor:
            lines += [f"Default shape (the adapter's, as the product runs it): no step below "
                      f"{self.schedule_floor['layers']} layers up to {self.schedule_floor['up_to_speedup']:g}x "
                      f"(linear decay); above, the solver's own.", ""]
        if self.full_repetition is not None:
            lines += [f"Full model's own greedy text: repetition {self.full_repetition:.3f}.", ""]
        if self.full_fact_accuracy is not None:
            lines += [f"Fact questions: {self.facts}; the full model answers {self.full_fact_accuracy:.1%} right "
                      f"(retention counts only those).", ""]
        lines += [
            "| variant | target | layer speedup | max→min layers | agreement | ppl ratio | judged ppl ratio | "
            "repetition | fact retention | fact recall | ROUGE-L | BLEU |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            lines.append(
                f"| {r.variant} | {r.target_speedup:g}x | {r.layer_speedup:.2f}x | {r.max_layers}→{r.min_layers} | "
                f"{r.agreement:.3f} | {r.perplexity_ratio:.2f} | {_cell(r.judged_ppl_ratio, '.2f')} | "
                f"{_cell(r.repetition, '.3f')} | {_cell(r.fact_retention, '.3f')} | {_cell(r.fact_recall, '.3f')} | "
                f"{_cell(r.rouge_l, '.3f')} | "
                f"{_cell(r.bleu, '.1f')} |"
            )
        split = [r for r in self.rows if r.facts_by_position and r.target_speedup != 1.0]
        if split:
            spans = [f.tokens for f in split[0].facts_by_position]
            lines += ["", "Fact answers kept by the reply token where the full model's answer starts "
                          "(kept / answered, and the layers a step runs there):", "",
                      "| variant | target | " + " | ".join(f"tokens {t}" for t in spans) + " |",
                      "|---|---|" + "---|" * len(spans)]
            lines += [f"| {r.variant} | {r.target_speedup:g}x | " + " | ".join(
                f"{f.kept}/{f.answered} ({f.layers:.0f} layers)" for f in r.facts_by_position) + " |" for r in split]
        losses = [r for r in self.rows if r.facts_lost_to_drift is not None and r.target_speedup != 1.0]
        if losses:
            lines += ["", "Fact answers lost, and where (recalled: predicted teacher-forced on the full model's reply):",
                      "", "| variant | target | lost | recalled (lost to drift) | not recalled (lost at the answer) |",
                      "|---|---|---|---|---|"]
            lines += [f"| {r.variant} | {r.target_speedup:g}x | {r.facts_lost_to_drift + r.facts_lost_at_answer} | "
                      f"{r.facts_lost_to_drift} | {r.facts_lost_at_answer} |" for r in losses]
        if self.quantization:
            lines += ["", "Quantised weights, full model against the float full model (same prompts):", "",
                      "| weights | teacher-forced agreement | ppl ratio | greedy token match | identical outputs |",
                      "|---|---|---|---|---|"]
            lines += [f"| {q.weights} | {q.agreement:.3f} | {q.perplexity_ratio:.3f} | {q.token_match:.3f} | "
                      f"{q.identical_outputs:.3f} |" for q in self.quantization]
        if self.candidate:
            inactive = ("" if not self.floor_inactive else " Not measured at " + ", ".join(
                f"{s:g}x" for s in self.floor_inactive) + ": there the adapter's own shape keeps that floor already.")
            lines += ["", f"Candidate rows: {self.candidate}, in its trained placement (warmup "
                          f"{self.candidate_warmup}, order {self.candidate_order}).{inactive}", "",
                      comparison_markdown(self.comparisons, self.adapter, self.candidate)]
        return "\n".join(lines)


def _cell(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


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


def repetition_counts(text: str, n: int = 4) -> tuple[int, int]:
    """(word n-grams that repeat an earlier n-gram of the text, all word n-grams of the text)."""
    words = text.lower().split()
    seen: set[tuple[str, ...]] = set()
    repeated = 0
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        repeated += gram in seen
        seen.add(gram)
    return repeated, max(0, len(words) - n + 1)


def repetition_rate(texts: Sequence[str], n: int = 4) -> float:
    """Share of word n-grams (pooled over texts) that repeat an earlier n-gram of the same text."""
    counts = [repetition_counts(text, n) for text in texts]
    total = sum(t for _, t in counts)
    return sum(r for r, _ in counts) / total if total else 0.0


@dataclass(frozen=True)
class FactQuestion:
    question: str
    answers: tuple[str, ...]


def read_facts(path: str | Path, limit: int | None = None) -> list[FactQuestion]:
    facts = []
    for number, record in enumerate(read_jsonl(path), start=1):
        answers = record.get("answers")
        if not isinstance(record.get("question"), str) or not answers or not all(isinstance(a, str) and a for a in answers):
            raise ValueError(f"{Path(path).name} record {number}: needs a question and a list of accepted answers")
        facts.append(FactQuestion(record["question"], tuple(answers)))
    return facts[:limit]


def answers_right(reply: str, answers: Sequence[str]) -> bool:
    """Any accepted answer as a whole word or phrase of the reply, ignoring case."""
    return answer_offset(reply, answers) is not None


def answer_offset(reply: str, answers: Sequence[str]) -> int | None:
    """The character where the reply's first accepted answer (whole word or phrase, any case) starts."""
    found = answer_characters(reply, answers)
    return found[0] if found else None


def answer_characters(reply: str, answers: Sequence[str]) -> tuple[int, int] | None:
    """[start, end) characters of the reply's first accepted answer (the longest at that start)."""
    matches = [(m.start(), -m.end()) for a in answers
               if (m := re.search(r"(?<![0-9a-z])" + re.escape(a.lower()) + r"(?![0-9a-z])", reply.lower()))]
    if not matches:
        return None
    start, negative_end = min(matches)
    return start, -negative_end


def answer_token_span(decode: Callable[[Sequence[int]], str], tokens: Sequence[int],
                      answers: Sequence[str]) -> tuple[int, int] | None:
    """1-based (first, last) reply tokens of the first accepted answer: the first tokens whose
    decoded prefix reaches past its first, and its last, character (None: no answer in the reply)."""
    found = answer_characters(decode(tokens), answers)
    if found is None:
        return None
    start, end = found
    reaching = [next((k for k in range(1, len(tokens) + 1) if len(decode(tokens[:k])) > c), len(tokens))
                for c in (start, end - 1)]
    return reaching[0], reaching[1]


@dataclass
class FreeRun:
    """Greedy outputs of one decoder under one schedule: texts, and prompt + output ids to score."""

    texts: list[str]
    examples: list[Example]


def free_run(generator, decoder: SkipDecoder, prompt_batches, schedule: ScheduleConfig, max_new_tokens: int) -> FreeRun:
    texts, examples = [], []
    eos = generator.loaded.tokenizer.eos_token_id
    for ids, mask in prompt_batches:
        result = decoder.generate(ids, mask, schedule, max_new_tokens=max_new_tokens)
        for row, (tokens, reason) in enumerate(zip(result.tokens, result.finish_reasons)):
            texts.append(generator.text.decode_text(tokens))
            target = continuation_target(tokens, reason, eos)
            examples.append(Example(prompt=ids[row][mask[row].bool()].tolist(), target=target or [eos]))
    return FreeRun(texts=texts, examples=examples)


def judged_scores(loaded, examples: Sequence[Example], batch_size: int, num_layers: int) -> Scores:
    """The ORIGINAL model's scores of ``examples``' targets given their prompts (``.nll``: mean per token)."""
    batches = batches_of(examples, batch_size, loaded.pad_token_id, loaded.device)
    return teacher_forced_scores(loaded.model, batches, lambda steps: full_schedule(num_layers))


# --- the run -------------------------------------------------------------------------------------


@dataclass
class _Context:
    """What every row of a run shares: the model, placement, references and prompt batches."""

    config: EvalConfig
    generator: object
    loaded: object
    num_layers: int
    warmup: int
    order: str
    ranking: tuple[int, ...]
    prompts: list[str]
    prompt_batches: list
    references: FreeRun  # the full model's own greedy text and its examples (prompt + continuation ids)
    batches: list  # the references' examples, collated for teacher-forced scoring
    full_scores: Scores  # the original model on its own text (.nll: mean NLL per token)
    fact_batches: list
    facts: list[FactQuestion]
    full_facts_right: list[bool]
    # per question answered right: the full model's reply (prompt + reply ids) and its answer's
    # (first, last) reply tokens, 1-based: what fact recall teacher-forces and checks
    answer_replies: list[Example] = field(default_factory=list)
    answer_spans: list[tuple[int, int] | None] = field(default_factory=list)

    @property
    def answer_tokens(self) -> list[int | None]:
        """Per question answered right: the reply token where its answer starts."""
        return [span[0] if span else None for span in self.answer_spans]

    @property
    def full_nll(self) -> float:
        return self.full_scores.nll

    def floor(self, speedup: float, variant: _Variant | None) -> int | None:
        """The variant's own floor (a floor candidate), else the run's (``min_layers_floor``), else
        the default the product runs: the skip policy's measured shape (SchedulePlanner.default_floor)."""
        if variant is not None and variant.floor is not None:
            return variant.floor
        if self.config.min_layers_floor is not None:
            return self.config.min_layers_floor
        default_floor, warmup = (variant.default_floor, variant.warmup) if variant is not None else \
            (self.generator.schedules.default_floor, self.warmup)
        return default_floor(speedup, self.config.decay, warmup)

    def schedule(self, speedup: float, tokens: int, variant: _Variant | None = None) -> tuple[ScheduleConfig, float]:
        """The schedule of ``speedup`` over ``tokens`` steps, in ``variant``'s placement (default: the run's)."""
        if speedup == 1.0:
            return full_schedule(self.num_layers, tokens), 1.0
        warmup, order, ranking = (variant.warmup, variant.order, variant.ranking) if variant else \
            (self.warmup, self.order, self.ranking)
        floor = self.floor(speedup, variant)
        solved = solve_schedule(self.num_layers, speedup, decay=self.config.decay, warmup=warmup,
                                order=order, ranking=ranking, decay_length=tokens,
                                num_steps=max(1, tokens - 1), min_layers_floor=floor)
        return solved.config, solved.layer_speedup


@dataclass
class _Variant:
    """One model measured: its teacher-forced model, entry bridge, free-running decoder, placement."""

    name: str  # "adapter", "candidate" or "no adapter"
    model: object
    bridge: object
    decoder: SkipDecoder
    warmup: int
    order: str
    ranking: tuple[int, ...]
    floor: int | None = None  # its own schedule floor (a floor candidate); None: the run's
    default_floor: Callable[[float, str, int], int | None] = lambda speedup, decay, warmup: None  # its policy's shape


def floor_candidate_name(floor: int) -> str:
    return f"the same adapter, schedule floor {floor} layers"


def _check_candidate(config: EvalConfig) -> None:
    """Refuse a candidate that cannot be measured before the references are generated."""
    if config.candidate and config.candidate_floor is not None:
        raise ValueError("compare ONE candidate: an adapter (--candidate) or a schedule floor (--candidate-floor)")
    if config.candidate:
        if config.candidate in ("auto", "none") or resolve_adapter(config.candidate, "") is None:
            raise ValueError(f"candidate {config.candidate!r}: give a trained adapter folder")
    if config.candidate_floor is not None:
        check_int("candidate_floor", config.candidate_floor, low=1)  # a layer count
    if config.compares and config.resamples < 100:
        raise ValueError(f"resamples must be >= 100; got {config.resamples}")


def _same_schedules(context: _Context, adapter: _Variant, candidate: _Variant, speedup: float) -> bool:
    """Does ``candidate`` run exactly ``adapter``'s schedules at ``speedup`` (replies and fact answers)?"""
    lengths = {context.config.continuation_tokens, context.config.fact_tokens}
    return all(context.schedule(speedup, n, adapter)[0] == context.schedule(speedup, n, candidate)[0] for n in lengths)


def _check_floor_reaches(config: EvalConfig, context: _Context) -> None:
    """A floor of F layers per step cannot average fewer than F: every speedup must allow it."""
    floor = config.candidate_floor
    if floor is None:
        return
    if floor > context.num_layers:
        raise ValueError(f"candidate floor {floor} exceeds the model's {context.num_layers} layers")
    blocked = [s for s in config.speedups
               if s != 1.0 and not speedup_reachable(context.num_layers, s, context.warmup, floor)]
    if blocked:
        raise ValueError(f"a floor of {floor} layers cannot reach {', '.join(f'{s:g}x' for s in blocked)} on "
                         f"{context.num_layers} layers; leave those speedups out")


def evaluate(config: EvalConfig, progress=print) -> EvalReport:
    _check_candidate(config)
    context, report = _prepare(config, progress)
    _check_floor_reaches(config, context)
    for weights in config.quantize:
        report.quantization.append(_quantization_row(config, weights, context))
        q = report.quantization[-1]
        progress(f"{weights} full model vs float: agreement {q.agreement:.3f}, ppl ratio {q.perplexity_ratio:.3f}, "
                 f"greedy token match {q.token_match:.3f}, identical outputs {q.identical_outputs:.3f}")
    items: dict[tuple[str, float], RowItems] = {}
    variants = _variants(context)
    for variant in variants:
        _measure(context, report, items, variant, config.speedups, variants[0], progress)
    if config.compares:  # where the candidate was measured (not where a floor changes nothing)
        report.comparisons = [
            comparison for speedup in config.speedups if speedup != 1.0 and ("candidate", speedup) in items
            for comparison in compare_variants(context.full_scores.per_example, items["adapter", speedup],
                                               items["candidate", speedup], speedup, config.resamples)
        ]
    return report


def _measure(context: _Context, report: EvalReport, items: dict[tuple[str, float], RowItems], variant: _Variant,
             speedups: Sequence[float], adapter: _Variant, progress) -> None:
    """``variant``'s rows at ``speedups`` into ``report`` and their per-prompt counts into ``items``;
    a floor candidate is not measured where its shape is the adapter's own."""
    if variant.name == "candidate":
        report.candidate_warmup, report.candidate_order = variant.warmup, variant.order
    for speedup in speedups:
        if variant.floor is not None and _same_schedules(context, adapter, variant, speedup):
            report.floor_inactive.append(speedup)  # nothing to measure: the shape is the adapter's own
            progress(f"candidate {speedup}x: the floor changes no step (the adapter's shape keeps "
                     f"{variant.floor} layers or more): not measured")
            continue
        row, items[variant.name, speedup] = _row(context, variant, speedup)
        report.rows.append(row)
        progress(f"{variant.name} {speedup}x: agreement {row.agreement:.3f}, ppl ratio {row.perplexity_ratio:.2f}, "
                 f"judged ppl ratio {row.judged_ppl_ratio}, repetition {row.repetition}, "
                 f"fact retention {row.fact_retention}, fact recall {row.fact_recall}, ROUGE-L {row.rouge_l}")


def evaluate_shapes(config: EvalConfig, shapes: Sequence[tuple[str, int | None]], on_row, progress=print) -> EvalReport:
    """The adapter (or the bare model when there is none) under each schedule SHAPE (decay, floor)
    at every speedup of ``config``; the model, references and fact answers are prepared once.
    ``on_row(decay, floor, row)`` sees each row as soon as it is measured."""
    context, report = _prepare(config, progress)
    variant = _variants(context)[0]  # the adapter, or the bare model without one
    for decay, floor in shapes:
        context.config = replace(config, decay=decay, min_layers_floor=floor)
        for speedup in config.speedups:
            if floor is not None and not speedup_reachable(context.num_layers, speedup, context.warmup, floor):
                progress(f"{decay} floor {floor} at {speedup:g}x skipped: {floor} layers per step cannot reach it")
                continue
            row, _ = _row(context, variant, speedup)
            report.rows.append(row)
            on_row(decay, floor, row)
    return report


def _variants(context: _Context) -> list[_Variant]:
    """Each variant measured: the adapter (when there is one) first, then the candidate (when asked
    for: another adapter loaded beside, in its own trained placement, or the same adapter under
    another schedule floor), then the bare model (when asked for, or without an adapter)."""
    loaded, generator, config = context.loaded, context.generator, context.config
    variants = []
    if loaded.adapter_path:
        variants.append(_Variant("adapter", gated_peft_copy(loaded), loaded.bridge, generator.skip_decoder,
                                 context.warmup, context.order, context.ranking,
                                 default_floor=generator.schedules.default_floor))
    if config.candidate:
        variants.append(_candidate_variant(context, config.candidate))
    if config.candidate_floor is not None:
        variants.append(replace(variants[0], name="candidate", floor=config.candidate_floor))
    if config.include_no_adapter or not loaded.adapter_path:
        variants.append(_Variant("no adapter", loaded.model, None, generator.full_decoder,
                                 context.warmup, context.order, context.ranking))
    return variants


def _candidate_variant(context: _Context, adapter: str | Path) -> _Variant:
    """Another adapter loaded beside the run's, in its own trained placement (unless the run sets one)."""
    config = context.config
    other = TextGenerator(load_model(config.model, device=config.device, adapter=str(adapter)))
    warmup = config.warmup if config.warmup is not None else other.schedules.default_warmup
    order = config.order or other.schedules.default_order
    return _Variant("candidate", gated_peft_copy(other.loaded), other.loaded.bridge, other.skip_decoder,
                    warmup, order, other.schedules.ranking_for(order), default_floor=other.schedules.default_floor)


def _prepare(config: EvalConfig, progress) -> tuple[_Context, EvalReport]:
    """Load the model; the full model's greedy continuations (the reference of every metric) and fact answers."""
    loaded = load_model(config.model, device=config.device, adapter=config.adapter)
    if config.compares and not loaded.adapter_path:
        raise ValueError("a candidate is compared with an adapter, and this run has none")
    generator = TextGenerator(loaded)
    num_layers = generator.num_layers
    prompts = read_prompts(config.prompts, config.max_prompts)
    if not prompts:
        raise ValueError("the evaluation prompt set is empty")
    n = config.continuation_tokens
    # The adapter's trained placement unless the caller chose one (the same defaults as generate).
    warmup = config.warmup if config.warmup is not None else generator.schedules.default_warmup
    order = config.order or generator.schedules.default_order
    # The full model's greedy text: the reference of every metric (teacher-forced targets, ROUGE,
    # the judged ratio's denominator: the original model's NLL of its own text).
    prompt_batches = _encoded_batches(generator, prompts, config.batch_size)
    references = free_run(generator, generator.full_decoder, prompt_batches, full_schedule(num_layers, n), n)
    batches = batches_of(references.examples, config.batch_size, loaded.pad_token_id, loaded.device)
    full_scores = teacher_forced_scores(loaded.model, batches, lambda steps: full_schedule(num_layers))
    facts = read_facts(config.facts, config.max_facts) if config.facts else []
    fact_batches = _encoded_batches(generator, [f.question for f in facts], config.batch_size)
    full_facts = free_run(generator, generator.full_decoder, fact_batches,
                          full_schedule(num_layers, config.fact_tokens), config.fact_tokens) if facts else None
    full_replies = full_facts.texts if full_facts else []
    full_facts_right = [answers_right(r, f.answers) for r, f in zip(full_replies, facts)]
    eos = loaded.tokenizer.eos_token_id
    answered = [(Example(prompt=example.prompt, target=[t for t in example.target if t != eos]), fact)
                for example, fact, right in zip(full_facts.examples, facts, full_facts_right)
                if right] if full_facts else []
    answer_spans = [answer_token_span(generator.text.decode_text, example.target, fact.answers) for example, fact in answered]
    context = _Context(config=config, generator=generator, loaded=loaded, num_layers=num_layers, warmup=warmup,
                       order=order, ranking=generator.schedules.ranking_for(order), prompts=prompts,
                       batches=batches, full_scores=full_scores,
                       prompt_batches=prompt_batches, references=references,
                       fact_batches=fact_batches, facts=facts,
                       full_facts_right=full_facts_right, answer_replies=[example for example, _ in answered], answer_spans=answer_spans)
    report = EvalReport(model=loaded.name, adapter=portable_path(loaded.adapter_path), device=str(loaded.device),
                        num_prompts=len(prompts), continuation_tokens=n, decay=config.decay,
                        full_perplexity=math.exp(full_scores.nll), warmup=warmup, order=order,
                        full_repetition=round(repetition_rate(references.texts), 4), facts=len(facts),
                        full_fact_accuracy=round(sum(context.full_facts_right) / len(facts), 4) if facts else None,
                        schedule_floor=loaded.skip_policy.get("schedule_floor") if config.min_layers_floor is None
                        and config.decay == "linear" else None,
                        candidate=portable_path(config.candidate) if config.candidate else
                        floor_candidate_name(config.candidate_floor) if config.candidate_floor is not None else None)
    progress(f"full model: perplexity {report.full_perplexity:.3f} on {len(prompts)} prompts, repetition "
             f"{report.full_repetition}, facts right {report.full_fact_accuracy}")
    return context, report


def _encoded_batches(generator, prompts: Sequence[str], batch_size: int) -> list:
    return [generator.text.encode(prompts[i:i + batch_size]) for i in range(0, len(prompts), batch_size)]


def _row(context: _Context, variant: _Variant, speedup: float) -> tuple[EvalRow, RowItems]:
    """Every measure of one variant at one speedup, and the per-prompt counts behind them."""
    config, n = context.config, context.config.continuation_tokens
    schedule, layer_speedup = context.schedule(speedup, n, variant)
    scores = teacher_forced_scores(variant.model, context.batches, lambda _steps: schedule, variant.bridge)
    full_nll = context.full_nll
    row = EvalRow(variant=variant.name, target_speedup=speedup, layer_speedup=round(layer_speedup, 4),
                  max_layers=schedule.max_layers, min_layers=schedule.min_layers,
                  agreement=round(scores.agreement, 4), perplexity=round(math.exp(scores.nll), 4),
                  perplexity_ratio=round(math.exp(scores.nll - full_nll), 4))
    items = RowItems(teacher_forced=scores.per_example)
    if config.free_running and (config.free_running_speedups is None or speedup in config.free_running_speedups):
        run = free_run(context.generator, variant.decoder, context.prompt_batches, schedule, n)
        references = context.references.texts
        row.rouge_l = round(sum(rouge_l(o, r) for o, r in zip(run.texts, references)) / len(run.texts), 4)
        row.bleu = round(corpus_bleu(run.texts, references), 2)
        judged = judged_scores(context.loaded, run.examples, config.batch_size, context.num_layers)
        row.judged_ppl_ratio = round(math.exp(judged.nll - full_nll), 4)
        row.repetition = round(repetition_rate(run.texts), 4)
        items.judged = judged.per_example
        items.repetition = tuple(repetition_counts(text) for text in run.texts)
        fact_schedule, _ = context.schedule(speedup, config.fact_tokens, variant)
        items.facts_kept = _facts_kept(context, variant, fact_schedule)
        if items.facts_kept:
            row.fact_retention = round(sum(items.facts_kept) / len(items.facts_kept), 4)
            items.facts_recalled = facts_recalled(variant.model, variant.bridge, context.answer_replies,
                                                  context.answer_spans, fact_schedule, config.batch_size,
                                                  context.loaded.pad_token_id, context.loaded.device)
            row.fact_recall = round(sum(items.facts_recalled) / len(items.facts_recalled), 4)
            lost = [recalled for kept, recalled in zip(items.facts_kept, items.facts_recalled) if not kept]
            row.facts_lost_to_drift, row.facts_lost_at_answer = sum(lost), len(lost) - sum(lost)
            # reply token 1 comes out of the prompt's pass, token k + 2 out of decode step k
            predicting = [fact_schedule.prefill_budget, *fact_schedule.budgets(config.fact_tokens - 1)]
            row.facts_by_position = facts_by_position(items.facts_kept, context.answer_tokens, predicting)
    return row, items


def facts_by_position(kept: Sequence[bool], answer_tokens: Sequence[int | None],
                      budgets: Sequence[int]) -> list[FactsByPosition]:
    """``kept`` (per question answered right) split by its answer's start token into ANSWER_SPANS;
    ``budgets[i]``: the layers of the pass that predicts reply token i + 1. Spans nobody answers in
    are left out."""
    split = []
    for first, last in ANSWER_SPANS:
        end = len(budgets) if last is None else min(last, len(budgets))
        if first > end:
            continue
        inside = [k for k, token in zip(kept, answer_tokens) if token is not None and first <= token <= end]
        if inside:
            span = budgets[first - 1:end]
            split.append(FactsByPosition(tokens=f"{first}-{end}", answered=len(inside), kept=sum(inside),
                                         layers=round(sum(span) / len(span), 1)))
    return split


def facts_recalled(model, bridge, replies: Sequence[Example], spans: Sequence[tuple[int, int] | None],
                   schedule: ScheduleConfig, batch_size: int, pad_id: int, device) -> tuple[bool, ...]:
    """Per reply: does ``model`` under ``schedule``, teacher-forced on the reply, predict (argmax)
    every token of its answer span (1-based reply tokens, inclusive)? A reply without a span: False.
    Replies are cut after their answer: what follows cannot change the prediction of the answer."""
    import torch  # noqa: PLC0415

    cut = [Example(prompt=r.prompt, target=r.target[:span[1]] if span else r.target[:1]) for r, span in zip(replies, spans)]
    recalled: list[bool] = []
    with torch.no_grad():
        for start, (ids, mask, _, prompt_len) in zip(range(0, len(cut), batch_size),
                                                     batches_of(cut, batch_size, pad_id, device)):
            predicted = skip_policy_logits(model, ids, mask, schedule, prompt_len, bridge=bridge).argmax(-1)  # (B, N)
            targets = ids[:, prompt_len:]
            for row, span in enumerate(spans[start:start + batch_size]):
                recalled.append(span is not None and
                                bool((predicted[row, span[0] - 1:span[1]] == targets[row, span[0] - 1:span[1]]).all()))
    return tuple(recalled)


def _facts_kept(context: _Context, variant: _Variant, schedule: ScheduleConfig) -> tuple[bool, ...]:
    """For each fact question the full model answers right: does this variant, under the fact
    replies' ``schedule``, still answer it right?"""
    if not context.facts or not any(context.full_facts_right):
        return ()
    replies = free_run(context.generator, variant.decoder, context.fact_batches, schedule,
                       context.config.fact_tokens).texts
    return tuple(answers_right(reply, fact.answers)
                 for reply, fact, right in zip(replies, context.facts, context.full_facts_right) if right)


def _quantization_row(config: EvalConfig, weights: str, context: _Context) -> QuantizationRow:
    """Load the model again with ``weights`` and compare its full depth with the float reference."""
    quantized = load_model(config.model, device=config.device, adapter=None, quantize=weights)
    scores = teacher_forced_scores(quantized.model, context.batches, lambda steps: full_schedule(context.num_layers))
    agreement, nll = scores.agreement, scores.nll
    mine = teacher_continuations(TextGenerator(quantized), context.prompts,
                                 max_new_tokens=config.continuation_tokens, max_prompt_tokens=10**9,
                                 batch_size=config.batch_size)
    same = total = identical = 0
    for reference, candidate in zip(context.references.examples, mine):
        length = max(len(reference.target), len(candidate.target))
        same += sum(a == b for a, b in zip(reference.target, candidate.target))
        total += length
        identical += reference.target == candidate.target
    return QuantizationRow(weights=weights, agreement=round(agreement, 4),
                           perplexity_ratio=round(math.exp(nll - context.full_nll), 4),
                           token_match=round(same / max(1, total), 4),
                           identical_outputs=round(identical / len(context.references.examples), 4))


def write_report(report: EvalReport, folder: str | Path) -> tuple[Path, Path]:
    return write_result_files(folder, "eval", report.to_json(), report.to_markdown())
