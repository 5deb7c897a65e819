"""Which schedule a request runs: the user's ask (``ScheduleRequest``), the skip policy's trained
defaults (warmup, layer order, its ranking, its measured floor), solving it, and the solved
schedules kept per inputs.

The solver scores every (max, min) pair in pure Python (~0.25 s for 30 layers) and the page asks
again on every control change, so the answers are kept; the inputs are frozen and the answer
pure, so a kept one is always right.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from model.skipdecode.schedule import (
    RANKED,
    CostModel,
    ScheduleConfig,
    SolvedSchedule,
    default_warmup,
    evaluate_schedule,
    full_schedule,
    solve_schedule,
    speedup_reachable,
)

SCHEDULE_CACHE_SIZE = 256  # solved schedules kept per planner (see SchedulePlanner.schedule_for)


@dataclass(frozen=True)
class ScheduleRequest:
    """How the user asked for a schedule: a target layer speedup, or explicit min/max layers."""

    target_speedup: float = 2.0
    decay: str = "linear"
    warmup: int | None = None  # None: the adapter's trained placement (or default_warmup(L))
    min_layers: int | None = None
    max_layers: int | None = None
    decay_length: int | None = None  # default: max_new_tokens
    # the least layers a step runs (the solver keeps the target); None: the skip policy's own floor
    min_layers_floor: int | None = None
    # the steps the target speedup averages over; None: the decode steps (max_new_tokens - 1). A task
    # sets its decay length: its speedup holds over a typical output, as its policies were trained
    speedup_steps: int | None = None
    order: str | None = None  # None: the adapter's trained order (ranked ones bring their ranking)
    prompt_at_full_depth: bool = True
    full: bool = False  # the full model (n_k = L) through the same decoder
    skip_policy: bool = True  # False: the untouched model skips layers (no adapter, no bridge)


class SchedulePlanner:
    """The schedules one model's skip policy runs (``skip_policy``: its training_info.json record)."""

    def __init__(self, skip_policy: Mapping[str, Any], num_layers: int, cost: CostModel) -> None:
        self.skip_policy = skip_policy
        self.num_layers = num_layers
        self.cost = cost
        self._solved: dict[tuple[ScheduleRequest, int], SolvedSchedule] = {}

    # --- the skip policy's trained defaults -----------------------------------------------
    @property
    def default_warmup(self) -> int:
        """The warmup the skip policy was trained with (the study's placement), else a default."""
        return int(self.skip_policy.get("warmup", default_warmup(self.num_layers)))

    @property
    def default_order(self) -> str:
        """The layer order the skip policy was trained with, else warmup_top."""
        return str(self.skip_policy.get("order", "warmup_top"))

    def default_floor(self, target_speedup: float, decay: str, warmup: int | None = None) -> int | None:
        """The least layers per step the skip policy's measured default shape keeps at this
        speedup (``schedule_floor`` in its training_info.json, set by ``export-adapter
        --schedule-floor``), or None: the solver's own shape. Only for the linear decay and up to
        the speedup the floor was measured at, and only where the floor can still reach it (with
        ``warmup``, default the policy's)."""
        rule = self.skip_policy.get("schedule_floor")
        if not rule or decay != "linear" or target_speedup > float(rule["up_to_speedup"]) + 1e-9:
            return None
        layers = int(rule["layers"])
        reachable = layers <= self.num_layers and speedup_reachable(self.num_layers, target_speedup,
                                                                     self.default_warmup if warmup is None else warmup,
                                                                     layers)
        return layers if reachable else None

    def ranking_for(self, order: str) -> tuple[int, ...]:
        """The adapter's layer ranking for order "ranked" (measured importance, most important
        first); () for the other orders. A ranked order with no trained ranking is refused."""
        if order != RANKED:
            return ()
        ranking = tuple(int(i) for i in self.skip_policy.get("ranking", ()))
        if not ranking:
            raise ValueError("order 'ranked' needs a layer ranking: use an adapter trained with --order ranked")
        return ranking

    # --- solving --------------------------------------------------------------------------
    def schedule_for(self, request: ScheduleRequest, max_new_tokens: int) -> SolvedSchedule:
        """The SolvedSchedule a request asks for, evaluated over the decode steps that will run
        (kept per (request, max_new_tokens): the inputs are frozen, the answer is pure)."""
        key = (request, max_new_tokens)
        solved = self._solved.get(key)  # one lookup: request threads share the dict
        if solved is None:
            solved = self._solve(request, max_new_tokens)
            if len(self._solved) >= SCHEDULE_CACHE_SIZE:
                self._solved.clear()
            self._solved[key] = solved
        return solved

    def check(self, request: ScheduleRequest, max_new_tokens: int) -> None:
        """The solver's verdict on a schedule request in milliseconds: the same request (its decay
        length fixed to what the run's would be) solved over one decode step, which refuses exactly
        what the run's solve would (ValueError)."""
        decay_length = request.decay_length or max_new_tokens
        self.schedule_for(replace(request, decay_length=decay_length), 2)

    def _solve(self, request: ScheduleRequest, max_new_tokens: int) -> SolvedSchedule:
        num_layers = self.num_layers
        decode_steps = max(1, max_new_tokens - 1)  # the prefill produces the first token
        decay_length = request.decay_length if request.decay_length is not None else max_new_tokens
        if request.full:
            return evaluate_schedule(full_schedule(num_layers, decay_length), decode_steps, self.cost, 1.0)
        warmup = request.warmup if request.warmup is not None else self.default_warmup
        order = request.order or self.default_order
        common: dict[str, Any] = dict(
            decay=request.decay,
            warmup=warmup,
            decay_length=decay_length,
            order=order,
            ranking=self.ranking_for(order),
            prompt_at_full_depth=request.prompt_at_full_depth,
        )
        if request.min_layers is not None or request.max_layers is not None:
            config = ScheduleConfig(
                num_layers=num_layers,
                max_layers=request.max_layers if request.max_layers is not None else num_layers,
                min_layers=request.min_layers if request.min_layers is not None else warmup + 1,
                **common,
            )
            return evaluate_schedule(config, decode_steps, self.cost)
        floor = request.min_layers_floor
        if floor is None and request.skip_policy:
            floor = self.default_floor(request.target_speedup, request.decay, warmup)
        steps = request.speedup_steps if request.speedup_steps is not None else decode_steps
        return solve_schedule(num_layers, request.target_speedup, num_steps=steps, cost=self.cost,
                              min_layers_floor=floor, **common)
