"""The architecture adapters: where transformers internals live (docs/DESIGN.md says where else and
why). One small adapter per family exposes what SkipDecode needs: embed tokens at explicit
positions, run decoder layer i (with or without the KV cache), final norm + LM head, and parameter
counts for the cost model. Everything else in model/ talks to these adapters, never to
`model.model.layers` & co. transformers is pinned in requirements.txt because these internals
move between releases. The caches and masks the layers read are in kv_cache.py; the lean
Llama-family layer the Llama adapter runs is in lean_layer.py.

Shapes: B = batch, T = new positions this call, K = key positions, C = hidden size, V = vocab.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import torch
from torch import nn

from model.skipdecode.kv_cache import LayerCache, LayerInputs, PrefixKVCache, attention_mask
from model.skipdecode.lean_layer import LeanLlamaLayer, fused_rms_norm, low_bit_parts
from model.skipdecode.schedule import CostModel

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_MODEL_TYPES = LLAMA_FAMILY + ("opt", "gpt2")


class ArchitectureAdapter(ABC):
    """Base class: one subclass per architecture family."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.config = model.config

    # --- structure -------------------------------------------------------------------------
    @property
    @abstractmethod
    def layers(self) -> nn.ModuleList: ...

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def max_context(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 2048) or 2048)

    @property
    def hidden_size(self) -> int:
        """The residual stream's width (GPT-2's config maps hidden_size to n_embd)."""
        return int(self.config.hidden_size)

    # --- compute ---------------------------------------------------------------------------
    @abstractmethod
    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, C) hidden states entering layer 0."""

    def layer_extras(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
        """Per-step inputs shared by all layers (rotary cos/sin for the Llama family)."""
        return {}

    @abstractmethod
    def run_layer(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: LayerCache | None) -> torch.Tensor:
        """Decoder layer ``index`` on (B, T, C); appends its keys/values to ``cache`` when given."""

    def run_layers(self, indices: list[int], hidden: torch.Tensor, inputs_for: Callable[[int], LayerInputs],
                   cache: PrefixKVCache, key_valid: torch.Tensor | None, extra: dict[str, Any]) -> torch.Tensor:
        """A decode step's layers ``indices`` in order (a run with no bridge between them): one
        ``run_layer`` each, with ``inputs_for(index)`` taken just before that layer runs. A family
        may run them in fewer calls; ``key_valid`` is the decoder's (B, capacity) bool of the
        positions a row may attend to, None where nothing is padded (what ``inputs_for``'s masks
        say), and ``extra`` the step's ``layer_extras`` (every ``inputs_for`` carries the same), so
        that a call which reads the rows' validity from ``key_valid`` builds no mask."""
        for index in indices:
            hidden = self.run_layer(index, hidden, inputs_for(index), cache)
        return hidden

    @abstractmethod
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm (and output projection where the family has one)."""

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, C) last-layer hidden -> (B, T, V) logits."""
        return self.lm_head(self.final_norm(hidden))

    def layer_inputs(self, hidden: torch.Tensor, key_valid: torch.Tensor, position_ids: torch.Tensor,
                     after_cache: bool = False) -> LayerInputs:
        return LayerInputs(mask=self.layer_mask(hidden, key_valid, after_cache), position_ids=position_ids,
                           extra=self.layer_extras(hidden, position_ids))

    def layer_mask(self, hidden: torch.Tensor, key_valid: torch.Tensor, after_cache: bool = False
                   ) -> torch.Tensor | None:
        """The layers' attention mask for ``hidden``'s (B, T) queries, the last T of ``key_valid``'s keys.
        ``after_cache``: the keys begin with cached positions, so even an unpadded batch needs the mask
        (SDPA's own causal mask aligns the queries with the FIRST keys)."""
        # Eager attention applies no causal mask of its own, so it always needs ours for T > 1.
        eager = self.config._attn_implementation == "eager"
        num_queries = hidden.shape[1]
        return attention_mask(key_valid, num_queries, hidden.dtype if eager else None,
                              always=(eager or after_cache) and num_queries > 1)

    def static_step_inputs(self, hidden: torch.Tensor, allowed: torch.Tensor, position_ids: torch.Tensor
                           ) -> LayerInputs:
        """A static decode step's inputs: ``allowed`` (B, capacity) bool, the columns each row may
        attend to (its valid prompt and the steps so far), as a (B, 1, 1, capacity) mask — bool for
        SDPA, additive for eager attention — always given, since the unwritten columns must be hidden."""
        mask = allowed[:, None, None, :]
        if self.config._attn_implementation == "eager":
            mask = torch.zeros(mask.shape, dtype=hidden.dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(hidden.dtype).min)
        return LayerInputs(mask=mask, position_ids=position_ids, extra=self.layer_extras(hidden, position_ids))

    def prepare_layers(self) -> None:
        """Build whatever the layers' fast path needs now, not inside a visitor's first request
        (nothing for families without one)."""

    # --- cost model ------------------------------------------------------------------------
    def fixed_modules(self) -> list[nn.Module]:
        """Modules every step runs whatever its depth (besides the LM head)."""
        return []

    def cost_model(self) -> CostModel:
        """Parameter counts touched per token (the embedding is a lookup: C, not V * C)."""
        layer_cost = _weight_count(self.layers[0])
        head_cost = _weight_count(self.lm_head)
        fixed = sum(_weight_count(m) for m in self.fixed_modules())
        embed_cost = self.config.hidden_size
        return CostModel(layer_cost=float(layer_cost), fixed_cost=float(head_cost + fixed + embed_cost))


