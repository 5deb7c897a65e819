"""A job's model time, so that no admitted job holds the one lane for more than a few seconds; and
a step-mode session's memory, so that step mode is bounded in bytes, not positions.

Units: one batch-1 step of BOTH streams (SkipDecode and the full model) as the page runs it (the
race, the full model's judgement, the page's rendering). The weights are fitted to page jobs timed
in the lane by lab/serving/calibrate_job_cost.py on a quiet 2-core EPYC (avx2, avx512f, avx512_vnni)
with the int4 default model (assets/load/job_cost.json; two quiet runs: 13.7 and 14.5 ms a unit,
each further row 0.23 and 0.24, each prompt token 0.28 and 0.26, the lens 0.66 and 0.52 a token).
Limits.max_job_cost bounds the sum.
"""

from __future__ import annotations

UNIT_SECONDS = 0.014  # one unit on a quiet 2-core CPU (what the refusal's "about N s" is made of)
BATCH_ROW_WEIGHT = 0.23  # each further row of a decode step: a batch-8 step costs ~2.6x a batch-1 step
PROMPT_TOKEN_WEIGHT = 0.27  # each prompt token of each row (one batched prefill per stream)
LENS_TOKEN_WEIGHT = 0.6  # the logit lens on row 0: a vocabulary projection per layer run, per new token
DEFAULT_MAX_JOB_COST = 300  # units a job may cost (Limits.max_job_cost): ~4 s of the one lane at UNIT_SECONDS


def job_cost(batch: int, prompt_tokens: int, new_tokens: int, lens: bool) -> int:
    """A job's model time in units: decode steps widened by the batch, the prompt of every row,
    and the lens's readings of row 0."""
    decode = new_tokens * (1 + BATCH_ROW_WEIGHT * (batch - 1))
    return round(decode + PROMPT_TOKEN_WEIGHT * batch * prompt_tokens + LENS_TOKEN_WEIGHT * new_tokens * lens)


FLOAT_BYTES = 4  # the KV cache and the lens's hidden states are float32 on the CPU (int4/int8 weights too)


def kv_bytes_per_position(config) -> int:
    """Keys and values of one position over all layers, from a transformers config (any family)."""
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 1)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 1)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", 1)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return 2 * layers * kv_heads * head_dim * FLOAT_BYTES


def session_bytes(config, positions: int, new_tokens: int, lens: bool) -> int:
    """A step session's memory: its KV-cache ``positions`` (both streams) and, with the lens, the
    hidden state after every layer of each new token of row 0 (kept for the lens and its KL)."""
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 1)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 1)
    return positions * kv_bytes_per_position(config) + lens * new_tokens * layers * hidden * FLOAT_BYTES
