"""CPU thread scaling: our int4 engine beside llama.cpp's llama-bench at each thread count, batch 1, in one
process (the model loads once per count; the bench's own side-by-side rounds at each count). Writes
FOLDER/threads.json (every count's whole bench report: hardware, CPU flags, notes) and FOLDER/threads.md.

    python scripts/thread_scaling.py --threads 1,2,4,8,16 --output OUT          (default model, int4)
    python scripts/thread_scaling.py --model FOLDER --threads 1,2 --tokens 8 --repeats 1 --output OUT

llama.cpp's row needs scripts/build_llama_bench.sh's binary and the default model (its GGUF); without them
the table says so and has our rows alone."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from model.evaluation.bench import BenchConfig, BenchReport, run_bench


def scaling_reports(threads: list[int], model: str | None, quantize: str, speedup: float, tokens: int,
                    repeats: int, on_count: Callable[[list[BenchReport]], None] | None = None) -> list[BenchReport]:
    """One batch-1 bench per thread count: our full model and SkipDecode at ``speedup``, and llama-bench;
    ``on_count`` sees the reports so far after each count (a run stopped by a time limit keeps them)."""
    reports: list[BenchReport] = []
    for count in threads:
        config = BenchConfig(model=model, device="cpu", batch_sizes=(1,), speedups=(speedup,), new_tokens=tokens,
                             repeats=repeats, include_hf=False, quantize=(quantize,), threads=count,
                             prompt_tokens=0, graphs=False)
        reports.append(run_bench(config, progress=lambda line, c=count: print(f"{c} threads: {line}", file=sys.stderr)))
        if on_count is not None:
            on_count(reports)
    return reports


def scaling_markdown(threads: list[int], reports: list[BenchReport]) -> str:
    """One line per thread count: decode tokens/s of our full model, of SkipDecode and of llama.cpp."""
    first = reports[0]
    lines = [f"CPU thread scaling, batch 1, {first.new_tokens} new tokens, median of {first.repeats}: "
             f"{first.model}, {first.hardware['cpu']}, {first.hardware['cores']} cores; CPU flags: {', '.join(first.hardware.get('cpu_flags', []))}.",
             *[f"Note: {note}" for note in dict.fromkeys(n for r in reports for n in r.notes)], "",
             "| threads | ours full decode tok/s | ours skip decode tok/s | llama.cpp decode tok/s | full vs llama.cpp | "
             "skip vs llama.cpp |", "|---|---|---|---|---|---|"]
    for count, report in zip(threads, reports):
        by_mode = {row.mode: row for row in report.rows}
        full, skip, llama = by_mode.get("full"), by_mode.get("skipdecode"), by_mode.get("llama.cpp")

        def cell(row, attr: str, digits: int = 1, suffix: str = "") -> str:
            value = getattr(row, attr) if row is not None else None
            return "–" if value is None else f"{value:.{digits}f}{suffix}"
        lines.append(f"| {count} | {cell(full, 'decode_tokens_per_second')} | {cell(skip, 'decode_tokens_per_second')} | "
                     f"{cell(llama, 'decode_tokens_per_second')} | {cell(full, 'vs_llama_cpp', 2, 'x')} | "
                     f"{cell(skip, 'vs_llama_cpp', 2, 'x')} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2,4,8,16", help="comma-separated thread counts")
    parser.add_argument("--model", default=None, help="a model folder or id (default: the embedded model)")
    parser.add_argument("--quantize", default="int4", help="our weight mode (default int4)")
    parser.add_argument("--speedup", type=float, default=2.0)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", required=True, type=Path, help="folder for threads.json and threads.md")
    args = parser.parse_args()
    try:
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads takes comma-separated whole numbers; got {args.threads!r}")
    if not threads or min(threads) < 1 or args.tokens < 2 or args.repeats < 1:
        parser.error("--threads must be >= 1, --tokens >= 2 and --repeats >= 1")
    args.output.mkdir(parents=True, exist_ok=True)
    reports = scaling_reports(threads, args.model, args.quantize, args.speedup, args.tokens, args.repeats,
                              on_count=lambda so_far: write_scaling(args.output, threads, so_far))
    print(scaling_markdown(threads, reports))  # the files: written after the last count already
    return 0


def write_scaling(folder: Path, threads: list[int], reports: list[BenchReport]) -> str:
    """threads.json and threads.md for the counts measured so far (the first len(reports) of ``threads``)."""
    counts = threads[:len(reports)]
    (folder / "threads.json").write_text(json.dumps(
        [dict(threads=count, **report.to_json()) for count, report in zip(counts, reports)], indent=2))
    table = scaling_markdown(counts, reports)
    (folder / "threads.md").write_text(table + "\n")
    return table


if __name__ == "__main__":
    sys.exit(main())
