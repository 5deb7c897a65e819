"""The int4 kernels side by side on the default model's matrix shapes (random weights), one process:
AMX tiles (where the CPU has AMX-INT8: "amx" with the weights laid out for them at load, "amx-bare"
transposing the 4-bit bytes on every call), AVX2's lane kernel ("avx2-lane", 8 blocks a vector) and
its row kernel ("avx2-row", a block at a time; both forced on an AVX-512 CPU), the AVX-512 lane kernel (16-bit activations, and "lane8" with
8-bit ones), the group kernel (the same q4 bytes without the lane layout) and torch's int4
kernel, at each row count (a decode batch, or a prompt's tokens).

    python lab/bench/bench_q4_kernels.py --threads 1 --layers 30 --rows 1,4,8,16 --repeats 5
    python lab/bench/bench_q4_kernels.py --threads 1 --layers 4 --rows 128,512 --repeats 3

A sweep multiplies ``--layers`` layers' q/k/v (960 x 576), o (576 x 576), gate/up (3072 x 576) and down
(576 x 1536) matrices and the LM head (49152 x 576) once. ``--clock cpu`` (the default) times the
process's CPU time, which on a machine shared with other jobs counts this process's own work rather
than the time others held the cores (with --threads 1); ``--clock wall`` times wall-clock. The best of
``--repeats`` sweeps per kernel, the kernels interleaved; ratios are taken within the run.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from model.common.hardware import hardware_info
from model.lowbit.native_kernels import Q4Blocks, amx_rows_setting, native_module, q4_isa
from model.lowbit.quantization import INT4_GROUP, Int4WeightLinear

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HEAD = (49152, 576)


avx2_lanes: dict[int, torch.Tensor] = {}  # each matrix's bytes in AVX2's lane layout, by id of its Q4Blocks


def sweep(modules: list[Int4WeightLinear], blocks: list[Q4Blocks], rows: int, kind: str, clock) -> float:
    """Seconds of one pass over every matrix with ``rows`` random rows through ``kind``'s kernel."""
    module = native_module()
    inputs = {width: torch.randn(rows, width) for width in (576, 1536)}
    module.set_q4_amx_rows(1 if kind.startswith("amx") else 0)
    module.set_q4_isa("avx2" if kind.startswith("avx2") else "auto")
    start = clock()
    for linear, b in zip(modules, blocks):
        x = inputs[linear.in_features]
        if kind in ("lane", "lane8"):  # lane8: 8-bit activations (the head's coarse scan)
            module.q4_matmul(x, b.qs, b.sz, kind == "lane8", b.lanes)
        elif kind == "amx":  # AMX tiles (amx_kernels.h) at any row count, on the load-time layout
            module.q4_matmul(x, b.qs, b.sz, False, b.lanes, b.amx)
        elif kind == "amx-bare":  # the same, transposing the bytes on every call
            module.q4_matmul(x, b.qs, b.sz, False, b.lanes)
        elif kind == "group" or kind == "avx2-row":
            module.q4_matmul(x, b.qs, b.sz, False)
        elif kind == "avx2-lane":
            module.q4_matmul(x, b.qs, b.sz, False, avx2_lanes[id(b)])
        else:
            torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), linear.weight_int4pack, INT4_GROUP,
                                                        linear.scales_and_zeros)
    elapsed = clock() - start
    module.set_q4_amx_rows(amx_rows_setting())
    module.set_q4_isa("auto")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rows", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    if native_module() is None or q4_isa() is None:
        raise SystemExit("the q4 kernels do not run here (no C++ compiler, or not x86-64 with AVX2)")
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    modules = [Int4WeightLinear.from_linear(nn.Linear(k, o, bias=False)) for o, k in SHAPES * args.layers + [HEAD]]
    blocks = [Q4Blocks.of(m) for m in modules]
    avx2_lanes.update({id(b): native_module().q4_lanes_avx2(b.qs) for b in blocks})
    kinds = (["lane", "lane8", "group"] if q4_isa() == "avx512-vnni" else []) + ["avx2-lane", "avx2-row", "torch"]
    if native_module().q4_amx():
        kinds[:0] = ["amx", "amx-bare"]
    info = hardware_info(torch.device("cpu"))
    print(f"{info['summary']}; CPU flags: {', '.join(info.get('cpu_flags', []))}; q4 on {q4_isa()}; "
          f"{args.threads} thread(s), {args.clock} time, best of {args.repeats}, {args.layers} layers + head")
    print("| rows | " + " | ".join(f"{k} ms" for k in kinds) + " | torch / ours | group / lane | lane / lane8 | lane / amx | amx-bare / amx | avx2 row / lane |")
    print("|---" * (len(kinds) + 7) + "|")
    for rows in (int(r) for r in args.rows.split(",")):
        best = {kind: float("inf") for kind in kinds}
        for _ in range(args.repeats):
            for kind in kinds:
                best[kind] = min(best[kind], sweep(modules, blocks, rows, kind, clock))
        ours = min(best[k] for k in kinds if k != "torch")
        lane_gain = f"{best['group'] / best['lane']:.2f}x" if "lane" in best else "–"
        eight_gain = f"{best['lane'] / best['lane8']:.2f}x" if "lane8" in best else "–"
        amx_gain = f"{best['lane'] / best['amx']:.2f}x" if "amx" in best and "lane" in best else "–"
        layout_gain = f"{best['amx-bare'] / best['amx']:.2f}x" if "amx" in best else "–"
        avx2_gain = f"{best['avx2-row'] / best['avx2-lane']:.2f}x"
        print(f"| {rows} | " + " | ".join(f"{1000 * best[k]:.1f}" for k in kinds) +
              f" | {best['torch'] / ours:.2f}x | {lane_gain} | {eight_gain} | {amx_gain} | {layout_gain} | {avx2_gain} |", flush=True)


if __name__ == "__main__":
    main()
