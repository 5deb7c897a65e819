"""`python -m model bench`: measured wall-clock speed, side by side in one run.

For each batch size, the same prompts and a FIXED generated length (EOS ignored) run through:
  hf_generate   the original full model through transformers' generate (greedy)
  full          the original full model through our decoder (n_k = L)
  skip@S        SkipDecode at target layer speedup S (linear decay by default), on the model
                users run: the skip-policy adapter merged into its weights
  hf_static_compile   transformers' generate with its static cache and torch.compile(mode="reduce-overhead")
                (CUDA only: the ecosystem's best plain path)
  graphs full, graphs skip@S   our decoder over the static KV cache, one CUDA graph per layer set replayed
                (CUDA only; model/skipdecode/cuda_graphs.py); the "capture s" column is the seconds its graphs
                took to capture (transformers' compiled row: its first, compiling call)
  static full, static skip@S   the same static-cache step run eagerly (``--static-cache``; any device)
  compiled full, compiled skip@S   the static step with each layer kind's decode step compiled by torch.compile
                (model/skipdecode/compiled_layers.py): inside the CUDA graphs on CUDA, run eagerly elsewhere
                (with ``--static-cache``); "capture s" then includes the compiles
  llama.cpp     llama.cpp's own `llama-bench` on the SAME GGUF file (the default model only, batch 1, the
                same thread count and token count), and `llama-batched-bench -npl N` at batch N > 1, when
                scripts/build_llama_bench.sh has built them
Prompt processing: prompts of 128 and --prompt-tokens tokens (default 512) through our prefill, and the time to the
first token (prefill, head, argmax), beside llama-bench's `-p N` (pp128, pp512) on the same GGUF, batch 1.
On a CPU every figure is also a share of this machine's limits, measured in the same run (its read bandwidth and
the q4 kernels' multiply-add peak: model/evaluation/machine_limits.py).
A weight mode may name the int4 kernel it runs (``int4@torch``, ``int4@avx2``, ``int4@avx512-vnni``; plain ``int4``
takes the machine's default), so kernels compare side by side in one run.
Modes run interleaved (a fresh random order each round) and repeated; medians are reported and every ratio is
taken between medians of the same run. Efficiency = measured speedup / cost-model speedup. llama-bench's
figure is pure decoding (its "tg" test), so our modes are compared with it on DECODE tokens/s (1 / median
step time, prefill excluded).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import torch

from model.common.hardware import hardware_info
from model.common.paths import cache_root
from model.common.settings import changed_settings
from model.evaluation.machine_limits import (
    MachineLimits,
    arithmetic_share,
    bandwidth_share,
    llama_batched_bench_binary,
    llama_batched_decode,
    measure_limits,
)
from model.evaluation.reporting import speed_figure
from model.generation.generator import TextGenerator
from model.generation.schedules import ScheduleRequest
from model.loading import DEFAULT_MODEL, LoadedModel, load_model, locate_default_gguf, resolve_device
from model.lowbit.native_kernels import DEFAULT_AMX_ROWS, native_module, q4_isa, q4_kernel_selected
from model.skipdecode.compiled_layers import CompiledStep
from model.skipdecode.cuda_graphs import CudaGraphStep
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.schedule import CostModel, ScheduleConfig, SolvedSchedule, full_schedule, speedup_summary
from model.skipdecode.static_decoder import EagerStep, StaticSkipDecoder, static_decoder


@dataclass(frozen=True)
class Mode:
    """One timed mode of a weight variant: what runs, through which of our engines, at which target speedup.
    Parsed once from the name the bench's notes write ("skip@2", "graphs:skip@2", "hf_static_compile",
    "llama.cpp"), and ``name`` gives that string back: ``Mode.parse(mode.name) == mode``."""

    kind: str  # "full", "skip", "hf_generate", "hf_static_compile", "llama.cpp" or "prefill"
    engine: str = ""  # "": our decoder run eagerly; or one of ENGINES ("static", "graphs", "compiled")
    speedup: float | None = None  # a skip mode's target layer speedup, and only a skip mode's

    def __post_init__(self) -> None:
        if (self.kind == "skip") != (self.speedup is not None):
            raise ValueError(f"a skip mode, and only a skip mode, has a target speedup: {self}")

    @classmethod
    def parse(cls, name: str) -> Mode:
        """"graphs:skip@2" -> Mode("skip", "graphs", 2.0); "full" -> Mode("full")."""
        engine, _, mode = name.rpartition(":")
        kind, _, speedup = mode.partition("@")
        return cls(kind, engine, float(speedup)) if kind == "skip" else cls(mode, engine)

    @property
    def name(self) -> str:
        """The mode as the bench's notes name it: "graphs:skip@2", "full", "llama.cpp"."""
        mode = f"skip@{self.speedup:g}" if self.kind == "skip" else self.kind
        return f"{self.engine}:{mode}" if self.engine else mode

    @property
    def row_mode(self) -> str:
        """BenchRow.mode, as the reports name it (the speedup in its own field): "full", "skipdecode",
        "graphs full", "graphs skipdecode", "hf_static_compile", ..."""
        kind = "skipdecode" if self.kind == "skip" else self.kind
        return f"{self.engine} {kind}" if self.engine else kind

    @property
    def optional(self) -> bool:
        """True: its failure is a note in the report, not the end of the run (OPTIONAL_KINDS)."""
        return self.kind in OPTIONAL_KINDS or self.engine in OPTIONAL_ENGINES

    def at_full_depth(self) -> Mode:
        """The full model through the same engine: what this mode's measured speedup is over."""
        return Mode("full", self.engine)


FULL, HF_GENERATE, HF_STATIC_COMPILE = Mode("full"), Mode("hf_generate"), Mode("hf_static_compile")
LLAMA_CPP, PREFILL = Mode("llama.cpp"), Mode("prefill")
LLAMA_WEIGHTS = "Q4_1"  # llama.cpp's rows' weights: the GGUF's own 4-bit blocks
# Modes whose failure is a note in the report, not the end of the run: transformers' compiled path (its
# compiler and our pinned transformers meet a lease's torch for the first time there), our CUDA graphs (the
# device tests judge them) and llama.cpp (a binary carried to another CPU may lack its instructions).
OPTIONAL_KINDS, OPTIONAL_ENGINES = ("hf_static_compile", "llama.cpp"), ("graphs", "compiled")

