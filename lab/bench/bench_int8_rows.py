"""int8 weights at batch: torch's int8 kernel against the bfloat16 rows ("AMX-BF16 rows": AMX or AVX512-BF16) (model/lowbit/native_kernels.py,
int8_rows_mm), side by side in one process, alternated run by run (the host's drift falls on both): the
default model in int8 at full depth, greedy, a batch of E2E-like prompts; prefill ms, median decode step ms,
whole-run seconds, and each path's agreement with the float model over the same run (rows whose tokens all
match, and matching positions).

    python lab/bench/bench_int8_rows.py --batch-sizes 8,64 --tokens 24 --repeats 3 --output assets/bench/issue51/int8-rows.json

With --matmul ROWS, the one projection alone instead (576 -> 1536 and 1536 -> 576, random int8 weights), both
paths at each row count, alternated, ms per call (median of --repeats rounds of 20 calls):

    python lab/bench/bench_int8_rows.py --matmul 1,16,32,64,512 --repeats 5 --output assets/bench/issue51/int8-matmul.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from model.common.hardware import hardware_info
from model.loading import load_model
from model.lowbit.native_kernels import int8_bf16_rows, int8_rows_mm, set_int8_bf16_rows
from model.skipdecode.schedule import full_schedule

PROMPT = "name[The Eagle {i}], eatType[coffee shop], food[French], priceRange[moderate], area[riverside], near[Burger King]"


def greedy_run(decoder, ids, mask, tokens: int) -> tuple[float, float, float, list[list[int]]]:
    """(prefill s, median decode step s, whole run s, tokens per row) of one full-depth run."""
    start = time.perf_counter()
    result = decoder.generate(ids, mask, full_schedule(decoder.num_layers), max_new_tokens=tokens)
    return (result.prefill_seconds, statistics.median(result.step_seconds), time.perf_counter() - start,
            [list(map(int, row)) for row in result.tokens])


def agreement(rows: list[list[int]], reference: list[list[int]]) -> dict:
    positions = sum(len(r) for r in reference)
    return {"rows_equal": sum(r == f for r, f in zip(rows, reference)),
            "positions_equal": round(sum(a == b for r, f in zip(rows, reference) for a, b in zip(r, f)) / positions, 4)}


def matmul_rows(rows: list[int], repeats: int) -> list[dict]:
    """ms per call of one int8 projection on each path, at each row count (the paths alternated per round)."""
    out = []
    for inputs, outputs in ((576, 1536), (1536, 576)):
        weight = torch.randn(outputs, inputs)
        scales = weight.abs().amax(1) / 127
        weight_int8, scales = torch.round(weight / scales[:, None]).to(torch.int8), scales.to(torch.bfloat16)
        for count in rows:
            x = torch.randn(count, inputs).to(torch.bfloat16)
            times: dict[str, list[float]] = {"torch int8 kernel": [], "AMX-BF16 rows": []}
            for _ in range(repeats):
                for name, threshold in (("AMX-BF16 rows", 1), ("torch int8 kernel", 0)):
                    set_int8_bf16_rows(threshold)
                    int8_rows_mm(x, weight_int8, scales)  # warm
                    start = time.perf_counter()
                    for _ in range(20):
                        int8_rows_mm(x, weight_int8, scales)
                    times[name].append((time.perf_counter() - start) / 20 * 1000)
            kernel, bf16 = (statistics.median(times[n]) for n in ("torch int8 kernel", "AMX-BF16 rows"))
            out.append(dict(inputs=inputs, outputs=outputs, rows=count, torch_int8_ms=round(kernel, 4),
                            amx_bf16_ms=round(bf16, 4), ratio=round(kernel / bf16, 2)))
            print(json.dumps(out[-1]), file=sys.stderr)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="8,64")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--matmul", default=None, help="comma-separated row counts: the one projection alone")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    threshold = int8_bf16_rows()
    if not threshold:
        print("this CPU runs int8 on torch's kernel at every batch (no AMX-BF16 or AVX512-BF16, or SKIPDECODE_INT8_BF16_ROWS=0): "
              "nothing to compare", file=sys.stderr)
        return 1
    if args.matmul:
        report = {"hardware": hardware_info(torch.device("cpu")), "threads": args.threads, "repeats": args.repeats,
                  "calls_per_round": 20, "rows": matmul_rows([int(r) for r in args.matmul.split(",")], args.repeats)}
        set_int8_bf16_rows(threshold)
        return _written(report, args.output)
    loaded = load_model(None, device="cpu", quantize="int8", adapter=None)
    reference_model = load_model(None, device="cpu", quantize="none", adapter=None)
    report: dict = {"hardware": hardware_info(torch.device("cpu")), "threads": args.threads, "tokens": args.tokens,
                    "repeats": args.repeats, "bf16_from_rows": threshold, "rows": []}
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        encoded = loaded.tokenizer([PROMPT.format(i=i) for i in range(batch)], return_tensors="pt", padding=True)
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        decoder, reference = loaded.full_decoder(), reference_model.full_decoder()
        decoder.eos_token_ids = reference.eos_token_ids = ()
        float_rows = greedy_run(reference, ids, mask, args.tokens)[3]
        runs: dict[str, list] = {"torch int8 kernel": [], "AMX-BF16 rows": []}
        for _ in range(args.repeats):
            for name, rows in (("AMX-BF16 rows", threshold), ("torch int8 kernel", 0)):
                set_int8_bf16_rows(rows)
                runs[name].append(greedy_run(decoder, ids, mask, args.tokens))
        set_int8_bf16_rows(threshold)
        for name, timings in runs.items():
            report["rows"].append(dict(batch=batch, prompt_tokens=int(ids.shape[1]), path=name,
                                       prefill_ms=round(1000 * statistics.median(t[0] for t in timings), 1),
                                       decode_step_ms=round(1000 * statistics.median(t[1] for t in timings), 2),
                                       run_seconds=round(statistics.median(t[2] for t in timings), 3),
                                       vs_float=agreement(timings[0][3], float_rows)))
        print(json.dumps(report["rows"][-2:]), file=sys.stderr)
    return _written(report, args.output)


def _written(report: dict, output: Path | None) -> int:
    text = json.dumps(report, indent=2)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
