"""How much would fusing a layer's kernels buy our CUDA graphs? One probe, side by side in one process: our
static decode step replayed by CUDA graphs as it is, and the same step compiled by torch.compile (inductor
fuses the norms, rotary embedding and elementwise ops) and then captured in the same graphs. Full depth,
greedy, a fixed number of tokens; decode step ms (median), tokens/s, the compile seconds, and whether the
two ran the same tokens. The weights are random (the default model's shape: a step's time does not depend
on their values), so it needs no model files: on a lease it runs before or without the GGUF.

    python lab/bench/gpu_fusion_probe.py --config CONFIG.json --batch-sizes 1,8 --output OUT/fusion.json
    python lab/bench/gpu_fusion_probe.py --config CONFIG.json --device cpu --layers 2 --tokens 4   (a dry run)

On the CPU there are no graphs: the two rows are the eager static step and its compiled form."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers as tf

from model.skipdecode.cuda_graphs import CudaGraphStep
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.schedule import full_schedule
from model.skipdecode.static_decoder import EagerStep, static_decoder, static_step


def random_model(config_path: Path, layers: int | None, device: str, dtype: torch.dtype) -> torch.nn.Module:
    config = tf.AutoConfig.for_model(**{k: v for k, v in json.loads(config_path.read_text()).items()
                                        if not k.startswith("_") and k not in ("architectures", "transformers_version")})
    if layers:
        config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype).eval()


def timed_run(decoder, ids, mask, tokens: int, device: torch.device) -> tuple[float, float, list[list[int]]]:
    """(seconds, median decode step seconds, the generated ids per row) of one greedy full-depth run."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = decoder.generate(ids, mask, full_schedule(decoder.num_layers), max_new_tokens=tokens)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return seconds, statistics.median(result.step_seconds), [list(map(int, row)) for row in result.tokens]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="a causal LM's config.json (the default model's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the config (dry runs)")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mode", default="default", help="torch.compile mode (default, max-autotune-no-cudagraphs)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    model = random_model(args.config, args.layers, args.device, getattr(torch, args.dtype))
    compiled = torch.compile(static_step, mode=None if args.mode == "default" else args.mode, dynamic=False)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "dtype": args.dtype, "layers": model.config.num_hidden_layers,
                    "tokens": args.tokens, "repeats": args.repeats, "mode": args.mode, "rows": []}
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        ids = torch.randint(3, model.config.vocab_size, (batch, 32), device=device)
        mask = torch.ones_like(ids)
        runs = {}
        for name, step in (("graphs", static_step), ("compiled graphs", compiled)):
            runner = CudaGraphStep(step=step) if device.type == "cuda" else EagerStep(step=step)
            runs[name] = static_decoder(SkipDecoder(model), runner), runner
        first: dict[str, float] = {}
        for name, (decoder, _) in runs.items():  # the first run captures (and compiles)
            start = time.perf_counter()
            timed_run(decoder, ids, mask, args.tokens, device)
            first[name] = time.perf_counter() - start
            print(f"batch {batch}: {name} first run {first[name]:.1f} s", file=sys.stderr)
        timings: dict[str, list] = {name: [] for name in runs}
        for _ in range(args.repeats):  # alternated: the host's drift falls on both
            for name, (decoder, _) in runs.items():
                timings[name].append(timed_run(decoder, ids, mask, args.tokens, device))
        for name, runs_of in timings.items():
            seconds = statistics.median(t[0] for t in runs_of)
            step = statistics.median(t[1] for t in runs_of)
            report["rows"].append(dict(batch=batch, mode=name, tokens_per_second=round(batch * args.tokens / seconds, 1),
                                       decode_step_ms=round(step * 1000, 3), first_run_seconds=round(first[name], 2),
                                       capture_seconds=round(getattr(runs[name][1], "capture_seconds", 0.0), 2)))
        same = timings["graphs"][0][2] == timings["compiled graphs"][0][2]
        report["rows"][-1]["same_tokens_as_graphs"] = same
        print(json.dumps(report["rows"][-2:]), file=sys.stderr)
        if args.output:  # after every batch size: a run stopped by a time limit keeps what it measured
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
