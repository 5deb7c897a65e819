"""This machine's limits for `python -m model bench` (each figure as a share of them), and llama.cpp's
`llama-batched-bench` (decoding at batch N on the same GGUF and threads).

Two limits, both measured in the run that uses them (a spec sheet's figures are not this machine's,
and a shared machine's are lower still):
  read bandwidth   a large float32 tensor summed by torch on the bench's threads (best of a few reads;
                   the tensor is far larger than the caches), GB/s; on 4 KiB pages and on 2 MiB pages
                   where Linux gives them (where the q4 kernels' weights live, model/common/huge_pages.py),
                   the faster of the two as the limit
  multiply-adds    the q4 kernels' own instruction (lean_step.cpp, q4_peak: AVX-512 VNNI vpdpbusd or
                   AVX2 vpmaddwd, no loads) on the bench's threads, counted in the kernels' multiply-adds:
                   a weight times a 16-bit activation is two VNNI byte products, one AVX2 product
A decode step at batch B reads every weight it runs once (int4: 0.625 bytes a weight, the 4-bit code
plus a bfloat16 scale and zero per 32) and does B multiply-adds a weight, so
  share of bandwidth = steps/s x weights a step x 0.625 / read bandwidth
  share of arithmetic = tokens/s x weights a token / multiply-add peak
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from model.common.huge_pages import huge_page_buffer
from model.common.paths import cache_root
from model.lowbit.native_kernels import native_module, q4_isa

INT4_BYTES_PER_WEIGHT = 0.625  # 4-bit codes + a bfloat16 scale and zero per block of 32


@dataclass
class MachineLimits:
    read_gb_per_second: float  # a large tensor read on the bench's threads (the faster kind of page)
    multiply_adds_per_second: float | None  # the q4 kernels' multiply-adds (None: no q4 kernels here)
    isa: str | None  # the q4 kernels' instruction set that ran ("avx512-vnni", "avx2")
    threads: int
    small_page_read_gb_per_second: float | None = None  # the read on 4 KiB pages, where it was the slower

    def describe(self) -> str:
        peak = "n/a (no q4 kernels)" if self.multiply_adds_per_second is None else \
            f"{self.multiply_adds_per_second / 1e9:.1f} G multiply-adds/s on {self.isa}"
        pages = "" if self.small_page_read_gb_per_second is None else \
            f" on 2 MiB pages ({self.small_page_read_gb_per_second:.1f} on 4 KiB pages)"
        products = _PRODUCTS.get(self.isa or "", "the kernels' own products")
        return (f"machine limits, measured in this run on {self.threads} threads: read bandwidth "
                f"{self.read_gb_per_second:.1f} GB/s{pages}, the q4 kernels' multiply-add peak {peak} "
                f"(16-bit activations: {products} a multiply-add)")


# what one of the q4 kernels' multiply-adds (a weight times a 16-bit activation) costs on each instruction set
_PRODUCTS = {"avx512-vnni": "two VNNI byte products", "avx2": "one vpmaddwd 16-bit product"}


def read_bandwidth(threads: int, megabytes: int = 512, reads: int = 5) -> float:
    """GB/s of the best of ``reads`` sums of a float32 tensor of ``megabytes`` (far past the caches)."""
    return _best_read(torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32), threads, reads)


def huge_page_read_bandwidth(threads: int, megabytes: int = 512, reads: int = 5) -> float | None:
    """read_bandwidth on 2 MiB pages (model/common/huge_pages.py), or None where this OS has none."""
    space = huge_page_buffer(megabytes * (1 << 20))
    return None if space is None else _best_read(space.view(torch.float32).fill_(1.0), threads, reads)


def _best_read(data: torch.Tensor, threads: int, reads: int) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data.sum()  # first touch
        best = float("inf")
        for _ in range(reads):
            start = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - start)
        return data.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(previous)


def multiply_add_peak(threads: int, seconds: float = 0.5) -> float | None:
    """The q4 kernels' multiply-adds a second on ``threads`` threads (a weight x a 16-bit activation:
    two VNNI byte products on AVX-512, one vpmaddwd product on AVX2), or None without them."""
    module, isa = native_module(), q4_isa()
    if module is None or isa is None:
        return None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        products = module.q4_peak(threads, seconds)
    finally:
        torch.set_num_threads(previous)
    return products / 2 if isa == "avx512-vnni" else products


def measure_limits(threads: int) -> MachineLimits:
    small = read_bandwidth(threads)
    read = max(small, huge_page_read_bandwidth(threads) or 0.0)  # the faster kind of page
    return MachineLimits(read_gb_per_second=round(read, 2), multiply_adds_per_second=multiply_add_peak(threads),
                         isa=q4_isa(), threads=threads,
                         small_page_read_gb_per_second=round(small, 2) if read > small else None)


def bandwidth_share(limits: MachineLimits, steps_per_second: float, weights_per_step: float) -> float:
    """The share of the read bandwidth a decode rate needs: every weight a step runs read once (int4)."""
    return steps_per_second * weights_per_step * INT4_BYTES_PER_WEIGHT / (limits.read_gb_per_second * 1e9)


def arithmetic_share(limits: MachineLimits, tokens_per_second: float, weights_per_token: float) -> float | None:
    """The share of the multiply-add peak a rate uses (one multiply-add a weight a token)."""
    if not limits.multiply_adds_per_second:
        return None
    return tokens_per_second * weights_per_token / limits.multiply_adds_per_second


# --- llama.cpp's llama-batched-bench (scripts/build_llama_bench.sh builds it) --------------------


def llama_batched_bench_binary() -> Path | None:
    path = cache_root() / "llama.cpp" / "llama-batched-bench"
    return path if path.is_file() else None


def parse_batched_bench(output: str, batch: int) -> float:
    """Decode tokens/s at ``batch`` sequences (``speed_tg``: batch x tg tokens over their time) from
    llama-batched-bench's ``--output-format jsonl`` lines."""
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{"):
            record = json.loads(line)
            if int(record.get("pl", -1)) == batch:
                return float(record["speed_tg"])
    raise RuntimeError(f"llama-batched-bench printed no npl {batch} result:\n{output[-2000:]}")


def llama_batched_decode(binary: Path, gguf: Path, threads: int, batch: int, prompt_tokens: int,
                         new_tokens: int) -> float:
    """llama.cpp's decode tokens/s at ``batch`` sequences of ``prompt_tokens`` + ``new_tokens`` (one run)."""
    context = batch * (prompt_tokens + new_tokens) + 16
    command = [str(binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-c", str(context),
               "-b", "2048", "-ub", "512", "-npp", str(prompt_tokens), "-ntg", str(new_tokens), "-npl", str(batch),
               "--output-format", "jsonl"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"llama-batched-bench failed ({done.returncode}): {done.stderr[-2000:]}")
    return parse_batched_bench(done.stdout, batch)
