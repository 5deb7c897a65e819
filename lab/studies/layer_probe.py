"""Which layers do fact replies need, against general text? A diagnostic of the layer placement.

For each training-data folder (never the held-out prompts or facts), teacher-forced and with the
untrained model: the KL to the full model when ONE layer is bypassed at every reply position
(the measure the shipped ranking came from) and the ranking it gives; then the KL and agreement
on both folders when the reply positions keep 27 / 22 / 18 / 15 layers by the shipped ranking and
by each folder's own: what a fact-aware placement alone would buy on fact replies, and cost on
general text.

    PYTHONPATH=. python lab/studies/layer_probe.py --count 32 --output runs/layer-probe.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from model.loading import load_model
from model.skipdecode.decoder import masked_forward
from model.studies.study import measure_layer_importance
from model.training.data import Example, batches_of, load_sequences
from model.training.scoring import kl_per_position

SHIPPED_RANKING = (0, 1, 29, 28, 24, 23, 27, 10, 21, 22, 20, 8, 19, 15, 26, 25, 18, 9, 2, 16, 11, 6, 13, 7, 17, 12,
                   14, 5, 3, 4)
KEPT = (27, 22, 18, 15)


def probe_set(loaded, folder: str, count: int, reply_tokens: int) -> tuple[list[tuple], list[torch.Tensor]]:
    """The first ``count`` sequences of ``folder`` (replies cut to ``reply_tokens``), batched
    [(ids, mask, target_mask, prompt_len)], and the full model's logits per batch."""
    examples = [Example(prompt=e.prompt[-96:], target=e.target[:reply_tokens]) for e in load_sequences(folder)[:count]]
    batches = batches_of(examples, 16, loaded.pad_token_id)
    with torch.inference_mode():
        teachers = [masked_forward(loaded.model, ids, mask, torch.ones(ids.shape[1], loaded.num_layers, dtype=torch.bool),
                                   logits_from=prompt_len - 1)[:, :-1] for ids, mask, _, prompt_len in batches]
    return batches, teachers


def score(loaded, probe: tuple[list[tuple], list[torch.Tensor]], executed: set[int]) -> tuple[float, float]:
    """(KL, top-1 agreement) to the full model when the reply positions run only ``executed``."""
    kl = agree = count = 0.0
    with torch.inference_mode():
        for (ids, mask, target_mask, prompt_len), teacher in zip(*probe):
            executes = torch.ones(ids.shape[1], loaded.num_layers, dtype=torch.bool)
            executes[prompt_len:, [j for j in range(loaded.num_layers) if j not in executed]] = False
            logits = masked_forward(loaded.model, ids, mask, executes, logits_from=prompt_len - 1)[:, :-1]
            kl += float((kl_per_position(logits, teacher) * target_mask).sum())
            agree += float(((logits.argmax(-1) == teacher.argmax(-1)).float() * target_mask).sum())
            count += float(target_mask.sum())
    return kl / count, agree / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", default="runs/data/entities", help="make-data folder of fact questions")
    parser.add_argument("--general", default="runs/data/default", help="make-data folder of general prompts")
    parser.add_argument("--count", type=int, default=32, help="sequences of each folder")
    parser.add_argument("--output", default="runs/layer-probe.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(None, device="cpu", dtype="float32", adapter=None)
    layers = range(loaded.num_layers)
    started = time.perf_counter()
    result: dict = {"count": args.count}
    sets = {name: probe_set(loaded, folder, args.count, reply)
            for name, folder, reply in (("facts", args.facts, 32), ("general", args.general, 48))}
    rankings = {"shipped": list(SHIPPED_RANKING)}
    for name, probe in sets.items():
        # the measure the shipped ranking came from (python -m model study), on this folder's replies
        single = [round(v, 4) for v in measure_layer_importance(loaded, *probe)]
        rankings[name] = sorted(layers, key=lambda j: (-single[j], j))
        result[name] = {"single_layer_kl": single}
        print(name, "single-layer KL", single, "ranking", rankings[name], flush=True)
    result["rankings"] = rankings
    for name, probe in sets.items():
        result[name]["kept_kl_agreement"] = {
            ranking: {keep: [round(v, 4) for v in score(loaded, probe, set(order[:keep]))] for keep in KEPT}
            for ranking, order in rankings.items()}
        print(name, "kept (KL, agreement) by ranking", result[name]["kept_kl_agreement"], flush=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
