"""How much a batch pays on this machine: the default model in int4 at full depth, greedy, fixed length,
each batch size's whole run (prefill included) and median decode step, the batch sizes ALTERNATED run by
run in one process, and each size's tokens/s as a ratio of the first size's, paired by round (the median
of the per-round ratios). `python -m model bench` times one batch size after another, minutes apart, and a
host whose speed drifts by up to 2x between minutes moves those cross-batch ratios by as much as the
kernels do; here the drift falls on every size alike.

    python scripts/batch_ratio.py --batch-sizes 1,8 --tokens 64 --repeats 7 --output assets/bench/issue51/batch-ratio-round5/after.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from model.common.hardware import hardware_info
from model.evaluation.bench import BENCH_PROMPTS, time_ours
from model.loading import load_model
from model.skipdecode.schedule import full_schedule


def timed_run(decoder, ids: torch.Tensor, mask: torch.Tensor, tokens: int) -> tuple[float, float]:
    """(tokens/s of the whole run, median decode step ms) of one full-depth greedy run, timed as the bench
    times its own."""
    timing = time_ours(decoder, ids, mask, full_schedule(decoder.num_layers), tokens)
    return ids.shape[0] * tokens / timing.seconds, 1000 * timing.step_seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated; ratios are to the first")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    loaded = load_model(None, device="cpu", quantize="int4")
    decoder = loaded.full_decoder()
    decoder.eos_token_ids = ()  # fixed-length runs
    batches = {}
    for size in sizes:
        encoded = loaded.tokenizer([BENCH_PROMPTS[i % len(BENCH_PROMPTS)] for i in range(size)], return_tensors="pt",
                                   padding=True)
        batches[size] = (encoded["input_ids"], encoded["attention_mask"])
        timed_run(decoder, *batches[size], 4)  # warm: the layouts, the first tile configuration
    runs: dict[int, list[tuple[float, float]]] = {size: [] for size in sizes}
    for _ in range(args.repeats):
        for size in sizes:
            runs[size].append(timed_run(decoder, *batches[size], args.tokens))
    first = runs[sizes[0]]
    report = {"hardware": hardware_info(torch.device("cpu")), "threads": args.threads, "tokens": args.tokens,
              "repeats": args.repeats, "weights": loaded.weights, "rows": []}
    for size in sizes:
        report["rows"].append(dict(
            batch=size, tokens_per_second=round(statistics.median(r[0] for r in runs[size]), 1),
            decode_step_ms=round(statistics.median(r[1] for r in runs[size]), 2),
            ratio_to_first=round(statistics.median(r[0] / f[0] for r, f in zip(runs[size], first)), 3),
            step_ratio_to_first=round(statistics.median(r[1] / f[1] for r, f in zip(runs[size], first)), 3)))
        print(json.dumps(report["rows"][-1]), file=sys.stderr)
    text = json.dumps(report, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