TimedKey = TypeVar("TimedKey", tuple[str, Mode], tuple[str, int])  # (weights, mode) or (weights, batch)

BENCH_PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle gear works.",
    "List ten fruits and their colours.",
    "Describe a busy market in the morning.",
    "Give step-by-step instructions to plant a tree.",
    "Write a letter to a friend about a trip to the mountains.",
    "Explain why leaves change colour in autumn.",
    "Write a poem about trains at night.",
]


@dataclass
class BenchConfig:
    model: str | None = None
    adapter: str | None = "auto"
    device: str = "auto"
    dtype: str = "auto"
    batch_sizes: tuple[int, ...] | None = None  # default: (1, 8) on CPU, (1, 8, 32, 64) on GPU
    speedups: tuple[float, ...] = (1.5, 2.0, 3.0, 4.0)
    decay: str = "linear"
    new_tokens: int = 64
    repeats: int = 3
    include_hf: bool = True
    quick: bool = False  # tiny run for tests: batch 1 and 2, 8 tokens, 1 repeat
    quantize: tuple[str, ...] | None = None  # weight modes side by side; default: none, int8, int4 on CPU
    threads: int | None = None  # torch threads (and llama-bench's -t); None: torch's default
    llama_cpp: bool = True  # add llama-bench's row when its binary is there (default model, CPU, batch 1)
    prompt_tokens: int = 512  # prompt processing and time to first token at batch 1 (0: not measured)
    static: bool = False  # add our static-cache step run eagerly (the graphs' step without graphs; any device)
    graphs: bool = True  # on CUDA: our CUDA graphs and transformers' static cache + torch.compile
    compiled: bool = True  # our compiled layers: in the graphs on CUDA, eagerly with ``static`` elsewhere


@dataclass
class BenchRow:
    mode: str  # "hf_generate", "full" or "skipdecode"
    batch_size: int
    target_speedup: float | None
    tokens_per_second: float
    step_latency_ms: float  # median decode-step wall time (prefill excluded)
    seconds: float  # median wall time of one generation
    layer_speedup: float = 1.0
    cost_speedup: float = 1.0
    measured_speedup: float = 1.0  # over our full decoder, same batch, same run (whole runs: prefill included)
    # the decode steps' time alone over our full decoder's (each round's pair, the median): what the cost
    # model counts; a whole run's prefill is the same in both and pulls measured_speedup towards 1
    decode_speedup: float | None = None
    efficiency: float | None = None  # decode speedup (measured speedup where no steps are known) / cost-model
    vs_hf_generate: float | None = None  # tokens/s over transformers' generate
    peak_memory_mb: float | None = None
    max_layers: int | None = None
    min_layers: int | None = None
    weights: str = "float"  # "float" (the report's dtype), "int8" or "int4" (model/lowbit/quantization.py), "Q4_1" (llama.cpp)
    vs_float_full: float | None = None  # tokens/s over the float weights' full decoder, same batch
    decode_tokens_per_second: float | None = None  # batch / median step time (prefill excluded)
    vs_llama_cpp: float | None = None  # decode tokens/s over llama.cpp's full model (same GGUF, same threads)
    bandwidth_share: float | None = None  # of the measured read bandwidth (model/evaluation/machine_limits.py)
    arithmetic_share: float | None = None  # of the q4 kernels' measured multiply-add peak
    vs_hf_static_compile: float | None = None  # tokens/s over transformers' static cache + torch.compile (CUDA)
    capture_seconds: float | None = None  # graphs: capturing this mode's graphs; hf_static_compile: its first call


@dataclass
class PrefillRow:
    """One prompt of ``prompt_tokens`` tokens at batch 1: prompt processing and time to the first token."""

    weights: str  # as BenchRow.weights; "Q4_1" for llama.cpp
    prompt_tokens: int
    tokens_per_second: float  # prompt tokens / median prefill time (llama.cpp: its pp test)
    ttft_ms: float  # median time from the prompt's token ids to the first generated token (llama.cpp: the prompt's time)
    vs_llama_cpp: float | None = None  # prompt tokens/s over llama-bench's pp on the same GGUF
    arithmetic_share: float | None = None  # of the q4 kernels' measured multiply-add peak (machine_limits.py)


@dataclass
class ScalingRow:
    """Full depth at one batch size in the batch-scaling run, where the sizes alternate run by run in every
    round (a host whose speed drifts between minutes moves every size alike; the per-batch rows above time one
    size after another, minutes apart)."""

    weights: str  # as BenchRow.weights
    batch_size: int
    decode_tokens_per_second: float  # median over the rounds of batch / the run's median decode step
    tokens_per_second: float  # median over the rounds of the whole run's (prefill included)
    vs_first_batch: float  # median over the rounds of decode tokens/s over the first size's in the same round
    rounds: int


