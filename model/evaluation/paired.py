"""Is a candidate adapter really better than the shipped one? A paired bootstrap over prompts.

Both adapters are measured on the same held-out prompts against the same full-model references
(model.evaluation.evaluation, ``--candidate``). A measure pools per-prompt counts (agreeing positions,
repeated 4-grams, NLL sums, kept fact answers); resampling the PROMPTS (the same draw for both
adapters, so prompt difficulty cancels) gives a 95% interval for the difference candidate −
adapter. With 64 prompts a repetition rate moves by a few hundredths when two or three prompts
loop: the interval says whether a difference is larger than that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass
class RowItems:
    """The per-prompt (and per-question) counts one EvalRow pools: what a paired comparison of two
    variants resamples. Lists follow the prompt (question) order of the run."""

    teacher_forced: tuple[tuple[float, float, float], ...]  # (agreeing positions, NLL sum, positions)
    judged: tuple[tuple[float, float, float], ...] = ()  # the original model on this variant's own text
    repetition: tuple[tuple[int, int], ...] = ()  # (repeated word 4-grams, word 4-grams) per output
    facts_kept: tuple[bool, ...] = ()  # per question the full model answers right: still answered right
    facts_recalled: tuple[bool, ...] = ()  # the same questions: answer predicted teacher-forced (fact recall)


# measure -> +1 where higher is better, -1 where lower is better
MEASURE_DIRECTIONS = {"agreement": 1, "ppl_ratio": -1, "judged_ppl_ratio": -1, "repetition": -1,
                      "fact_retention": 1, "fact_recall": 1}


@dataclass
class Comparison:
    target_speedup: float
    measure: str
    adapter: float
    candidate: float
    difference: float  # candidate − adapter
    low: float  # 95% paired bootstrap interval of the difference
    high: float
    verdict: str  # "candidate better", "candidate worse" or "no clear difference"


def _pooled_ratio(counts: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """counts (n, 2) of (numerator, denominator) per item; draws (R, n) item indices -> (R,) pooled ratios."""
    picked = counts[draws]  # (R, n, 2)
    return picked[..., 0].sum(1) / picked[..., 1].sum(1).clamp(min=1e-9)


def _statistics(full: torch.Tensor) -> dict[str, Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]]:
    """measure -> f(items of one variant as tensors, draws) -> (R,) values of that measure.
    ``full`` (n, 2): the full model's (NLL sum, tokens) of its own text per prompt."""

    def ppl_ratio(nll_counts: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        return torch.exp(_pooled_ratio(nll_counts, draws) - _pooled_ratio(full, draws))

    return {
        "agreement": lambda items, draws: _pooled_ratio(items["agreement"], draws),
        "ppl_ratio": lambda items, draws: ppl_ratio(items["nll"], draws),
        "judged_ppl_ratio": lambda items, draws: ppl_ratio(items["judged"], draws),
        "repetition": lambda items, draws: _pooled_ratio(items["repetition"], draws),
        "fact_retention": lambda items, draws: _pooled_ratio(items["facts"], draws),
        "fact_recall": lambda items, draws: _pooled_ratio(items["recall"], draws),
    }


def _as_tensors(items: RowItems) -> dict[str, torch.Tensor]:
    tf = torch.tensor(items.teacher_forced, dtype=torch.float64).reshape(-1, 3)
    tensors = {"agreement": tf[:, [0, 2]], "nll": tf[:, [1, 2]]}
    if items.judged:
        tensors["judged"] = torch.tensor(items.judged, dtype=torch.float64)[:, [1, 2]]
    if items.repetition:
        tensors["repetition"] = torch.tensor(items.repetition, dtype=torch.float64)
    if items.facts_kept:
        kept = torch.tensor(items.facts_kept, dtype=torch.float64)
        tensors["facts"] = torch.stack([kept, torch.ones_like(kept)], dim=1)
    if items.facts_recalled:
        recalled = torch.tensor(items.facts_recalled, dtype=torch.float64)
        tensors["recall"] = torch.stack([recalled, torch.ones_like(recalled)], dim=1)
    return tensors


# Which per-item table each measure resamples: prompts, or fact questions.
_ITEMS_OF = {"agreement": "agreement", "ppl_ratio": "nll", "judged_ppl_ratio": "judged", "repetition": "repetition",
             "fact_retention": "facts", "fact_recall": "recall"}


def compare_variants(full_per_example: Sequence[tuple[float, float, float]], adapter: RowItems, candidate: RowItems,
                     speedup: float, resamples: int = 2000, seed: int = 0) -> list[Comparison]:
    """Every measure both variants have at ``speedup``: values, candidate − adapter, its 95% interval."""
    full = torch.tensor(full_per_example, dtype=torch.float64).reshape(-1, 3)[:, [1, 2]]
    statistics = _statistics(full)
    ours, theirs = _as_tensors(adapter), _as_tensors(candidate)
    generator = torch.Generator().manual_seed(seed)
    comparisons = []
    for measure, statistic in statistics.items():
        key = _ITEMS_OF[measure]
        if key not in ours or key not in theirs:
            continue
        n = ours[key].shape[0]
        if theirs[key].shape[0] != n:
            raise ValueError(f"{measure}: the two variants were measured on different item counts ({n} and "
                             f"{theirs[key].shape[0]})")
        everything = torch.arange(n).unsqueeze(0)  # (1, n): the measure itself
        draws = torch.randint(0, n, (resamples, n), generator=generator)  # the same draws for both variants
        adapter_value = float(statistic(ours, everything)[0])
        candidate_value = float(statistic(theirs, everything)[0])
        differences = statistic(theirs, draws) - statistic(ours, draws)
        low, high = (float(q) for q in torch.quantile(differences, torch.tensor([0.025, 0.975], dtype=torch.float64)))
        comparisons.append(Comparison(
            target_speedup=speedup, measure=measure, adapter=round(adapter_value, 4),
            candidate=round(candidate_value, 4), difference=round(candidate_value - adapter_value, 4),
            low=round(low, 4), high=round(high, 4), verdict=_verdict(measure, low, high)))
    return comparisons


def _verdict(measure: str, low: float, high: float) -> str:
    """Better or worse only when the whole interval lies on one side of zero."""
    if low > 0 or high < 0:
        improved = (low > 0) == (MEASURE_DIRECTIONS[measure] > 0)
        return "candidate better" if improved else "candidate worse"
    return "no clear difference"


def comparison_markdown(comparisons: Sequence[Comparison], adapter: str | None, candidate: str | None) -> str:
    lines = [f"Candidate {candidate} against adapter {adapter}, paired over the same prompts (fact questions for "
             "fact retention and recall); 95% bootstrap interval of candidate − adapter:", "",
             "| target | measure | adapter | candidate | difference [95% interval] | verdict |", "|---|---|---|---|---|---|"]
    for c in comparisons:
        lines.append(f"| {c.target_speedup:g}x | {c.measure} | {c.adapter:.3f} | {c.candidate:.3f} | "
                     f"{c.difference:+.4f} [{c.low:+.4f}, {c.high:+.4f}] | {c.verdict} |")
    worse = [c for c in comparisons if c.verdict == "candidate worse"]
    better = [c for c in comparisons if c.verdict == "candidate better"]
    lines += ["", f"Candidate clearly better on {len(better)}, clearly worse on {len(worse)}, "
                  f"not clearly different on {len(comparisons) - len(better) - len(worse)} of {len(comparisons)}. "
                  f"Ship rule: {ship_verdict(comparisons)}"]
    return "\n".join(lines)


# What a candidate must show to replace the shipped adapter: better text by the measures that
# resolve a difference on 64 prompts, and a regression nowhere that the intervals can see.
MUST_IMPROVE = ("agreement", "judged_ppl_ratio")


def ship_verdict(comparisons: Sequence[Comparison]) -> str:
    """"ships" when the candidate is clearly better on agreement and judged perplexity at every
    speedup compared and clearly worse on no measure at any; else why not. Conservative by
    design: ~15 intervals each with a 2.5% tail on the wrong side, so an equal candidate is
    often held back by chance, and a better one needs six clear wins."""
    worse = [f"{c.measure} at {c.target_speedup:g}x" for c in comparisons if c.verdict == "candidate worse"]
    speedups = sorted({c.target_speedup for c in comparisons})
    verdicts = {(c.measure, c.target_speedup): c.verdict for c in comparisons}
    missing = [f"{measure} at {speedup:g}x" + ("" if (measure, speedup) in verdicts else " (not measured)")
               for speedup in speedups for measure in MUST_IMPROVE
               if verdicts.get((measure, speedup)) != "candidate better"]
    if not comparisons:
        return "nothing compared"
    if worse or missing:
        reasons = ([f"clearly worse on {', '.join(worse)}"] if worse else []) + \
                  ([f"not clearly better on {', '.join(missing)}"] if missing else [])
        return "does not ship (" + "; ".join(reasons) + ")"
    return "ships (clearly better on agreement and judged perplexity at every speedup, clearly worse on nothing)"
