"""How sure is a share? A paired bootstrap over the test MRs of an arm's BLEU and ROUGE-L as a share
of the task model's.

The issue's bars sit at the 0.99 level (2x >= 0.99 of the task model's BLEU), finer than one test
set can always resolve: a share of 0.986 may or may not be told apart from 0.99 by 630 MRs. Resampling
the MRs (the same draw for the arm and the task model, so an MR's difficulty cancels) gives a 95%
interval for each share. Corpus BLEU is not a mean of per-MR scores, so each MR's sacrebleu statistics
(lengths and n-gram matches) are summed over the draw and scored as a corpus, exactly as
``task_eval.bleu`` scores the whole set; ROUGE-L is a mean of per-MR best F-measures, so a draw
averages those. Nothing here picks a model: it says how far a measured share can be trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from model.tasks.task_eval import best_rouge_l, reference_streams

if TYPE_CHECKING:
    from sacrebleu.metrics import BLEU


@dataclass
class PerMRScores:
    """One arm's per-MR pieces of its corpus scores, in the test set's order."""

    bleu_statistics: torch.Tensor  # (n, 2 + 2 * 4): hyp length, ref length, matches and totals per n-gram order
    rouge_l: torch.Tensor  # (n,) best ROUGE-L F-measure over the MR's references, in percent


@dataclass
class ShareInterval:
    arm: str
    measure: str  # "bleu" or "rouge_l"
    share: float  # the arm's score / the task model's, on every MR
    low: float  # 95% paired bootstrap interval of the share
    high: float
    below: float | None  # the fraction of draws where the share is below ``bar`` (the test set saying "missed")
    bar: float | None  # the bar for this speedup; None where it sets none


def _bleu_metric() -> BLEU:
    from sacrebleu.metrics import BLEU  # noqa: PLC0415

    return BLEU()  # the settings task_eval.bleu scores with (13a tokenisation, exp smoothing)


def per_mr_scores(outputs: Sequence[str], references: Sequence[Sequence[str]]) -> PerMRScores:
    """Each MR's BLEU statistics and best ROUGE-L F-measure."""
    # sacrebleu keeps its per-sentence statistics behind a private method (its own significance
    # tests use it); pinned sacrebleu, and a test checks the pooled score equals corpus_score.
    statistics = _bleu_metric()._extract_corpus_statistics(list(outputs), reference_streams(references))  # noqa: SLF001
    return PerMRScores(torch.tensor(statistics, dtype=torch.float64),
                       torch.tensor(best_rouge_l(outputs, references), dtype=torch.float64))


def pooled_bleu(statistics: torch.Tensor) -> float:
    """Corpus BLEU of summed per-MR statistics ((n, 10) -> one score): every MR drawn once."""
    return float(_bleu_of_draws(statistics, torch.ones(1, statistics.shape[0], dtype=torch.float64))[0])


def _bleu_of_draws(statistics: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """statistics (n, 10), weights (R, n) how often each MR is drawn -> (R,) corpus BLEU of each draw."""
    totals = weights @ statistics  # (R, 10)
    metric = _bleu_metric()
    scores = [metric._compute_score_from_stats([int(v) for v in row.round().tolist()]).score  # noqa: SLF001
              for row in totals]
    return torch.tensor(scores, dtype=torch.float64)


def draw_weights(n: int, resamples: int, seed: int) -> torch.Tensor:
    """(R, n): how often each of ``n`` items is drawn in each of ``resamples`` bootstrap draws. The same
    weights for two arms pair them; a mean over a draw is then one matrix product."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, n, (resamples, n), generator=generator)
    return torch.zeros(resamples, n, dtype=torch.float64).scatter_add_(1, draws, torch.ones(resamples, n,
                                                                                            dtype=torch.float64))


def ratio_interval(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of ours / theirs over paired draws ((R,) each)."""
    ratios = ours / theirs.clamp(min=1e-9)
    low, high = (float(q) for q in torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)))
    return low, high


def _interval(arm: str, measure: str, ours: torch.Tensor, theirs: torch.Tensor, share: float,
              bar: float | None) -> ShareInterval:
    ratios = ours / theirs.clamp(min=1e-9)
    low, high = ratio_interval(ours, theirs)
    below = None if bar is None else round(float((ratios < bar).double().mean()), 3)
    return ShareInterval(arm, measure, round(share, 4), round(low, 4), round(high, 4), below, bar)


def share_intervals(arm: str, scores: PerMRScores, task_model: PerMRScores, bar: float | None = None,
                    resamples: int = 2000, seed: int = 0) -> list[ShareInterval]:
    """The arm's BLEU and ROUGE-L shares of the task model's on every MR, each with its 95% paired
    bootstrap interval and, given a ``bar``, how often a draw falls below it."""
    n = scores.rouge_l.shape[0]
    if task_model.rouge_l.shape[0] != n:
        raise ValueError(f"{arm}: {n} MRs against the task model's {task_model.rouge_l.shape[0]}")
    weights = draw_weights(n, resamples, seed)  # the same draws for both arms and both measures
    bleu_share = pooled_bleu(scores.bleu_statistics) / max(pooled_bleu(task_model.bleu_statistics), 1e-9)
    rouge_share = float(scores.rouge_l.mean() / task_model.rouge_l.mean().clamp(min=1e-9))
    return [
        _interval(arm, "bleu", _bleu_of_draws(scores.bleu_statistics, weights),
                  _bleu_of_draws(task_model.bleu_statistics, weights), bleu_share, bar),
        _interval(arm, "rouge_l", weights @ scores.rouge_l / n, weights @ task_model.rouge_l / n, rouge_share, bar),
    ]
