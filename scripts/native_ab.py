"""Two builds of the native decode step side by side in one process: this checkout's and a baseline
commit's (model/lowbit/lean_step.cpp and the headers it includes, read from git and compiled once, cached
by content). The default model in int4 at full depth, one copy of the weights; before each run the lean
layers' steps, the head and the argmax are pointed at that arm's build. The arms alternate run by run at
every batch size (the bench's alternation, alternated_batch_timings) and each size's median decode step
is paired by round: the baseline's step over this checkout's (above 1: this checkout is faster). A host
whose speed drifts between minutes moves both arms alike; two processes minutes apart do not.

    python scripts/native_ab.py --baseline HEAD~1 --batch-sizes 1,8 --tokens 64 --repeats 9 --output native-ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import model.lowbit.native_kernels as native_kernels
from model.common.hardware import hardware_info
from model.evaluation.bench import alternated_batch_timings, raw_bench_batches
from model.loading import load_model
from model.skipdecode.architectures import LeanLlamaLayer
from model.skipdecode.decoder import SkipDecoder

ROOT = Path(__file__).resolve().parents[1]


def baseline_sources(revision: str) -> list[bytes]:
    """lean_step.cpp and its headers as ``revision`` has them (native_kernels.compiled_step's order)."""
    paths = [native_kernels.SOURCE, *native_kernels.HEADERS]
    return [subprocess.run(["git", "show", f"{revision}:{path.relative_to(ROOT).as_posix()}"], cwd=ROOT, check=True,
                           capture_output=True).stdout for path in paths]


def run_on(decoder: SkipDecoder, module: ModuleType) -> None:
    """Point every native step of ``decoder``'s layers, the head's blocks and the argmax at ``module``."""
    native_kernels.native_module = lambda: module  # Q4Blocks' calls (the head, a prefill's matmuls) look it up
    native_kernels._loaded[:] = [module]  # the argmax's
    for layer in decoder.adapter.layers:
        lean = LeanLlamaLayer.of(layer, decoder.adapter.config)
        native = None if lean is None else lean.native
        if native is not None and native._module is not module:
            native._module = module
            native._build()


class OnBuild:
    """``decoder`` whose every generate runs on ``module`` (switched before the timed call)."""

    def __init__(self, decoder: SkipDecoder, module: ModuleType) -> None:
        self._decoder, self._module = decoder, module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        run_on(self._decoder, self._module)
        return self._decoder.generate(*args, **kwargs)


def paired_rows(timings: dict, sizes: list[int]) -> list[dict]:
    rows = []
    for size in sizes:
        base = [t.step_seconds for t in timings["baseline", size]]
        ours = [t.step_seconds for t in timings["this checkout", size]]
        ratios = [a / b for a, b in zip(base, ours)]
        rows.append({"batch_size": size, "step_ms_baseline": round(1000 * statistics.median(base), 3),
                     "step_ms_this_checkout": round(1000 * statistics.median(ours), 3),
                     "paired_speedup": round(statistics.median(ratios), 3),
                     "paired_range": [round(min(ratios), 3), round(max(ratios), 3)]})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="HEAD", help="a git revision of this repository")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(None, device="cpu", quantize="int4")
    decoder = loaded.full_decoder()
    decoder.eos_token_ids = ()  # fixed-length runs
    ours = native_kernels.native_module()
    if ours is None:
        raise SystemExit("no native decode step here (no compiler, or SKIPDECODE_NATIVE=0)")
    baseline = native_kernels.compiled_step(baseline_sources(args.baseline))
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    arms: dict[str, Any] = {"baseline": OnBuild(decoder, baseline), "this checkout": OnBuild(decoder, ours)}
    timings = alternated_batch_timings(arms, raw_bench_batches(loaded.tokenizer, sizes), args.tokens, args.repeats)
    report = {"baseline": args.baseline, "same_build": baseline is ours,
              "hardware": hardware_info(torch.device("cpu")), "threads": args.threads, "tokens": args.tokens,
              "repeats": args.repeats, "rows": paired_rows(timings, sizes)}
    for row in report["rows"]:
        print(json.dumps(row), file=sys.stderr)
    text = json.dumps(report, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
