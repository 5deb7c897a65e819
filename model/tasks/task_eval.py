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

import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

import torch

from model.generation.generator import TextGenerator
from model.generation.runs import GenerationRequest
from model.generation.schedules import ScheduleRequest
from model.skipdecode.decoder import SamplingConfig, SkipDecoder
from model.skipdecode.schedule import ScheduleConfig, cost_speedup, layer_speedup
from model.tasks.e2e import (
    E2ERecord,
    added_attributes,
    parse_mr,
    place_swaps,
    restore_places,
    task_prompt,
    unmentioned_attributes,
)

GPU_BATCH = 512  # MRs a CUDA device decodes at once (a distillation pass, the held-out sets)


@dataclass
class Descriptions:
    """One arm's outputs on a list of MRs, and the layers each decode step ran (every batch's
    steps, in order: a batch runs until its longest row ends, every row at the same depth)."""

    outputs: list[str]
    step_layers: list[int]


def describe(generator: TextGenerator, mrs: Sequence[str], schedule: ScheduleRequest, max_new_tokens: int,
             batch_size: int = 32, known_places: Collection[str] | None = None) -> Descriptions:
    """Greedy descriptions of ``mrs`` in batches of ``batch_size`` (lock-step decoding: a batch
    runs until its longest row ends). With ``known_places``, every other place is delexicalised:
    swapped for a known one in the prompt and written back in the text (e2e.delexicalise_places)."""
    swapped = place_swaps(mrs, known_places)
    run = Descriptions(outputs=[], step_layers=[])
    for start in range(0, len(mrs), batch_size):
        batch = swapped[start:start + batch_size]
        prompts = tuple(task_prompt(swap.mr) for swap in batch)
        result = generator.generate(GenerationRequest(prompts=prompts, schedule=schedule,
                                                      max_new_tokens=max_new_tokens, sampling=SamplingConfig()))
        run.outputs += [restore_places(text.strip(), swap.swaps) for text, swap in zip(result.outputs, batch)]
        run.step_layers += result.layers_per_step
    return run


def batch_for(device: torch.device | str, cpu_batch: int) -> int:
    """A generation batch for ``device``: an accelerator (CUDA, MPS) decodes hundreds of MRs in one
    lock-step batch for little more than the cost of one, while a CPU pays for every row (and for
    the padding a batch decodes until its longest row ends), so it keeps the caller's small batch."""
    return cpu_batch if torch.device(device).type == "cpu" else max(cpu_batch, GPU_BATCH)


# --- scores ----------------------------------------------------------------------------------------


def reference_streams(references: Sequence[Sequence[str]]) -> list[list[str | None]]:
    """Each MR's references as sacrebleu's reference streams: stream i holds every MR's i-th
    reference, None where an MR has fewer (sacrebleu takes a variable count that way)."""
    width = max(len(refs) for refs in references)
    return [[refs[i] if i < len(refs) else None for refs in references] for i in range(width)]


