"""The SkipDecode exit schedule: how many layers each generated step runs, and which ones.

Pure Python on purpose (no torch): the UI draws the schedule before any model is loaded, and
the solver runs on every slider move.

Vocabulary (docs/DESIGN.md, "The method"):
* step k = 0, 1, 2, ...: the k-th generated token fed back as input; step k runs n_k layers.
* n_k = round_half_up(f(k)) for a decay function f from ``max_layers`` (k = 0) to ``min_layers``
  (k >= decay_length), clamped to [min, max] and made monotone with a running minimum.
  Linear, step and constant decays are evaluated exactly (Fractions), so x.5 always rounds up.
* A layer ORDER maps a budget n to the set of layers that run. Orders must be NESTED
  (S(n) is a subset of S(n + 1)): with a non-increasing n_k, the steps that run any layer then
  form a prefix of the sequence, so every layer's KV cache is a prefix and nothing is recomputed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterator, Sequence

from model.common.checks import check_choice, check_int, check_number

DECAY_FUNCTIONS: tuple[str, ...] = ("linear", "exponential", "cosine", "power", "step", "constant")
DECAY_DESCRIPTIONS: dict[str, str] = {
    "linear": "straight line from max to min over the decay length (the paper's policy)",
    "exponential": "drops fast at first, then flattens towards min",
    "cosine": "half cosine: slow start, fast middle, slow end",
    "power": "power-law (D3-style): steep drop over the first tokens, long tail",
    "step": "max for the first half of the decay length, then min",
    "constant": "the same depth for every step (max = min)",
}

# Warmup layers of the default placement: the recipe study (python -m model study, assets/study)
# measured SmolLM2-135M's early layers as the ones that must not be bypassed.
DEFAULT_WARMUP = 4


def default_warmup(num_layers: int) -> int:
    """DEFAULT_WARMUP for a model as deep as SmolLM2 (30 layers); proportionally fewer for
    shallower models, so every model keeps room to skip."""
    return max(0, min(DEFAULT_WARMUP, num_layers // 6))


# The solver accepts a schedule this close (relative) to the best achievable layer speedup when
# it starts deeper: integer layer counts cannot hit every target exactly anyway.
SOLVER_TOLERANCE = 0.015

# Shape constants of the non-linear decays (chosen so each curve is visibly different).
_EXPONENTIAL_RATE = 4.0
_POWER_EXPONENT = 0.5


def _unit_decay(decay: str, progress: float, step: int, decay_length: int) -> float:
    """Fraction of the (max - min) range still kept at ``progress`` = step / decay_length in [0, 1]."""
    if decay == "linear":
        return 1.0 - progress
    if decay == "exponential":
        floor = math.exp(-_EXPONENTIAL_RATE)
        return (math.exp(-_EXPONENTIAL_RATE * progress) - floor) / (1.0 - floor)
    if decay == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if decay == "power":
        floor = (1.0 + decay_length) ** -_POWER_EXPONENT
        return ((1.0 + step) ** -_POWER_EXPONENT - floor) / (1.0 - floor)
    if decay == "step":
        return 1.0 if progress < 0.5 else 0.0
    if decay == "constant":
        return 1.0
    raise ValueError(f"decay must be one of {', '.join(DECAY_FUNCTIONS)}; got {decay!r}")


def decay_value(decay: str, step: int, max_layers: int, min_layers: int, decay_length: int) -> float | Fraction:
    """The un-rounded decay function f(step).

    Linear, step and constant are computed EXACTLY (Fractions): their values at the integer grid
    often land on x.5, where float error would push the rounding either way.
    """
    if step >= decay_length:
        return Fraction(min_layers if decay != "constant" else max_layers)
    if decay == "linear":
        return min_layers + Fraction((max_layers - min_layers) * (decay_length - step), decay_length)
    if decay in ("step", "constant"):
        return Fraction(max_layers if decay == "constant" or 2 * step < decay_length else min_layers)
    progress = step / decay_length
    return min_layers + (max_layers - min_layers) * _unit_decay(decay, progress, step, decay_length)


def round_half_up(value: float | Fraction) -> int:
    """The rounding rule of every schedule: nearest integer, exact halves go UP (more layers).

    Fractions are exact; for the transcendental decays a float within 1e-9 of a half counts
    as that half (cos(pi/2) is 6e-17, not 0).
    """
    if isinstance(value, Fraction):
        return math.floor(value + Fraction(1, 2))
    return math.floor(value + 0.5 + 1e-9)


# ---------------------------------------------------------------------------------------------
# Layer orders: budget n -> the sorted layer indices that run.

LayerOrder = Callable[[int, int, int], tuple[int, ...]]  # (num_layers, budget, warmup) -> layers


def warmup_top_layers(num_layers: int, budget: int, warmup: int) -> tuple[int, ...]:
    """The paper's order: the first ``warmup`` layers, then the TOP budget - warmup layers."""
    upper = budget - warmup
    return tuple(range(warmup)) + tuple(range(num_layers - upper, num_layers))


