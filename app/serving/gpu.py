"""GPU sizing for a ZeroGPU Space: spaces.GPU around the handlers, with a per-call duration
estimated from the request's size. Elsewhere the handlers run as they are."""

from __future__ import annotations

from typing import Callable

from model.common.settings import settings

# ZeroGPU bills the duration a call asks for and cuts the call off when it runs over: a fixed
# allowance (model to GPU, prefill, page updates) plus a cost per generated token of the batch
# (both streams, full and SkipDecode), within what a Space may ask for one call.
GPU_BASE_SECONDS = 10
GPU_SECONDS_PER_TOKEN = 0.1
GPU_MIN_SECONDS, GPU_MAX_SECONDS = 20, 120


def gpu_seconds(*args, **_kwargs) -> int:
    """ZeroGPU's per-call duration, from the request's size: the settings dict a handler gets
    (batch x new tokens, two streams), bounded to GPU_MIN_SECONDS..GPU_MAX_SECONDS."""
    values = next((a for a in args if isinstance(a, dict)), {})
    tokens = _setting_value(values, "max_new_tokens", 0)
    batch = _setting_value(values, "batch_size", 1)
    wanted = GPU_BASE_SECONDS + GPU_SECONDS_PER_TOKEN * batch * tokens
    return int(min(GPU_MAX_SECONDS, max(GPU_MIN_SECONDS, wanted)))


def _setting_value(values: dict, name: str, default: int) -> int:
    """A numeric setting from a handler's input dict, keyed by setting name or by the control
    (whose elem_id is setting-<name with dashes>)."""
    wanted = (name, f"setting-{name.replace('_', '-')}")
    for key, value in values.items():
        if getattr(key, "elem_id", key) in wanted and isinstance(value, (int, float)):
            return int(value)
    return default


def gpu_handler(fn: Callable) -> Callable:
    """spaces.GPU on a ZeroGPU Space (the GPU is attached per call, for a duration estimated from
    the request's size); the function itself elsewhere."""
    if not settings().spaces_zero_gpu:
        return fn
    try:
        import spaces  # noqa: PLC0415
    except ImportError:
        return fn
    return spaces.GPU(duration=gpu_seconds)(fn)
