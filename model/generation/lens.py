"""The logit lens (docs/DESIGN.md, "Looking inside: the logit lens"): what the hidden state after
each layer one position ran would predict, read through the final norm and LM head of the
weights that ran it, and how far each reading is from the full model's own prediction there.

The decoder records the hidden states (``SkipDecoder.stream(trace_row=r)``); reading them is kept
out of the decoder so it runs between the timed steps and never counts in tokens/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from model.generation.schedules import ScheduleRequest
from model.loading import LoadedModel
from model.skipdecode.decoder import SkipDecoder

LayerTrace = Sequence[tuple[int, torch.Tensor]]  # (layer, (C,) hidden state after it) for the layers one position ran


@dataclass(frozen=True)
class LensReading:
    """What the hidden state after ``layer`` would predict through the final norm and head."""

    layer: int
    token_ids: list[int]  # top-k, most likely first
    tokens: list[str]
    probs: list[float]

    def top1(self) -> dict:
        return {"layer": self.layer, "token_id": self.token_ids[0], "token": self.tokens[0], "prob": self.probs[0]}


class LogitLens:
    """Readings of traced hidden states; ``decoder_for`` says whose weights ran a request (the
    original's or the skip policy's), since a layer must be read by the head it fed."""

    def __init__(self, loaded: LoadedModel, decoder_for: Callable[[ScheduleRequest], SkipDecoder],
                 token_text: Callable[[int], str]) -> None:
        self.loaded = loaded
        self.decoder_for = decoder_for
        self.token_text = token_text

    @torch.inference_mode()
    def read(self, trace: LayerTrace, request: ScheduleRequest, top_k: int = 5) -> list[LensReading]:
        """A logit lens over the layers one position ran: each traced hidden state through the
        final norm and the LM head of the weights that ran it -> its top-k next tokens."""
        if not trace:
            return []
        top = self._log_probs(trace, request).exp().topk(top_k, dim=-1)
        readings = []
        for (layer, _), values, ids in zip(trace, top.values.tolist(), top.indices.tolist()):
            readings.append(LensReading(layer=layer, token_ids=ids, tokens=[self.token_text(i) for i in ids],
                                        probs=[round(v, 4) for v in values]))
        return readings

    def kl(self, traces: Sequence[LayerTrace], full_log_probs: torch.Tensor, request: ScheduleRequest) -> list[dict[int, float]]:
        """Per generated token t (of one row): {layer: KL(full model || lens after that layer)} at
        the position that produced t; ``full_log_probs`` from FullModelJudge.log_probs over the same
        tokens, so both sides see the same prefix."""
        result = []
        for t in range(min(len(traces), full_log_probs.shape[0] if full_log_probs.numel() else 0)):
            full = full_log_probs[t]
            with torch.no_grad():  # a reading, not training: no autograd graph kept
                lens = self._log_probs(traces[t], request)  # (layers run, V)
                kl = (full.exp() * (full - lens)).sum(-1).clamp(min=0.0)
            result.append({layer: round(float(value), 4) for (layer, _), value in zip(traces[t], kl)})
        return result

    def _log_probs(self, trace: LayerTrace, request: ScheduleRequest) -> torch.Tensor:
        """(layers run, V) log-probabilities of each traced hidden state through the final norm
        and the LM head of the weights that ran it."""
        hidden = torch.stack([h for _, h in trace])[:, None].to(self.loaded.device)  # (layers run, 1, C)
        return self.decoder_for(request).adapter.logits(hidden)[:, -1].float().log_softmax(-1)