def first_last_layers(num_layers: int, budget: int, warmup: int) -> tuple[int, ...]:
    """Keep the first and last layers, bypass the middle (D3-style, arXiv 2503.08524).

    The bottom block gets ceil(n/2) layers (at least ``warmup``), the top block the rest;
    growing n by one adds one layer to exactly one block, so the family is nested.
    """
    bottom = max(warmup, (budget + 1) // 2)
    top = budget - bottom
    return tuple(range(bottom)) + tuple(range(num_layers - top, num_layers))


LAYER_ORDERS: dict[str, LayerOrder] = {
    "warmup_top": warmup_top_layers,
    "first_last": first_last_layers,
}
LAYER_ORDER_DESCRIPTIONS: dict[str, str] = {
    "warmup_top": "warmup layers + the top layers; lower/middle layers bypassed (the paper)",
    "first_last": "first and last layers kept, the middle bypassed (D3-style)",
    "ranked": "the most important layers by a measured ranking (the adapter's; python -m model study)",
}
# An order given by ScheduleConfig.ranking rather than by a formula: the n most important layers
# by a measured ranking (python -m model study measures one); nested by construction.
RANKED = "ranked"


def ranked_layers(ranking: Sequence[int], budget: int) -> tuple[int, ...]:
    """The ``budget`` first layers of ``ranking`` (most important first), sorted."""
    return tuple(sorted(ranking[:budget]))


def check_nested(order: LayerOrder, num_layers: int, warmup: int, name: str = "order") -> None:
    """Raise ValueError unless S(n) is a subset of S(n + 1) for every legal budget n."""
    previous: set[int] | None = None
    for budget in range(warmup + 1, num_layers + 1):
        layers = order(num_layers, budget, warmup)
        current = set(layers)
        if len(current) != budget or len(layers) != budget:
            raise ValueError(f"layer order {name!r} gives {len(current)} distinct layers for budget {budget}")
        if not all(0 <= i < num_layers for i in current):
            raise ValueError(f"layer order {name!r} names a layer outside [0, {num_layers}) for budget {budget}")
        if not set(range(warmup)) <= current:
            raise ValueError(f"layer order {name!r} drops a warmup layer at budget {budget}")
        if previous is not None and not previous <= current:
            raise ValueError(
                f"layer order {name!r} is not nested: budget {budget - 1} runs layers "
                f"{sorted(previous - current)} that budget {budget} does not; the KV cache would have holes"
            )
        previous = current


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostModel:
    """Per-step cost as parameter counts touched (a proxy for FLOPs and memory traffic).

    cost(n) = n * layer_cost + fixed_cost, where fixed_cost is embedding lookup, final norm and
    LM head. For small models the head dominates: SmolLM2-135M's head is ~28M of 135M.
    """

    layer_cost: float = 1.0
    fixed_cost: float = 0.0
    # A skipping layer's count where the skip policy runs a LoRA BESIDE the shared weights (int4: its A
    # and B are real work every skipping step; a merged policy costs nothing more): None, as layer_cost.
    policy_layer_cost: float | None = None
    policy_gated: bool = True  # gated: full-depth steps run the original weights, only skipping steps the policy

    def step_cost(self, budget: int) -> float:
        """The full model's step at ``budget`` layers."""
        return budget * self.layer_cost + self.fixed_cost

    def skip_step_cost(self, budget: int, num_layers: int) -> float:
        """SkipDecode's step at ``budget`` of ``num_layers`` layers, the skip policy's side work included."""
        policy = self.policy_layer_cost
        runs_policy = policy is not None and (budget < num_layers or not self.policy_gated)
        return budget * (policy if policy is not None and runs_policy else self.layer_cost) + self.fixed_cost


@dataclass(frozen=True)
class ScheduleConfig:
    """All knobs of one SkipDecode policy. Validated on construction (ValueError names the setting)."""

    num_layers: int
    max_layers: int
    min_layers: int
    decay: str = "linear"
    warmup: int = 1
    decay_length: int = 32
    order: str = "warmup_top"
    prompt_at_full_depth: bool = True
    ranking: tuple[int, ...] = ()  # order "ranked": every layer, most important first
    _budgets: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int("num_layers", self.num_layers, low=1)
        check_int("max_layers", self.max_layers, low=1)
        check_int("min_layers", self.min_layers, low=1)
        check_int("warmup", self.warmup, low=0)
        check_int("decay_length", self.decay_length, low=1)
        if self.max_layers > self.num_layers:
            raise ValueError(f"max_layers ({self.max_layers}) must not exceed the model's {self.num_layers} layers")
        if self.min_layers > self.max_layers:
            raise ValueError(f"min_layers ({self.min_layers}) must not exceed max_layers ({self.max_layers})")
        if self.warmup >= self.min_layers:
            raise ValueError(
                f"warmup ({self.warmup}) must be smaller than min_layers ({self.min_layers}): "
                "every step needs at least one layer above the warmup block"
            )
        check_choice("decay", self.decay, DECAY_FUNCTIONS)
        check_choice("order", self.order, (*LAYER_ORDERS, RANKED))
        if self.order == RANKED:
            if sorted(self.ranking) != list(range(self.num_layers)):
                raise ValueError(f"order 'ranked' needs a ranking of all {self.num_layers} layers; got {self.ranking!r}")
            if set(self.ranking[: self.warmup]) != set(range(self.warmup)):
                raise ValueError("order 'ranked': the ranking must start with the warmup layers")
            return
        check_nested(LAYER_ORDERS[self.order], self.num_layers, self.warmup, self.order)

    # -- budgets ----------------------------------------------------------------------------
    def budget(self, step: int) -> int:
        """n_k: the number of layers generated step ``step`` runs (monotone non-increasing)."""
        if step < 0:
            raise ValueError(f"step must be >= 0; got {step}")
        budgets = self._budgets
        while len(budgets) <= min(step, self.decay_length):
            k = len(budgets)
            raw = round_half_up(decay_value(self.decay, k, self.max_layers, self.min_layers, self.decay_length))
            clamped = min(self.max_layers, max(self.min_layers, raw))
            budgets.append(clamped if not budgets else min(budgets[-1], clamped))  # running minimum
        return budgets[min(step, self.decay_length)]

    def budgets(self, num_steps: int) -> list[int]:
        return [self.budget(k) for k in range(num_steps)]

    @property
    def prefill_budget(self) -> int:
        return self.num_layers if self.prompt_at_full_depth else self.budget(0)

    # -- layer sets -------------------------------------------------------------------------
    def layers_for_budget(self, budget: int) -> tuple[int, ...]:
        if budget >= self.num_layers:
            return tuple(range(self.num_layers))
        if self.order == RANKED:
            return ranked_layers(self.ranking, budget)
        return LAYER_ORDERS[self.order](self.num_layers, budget, self.warmup)

    def step_layers(self, step: int) -> tuple[int, ...]:
        return self.layers_for_budget(self.budget(step))

    def prefill_layers(self) -> tuple[int, ...]:
        return self.layers_for_budget(self.prefill_budget)


def full_schedule(num_layers: int, decay_length: int = 1) -> ScheduleConfig:
    """n_k = L for every step: the full model through the same decoder."""
    return ScheduleConfig(
        num_layers=num_layers,
        max_layers=num_layers,
        min_layers=num_layers,
        decay="constant",
        warmup=min(1, num_layers - 1) if num_layers > 1 else 0,
        decay_length=max(1, decay_length),
    )


# ---------------------------------------------------------------------------------------------
# Speedups and the solver.


def layer_speedup(num_layers: int, budgets: Sequence[int]) -> float:
    """The paper's figure: L / mean(n_k) over the generated steps."""
    if not budgets:
        return 1.0
    return num_layers * len(budgets) / sum(budgets)


def cost_speedup(num_layers: int, budgets: Sequence[int], cost: CostModel) -> float:
    """Full-depth step cost over mean SkipDecode step cost, head, embedding and the skip policy's
    side work included."""
    if not budgets:
        return 1.0
    mean_cost = sum(cost.skip_step_cost(n, num_layers) for n in budgets) / len(budgets)
    return cost.step_cost(num_layers) / mean_cost


def max_layer_speedup(num_layers: int, warmup: int, min_layers_floor: int | None = None) -> float:
    """The fastest legal schedule runs its floor at every step: warmup + 1 layers, or the caller's
    ``min_layers_floor`` when higher."""
    floor = _solver_floor(num_layers, warmup, min_layers_floor)
    return num_layers / floor if floor <= num_layers else 1.0


def depth_share_floor(num_layers: int, target_speedup: float, share: float) -> int:
    """The least layers per step that keep ``share`` of the average depth a target speedup allows
    (num_layers / target_speedup): with share 2/3 a linear decay runs from about twice the floor
    down to it (2x on 30 layers: 20 -> 10), so a task's last words are never written by 1-3 layers."""
    if not (0 < share <= 1):
        raise ValueError(f"the floor's depth share must be in (0, 1]; got {share!r}")
    return max(1, min(num_layers, round(share * num_layers / target_speedup)))


def speedup_reachable(num_layers: int, target_speedup: float, warmup: int, min_layers_floor: int | None = None) -> bool:
    """Can ``solve_schedule`` reach ``target_speedup`` with this warmup and floor? (Its own test.)"""
    return target_speedup <= max_layer_speedup(num_layers, warmup, min_layers_floor) + 1e-9


@dataclass(frozen=True)
class SolvedSchedule:
    config: ScheduleConfig
    target_speedup: float
    num_steps: int
    layer_speedup: float
    cost_speedup: float
    budgets: list[int]

    @property
    def skipped_share(self) -> float:
        """Share of the layer computations of the generated steps that were bypassed."""
        total = self.config.num_layers * len(self.budgets)
        return 1.0 - sum(self.budgets) / total if total else 0.0


def solve_schedule(
    num_layers: int,
    target_speedup: float,
    *,
    decay: str = "linear",
    warmup: int = 1,
    decay_length: int = 32,
    num_steps: int | None = None,
    order: str = "warmup_top",
    prompt_at_full_depth: bool = True,
    cost: CostModel | None = None,
    ranking: tuple[int, ...] = (),
    min_layers_floor: int | None = None,
) -> SolvedSchedule:
    """Pick integer (max_layers, min_layers) whose layer speedup over ``num_steps`` steps
    (default: the decay length) is closest to ``target_speedup``.

    Ties go to the larger max_layers (more depth for the first tokens, as in the paper), then to
    the larger min_layers. ``min_layers_floor`` keeps every step at least that deep (the shape
    study's lever: a 2x schedule 22 -> 8 instead of 28 -> 1); the target must stay reachable.
    """
    check_number("target_speedup", target_speedup, low=1.0)  # 1 = the full model
    check_int("num_layers", num_layers, low=1)
    check_int("warmup", warmup, low=0)
    check_int("decay_length", decay_length, low=1)
    steps = decay_length if num_steps is None else num_steps
    check_int("num_steps", steps, low=1)
    check_choice("decay", decay, DECAY_FUNCTIONS)
    if warmup >= num_layers:
        raise ValueError(f"warmup ({warmup}) must be smaller than the model's {num_layers} layers")
    floor = _solver_floor(num_layers, warmup, min_layers_floor)
    limit = num_layers / floor
    if not speedup_reachable(num_layers, target_speedup, warmup, min_layers_floor):
        raise ValueError(
            f"target_speedup {target_speedup:g} is unreachable: with {num_layers} layers, warmup {warmup} and at "
            f"least {floor} layers per step the most is {limit:.2f}x"
        )
    cost = cost or CostModel()
    common: dict[str, Any] = dict(num_layers=num_layers, decay=decay, warmup=warmup, decay_length=decay_length,
                  order=order, prompt_at_full_depth=prompt_at_full_depth, ranking=tuple(ranking))

    # Among schedules within SOLVER_TOLERANCE of the best achievable error, take the largest
    # max_layers (the deepest start: the paper's decaying policy, not a flat one), then the
    # smallest error, then the larger min_layers.
    scored = []
    for max_layers, min_layers in _candidate_bounds(num_layers, floor, decay):
        config = ScheduleConfig(max_layers=max_layers, min_layers=min_layers, **common)
        error = abs(layer_speedup(num_layers, config.budgets(steps)) - target_speedup)
        scored.append((error, config))
    best_error = min(error for error, _ in scored)
    allowed = best_error + SOLVER_TOLERANCE * target_speedup
    _, best = min(
        ((error, config) for error, config in scored if error <= allowed),
        key=lambda pair: (-pair[1].max_layers, round(pair[0], 9), -pair[1].min_layers),
    )
    return evaluate_schedule(best, steps, cost, target_speedup)


def _solver_floor(num_layers: int, warmup: int, min_layers_floor: int | None) -> int:
    """The fewest layers a solved step may run: warmup + 1, or the caller's floor when higher."""
    if min_layers_floor is None:
        return warmup + 1
    check_int("min_layers_floor", min_layers_floor, low=1)
    if min_layers_floor > num_layers:
        raise ValueError(f"min_layers_floor ({min_layers_floor}) must not exceed the model's {num_layers} layers")
    return max(warmup + 1, min_layers_floor)


def _candidate_bounds(num_layers: int, floor: int, decay: str) -> Iterator[tuple[int, int]]:
    """Every legal integer (max_layers, min_layers) pair with min_layers >= floor; constant decay has max = min."""
    for max_layers in range(floor, num_layers + 1):
        if decay == "constant":
            yield max_layers, max_layers
            continue
        for min_layers in range(floor, max_layers + 1):
            yield max_layers, min_layers


def evaluate_schedule(
    config: ScheduleConfig, num_steps: int, cost: CostModel | None = None, target_speedup: float | None = None
) -> SolvedSchedule:
    """Figures of a given (not solved-for) schedule over ``num_steps`` generated steps."""
    check_int("num_steps", num_steps, low=1)
    budgets = config.budgets(num_steps)
    achieved = layer_speedup(config.num_layers, budgets)
    return SolvedSchedule(
        config=config,
        target_speedup=achieved if target_speedup is None else float(target_speedup),
        num_steps=num_steps,
        layer_speedup=achieved,
        cost_speedup=cost_speedup(config.num_layers, budgets, cost or CostModel()),
        budgets=budgets,
    )


# ---------------------------------------------------------------------------------------------
# The figures every report shows (CLI JSON, API messages, the live stats): computed here only.


@dataclass(frozen=True)
class SpeedupSummary:
    """Planned figures (the policy over the requested steps, what the solver targeted) and achieved
    ones (over the decode steps that actually ran: lower when every row stopped early at EOS)."""

    planned_layer_speedup: float
    planned_cost_model_speedup: float
    achieved_layer_speedup: float
    achieved_cost_model_speedup: float
    skipped_share: float  # of the layer computations of the steps that ran (planned when none ran)

    def to_json(self) -> dict:
        return {name: round(value, 4) for name, value in self.__dict__.items()}


def speedup_summary(solved: SolvedSchedule, layers_ran: Sequence[int], cost: CostModel) -> SpeedupSummary:
    num_layers = solved.config.num_layers
    ran = list(layers_ran)
    return SpeedupSummary(
        planned_layer_speedup=solved.layer_speedup,
        planned_cost_model_speedup=solved.cost_speedup,
        achieved_layer_speedup=layer_speedup(num_layers, ran) if ran else solved.layer_speedup,
        achieved_cost_model_speedup=cost_speedup(num_layers, ran, cost) if ran else solved.cost_speedup,
        skipped_share=1 - sum(ran) / (num_layers * len(ran)) if ran else solved.skipped_share,
    )


def schedule_json(config: ScheduleConfig) -> dict:
    """The schedule's settings as reported by the CLI JSON and the API."""
    return {"decay": config.decay, "max_layers": config.max_layers, "min_layers": config.min_layers,
            "warmup": config.warmup, "decay_length": config.decay_length, "order": config.order,
            "prompt_at_full_depth": config.prompt_at_full_depth}


@dataclass(frozen=True)
class StepSpeedup:
    """A measured decode speedup that one slowed step cannot swing: each step pair (step k of the
    full model, step k of SkipDecode, timed in turns on the same device) gives the share of the cost
    model's speedup for that step's layers that the clock saw; the median share, and the middle half
    of the shares (first to third quartile), times the cost model's speedup over the same steps."""

    median: float
    low: float
    high: float
    cost_model: float  # the cost model's speedup over the same steps
    steps: int


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks of a sorted, non-empty sequence."""
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def step_speedup(num_layers: int, budgets: Sequence[int], full_seconds: Sequence[float],
                 skip_seconds: Sequence[float], cost: CostModel) -> StepSpeedup | None:
    """StepSpeedup over the steps all three lists cover (``budgets``: SkipDecode's layers per step);
    None without a timed step. A step's share: (full time / SkipDecode time) over (full cost / that
    step's cost), so steps deep and shallow (the schedule decays) weigh alike."""
    pairs = [(f, s, n) for f, s, n in zip(full_seconds, skip_seconds, budgets) if f > 0 and s > 0]
    if not pairs:
        return None
    full_cost = cost.step_cost(num_layers)
    shares = sorted((f / s) / (full_cost / cost.skip_step_cost(n, num_layers)) for f, s, n in pairs)
    bound = cost_speedup(num_layers, [n for _, _, n in pairs], cost)
    return StepSpeedup(median=_quantile(shares, 0.5) * bound, low=_quantile(shares, 0.25) * bound,
                       high=_quantile(shares, 0.75) * bound, cost_model=bound, steps=len(pairs))
