"""A task's evaluation: greedy descriptions of every test MR at 1x and each speedup, scored as
the E2E challenge scores them, and the measured speed of SkipDecode against the task model.

Scores (all multi-reference, over the whole test set):
* BLEU: sacrebleu's corpus BLEU (13a tokenisation), every MR's references as its reference set;
* ROUGE-L: rouge-score's F-measure, best over an MR's references, averaged over MRs;
* NIST: NLTK's corpus NIST (n = 5), the challenge's second measure.
METEOR (needs WordNet data and, officially, Java) and CIDEr (its package bundles Java jars) are
not computed offline here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from model.decoder import SamplingConfig
from model.generation import GenerationRequest, GenerationResult, ScheduleRequest, TextGenerator
from model.tasks.e2e import E2ERecord, task_prompt


@dataclass
class Descriptions:
    """One arm's outputs on a list of MRs, with what the decoder ran."""

    outputs: list[str]
    generated_tokens: int
    decode_seconds: float  # the decode steps only (prefill excluded)
    total_seconds: float  # prefill + decode
    layers_run: int  # layers executed over every decode step of every batch (per row: the same)
    decode_steps: int
    planned_cost_speedup: float
    planned_layer_speedup: float


def describe(generator: TextGenerator, mrs: Sequence[str], schedule: ScheduleRequest, max_new_tokens: int,
             batch_size: int = 32) -> Descriptions:
    """Greedy descriptions of ``mrs`` in batches of ``batch_size`` (lock-step decoding: a batch
    runs until its longest row ends)."""
    outputs: list[str] = []
    totals = dict(tokens=0, decode=0.0, total=0.0, layers=0, steps=0)
    result: GenerationResult | None = None
    for start in range(0, len(mrs), batch_size):
        prompts = tuple(task_prompt(mr) for mr in mrs[start:start + batch_size])
        result = generator.generate(GenerationRequest(prompts=prompts, schedule=schedule,
                                                      max_new_tokens=max_new_tokens, sampling=SamplingConfig()))
        outputs += [text.strip() for text in result.outputs]
        _add_timings(totals, result)
    summary = result.to_json() if result is not None else {}
    return Descriptions(outputs=outputs, generated_tokens=totals["tokens"], decode_seconds=totals["decode"],
                        total_seconds=totals["total"], layers_run=totals["layers"], decode_steps=totals["steps"],
                        planned_cost_speedup=float(summary.get("planned_cost_model_speedup", 1.0)),
                        planned_layer_speedup=float(summary.get("planned_layer_speedup", 1.0)))


def _add_timings(totals: dict, result: GenerationResult) -> None:
    decode = result.decode
    totals["tokens"] += decode.num_generated
    totals["decode"] += sum(decode.step_seconds)
    totals["total"] += decode.total_seconds
    totals["layers"] += sum(decode.layers_per_step)
    totals["steps"] += len(decode.layers_per_step)


# --- scores ----------------------------------------------------------------------------------------


