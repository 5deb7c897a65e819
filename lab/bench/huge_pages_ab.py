"""What the huge pages buy (model/common/huge_pages.py), two arms in one process at full depth at every
batch size, alternated run by run (the bench's alternation, alternated_batch_timings), each batch size's
median decode step paired by round: 4 KiB pages over huge pages. A host whose speed drifts between
minutes moves both arms alike.
  --part weights   the default model in int4 loaded twice, its q4 copies on 4 KiB pages
                   (SKIPDECODE_HUGE_PAGES=0) and on huge pages (both with the cache on huge pages)
  --part cache     one model, its KV cache on 4 KiB pages (torch's buffers) and on huge pages

    python lab/bench/huge_pages_ab.py --part weights --batch-sizes 1,8 --tokens 64 --repeats 9 --output huge-pages.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

from model.common.hardware import hardware_info
from model.common.settings import changed_settings
from model.evaluation.bench import alternated_batch_timings, emit_report, paired_ratio, raw_bench_batches
from model.loading import load_model
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.kv_cache import PrefixKVCache


def _decoder(huge_pages: bool):
    # the weights' copies are placed at load: the setting for the load only (the cache's follows the process's)
    with changed_settings(huge_pages=huge_pages):
        loaded = load_model(None, device="cpu", quantize="int4")
    decoder = loaded.full_decoder()
    decoder.eos_token_ids = ()  # fixed-length runs
    return loaded, decoder


class _SmallPageCache(PrefixKVCache):
    def _buffer(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return like.new_empty(shape)


def _with_small_page_cache(decoder: SkipDecoder) -> SkipDecoder:
    """The same decoder (same weights) whose prefills make a cache of torch's own buffers."""
    twin = copy.copy(decoder)
    twin._new_cache = lambda batch, capacity, device: _SmallPageCache(decoder.num_layers, capacity)  # type: ignore[method-assign]
    return twin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("weights", "cache"), default="weights")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.part == "weights":
        loaded, small_pages = _decoder(huge_pages=False)
        _, huge_pages = _decoder(huge_pages=True)
    else:
        loaded, huge_pages = _decoder(huge_pages=True)
        small_pages = _with_small_page_cache(huge_pages)
    batches = raw_bench_batches(loaded.tokenizer, (int(b) for b in args.batch_sizes.split(",")))
    timings = alternated_batch_timings({"4 KiB pages": small_pages, "huge pages": huge_pages}, batches, args.tokens,
                                       args.repeats)
    report = {"part": args.part, "hardware": hardware_info(torch.device("cpu")), "threads": args.threads, "tokens": args.tokens,
              "repeats": args.repeats, "rows": []}
    for size in batches:
        small = [t.step_seconds for t in timings["4 KiB pages", size]]
        huge = [t.step_seconds for t in timings["huge pages", size]]
        row = {"batch_size": size, "step_ms_4k_pages": round(1000 * statistics.median(small), 2),
               "step_ms_huge_pages": round(1000 * statistics.median(huge), 2), **paired_ratio(small, huge)}
        report["rows"].append(row)
        print(json.dumps(row), file=sys.stderr)
    emit_report(report, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
