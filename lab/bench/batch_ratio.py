"""How much a batch pays on this machine: the default model in int4 at full depth, greedy, fixed length,
each batch size's whole run (prefill included) and median decode step, the batch sizes ALTERNATED run by
run in one process, and each size's decode tokens/s as a ratio of the first size's, paired by round (the
median of the per-round ratios); each round's median steps too (`rounds`: the ratio against the host's speed
of the moment). A host whose speed drifts by up to 2x between minutes moves a ratio of
runs minutes apart by as much as the kernels do; here the drift falls on every size alike. The same
alternation as the batch-scaling table of `python -m model bench` (model/evaluation/bench.py,
alternated_batch_timings), for the int4 full depth alone; its prompts are the bench's as raw text (no chat
template, as round five's files were measured), shorter than the table's.

    python lab/bench/batch_ratio.py --batch-sizes 1,8 --tokens 64 --repeats 7 --output batch-ratio.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from model.common.hardware import hardware_info
from model.evaluation.bench import alternated_batch_timings, emit_report, raw_bench_batches, scaling_rows
from model.loading import load_model


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
    batches = raw_bench_batches(loaded.tokenizer, sizes)
    timings = alternated_batch_timings({loaded.weights: decoder}, batches, args.tokens, args.repeats)
    report = {"hardware": hardware_info(torch.device("cpu")), "threads": args.threads, "tokens": args.tokens,
              "repeats": args.repeats, "weights": loaded.weights, "rows": []}
    for row in scaling_rows(timings, args.tokens):
        steps = timings[row.weights, row.batch_size]
        report["rows"].append({**asdict(row), "decode_step_ms": round(1000 * statistics.median(t.step_seconds for t in steps), 2)})
        print(json.dumps(report["rows"][-1]), file=sys.stderr)
    # each round's median step of every size: how the ratio moves with the host's speed of the moment (a
    # batch-1 step is the weights' read, a batch step mostly arithmetic, and the host's read speed drifts most)
    report["rounds"] = [{str(size): round(1000 * timings[loaded.weights, size][r].step_seconds, 3) for size in sizes}
                        for r in range(args.repeats)]
    emit_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