def bleu(outputs: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU with a variable number of references per output (sacrebleu pads with None)."""
    from sacrebleu.metrics import BLEU  # noqa: PLC0415

    width = max(len(refs) for refs in references)
    streams = [[refs[i] if i < len(refs) else None for refs in references] for i in range(width)]
    return float(BLEU().corpus_score(list(outputs), streams).score)


def rouge_l(outputs: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """ROUGE-L F-measure, best over each output's references, mean over outputs, in percent."""
    from rouge_score import rouge_scorer  # noqa: PLC0415

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    best = [max(scorer.score(ref, out)["rougeL"].fmeasure for ref in refs) for out, refs in zip(outputs, references)]
    return 100.0 * sum(best) / max(1, len(best))


def nist(outputs: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """NLTK's corpus NIST (n = 5) on lower-cased whitespace tokens."""
    from nltk.translate.nist_score import corpus_nist  # noqa: PLC0415

    hyps = [out.lower().split() for out in outputs]
    refs = [[ref.lower().split() for ref in group] for group in references]
    usable = [(h, r) for h, r in zip(hyps, refs) if h]  # an empty output scores 0 without a division by 0
    if not usable:
        return 0.0
    return float(corpus_nist([r for _, r in usable], [h for h, _ in usable], n=5))


def task_scores(outputs: Sequence[str], records: Sequence[E2ERecord]) -> dict:
    references = [r.references for r in records]
    return {"bleu": round(bleu(outputs, references), 2), "rouge_l": round(rouge_l(outputs, references), 2),
            "nist": round(nist(outputs, references), 3)}


# --- speed -------------------------------------------------------------------------------------------


@dataclass
class SpeedRow:
    """SkipDecode against the task model on the same MRs, runs alternated so that load drifts
    fall on both alike. Decode speedup: decode tokens/s over the task model's; end to end: the
    whole request (prefill included)."""

    speedup: float
    batch_size: int
    mrs: int
    full_decode_tps: float
    skip_decode_tps: float
    full_total_tps: float
    skip_total_tps: float
    cost_model_bound: float
    layer_speedup: float
    repeats: int
    decode_speedup: float = field(init=False)
    end_to_end_speedup: float = field(init=False)
    share_of_bound: float = field(init=False)

    def __post_init__(self) -> None:
        self.decode_speedup = round(self.skip_decode_tps / self.full_decode_tps, 3)
        self.end_to_end_speedup = round(self.skip_total_tps / self.full_total_tps, 3)
        self.share_of_bound = round(self.decode_speedup / self.cost_model_bound, 3)


def measure_speed(full: TextGenerator, skip: TextGenerator, mrs: Sequence[str], full_schedule: ScheduleRequest,
                  skip_schedule: ScheduleRequest, speedup: float, batch_size: int, max_new_tokens: int,
                  repeats: int = 2) -> SpeedRow:
    """Tokens/s of both arms over ``mrs``, alternated ``repeats`` times after one warm-up batch.
    Decode tokens/s counts each row's tokens over the decode steps' time (lock-step: a batch's
    steps run until its longest row ends, for both arms alike)."""
    warm = list(mrs[:batch_size])
    describe(full, warm, full_schedule, 8, batch_size)
    describe(skip, warm, skip_schedule, 8, batch_size)
    arms = {"full": [0, 0.0, 0.0], "skip": [0, 0.0, 0.0]}  # tokens, decode s, total s
    bound, layer = 1.0, 1.0
    for _ in range(repeats):
        for name, generator, schedule in (("full", full, full_schedule), ("skip", skip, skip_schedule)):
            run = describe(generator, mrs, schedule, max_new_tokens, batch_size)
            # the prefill makes each row's first token: decode tokens are the rest
            arms[name][0] += run.generated_tokens - len(mrs)
            arms[name][1] += run.decode_seconds
            arms[name][2] += run.total_seconds
            if name == "skip":
                layer = run.decode_steps * full.num_layers / max(1, run.layers_run)
                bound = _cost_bound(skip, run)
    return SpeedRow(speedup=speedup, batch_size=batch_size, mrs=len(mrs),
                    full_decode_tps=round(arms["full"][0] / arms["full"][1], 2),
                    skip_decode_tps=round(arms["skip"][0] / arms["skip"][1], 2),
                    full_total_tps=round((arms["full"][0] + len(mrs) * repeats) / arms["full"][2], 2),
                    skip_total_tps=round((arms["skip"][0] + len(mrs) * repeats) / arms["skip"][2], 2),
                    cost_model_bound=round(bound, 3), layer_speedup=round(layer, 3), repeats=repeats)


def _cost_bound(generator: TextGenerator, run: Descriptions) -> float:
    """The cost model's speedup for the layers the decode steps actually ran (each step also pays
    the embedding and the LM head, which skipping never saves)."""
    cost = generator.cost
    full_steps = run.decode_steps * cost.step_cost(generator.num_layers)
    ran = run.layers_run * cost.layer_cost + run.decode_steps * cost.fixed_cost
    return full_steps / ran if ran else 1.0
