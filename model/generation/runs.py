"""A run in three shapes: what was asked (``GenerationRequest``), what ``TextGenerator.prepare``
made of it once (``PreparedRun``: checked, tokenized, its schedule solved), and what it gave back
(``GenerationResult``, with the CLI's JSON); and how requests of one shape share a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from model.common.checks import check_int, check_number
from model.generation.schedules import ScheduleRequest
from model.generation.text import validate_prompts
from model.skipdecode.decoder import DecodeResult, SamplingConfig
from model.skipdecode.schedule import SolvedSchedule, SpeedupSummary, schedule_json


@dataclass(frozen=True)
class GenerationRequest:
    prompts: tuple[str, ...]
    schedule: ScheduleRequest = ScheduleRequest()
    max_new_tokens: int = 64
    sampling: SamplingConfig = SamplingConfig()
    raw: bool = False  # True: no chat template
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreparedRun:
    """A request as ``TextGenerator.prepare`` returns it: checked (``validate_request``), its prompts
    tokenized and left padded, the prompt plus ``max_new_tokens`` checked against the model's context,
    and its schedule solved over the decode steps. ``TextGenerator.stream`` runs it without checking
    or tokenizing again; ``with_schedule`` gives the same tokens under another schedule. ``schedule``
    is None after ``prepare(solve=False)``, which only checked the schedule (an admission check):
    such a run cannot be streamed."""

    request: GenerationRequest
    ids: torch.Tensor  # (B, P) left padded (after the shared prefix, where there is one)
    mask: torch.Tensor  # (B, P)
    schedule: SolvedSchedule | None
    shared_prefix: int = 0  # the first columns every row shares, read once (``prepare(share_prefix=True)``)

    @property
    def batch(self) -> int:
        return int(self.ids.shape[0])

    @property
    def prompt_width(self) -> int:
        """P: the longest row's prompt tokens (every row is padded to it)."""
        return int(self.ids.shape[1])

    @property
    def longest_prompt(self) -> int:
        return int(self.mask.sum(-1).max())

    @property
    def positions(self) -> int:
        """The KV-cache positions one stream of this run fills: batch x (P + max_new_tokens)."""
        return self.batch * (self.prompt_width + self.request.max_new_tokens)

    def prompt_ids(self, row: int = 0) -> list[int]:
        """Row ``row``'s prompt token ids, padding left out."""
        return self.ids[row][self.mask[row].bool()].tolist()


@dataclass
class GenerationResult:
    model: str
    device: str
    dtype: str
    adapter: str | None  # the skip-policy adapter SkipDecode ran with (None: untouched model)
    weights: str  # "float", "int8" or "int4" (model/lowbit/quantization.py)
    num_layers: int
    prompts: list[str]
    outputs: list[str]
    schedule: SolvedSchedule
    decode: DecodeResult
    speedups: SpeedupSummary  # planned and achieved (early EOS shortens the steps that ran)

    @property
    def layers_per_step(self) -> list[int]:
        return self.decode.layers_per_step

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "weights": self.weights,
            "adapter": self.adapter,
            "num_layers": self.num_layers,
            "prompts": self.prompts,
            "outputs": self.outputs,
            "finish_reasons": self.decode.finish_reasons,
            "generated_tokens": [len(row) for row in self.decode.tokens],
            "prefill_layers": list(self.decode.prefill_layers),
            "layers_per_step": self.layers_per_step,
            **self.speedups.to_json(),
            "target_speedup": self.schedule.target_speedup,
            "schedule": schedule_json(self.schedule.config),
            "tokens_per_second": round(self.decode.tokens_per_second, 3),
            "seconds": round(self.decode.total_seconds, 4),
            "prefill_seconds": round(self.decode.prefill_seconds, 4),
        }


def shared_part(request: GenerationRequest) -> GenerationRequest:
    """What requests must have in common to run as one batch (``merged_request``): everything but
    their prompts and their sampling seed. Two requests with equal shared parts decode under one
    schedule, with one token budget, sampler and stop strings: SkipDecode's one exit for the batch."""
    return replace(request, prompts=(), sampling=replace(request.sampling, seed=None, row_seeds=()))


def merged_request(requests: Sequence[GenerationRequest]) -> GenerationRequest:
    """Several requests of one shared part as one batch: their prompts in order, each request's rows
    sampled from its own seed (SamplingConfig.row_seeds), so a sampled row draws what it would alone."""
    first = requests[0]
    if any(shared_part(request) != shared_part(first) for request in requests[1:]):
        raise ValueError("only requests with the same schedule, token budget, sampler and stop strings share a batch")
    prompts = tuple(prompt for request in requests for prompt in request.prompts)
    seeds = tuple((len(request.prompts), request.sampling.seed) for request in requests)
    return replace(first, prompts=prompts, sampling=replace(first.sampling, row_seeds=seeds))


def validate_request(request: GenerationRequest) -> None:
    """A request's own values (its prompts, max_new_tokens, target_speedup), before any model work;
    the schedule's other settings are checked where they are solved."""
    validate_prompts(request.prompts)
    check_int("max_new_tokens", request.max_new_tokens, low=1)
    check_number("target_speedup", request.schedule.target_speedup)
