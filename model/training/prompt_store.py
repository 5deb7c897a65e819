"""Each training prompt prefilled once: its keys and values in every layer and its last position's logits,
kept for every later batch that draws it.

Why: a skip policy's trainable parts (a gated LoRA, an entry bridge) act only where a position bypasses
layers, and a prompt at full depth bypasses none, so its keys and values are the frozen base model's,
the same at every step. A TL;DR prompt is ~330 tokens against a ~36-token summary: prefilling it again
at every step was most of a CPU training step. Stored rows are the prompt's real tokens only (no
padding), so a prompt drawn into batches of other prompt lengths is left padded afresh each time.

Memory: 30 layers x 2 x 3 KV heads x 64 x 4 bytes ~ 46 KB a prompt token for the default model, ~17 MB
for a 380-token prompt; rows beyond ``max_bytes`` are computed again when drawn (the oldest kept).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from model.skipdecode.architectures import adapter_for
from model.skipdecode.decoder import prompt_prefill
from model.skipdecode.kv_cache import PromptKVCache
from model.skipdecode.skip_policy import gated

DEFAULT_MAX_BYTES = 8 << 30


@dataclass
class StoredPrompt:
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (1, H_kv, n, D) keys and values, n real tokens
    logits: torch.Tensor  # (1, 1, V): the last position's, predicting the first target token

    @property
    def nbytes(self) -> int:
        return self.logits.nbytes + sum(keys.nbytes + values.nbytes for keys, values in self.layers)


class PromptStore:
    """Prompts by their real token ids -> StoredPrompt; ``batch`` prefills the ones not kept yet."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.rows: OrderedDict[tuple[int, ...], StoredPrompt] = OrderedDict()
        self.bytes = 0
        self.prefilled = 0  # prompts prefilled so far (a test reads it; a kept prompt is never prefilled again)

    def batch(self, model, ids: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> tuple[PromptKVCache, torch.Tensor]:
        """The left-padded batch's prompts ``ids[:, :prompt_len]`` as a PromptKVCache (zeros where padded:
        ``mask`` hides them) and their last positions' logits (B, 1, V)."""
        keys = [tuple(row[:prompt_len][valid[:prompt_len].bool()].tolist()) for row, valid in zip(ids, mask)]
        missing = [index for index, key in enumerate(keys) if key not in self.rows]
        fresh = self._prefill(model, ids[missing], mask[missing], prompt_len, [keys[i] for i in missing]) if missing else {}
        rows = [fresh.get(key) or self.rows[key] for key in keys]
        for key in keys:
            if key in self.rows:
                self.rows.move_to_end(key)
        return _padded(rows, prompt_len), torch.cat([row.logits for row in rows], dim=0)

    def _prefill(self, model, ids: torch.Tensor, mask: torch.Tensor, prompt_len: int,
                 keys: list[tuple[int, ...]]) -> dict[tuple[int, ...], StoredPrompt]:
        full_depth = torch.ones(prompt_len, adapter_for(model).num_layers, dtype=torch.bool)
        with gated(model, full_depth, len(keys)):  # a gated LoRA is off where nothing is bypassed
            cache, logits = prompt_prefill(model, ids, mask, prompt_len)
        made = {}
        for index, key in enumerate(keys):
            start = prompt_len - len(key)  # left padded: the real tokens are the last ones
            row = StoredPrompt([(k[index:index + 1, :, start:].clone(), v[index:index + 1, :, start:].clone())
                                for k, v in cache.layers], logits[index:index + 1].clone())
            made[key] = row
            self._keep(key, row)
        self.prefilled += len(keys)
        return made

    def _keep(self, key: tuple[int, ...], row: StoredPrompt) -> None:
        while self.rows and self.bytes + row.nbytes > self.max_bytes:
            _, oldest = self.rows.popitem(last=False)
            self.bytes -= oldest.nbytes
        if row.nbytes <= self.max_bytes:
            self.rows[key] = row
            self.bytes += row.nbytes


def _padded(rows: list[StoredPrompt], prompt_len: int) -> PromptKVCache:
    """The rows' keys and values left padded with zeros to ``prompt_len`` positions, one batch per layer."""
    layers = []
    for layer in range(len(rows[0].layers)):
        keys, values = [], []
        for row in rows:
            k, v = row.layers[layer]
            pad = prompt_len - k.shape[2]
            keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)) if pad else k)
            values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)) if pad else v)
        layers.append((torch.cat(keys, dim=0), torch.cat(values, dim=0)))
    return PromptKVCache(layers)