@dataclass
class BenchReport:
    model: str
    adapter: str | None
    device: str
    dtype: str
    hardware: dict
    new_tokens: int
    repeats: int
    decay: str
    rows: list[BenchRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. why there is no llama.cpp row
    prefill: list[PrefillRow] = field(default_factory=list)
    limits: dict | None = None  # this machine's measured limits (MachineLimits), CPU runs
    batch_scaling: list[ScalingRow] = field(default_factory=list)  # full depth, the batch sizes alternated

    def to_json(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        lines = [
            f"{self.model} ({'adapter merged' if self.adapter else 'no adapter'}), {self.dtype}, "
            f"{self.hardware['summary']}; {self.new_tokens} new tokens per row, median of {self.repeats}, {self.decay} decay. "
            "Measured speedup and vs HF generate compare within the same weights; vs float full compares with "
            "the float weights' full decoder; vs llama.cpp compares decode tokens/s with llama-bench on the same GGUF, "
            f"same threads. CPU flags: {', '.join(self.hardware.get('cpu_flags', [])) or 'n/a'}; torch CPU capability "
            f"{self.hardware.get('torch_cpu_capability', 'n/a')}.",
            *[f"Note: {note}" for note in self.notes],
            "",
            "| batch | weights | mode | tokens/s | decode tok/s | step ms | layer speedup | cost-model speedup | "
            "measured speedup | decode speedup | efficiency | vs HF generate | vs float full | vs llama.cpp | vs HF static+compile | "
            "capture s | of read bandwidth | of multiply-add peak |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            mode = r.mode if r.target_speedup is None else (
                f"{r.mode.replace('skipdecode', 'skip')} {r.target_speedup:g}x ({r.max_layers}→{r.min_layers})")
            weights = self.dtype if r.weights == "float" else r.weights
            lines.append(
                f"| {r.batch_size} | {weights} | {mode} | {r.tokens_per_second:.1f} | {_fmt(r.decode_tokens_per_second, '', 1)} | "
                f"{r.step_latency_ms:.1f} | {r.layer_speedup:.2f}x | {r.cost_speedup:.2f}x | {r.measured_speedup:.2f}x | "
                f"{_fmt(r.decode_speedup, 'x')} | {_fmt(r.efficiency)} | {_fmt(r.vs_hf_generate, 'x')} | {_fmt(r.vs_float_full, 'x')} | "
                f"{_fmt(r.vs_llama_cpp, 'x')} | {_fmt(r.vs_hf_static_compile, 'x')} | {_fmt(r.capture_seconds)} | "
                f"{_fmt(r.bandwidth_share)} | {_fmt(r.arithmetic_share)} |"
            )
        if self.batch_scaling:
            first = self.batch_scaling[0].batch_size
            lines += ["", f"Batch scaling, full depth, the batch sizes alternated run by run ({self.batch_scaling[0].rounds} "
                      f"rounds; vs batch {first}: the median of each round's ratio):", "",
                      f"| weights | batch | decode tok/s | tokens/s | vs batch {first} |", "|---|---|---|---|---|"]
            lines += [f"| {self.dtype if r.weights == 'float' else r.weights} | {r.batch_size} | "
                      f"{r.decode_tokens_per_second:.1f} | {r.tokens_per_second:.1f} | {r.vs_first_batch:.2f}x |"
                      for r in self.batch_scaling]
        if self.prefill:
            lines += ["", "Prompt processing, batch 1 (llama.cpp: llama-bench -p on the same GGUF):", "",
                      "| prompt tokens | weights | prompt tokens/s | time to first token ms | vs llama.cpp | "
                      "of multiply-add peak |", "|---|---|---|---|---|---|"]
            lines += [f"| {r.prompt_tokens} | {self.dtype if r.weights == 'float' else r.weights} | "
                      f"{r.tokens_per_second:.1f} | {r.ttft_ms:.1f} | {_fmt(r.vs_llama_cpp, 'x')} | "
                      f"{_fmt(r.arithmetic_share)} |" for r in self.prefill]
        return "\n".join(lines)


def _fmt(value: float | None, suffix: str = "", digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


# --- llama.cpp (scripts/build_llama_bench.sh) -------------------------------------------------


def llama_bench_binary() -> Path | None:
    """llama-bench as scripts/build_llama_bench.sh caches it, or None when it has not been built."""
    path = cache_root() / "llama.cpp" / "llama-bench"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def parse_llama_bench(output: str, new_tokens: int, prompt_tokens: int = 0) -> float:
    """tokens/s of llama-bench's generation test ("tg", n_prompt 0), or with ``prompt_tokens`` its prompt
    processing test ("pp", n_gen 0), from its ``-o jsonl`` output."""
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if int(record.get("n_prompt", -1)) == prompt_tokens and int(record.get("n_gen", -1)) == new_tokens:
            return float(record["avg_ts"])
    test = f"pp{prompt_tokens}" if prompt_tokens else f"tg{new_tokens}"
    raise RuntimeError(f"llama-bench printed no {test} result:\n{output[-2000:]}")


def time_llama_cpp(binary: Path, gguf: Path, threads: int, new_tokens: int, prompt_tokens: int = 0) -> Timing:
    """One llama-bench run (its own warm-up, then one repetition), batch 1: pure decoding of
    ``new_tokens`` (its tg test), or with ``prompt_tokens`` its prompt processing test (pp, no decoding)."""
    generated = 0 if prompt_tokens else new_tokens
    command = [str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(prompt_tokens), "-n", str(generated),
               "-r", "1", "-o", "jsonl"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr[-2000:]}")
    if prompt_tokens:
        tokens_per_second = parse_llama_bench(done.stdout, 0, prompt_tokens)
        return Timing(prompt_tokens / tokens_per_second, 0.0)
    tokens_per_second = parse_llama_bench(done.stdout, new_tokens)
    return Timing(new_tokens / tokens_per_second, 1.0 / tokens_per_second)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process high-water mark (KiB on Linux)


@dataclass
class Timing:
    seconds: float
    step_seconds: float
    # the decode steps' wall time summed (prefill excluded; None where a run exposes no steps): what the
    # cost model's speedup counts, a schedule's mean step cost over the full model's
    decode_seconds: float | None = None


def time_ours(decoder: SkipDecoder, ids, mask, schedule: ScheduleConfig, new_tokens: int) -> Timing:
    device = decoder.device
    _sync(device)
    start = time.perf_counter()
    result = decoder.generate(ids, mask, schedule, max_new_tokens=new_tokens)
    _sync(device)
    seconds = time.perf_counter() - start
    steps = result.step_seconds
    return Timing(seconds, statistics.median(steps) if steps else 0.0, sum(steps) if steps else None)


def alternated_batch_timings(decoders: dict[str, SkipDecoder], batches: dict[int, tuple[torch.Tensor, torch.Tensor]],
                             new_tokens: int, rounds: int, kernels: dict[str, str | None] | None = None
                             ) -> dict[tuple[str, int], list[Timing]]:
    """Full-depth runs of every decoder at every batch size, alternated as the bench alternates its modes
    (_time_modes: each warmed up once, then every round runs each once in a fresh random order), so round r's
    runs of all sizes are neighbours in time. ``kernels``: an int4 decoder's forced kernel by name.
    (name, batch) -> one Timing a round."""
    kernels = kernels or {}
    modes = {(name, size): _in_kernel(kernels.get(name), lambda d=decoder, b=batch: time_ours(
                 d, *b, full_schedule(d.num_layers), new_tokens))
             for name, decoder in decoders.items() for size, batch in batches.items()}
    device = next(iter(decoders.values())).device
    timings, _ = _time_modes(modes, rounds, max(batches), device)
    return timings


def scaling_rows(timings: dict[tuple[str, int], list[Timing]], new_tokens: int) -> list[ScalingRow]:
    """Each (name, batch)'s ScalingRow; ratios pair each round's run with the first batch size's of that round."""
    def decode_rate(size: int, timing: Timing) -> float:  # a run of one new token has no decode step
        return size / timing.step_seconds if timing.step_seconds > 0 else size * new_tokens / timing.seconds

    rows = []
    for (name, size), runs in timings.items():
        first_size = next(s for (n, s) in timings if n == name)
        firsts = timings[name, first_size]
        rows.append(ScalingRow(
            weights=name, batch_size=size,
            decode_tokens_per_second=round(statistics.median(decode_rate(size, t) for t in runs), 3),
            tokens_per_second=round(statistics.median(size * new_tokens / t.seconds for t in runs), 3),
            vs_first_batch=round(statistics.median(decode_rate(size, t) / decode_rate(first_size, f)
                                                   for t, f in zip(runs, firsts)), 4),
            rounds=len(runs)))
    return rows


def raw_bench_batches(tokenizer: Any, sizes: Iterable[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """size -> (ids, mask) of ``size`` of the bench's prompts in turn, as raw text (no chat template; the
    alternated scripts' prompts, as round five's files were measured), left as the tokenizer pads."""
    batches = {}
    for size in sizes:
        encoded = tokenizer([BENCH_PROMPTS[i % len(BENCH_PROMPTS)] for i in range(size)], return_tensors="pt",
                            padding=True)
        batches[size] = (encoded["input_ids"], encoded["attention_mask"])
    return batches


def paired_ratio(baseline: Iterable[float], candidate: Iterable[float]) -> dict[str, Any]:
    """The alternated A/B scripts' comparison of two arms' per-round seconds: each round's baseline over its
    candidate (above 1: the candidate is faster), their median and their range."""
    ratios = [a / b for a, b in zip(baseline, candidate)]
    return {"paired_speedup": round(statistics.median(ratios), 3),
            "paired_range": [round(min(ratios), 3), round(max(ratios), 3)]}


def emit_report(report: dict[str, Any], output: Path | None) -> None:
    """An alternated script's report as JSON on stdout, and in ``output`` where one is given."""
    text = json.dumps(report, indent=2)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    print(text)


def bench_batch(generator: TextGenerator, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of ``size`` of the bench's prompts, in turn, on ``device``."""
    ids, mask = generator.text.encode([BENCH_PROMPTS[i % len(BENCH_PROMPTS)] for i in range(size)])
    return ids.to(device), mask.to(device)


def _batch_scaling(config: BenchConfig, variants: dict[str, WeightVariant], generator: TextGenerator,
                   batch_sizes: tuple[int, ...], device: torch.device) -> list[ScalingRow]:
    """Every weight variant's full depth at every batch size, the sizes alternated (alternated_batch_timings)."""
    batches = {size: bench_batch(generator, size, device) for size in batch_sizes}
    decoders = {label: variant.full_decoder for label, variant in variants.items()}
    kernels = {label: variant.kernel for label, variant in variants.items()}
    return scaling_rows(alternated_batch_timings(decoders, batches, config.new_tokens, config.repeats, kernels),
                        config.new_tokens)


def time_hf_generate(model, ids, mask, new_tokens: int, pad_id: int, static_compile: bool = False) -> Timing:
    """transformers' generate, greedy, fixed length; ``static_compile``: with its static cache and its forward
    compiled by torch.compile(mode="reduce-overhead") (CUDA graphs; transformers compiles it on CUDA)."""
    from transformers import CompileConfig, GenerationConfig  # noqa: PLC0415

    extra = dict(cache_implementation="static", compile_config=CompileConfig(mode="reduce-overhead")) \
        if static_compile else {}
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id, eos_token_id=None,
                              **extra)
    device = ids.device
    _sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    _sync(device)
    seconds = time.perf_counter() - start
    if out.shape[1] - ids.shape[1] != new_tokens:
        raise RuntimeError("transformers' generate stopped early; the comparison needs a fixed length")
    return Timing(seconds, seconds / new_tokens)  # generate exposes no per-step times: the mean


# --- the run ---------------------------------------------------------------------------------


def run_bench(config: BenchConfig, progress: Callable[[str], None] = print,
              on_batch: Callable[[BenchReport], None] | None = None) -> BenchReport:
    """Every mode side by side, batch by batch; ``on_batch`` sees the report after each batch size's rows (a run
    stopped later by a time limit keeps what it measured)."""
    device = resolve_device(config.device)
    if config.threads:
        torch.set_num_threads(config.threads)
    variants = _load_variants(config, device)
    first = next(iter(variants.values()))
    loaded, generator = first.loaded, first.generator
    if config.quick:
        config.batch_sizes, config.new_tokens, config.repeats = (1, 2), 8, 1
        config.prompt_tokens = min(config.prompt_tokens, 16)
    batch_sizes = config.batch_sizes or ((1, 8, 32, 64) if device.type == "cuda" else (1, 4, 8, 16))
    # The shape the product runs (the policy's placement and measured floor), over the bench's tokens.
    schedules = {s: generator.schedules.schedule_for(ScheduleRequest(target_speedup=s, decay=config.decay), config.new_tokens)
                 for s in config.speedups}
    report = BenchReport(model=loaded.name, adapter=loaded.adapter_path, device=str(device),
                         dtype=str(loaded.dtype).replace("torch.", ""), hardware=hardware_info(device),
                         new_tokens=config.new_tokens, repeats=config.repeats, decay=config.decay)
    llama = _llama_cpp_mode(config, loaded, device, report.notes)
    batched = _llama_batched_mode(config, device, report.notes) if llama is not None else None
    limits = _machine_limits(config, device, report)
    if device.type != "cuda" and config.graphs:
        report.notes.append(NO_CUDA_NOTE.format(device=device))
    if device.type == "cpu" and any(v.weights != "float" for v in variants.values()):
        report.notes.append(_decode_step_note())

    for batch in batch_sizes:
        ids, mask = bench_batch(generator, batch, device)
        # Every mode of every weight variant, interleaved in one run: ratios are side by side.
        modes = _bench_modes(config, variants, schedules, generator.num_layers, ids, mask)
        captures: dict[tuple[str, Mode], float] = {}
        modes.update(engine_modes(config, variants, schedules, generator.num_layers, ids, mask, captures))
        if llama is not None and batch == 1:
            modes[LLAMA_WEIGHTS, LLAMA_CPP] = lambda: llama(0)
        elif batched is not None:
            modes[LLAMA_WEIGHTS, LLAMA_CPP] = lambda b=batch: batched(b)
        timings, peaks = _time_modes(modes, config.repeats, batch, device, report.notes)
        report.rows.extend(_batch_rows(config, variants, schedules, generator, batch, timings, peaks, report))
        add_captures(report.rows, batch, captures)
        progress(f"batch {batch}: " + ", ".join(
            f"{r.weights} {r.mode if r.target_speedup is None else f'{r.mode} {r.target_speedup:g}x'} "
            f"{r.tokens_per_second:.1f} tok/s" for r in report.rows if r.batch_size == batch))
        if on_batch is not None:
            on_batch(report)
    if len(batch_sizes) > 1:
        report.batch_scaling = _batch_scaling(config, variants, generator, batch_sizes, device)
        progress("batch scaling, alternated: " + ", ".join(
            f"{r.weights} batch {r.batch_size} {r.vs_first_batch:.2f}x" for r in report.batch_scaling))
    if config.prompt_tokens:
        report.prefill = [row for tokens in _prompt_lengths(config)
                          for row in _prefill_rows(config, variants, llama, device, tokens)]
        progress("prompt processing: " + ", ".join(f"{r.weights} {r.prompt_tokens} tokens {r.tokens_per_second:.1f} "
                                                   f"tok/s, first token {r.ttft_ms:.0f} ms" for r in report.prefill))
    if limits is not None:
        add_shares(report, limits, generator.cost.step_cost(generator.num_layers))
    return report


def _prompt_lengths(config: BenchConfig) -> tuple[int, ...]:
    """The prompt lengths measured: --prompt-tokens, and 128 beside a longer one (short prompts are a chat's)."""
    if config.quick or config.prompt_tokens <= 128:
        return (config.prompt_tokens,)
    return (128, config.prompt_tokens)


def _machine_limits(config: BenchConfig, device: torch.device, report: BenchReport) -> MachineLimits | None:
    """This machine's read bandwidth and multiply-add peak, measured now (CPU; not in the quick run)."""
    if device.type != "cpu" or config.quick:
        return None
    limits = measure_limits(config.threads or torch.get_num_threads())
    report.limits = asdict(limits)
    report.notes.append(limits.describe())
    return limits


def add_shares(report: BenchReport, limits: MachineLimits, full_step_weights: float) -> None:
    """Each row's share of the machine's limits: a row's weights a token are the full step's over its
    cost-model speedup (the layers it runs, the head every step); llama.cpp's rows are counted with the
    same weights (its Q4_1 layers read what our int4 ones do)."""
    for row in report.rows:
        if row.decode_tokens_per_second:
            weights = full_step_weights / row.cost_speedup
            row.bandwidth_share = round(bandwidth_share(limits, row.decode_tokens_per_second / row.batch_size,
                                                        weights), 4)
            share = arithmetic_share(limits, row.decode_tokens_per_second, weights)
            row.arithmetic_share = None if share is None else round(share, 4)
    for prompt in report.prefill:
        share = arithmetic_share(limits, prompt.tokens_per_second, full_step_weights)
        prompt.arithmetic_share = None if share is None else round(share, 4)


# A weight mode's @kernel: torch's int4 kernel, or the q4 kernels on one instruction set: avx2; avx512-vnni
# without AMX; amx: AVX-512 with AMX tiles from DEFAULT_AMX_ROWS rows (SKIPDECODE_Q4_AMX_ROWS's default).
INT4_KERNELS = ("torch", "avx2", "avx512-vnni", "amx")
KERNEL_SETTINGS = {"avx2": ("avx2", 0), "avx512-vnni": ("avx512-vnni", 0), "amx": ("avx512-vnni", DEFAULT_AMX_ROWS)}  # (ISA, AMX rows)


def split_weight_mode(mode: str) -> tuple[str, str | None]:
    """"int4@avx2" -> ("int4", "avx2"); a plain mode has no kernel of its own (the machine's default)."""
    quantize, _, kernel = mode.partition("@")
    if kernel and (quantize != "int4" or kernel not in INT4_KERNELS):
        raise ValueError(f"a weight mode's kernel is int4@{'|'.join(INT4_KERNELS)}; got {mode!r}")
    return quantize, kernel or None


@contextlib.contextmanager
def int4_kernel(kernel: str | None) -> Iterator[None]:
    """Run (and load) with the int4 kernel a weight mode names: torch's, or the q4 kernels on one
    instruction set; None changes nothing. The lean layers read the choice when they are built (at
    load), the two-stage head and the q4 kernels at each call, so a variant's runs happen inside it."""
    if kernel is None:
        yield
        return
    module = native_module()
    before = (module.q4_isa(), module.q4_amx_rows()) if module is not None else ("", 0)
    # The process's settings for the while (the environment is read once: writing it would change nothing)
    with changed_settings(int4_kernel="torch" if kernel == "torch" else "native"):
        try:
            if kernel != "torch":
                isa, amx_rows = KERNEL_SETTINGS[kernel]
                if module is None or not module.set_q4_isa(isa) or (amx_rows and not module.q4_amx()):
                    raise ValueError(f"int4@{kernel}: the q4 kernels cannot run on {kernel} here")
                module.set_q4_amx_rows(amx_rows)
            yield
        finally:
            if module is not None and before[0]:
                module.set_q4_isa(before[0])
                module.set_q4_amx_rows(before[1])


@dataclass(frozen=True)
class WeightVariant:
    """One weight mode benched: the model loaded with it, the generator over it, its two decoders (EOS
    ignored: fixed-length runs) and the int4 kernel its runs happen inside (None: the machine's default)."""

    loaded: LoadedModel
    generator: TextGenerator
    full_decoder: SkipDecoder
    skip_decoder: SkipDecoder
    weights: str  # LoadedModel.weights: "float", "int8" or "int4"
    kernel: str | None = None

    @property
    def label(self) -> str:
        """The weights as the report's rows name them: the weight mode, "int4@avx2" naming its kernel."""
        return self.weights + (f"@{self.kernel}" if self.kernel else "")


def _load_variants(config: BenchConfig, device: torch.device) -> dict[str, WeightVariant]:
    """label -> WeightVariant for every weight mode benched."""
    weight_modes = config.quantize or (("none", "int8", "int4") if device.type == "cpu" else ("none",))
    variants = {}
    for mode in weight_modes:
        quantize, kernel = split_weight_mode(mode)
        with int4_kernel(kernel):
            loaded = load_model(config.model, device=config.device, dtype=config.dtype, adapter=config.adapter,
                                quantize=quantize)
        full_decoder, skip_decoder = loaded.full_decoder(), loaded.skip_decoder()
        full_decoder.eos_token_ids = skip_decoder.eos_token_ids = ()  # fixed-length runs: EOS ignored
        variant = WeightVariant(loaded, TextGenerator(loaded), full_decoder, skip_decoder, loaded.weights, kernel)
        variants[variant.label] = variant
    return variants


def _in_kernel(kernel: str | None, run: Callable[[], Timing]) -> Callable[[], Timing]:
    def timed() -> Timing:
        with int4_kernel(kernel):
            return run()
    return timed


def _bench_modes(config: BenchConfig, variants: dict[str, WeightVariant], schedules: dict[float, SolvedSchedule],
                 num_layers: int, ids: torch.Tensor, mask: torch.Tensor
                 ) -> dict[tuple[str, Mode], Callable[[], Timing]]:
    """(weights, mode) -> one timed run on this batch's prompts, for every mode of every weight variant."""
    modes: dict[tuple[str, Mode], Callable[[], Timing]] = {}
    for label, variant in variants.items():
        kernel = variant.kernel
        if config.include_hf:
            modes[label, HF_GENERATE] = _in_kernel(kernel, lambda m=variant.loaded.model, pad=variant.loaded.pad_token_id:
                                                   time_hf_generate(m, ids, mask, config.new_tokens, pad))
        modes[label, FULL] = _in_kernel(kernel, lambda d=variant.full_decoder: time_ours(
            d, ids, mask, full_schedule(num_layers), config.new_tokens))
        for s, solved in schedules.items():
            modes[label, Mode("skip", speedup=s)] = _in_kernel(kernel, lambda d=variant.skip_decoder, solved=solved:
                                                               time_ours(d, ids, mask, solved.config, config.new_tokens))
    return modes


# our decoder over the static KV cache: eagerly, by CUDA graph replay, and with compiled layers (in the graphs on CUDA)
ENGINES = ("static", "graphs", "compiled")
NO_CUDA_NOTE = ("no rows of our CUDA graphs or of transformers' static cache + torch.compile: they need a CUDA "
                "device (this run is on {device})")


def engine_modes(config: BenchConfig, variants: dict[str, WeightVariant], schedules: dict[float, SolvedSchedule],
                 num_layers: int, ids: torch.Tensor, mask: torch.Tensor, captures: dict[tuple[str, Mode], float]
                 ) -> dict[tuple[str, Mode], Callable[[], Timing]]:
    """The static-cache modes, (weights, "ENGINE:full" | "ENGINE:skip@S") -> one timed run: "static" (eager,
    with ``config.static``), on CUDA "graphs" (one graph runner per mode and batch, so each mode's capture
    is its own) and transformers' static cache + torch.compile, and "compiled" (the compiled layers: in graphs
    on CUDA, eagerly with ``config.static`` elsewhere; one CompiledStep for every mode, as a server has). ``captures`` receives each graph mode's capture
    seconds, and the compiled mode's first call, as they happen (the warm-up pays them)."""
    modes: dict[tuple[str, Mode], Callable[[], Timing]] = {}
    cuda = ids.device.type == "cuda" and config.graphs
    compiled = CompiledStep()
    for label, variant in variants.items():
        # (kind, target speedup, decoder, schedule): full depth, then each skip schedule
        runs: list[tuple[str, float | None, SkipDecoder, ScheduleConfig]] = [
            ("full", None, variant.full_decoder, full_schedule(num_layers))]
        runs += [("skip", s, variant.skip_decoder, solved.config) for s, solved in schedules.items()]
        for engine in ENGINES:
            if not _engine_runs(engine, config, cuda):
                continue
            for kind, speedup, decoder, schedule in runs:
                runner = _engine_runner(engine, cuda, compiled)
                key = (label, Mode(kind, engine, speedup))
                modes[key] = _in_kernel(variant.kernel, _static_run(
                    static_decoder(decoder, runner), runner, ids, mask, schedule, config.new_tokens, captures, key))
        if cuda and config.include_hf:
            key = (label, HF_STATIC_COMPILE)
            modes[key] = _first_call_seconds(lambda m=variant.loaded.model, pad=variant.loaded.pad_token_id:
                                             time_hf_generate(m, ids, mask, config.new_tokens, pad, static_compile=True),
                                             captures, key)
    return modes


def _engine_runs(engine: str, config: BenchConfig, cuda: bool) -> bool:
    if engine == "compiled":
        return config.compiled and (cuda or config.static)
    return config.static if engine == "static" else cuda


def _engine_runner(engine: str, cuda: bool, compiled: CompiledStep) -> CudaGraphStep | EagerStep | None:
    """The step runner of one mode: the graphs' own per mode (its captures its own), the compiled layers'
    shared; None: the static step run eagerly."""
    if engine == "graphs":
        return CudaGraphStep()
    if engine == "compiled":
        return CudaGraphStep(step=compiled) if cuda else EagerStep(compiled)
    return None


def _static_run(decoder: StaticSkipDecoder, runner: CudaGraphStep | EagerStep | None, ids: torch.Tensor, mask: torch.Tensor,
                schedule: ScheduleConfig, new_tokens: int, captures: dict[tuple[str, Mode], float],
                key: tuple[str, Mode]) -> Callable[[], Timing]:
    def timed() -> Timing:
        timing = time_ours(decoder, ids, mask, schedule, new_tokens)
        if isinstance(runner, CudaGraphStep):
            captures[key] = runner.capture_seconds  # every graph this mode needs, captured in its first run
        return timing
    return timed


def _first_call_seconds(run: Callable[[], Timing], captures: dict[tuple[str, Mode], float],
                        key: tuple[str, Mode]) -> Callable[[], Timing]:
    def timed() -> Timing:
        timing = run()
        captures.setdefault(key, timing.seconds)  # the first call compiles (and captures) the forward
        return timing
    return timed


def time_prefill(decoder: SkipDecoder, ids: torch.Tensor, mask: torch.Tensor) -> Timing:
    """A prompt through every layer, then its first token (the head, argmax): the time to first token."""
    device = decoder.device
    _sync(device)
    start = time.perf_counter()
    _, logits = decoder.prefill(ids, mask, list(range(decoder.num_layers)), ids.shape[1] + 1)
    logits.argmax(-1).tolist()
    _sync(device)
    return Timing(time.perf_counter() - start, 0.0)


def bench_prompt(generator: TextGenerator, tokens: int) -> torch.Tensor:
    """(1, tokens) ids: the bench prompts' text, tokenized and repeated to exactly ``tokens``."""
    pieces = [generator.loaded.tokenizer(p + "\n")["input_ids"] for p in BENCH_PROMPTS]
    ids: list[int] = []
    while len(ids) < tokens:
        ids += pieces[len(ids) % len(pieces)]
    return torch.tensor([ids[:tokens]])


def _prefill_rows(config: BenchConfig, variants: dict[str, WeightVariant], llama: Callable[[int], Timing] | None,
                  device: torch.device, prompt_tokens: int) -> list[PrefillRow]:
    """Prompt processing at batch 1 for every weight variant (and llama-bench's pp), interleaved in rounds."""
    generator = next(iter(variants.values())).generator
    ids = bench_prompt(generator, prompt_tokens).to(device)
    mask = torch.ones_like(ids)
    modes: dict[tuple[str, Mode], Callable[[], Timing]] = {
        (label, PREFILL): _in_kernel(v.kernel, lambda d=v.full_decoder: time_prefill(d, ids, mask))
        for label, v in variants.items()}
    if llama is not None:
        modes[LLAMA_WEIGHTS, PREFILL] = lambda: llama(prompt_tokens)
    timings, _ = _time_modes(modes, config.repeats, 1, device)
    seconds = {weights: statistics.median(t.seconds for t in runs) for (weights, _), runs in timings.items()}
    llama_tps = prompt_tokens / seconds[LLAMA_WEIGHTS] if LLAMA_WEIGHTS in seconds else None
    return [PrefillRow(weights=w, prompt_tokens=prompt_tokens, tokens_per_second=round(prompt_tokens / t, 2),
                       ttft_ms=round(1000 * t, 2),
                       vs_llama_cpp=round(prompt_tokens / t / llama_tps, 4) if llama_tps else None)
            for w, t in seconds.items()]


def _time_modes(modes: dict[TimedKey, Callable[[], Timing]], repeats: int, batch: int, device: torch.device,
                notes: list[str] | None = None) -> tuple[dict[TimedKey, list[Timing]], dict[TimedKey, float]]:
    """Every mode warmed up once, then ``repeats`` rounds in a fresh random order: (timings, peak MB) per mode.
    An optional mode (Mode.optional) whose warm-up raises is left out, with a line in ``notes``."""
    modes = dict(modes)
    for key, run in list(modes.items()):  # warm-up: first-call allocations and kernel selection
        try:
            run()
        except Exception as error:
            mode = key[1]
            if notes is None or not (isinstance(mode, Mode) and mode.optional):
                raise
            del modes[key]
            notes.append(f"batch {batch}: {key[0]} {mode.name} left out, its first call raised "
                         f"{type(error).__name__}: {str(error)[:300]}")
    timings: dict[TimedKey, list[Timing]] = {key: [] for key in modes}
    peaks: dict[TimedKey, float] = {}
    keys = list(modes)
    order_rng = random.Random(batch)
    for _ in range(repeats):
        # A fresh random order every round: no mode always runs right after another
        # (on CPU the previous run's allocations measurably change the next one's speed).
        order_rng.shuffle(keys)
        for key in keys:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            timings[key].append(modes[key]())
            peaks[key] = max(peaks.get(key, 0.0), _peak_memory_mb(device))
    return timings, peaks


def _batch_rows(config: BenchConfig, variants: dict[str, WeightVariant], schedules: dict[float, SolvedSchedule],
                generator: TextGenerator, batch: int, timings: dict[tuple[str, Mode], list[Timing]],
                peaks: dict[tuple[str, Mode], float], report: BenchReport) -> list[BenchRow]:
    """One batch size's rows for every weight variant, with their ratios to float full depth and to llama.cpp
    (llama.cpp's own row goes into ``report`` first)."""
    float_full = batch * config.new_tokens / statistics.median(t.seconds for t in timings["float", FULL]) \
        if ("float", FULL) in timings else None
    llama_tps = _llama_row(report, timings, batch, config.new_tokens)
    all_rows = []
    for label in variants:
        rows = _rows(batch, {mode: t for (w, mode), t in timings.items() if w == label},
                     {mode: p for (w, mode), p in peaks.items() if w == label}, schedules, generator.num_layers,
                     generator.cost, config.new_tokens)
        for row in rows:
            row.weights = label
            row.vs_float_full = round(row.tokens_per_second / float_full, 4) if float_full else None
            if llama_tps and row.decode_tokens_per_second:
                row.vs_llama_cpp = round(row.decode_tokens_per_second / llama_tps, 4)
        all_rows.extend(rows)
    return all_rows


def _decode_step_note() -> str:
    """Which decode step, int4 kernel and head this run's low-bit rows used (model/lowbit/native_step.py);
    a weight mode that names its kernel (int4@torch, int4@avx2) ran that one instead."""
    if native_module() is None:
        return "low-bit decode steps: the Python step (no native step on this machine); int4 kernel: torch's"
    if not q4_kernel_selected():
        return "low-bit decode steps: the native C++ step (torch's ATen ops); int4 kernel: torch's _weight_int4pack_mm_for_cpu"
    module = native_module()
    avx512 = q4_isa() == "avx512-vnni"
    kernel = "the lane kernel (16 blocks a vector)" if avx512 else "the lane kernel (8 blocks a vector)"
    if avx512 and module.q4_amx() and module.q4_amx_rows():
        kernel += f", AMX tiles from {module.q4_amx_rows()} rows on a load-time layout (the head's scan too)"
    return (f"low-bit decode steps: the native C++ step, int4 layers fused (one call a run of layers); int4 kernel: "
            f"q4 on {q4_isa()}, {kernel}, tiles of rows x weight rows, prompts too (16-bit activations; int4@KERNEL "
            "modes name their own); LM head: 4-bit scan (8-bit activations) + top 32 rescored, native")


def _llama_cpp_mode(config: BenchConfig, loaded: LoadedModel, device: torch.device, notes: list[str]
                    ) -> Callable[[int], Timing] | None:
    """llama-bench on the default model's GGUF (a function of the prompt tokens: 0 times its decoding, N its
    pp test), or None with a note saying why there is no row."""
    if not config.llama_cpp or config.quick:
        return None
    if device.type != "cpu" or loaded.name != DEFAULT_MODEL:
        notes.append("no llama.cpp row: it runs the default model's GGUF on CPU only")
        return None
    binary = llama_bench_binary()
    if binary is None:
        notes.append("no llama.cpp row: llama-bench is not built (bash scripts/build_llama_bench.sh builds it)")
        return None
    gguf, threads = locate_default_gguf(), torch.get_num_threads()
    notes.append(f"llama.cpp: {binary} ({_llama_version(binary)}), {gguf.name}, {threads} threads, batch 1")
    return lambda prompt_tokens: time_llama_cpp(binary, gguf, threads, config.new_tokens, prompt_tokens)


def _llama_batched_mode(config: BenchConfig, device: torch.device, notes: list[str]
                        ) -> Callable[[int], Timing] | None:
    """llama-batched-bench on the default model's GGUF (a function of the batch: its decode tokens/s at
    that many sequences of 32 prompt tokens and --new-tokens), or None with a note."""
    binary = llama_batched_bench_binary()
    if binary is None:
        notes.append("no llama.cpp row at batch > 1: llama-batched-bench is not built "
                     "(bash scripts/build_llama_bench.sh builds it)")
        return None
    gguf, threads = locate_default_gguf(), torch.get_num_threads()
    notes.append(f"llama.cpp at batch > 1: {binary.name} -npp 32 -ntg {config.new_tokens} -npl BATCH, {threads} threads")

    def timed(batch: int) -> Timing:
        tokens_per_second = llama_batched_decode(binary, gguf, threads, batch, 32, config.new_tokens)
        return Timing(config.new_tokens / tokens_per_second, batch / tokens_per_second)
    return timed


def _llama_version(binary: Path) -> str:
    version = binary.parent / "VERSION"
    return version.read_text().strip() if version.is_file() else "unknown version"


def _llama_row(report: BenchReport, timings: dict[tuple[str, Mode], list[Timing]], batch: int,
               new_tokens: int) -> float | None:
    """Append llama.cpp's row (when it ran); return its tokens/s."""
    runs = timings.get((LLAMA_WEIGHTS, LLAMA_CPP))
    if not runs:
        return None
    seconds = statistics.median(t.seconds for t in runs)
    tps = new_tokens / seconds
    report.rows.append(BenchRow(mode=LLAMA_CPP.row_mode, batch_size=batch, target_speedup=None,
                                tokens_per_second=round(tps, 3),
                                step_latency_ms=round(1000 * statistics.median(t.step_seconds for t in runs), 3),
                                seconds=round(seconds, 4), weights=LLAMA_WEIGHTS, decode_tokens_per_second=round(tps, 3),
                                vs_llama_cpp=1.0, efficiency=None))
    return tps


def _rows(batch: int, timings: dict[Mode, list[Timing]], peaks: dict[Mode, float],
          schedules: dict[float, SolvedSchedule], num_layers: int, cost: CostModel, new_tokens: int) -> list[BenchRow]:
    """One row per timed mode of one weight variant. Measured speedup is over the full model through the SAME
    engine (our graphs' skip rows over our graphs' full row), so each engine's own gain is read in its row."""
    def median(mode: Mode, attr: str) -> float:
        return statistics.median(getattr(t, attr) for t in timings[mode])

    tokens = batch * new_tokens
    hf_tps = tokens / median(HF_GENERATE, "seconds") if HF_GENERATE in timings else None
    compiled_tps = tokens / median(HF_STATIC_COMPILE, "seconds") if HF_STATIC_COMPILE in timings else None
    rows = []
    for mode in timings:
        full = mode.at_full_depth() if mode.at_full_depth() in timings else FULL
        tps = tokens / median(mode, "seconds")
        row = BenchRow(mode=mode.row_mode, batch_size=batch, target_speedup=None,
                       tokens_per_second=round(tps, 3), step_latency_ms=round(1000 * median(mode, "step_seconds"), 3),
                       seconds=round(median(mode, "seconds"), 4),
                       measured_speedup=round(tps * median(full, "seconds") / tokens, 4),
                       decode_speedup=_paired_decode_speedup(timings[full], timings[mode]),
                       decode_tokens_per_second=round(batch / median(mode, "step_seconds"), 3)
                       if median(mode, "step_seconds") > 0 else None,
                       vs_hf_generate=round(tps / hf_tps, 4) if hf_tps else None,
                       vs_hf_static_compile=round(tps / compiled_tps, 4) if compiled_tps else None,
                       peak_memory_mb=round(peaks.get(mode, 0.0), 1))
        if mode.speedup is not None:  # a skip mode: its schedule's planned speedups
            solved = schedules[mode.speedup]
            row.target_speedup = solved.target_speedup
            summary = speedup_summary(solved, solved.budgets, cost)  # EOS ignored: every planned step ran
            row.layer_speedup = round(summary.achieved_layer_speedup, 4)
            row.cost_speedup = round(summary.achieved_cost_model_speedup, 4)
            row.max_layers, row.min_layers = solved.config.max_layers, solved.config.min_layers
        row.efficiency = round((row.decode_speedup or row.measured_speedup) / row.cost_speedup, 4)
        rows.append(row)
    return rows


def _paired_decode_speedup(full: list[Timing], mode: list[Timing]) -> float | None:
    """The median over rounds of the full model's decode time over the mode's (round r's runs are
    neighbours in time: _time_modes), or None where a run has no decode steps."""
    pairs = [(f.decode_seconds, m.decode_seconds) for f, m in zip(full, mode)]
    if not pairs or any(not f or not m for f, m in pairs):
        return None
    return round(statistics.median(f / m for f, m in pairs), 4)


def add_captures(rows: list[BenchRow], batch: int, captures: dict[tuple[str, Mode], float]) -> None:
    """Each of this batch's rows gets the capture (or compile) seconds its mode paid, where it paid any."""
    by_mode = {(weights, mode.row_mode, mode.speedup): seconds for (weights, mode), seconds in captures.items()}
    for row in rows:
        if row.batch_size == batch:
            seconds = by_mode.get((row.weights, row.mode, row.target_speedup))
            row.capture_seconds = round(seconds, 3) if seconds is not None else None


def write_bench(report: BenchReport, folder: str | Path) -> list[Path]:
    """bench.json (raw), bench.md (table) and speedup.json (the Plotly figure) under ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "bench.json", folder / "bench.md", folder / "speedup.json"]
    paths[0].write_text(json.dumps(report.to_json(), indent=2))
    paths[1].write_text(report.to_markdown() + "\n")
    paths[2].write_text(speed_figure(report.to_json()).to_json())
    return paths
