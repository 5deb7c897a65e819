"""step_speedup (model/skipdecode/schedule.py): the measured decode speedup one slowed step cannot swing."""

from __future__ import annotations

import pytest

from model.skipdecode.schedule import CostModel, cost_speedup, step_speedup

COST = CostModel(layer_cost=1.0, fixed_cost=6.0)
BUDGETS = [30, 24, 18, 12, 8, 8, 8, 8, 8, 8]


def times(budgets: list[int], per_unit: float) -> list[float]:
    return [per_unit * COST.step_cost(n) for n in budgets]


def test_times_that_follow_the_cost_model_give_it_back_with_no_spread() -> None:
    figure = step_speedup(30, BUDGETS, times([30] * 10, 1e-3), times(BUDGETS, 1e-3), COST)
    assert figure is not None and figure.steps == 10
    assert figure.median == pytest.approx(cost_speedup(30, BUDGETS, COST))
    assert figure.low == pytest.approx(figure.high) == pytest.approx(figure.cost_model)


def test_one_slowed_full_step_does_not_move_the_median() -> None:
    full = times([30] * 10, 1e-3)
    full[3] *= 5  # another process took the core for one step of the full lane
    figure = step_speedup(30, BUDGETS, full, times(BUDGETS, 1e-3), COST)
    plain = sum(full) / sum(times(BUDGETS, 1e-3))
    assert plain > 1.3 * figure.cost_model  # the plain ratio of totals is swung by it
    assert figure.median == pytest.approx(figure.cost_model)


def test_a_step_overhead_shows_as_a_share_under_the_cost_model() -> None:
    skip = [t + 4e-3 for t in times(BUDGETS, 1e-3)]  # a fixed cost per step the model leaves out
    figure = step_speedup(30, BUDGETS, times([30] * 10, 1e-3), skip, COST)
    assert figure.median < 0.8 * figure.cost_model and figure.low <= figure.median <= figure.high


def test_no_timed_step_is_none() -> None:
    assert step_speedup(30, [], [], [], COST) is None
    assert step_speedup(30, [8], [0.0], [0.0], COST) is None