def _weight_count(module: nn.Module) -> int:
    """Weights a step touches: parameters, plus low-bit weights held as buffers and a LoRA's A and B
    kept beside them (model/lowbit/quantization.py)."""
    return (sum(p.numel() for p in module.parameters())
            + sum(int(getattr(m, "quantized_weight_count", 0)) + int(getattr(m, "side_weight_count", 0))
                  for m in module.modules()))


def mean_layer_weight_count(adapter: "ArchitectureAdapter") -> float:
    """The weights a step touches per decoder layer, averaged over the layers (a skip policy's LoRA
    may leave some layers out)."""
    return sum(_weight_count(layer) for layer in adapter.layers) / adapter.num_layers


class LlamaFamilyAdapter(ArchitectureAdapter):
    """Llama, SmolLM2, Mistral, Qwen2, Qwen3: pre-norm blocks, rotary embeddings at model level."""

    @property
    def _backbone(self) -> nn.Module:
        return self.model.model

    @property
    def layers(self) -> nn.ModuleList:
        return self._backbone.layers

    @property
    def max_context(self) -> int:
        window = getattr(self.config, "sliding_window", None)
        use_window = getattr(self.config, "use_sliding_window", window is not None)
        limit = super().max_context
        # Our masks are full-causal: stay inside the sliding window where a model has one.
        return min(limit, window) if window and use_window else limit

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self._backbone.embed_tokens(input_ids)

    def layer_extras(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
        return {"position_embeddings": self._backbone.rotary_emb(hidden, position_ids=position_ids)}

    def run_layer(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: LayerCache | None) -> torch.Tensor:
        lean = LeanLlamaLayer.of(self.layers[index], self.config)
        if lean is not None:
            return lean(hidden, inputs, cache)
        return self.layers[index](
            hidden,
            attention_mask=inputs.mask,
            position_ids=inputs.position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=inputs.extra["position_embeddings"],
        )

    def run_layers(self, indices: list[int], hidden: torch.Tensor, inputs_for: Callable[[int], LayerInputs],
                   cache: PrefixKVCache, key_valid: torch.Tensor | None, extra: dict[str, Any]) -> torch.Tensor:
        """Several decode layers whose lean layers all take the native step run as one native call
        (the low-bit engine's ``native_run``: it reads ``key_valid``, so no mask is built; at batch 8
        with padding the mask had cost ~0.3 ms a step); anything else one by one."""
        if len(indices) > 1 and hidden.shape[1] == 1:
            layers = list(self.layers)  # (ModuleList's indexing checks and converts each index)
            leans = [lean for lean in [LeanLlamaLayer.of(layers[index], self.config) for index in indices]
                     if lean is not None]
            if len(leans) == len(indices):
                out = low_bit_parts().native_run(leans, hidden, extra, cache, key_valid)
                if out is not None:
                    return out
        return super().run_layers(indices, hidden, inputs_for, cache, key_valid, extra)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return fused_rms_norm(self._backbone.norm)(hidden)  # torch's one call where it is the plain RMSNorm

    def prepare_layers(self) -> None:
        """The lean layers, built at load: fusing and stacking a low-bit model's projections
        (probes included) inside the first request cost the first visitor's SkipDecode ~2.5x its
        step time on int4 (the app's race read 0.42x 'faster' on a fresh start)."""
        for layer in self.layers:
            LeanLlamaLayer.of(layer, self.config)

    def fixed_modules(self) -> list[nn.Module]:
        return [self._backbone.norm]


class OPTAdapter(ArchitectureAdapter):
    """OPT (the paper's family): learned positions with offset 2, optional in/out projections."""

    @property
    def _decoder(self) -> nn.Module:
        return self.model.model.decoder

    @property
    def layers(self) -> nn.ModuleList:
        return self._decoder.layers

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        decoder = self._decoder
        hidden = decoder.embed_tokens(input_ids)
        if decoder.project_in is not None:
            hidden = decoder.project_in(hidden)
        positions = decoder.embed_positions(None, 0, position_ids=position_ids)
        return hidden + positions

    def run_layer(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: LayerCache | None) -> torch.Tensor:
        return self.layers[index](
            hidden,
            attention_mask=inputs.mask,
            past_key_values=cache,
            use_cache=cache is not None,
            position_ids=inputs.position_ids,
        )

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        decoder = self._decoder
        if decoder.final_layer_norm is not None:
            hidden = decoder.final_layer_norm(hidden)
        if decoder.project_out is not None:
            hidden = decoder.project_out(hidden)
        return hidden

    def fixed_modules(self) -> list[nn.Module]:
        decoder = self._decoder
        return [m for m in (decoder.final_layer_norm, decoder.project_out, decoder.project_in) if m is not None]


class GPT2Adapter(ArchitectureAdapter):
    """GPT-2: learned absolute positions (wpe), post-stack ln_f."""

    @property
    def _transformer(self) -> nn.Module:
        return self.model.transformer

    @property
    def layers(self) -> nn.ModuleList:
        return self._transformer.h

    @property
    def max_context(self) -> int:
        return int(self.config.n_positions)

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        t = self._transformer
        return t.drop(t.wte(input_ids) + t.wpe(position_ids))

    def run_layer(self, index: int, hidden: torch.Tensor, inputs: LayerInputs, cache: LayerCache | None) -> torch.Tensor:
        return self.layers[index](hidden, past_key_values=cache, attention_mask=inputs.mask, use_cache=cache is not None)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._transformer.ln_f(hidden)

    def fixed_modules(self) -> list[nn.Module]:
        return [self._transformer.ln_f]


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (LoRA layers stay injected in its modules)."""
    base = getattr(model, "base_model", None)
    inner = getattr(base, "model", None)
    if base is not None and inner is not None and hasattr(inner, "config") and base is not model:
        return inner
    return model


def attention_implementation(model: nn.Module) -> str:
    """The attention kernel transformers chose for ``model`` ("sdpa", "eager", ...): a second copy
    of the model (a full fine-tune's weights) must be loaded with the same one to match it."""
    return unwrap_peft(model).config._attn_implementation


def forget_gguf_quantization(model: nn.Module) -> None:
    """A model loaded from a GGUF file holds plain float weights but still carries the GGUF
    quantizer's markers, which stop save_pretrained: drop them."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def adapter_for(model: nn.Module) -> ArchitectureAdapter:
    """Pick the adapter for a loaded causal LM; a clear error for unsupported families."""
    inner = unwrap_peft(model)
    model_type = getattr(inner.config, "model_type", None)
    if model_type in LLAMA_FAMILY:
        return LlamaFamilyAdapter(inner)
    if model_type == "opt":
        return OPTAdapter(inner)
    if model_type == "gpt2":
        return GPT2Adapter(inner)
    raise ValueError(
        f"model type {model_type!r} is not supported yet; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )
