"""Two builds of the native decode step side by side in one process: this checkout's and a baseline
commit's (model/lowbit/lean_step.cpp and the headers it includes, read from git and compiled once, cached
by content). The default model in int4 at full depth, one copy of the weights; before each run the lean
layers' steps, the head and the argmax are pointed at that arm's build. The arms alternate run by run at
every batch size (the bench's alternation, alternated_batch_timings) and each size's median decode step
is paired by round: the baseline's step over this checkout's (above 1: this checkout is faster). A host
whose speed drifts between minutes moves both arms alike; two processes minutes apart do not.

    python lab/bench/native_ab.py --baseline HEAD~1 --batch-sizes 1,8 --tokens 64 --repeats 9 --output native-ab.json

--speedup S times SkipDecode at S with this model's skip policy (its skipping steps run the policy's layers: the
LoRA beside the int4 base) at the schedule the product runs, instead of the full depth.

--part head times the LM head's one call alone (two_stage_head: the 4-bit scan, each row's candidates rescored)
on random rows of each batch size, the two builds alternated call batch by call batch, and checks that their
logits are the same bits.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import model.lowbit.native_kernels as native_kernels
from model.common.hardware import hardware_info
from model.evaluation.bench import alternated_batch_timings, emit_report, paired_ratio, raw_bench_batches
from model.generation.generator import TextGenerator
from model.generation.schedules import ScheduleRequest
from model.loading import load_model
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.lean_layer import LeanLlamaLayer
from model.skipdecode.schedule import ScheduleConfig

ROOT = Path(__file__).resolve().parents[2]


def baseline_sources(revision: str) -> list[bytes]:
    """lean_step.cpp and its headers as ``revision`` has them (native_kernels.compiled_step's order)."""
    paths = [native_kernels.SOURCE, *native_kernels.HEADERS]
    return [subprocess.run(["git", "show", f"{revision}:{path.relative_to(ROOT).as_posix()}"], cwd=ROOT, check=True,
                           capture_output=True).stdout for path in paths]


def run_on(decoder: SkipDecoder, module: ModuleType) -> None:
    """Point every native step of ``decoder``'s layers, the head's blocks and the argmax at ``module``."""
    native_kernels.native_module = lambda: module  # Q4Blocks' calls (the head, a prefill's matmuls) look it up
    native_kernels._loaded[:] = [module]  # the argmax's
    for adapter in {id(a): a for a in (decoder.adapter, decoder.skip_adapter)}.values():  # the policy's layers too
        for layer in adapter.layers:
            lean = LeanLlamaLayer.of(layer, adapter.config)
            native = None if lean is None else lean.native
            if native is not None and native._module is not module:
                native._module = module
                native._build()


class OnBuild:
    """``decoder`` whose every generate runs on ``module`` (switched before the timed call), at ``schedule``
    where one is given (instead of the caller's full depth)."""

    def __init__(self, decoder: SkipDecoder, module: ModuleType, schedule: ScheduleConfig | None = None) -> None:
        self._decoder, self._module, self._schedule = decoder, module, schedule

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)

    def generate(self, ids: torch.Tensor, mask: torch.Tensor, schedule: ScheduleConfig, **kwargs: Any) -> Any:
        run_on(self._decoder, self._module)
        return self._decoder.generate(ids, mask, self._schedule or schedule, **kwargs)


def head_rows(decoder: SkipDecoder, builds: dict[str, ModuleType], sizes: list[int], repeats: int) -> list[dict]:
    """The head's call at each batch size on each build, 20 calls a timing, the builds in a fresh random order
    every round; each size's baseline time over this checkout's, paired by round."""
    head = decoder.adapter.lm_head
    blocks = native_kernels.q4_scan(head.scan)
    if blocks is None:
        raise SystemExit("the head does not run the q4 kernels here")
    exact, scales = (head._tied[0], None) if head._tied is not None else (head.exact_int8, head.exact_scales)
    rows = []
    for size in sizes:
        x = torch.randn(size, head.in_features, generator=torch.Generator().manual_seed(size))

        def call(module: ModuleType) -> torch.Tensor:
            return module.two_stage_head(x, blocks.qs, blocks.sz, exact, scales, head.candidates, blocks.lanes,
                                         blocks.amx)

        def timed(module: ModuleType) -> float:
            start = time.perf_counter()
            for _ in range(20):
                call(module)
            return (time.perf_counter() - start) / 20

        same = torch.equal(call(builds["baseline"]), call(builds["this checkout"]))
        seconds: dict[str, list[float]] = {name: [] for name in builds}
        for _ in range(repeats):
            for name in random.sample(list(builds), len(builds)):
                seconds[name].append(timed(builds[name]))
        rows.append({"batch_size": size, "head_ms_baseline": round(1000 * statistics.median(seconds["baseline"]), 3),
                     "head_ms_this_checkout": round(1000 * statistics.median(seconds["this checkout"]), 3),
                     **paired_ratio(seconds["baseline"], seconds["this checkout"]), "same_logits": same})
    return rows


def paired_rows(timings: dict, sizes: list[int]) -> list[dict]:
    rows = []
    for size in sizes:
        base = [t.step_seconds for t in timings["baseline", size]]
        ours = [t.step_seconds for t in timings["this checkout", size]]
        rows.append({"batch_size": size, "step_ms_baseline": round(1000 * statistics.median(base), 3),
                     "step_ms_this_checkout": round(1000 * statistics.median(ours), 3), **paired_ratio(base, ours)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="HEAD", help="a git revision of this repository")
    parser.add_argument("--part", choices=("step", "head"), default="step",
                        help="whole decode runs (step), or the LM head's call alone (head)")
    parser.add_argument("--speedup", type=float, default=None,
                        help="SkipDecode at this target with the skip policy (default: the full depth)")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(None, device="cpu", quantize="int4")
    decoder = loaded.full_decoder() if args.speedup is None else loaded.skip_decoder()
    decoder.eos_token_ids = ()  # fixed-length runs
    schedule = None if args.speedup is None else TextGenerator(loaded).schedules.schedule_for(
        ScheduleRequest(target_speedup=args.speedup), args.tokens).config
    ours = native_kernels.native_module()
    if ours is None:
        raise SystemExit("no native decode step here (no compiler, or SKIPDECODE_NATIVE=0)")
    baseline = native_kernels.compiled_step(baseline_sources(args.baseline))
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.part == "head":
        rows = head_rows(decoder, {"baseline": baseline, "this checkout": ours}, sizes, args.repeats)
    else:
        arms: dict[str, Any] = {"baseline": OnBuild(decoder, baseline, schedule),
                                "this checkout": OnBuild(decoder, ours, schedule)}
        timings = alternated_batch_timings(arms, raw_bench_batches(loaded.tokenizer, sizes), args.tokens, args.repeats)
        rows = paired_rows(timings, sizes)
    report = {"baseline": args.baseline, "part": args.part, "speedup": args.speedup, "same_build": baseline is ours,
              "hardware": hardware_info(torch.device("cpu")), "threads": args.threads, "tokens": args.tokens,
              "repeats": args.repeats, "rows": rows}
    for row in report["rows"]:
        print(json.dumps(row), file=sys.stderr)
    emit_report(report, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