def bleu(outputs: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU with a variable number of references per output."""
    from sacrebleu.metrics import BLEU  # noqa: PLC0415

    return float(BLEU().corpus_score(list(outputs), reference_streams(references)).score)


def best_rouge_l(outputs: Sequence[str], references: Sequence[Sequence[str]]) -> list[float]:
    """Each output's ROUGE-L F-measure against its best reference, in percent."""
    from rouge_score import rouge_scorer  # noqa: PLC0415

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    return [100.0 * max(scorer.score(ref, out)["rougeL"].fmeasure for ref in refs)
            for out, refs in zip(outputs, references)]


def rouge_l(outputs: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """ROUGE-L F-measure, best over each output's references, mean over outputs, in percent."""
    best = best_rouge_l(outputs, references)
    return sum(best) / max(1, len(best))


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
    """BLEU, ROUGE-L and NIST against the references, and what BLEU does not see: ``facts``, the
    share of descriptions that mention every fact of their MR (unmentioned_attributes), and
    ``made_up``, the share that mention a fact their MR does not give (added_attributes)."""
    references = [r.references for r in records]
    complete = sum(not unmentioned_attributes(r.mr, text) for r, text in zip(records, outputs))
    count = max(1, len(records))
    return {"bleu": round(bleu(outputs, references), 2), "rouge_l": round(rouge_l(outputs, references), 2),
            "nist": round(nist(outputs, references), 3), "facts": round(complete / count, 3),
            "made_up": made_up_share([r.mr for r in records], outputs)}


def names_near_place(mr: str, text: str) -> bool | None:
    """Whether ``text`` names the MR's near[...] place word for word (None: the MR names none), the
    fact a description must copy from the prompt when the place is new to the model."""
    near = parse_mr(mr).get("near")
    return None if near is None else near in text


def near_named_share(mrs: Sequence[str], texts: Sequence[str]) -> float:
    """The share of descriptions that name their MR's near place, over the MRs that have one."""
    named = [flag for flag in map(names_near_place, mrs, texts) if flag is not None]
    return round(sum(named) / len(named), 3) if named else 0.0


def made_up_share(mrs: Sequence[str], texts: Sequence[str]) -> float:
    """The share of descriptions that mention a kind of fact their MR does not give (added_attributes)."""
    return round(sum(bool(added_attributes(mr, text)) for mr, text in zip(mrs, texts)) / max(1, len(mrs)), 3)


def made_up_beyond_share(mrs: Sequence[str], texts: Sequence[str], task_model_texts: Sequence[str]) -> float:
    """The share of descriptions that make up a kind of fact the task model's own description of the
    same MR does not (a policy at its floor running past the task model's stop appends one)."""
    beyond = sum(bool(set(added_attributes(mr, text)) - set(added_attributes(mr, task_text)))
                 for mr, text, task_text in zip(mrs, texts, task_model_texts))
    return round(beyond / max(1, len(mrs)), 3)


def closeness(outputs: Sequence[str], task_model_outputs: Sequence[str]) -> dict:
    """How close descriptions stay to the task model's own of the same MRs: BLEU with the task
    model's as the one reference, and the share of MRs described identically."""
    same = sum(a == b for a, b in zip(outputs, task_model_outputs)) / max(1, len(task_model_outputs))
    return {"bleu": round(bleu(outputs, [(text,) for text in task_model_outputs]), 2), "same_share": round(same, 3)}


# --- speed -------------------------------------------------------------------------------------------


@dataclass
class SpeedRow:
    """SkipDecode against the task model over the SAME steps: the prompts' prefill, then
    ``steps`` greedy decode steps (EOS ignored, so both arms run every step), arms alternated so
    that load drifts fall on both alike. Decode speedup: the task model's decode seconds over
    SkipDecode's; end to end: the same with the prefill included; the bound: the cost model's
    speedup for the layers those steps ran."""

    speedup: float
    batch_size: int
    mrs: int
    steps: int
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


@torch.inference_mode()
def timed_decode(decoder: SkipDecoder, ids: torch.Tensor, mask: torch.Tensor, schedule: ScheduleConfig,
                 steps: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of ``steps`` greedy decode steps under ``schedule``."""
    sync = torch.cuda.synchronize if decoder.device.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    state, logits = decoder.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + steps + 1)
    token = logits.argmax(-1)
    sync()
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(steps):
        token = decoder.decode_step(state, token, schedule.step_layers(step)).argmax(-1)
    sync()
    return prefill, time.perf_counter() - start


def measure_speed(generator: TextGenerator, mrs: Sequence[str], full_request: ScheduleRequest,
                  skip_request: ScheduleRequest, speedup: float, batch_size: int, steps: int,
                  repeats: int = 2, prompt_for: Callable[[str], str] = task_prompt) -> SpeedRow:
    """Decode and end-to-end tokens/s of the task model and SkipDecode on ``mrs`` in batches of
    ``batch_size``, each batch run by both arms in turn, ``repeats`` times, after a warm-up. ``prompt_for``
    makes each input's prompt (E2E's from an MR; another task passes its own)."""
    full_schedule = generator.schedules.schedule_for(full_request, steps + 1).config
    skip_schedule = generator.schedules.schedule_for(skip_request, steps + 1).config
    arms = {"full": (generator.decoder_for(full_request), full_schedule, [0.0, 0.0]),
            "skip": (generator.decoder_for(skip_request), skip_schedule, [0.0, 0.0])}
    batches = [generator.text.encode([prompt_for(mr) for mr in mrs[i:i + batch_size]])
               for i in range(0, len(mrs), batch_size)]
    for decoder, schedule, _ in arms.values():  # warm-up: first calls allocate and build kernels
        timed_decode(decoder, *batches[0], schedule, 4)
    for _ in range(repeats):
        for ids, mask in batches:
            for decoder, schedule, totals in arms.values():
                prefill, decode = timed_decode(decoder, ids, mask, schedule, steps)
                totals[0] += prefill
                totals[1] += decode
    tokens = len(mrs) * steps * repeats
    full, skip = arms["full"][2], arms["skip"][2]
    budgets = [len(skip_schedule.step_layers(step)) for step in range(steps)]
    return SpeedRow(speedup=speedup, batch_size=batch_size, mrs=len(mrs), steps=steps,
                    full_decode_tps=round(tokens / full[1], 2), skip_decode_tps=round(tokens / skip[1], 2),
                    full_total_tps=round(tokens / (full[0] + full[1]), 2),
                    skip_total_tps=round(tokens / (skip[0] + skip[1]), 2),
                    cost_model_bound=round(cost_speedup(generator.num_layers, budgets, generator.cost), 3),
                    layer_speedup=round(layer_speedup(generator.num_layers, budgets), 3), repeats=repeats)
