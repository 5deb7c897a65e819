"""The default model's own 4-bit blocks, read from its GGUF file (no de-quantising).

SmolLM2-135M-Instruct.Q4_1.gguf stores every layer weight as Q4_1: blocks of 32 weights along
the input dimension, each with a float16 scale d and minimum m, w = d * q + m with q in 0..15
(ggml's block_q4_1: d, m, then 16 bytes whose low nibbles are weights 0..15 and high nibbles
16..31). ``q4_1_blocks`` turns them into ``Int4Blocks`` under the transformers module names, so
the int4 engine multiplies the very values the file holds (model/lowbit/quantization.py).

llama.cpp's converter permutes the rows of q_proj and k_proj (its rotary layout); transformers
un-permutes them when it loads a GGUF, and so do we, row by row: a block lies inside one row, so
the permutation moves whole blocks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from model.lowbit.quantization import INT4_GROUP, Int4Blocks

# GGUF tensor name (inside blk.{i}.) -> transformers module name (inside model.layers.{i}.)
LLAMA_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
Q4_1_BLOCK_BYTES = 20  # float16 d, float16 m, 16 bytes of nibbles


def unpack_q4_1(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, blocks * 20) uint8 -> codes (rows, blocks * 32) uint8, d and m (rows, blocks) float16."""
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(rows, -1, Q4_1_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    nibbles = blocks[..., 4:]
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(rows, -1)
    return torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(m)


def rotary_row_order(rows: int, heads: int) -> torch.Tensor:
    """Row indices that undo llama.cpp's q/k permutation (transformers' _reverse_permute_weights)."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)


def q4_1_blocks(gguf_path: str | Path, config) -> dict[str, Int4Blocks]:
    """Every Q4_1 layer weight of a Llama-family GGUF as Int4Blocks, keyed by module name
    (``model.layers.3.mlp.gate_proj``). Tensors of any other type are left out (quantised from
    float by the caller)."""
    from gguf import GGMLQuantizationType, GGUFReader  # noqa: PLC0415

    reader = GGUFReader(str(gguf_path))
    blocks: dict[str, Int4Blocks] = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")  # blk.{i}.{kind}.weight
        if tensor.tensor_type != GGMLQuantizationType.Q4_1 or len(parts) != 4 or parts[0] != "blk":
            continue
        if parts[2] not in LLAMA_GGUF_NAMES:
            continue
        codes, d, m = unpack_q4_1(np.asarray(tensor.data))
        if parts[2] in ("attn_q", "attn_k"):
            heads = config.num_attention_heads if parts[2] == "attn_q" else config.num_key_value_heads
            order = rotary_row_order(codes.shape[0], heads)
            codes, d, m = codes[order], d[order], m[order]
        assert codes.shape[1] == d.shape[1] * INT4_GROUP
        blocks[f"model.layers.{parts[1]}.{LLAMA_GGUF_NAMES[parts[2]]}"] = Int4Blocks.from_q4_1(codes, d, m)
    return blocks
