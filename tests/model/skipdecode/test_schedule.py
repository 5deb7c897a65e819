import subprocess
import sys

import pytest

from model.skipdecode.schedule import (
    DECAY_FUNCTIONS,
    LAYER_ORDERS,
    CostModel,
    ScheduleConfig,
    check_nested,
    cost_speedup,
    evaluate_schedule,
    layer_speedup,
    solve_schedule,
)

SHAPES = [(30, 27, 2, 64), (30, 30, 10, 16), (24, 20, 8, 5), (6, 6, 2, 3), (12, 9, 9, 7)]


@pytest.mark.parametrize("decay", DECAY_FUNCTIONS)
@pytest.mark.parametrize("order", tuple(LAYER_ORDERS))
@pytest.mark.parametrize("num_layers,max_layers,min_layers,decay_length", SHAPES)
def test_budgets_are_monotone_bounded_and_reach_min(decay, order, num_layers, max_layers, min_layers, decay_length):
    if decay == "constant":
        min_layers = max_layers
    config = ScheduleConfig(num_layers, max_layers, min_layers, decay=decay, decay_length=decay_length, order=order)
    budgets = config.budgets(decay_length + 10)
    assert budgets[0] == max_layers
    assert all(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:]))
    assert all(min_layers <= b <= max_layers for b in budgets)
    assert budgets[decay_length:] == [min_layers] * 10  # k >= D stays at min


@pytest.mark.parametrize("order", tuple(LAYER_ORDERS))
def test_layer_sets_keep_warmup_are_nested_and_sized(order):
    for warmup in (0, 1, 3):
        config = ScheduleConfig(12, 12, warmup + 1, warmup=warmup, decay_length=20, order=order)
        previous = None
        for step in range(25):
            layers = config.step_layers(step)
            assert len(layers) == config.budget(step) == len(set(layers))
            assert set(range(warmup)) <= set(layers)
            if previous is not None:
                assert set(layers) <= set(previous)  # later steps run a subset: caches stay prefixes
            previous = layers


def test_paper_order_runs_warmup_then_top_layers():
    config = ScheduleConfig(10, 10, 4, warmup=2, decay_length=6)
    assert config.layers_for_budget(5) == (0, 1, 7, 8, 9)
    assert config.layers_for_budget(10) == tuple(range(10))


def test_first_last_order_bypasses_the_middle():
    config = ScheduleConfig(10, 10, 4, warmup=1, decay_length=6, order="first_last")
    assert config.layers_for_budget(5) == (0, 1, 2, 8, 9)
    assert config.layers_for_budget(4) == (0, 1, 8, 9)


def test_a_non_nested_order_is_rejected():
    def jumping(num_layers, budget, warmup):  # even budgets take the bottom, odd the top: not nested
        return tuple(range(budget)) if budget % 2 == 0 else tuple(range(num_layers - budget, num_layers))

    with pytest.raises(ValueError, match="not nested"):
        check_nested(jumping, 8, 0, "jumping")


@pytest.mark.parametrize("decay", DECAY_FUNCTIONS)
@pytest.mark.parametrize("target", [1.0, 1.5, 2.0, 3.0, 4.0])
def test_solver_hits_target_within_rounding(decay, target):
    solved = solve_schedule(30, target, decay=decay, decay_length=64, num_steps=63)
    assert solved.layer_speedup == pytest.approx(layer_speedup(30, solved.budgets))
    # integer layers: one layer of mean depth is the resolution of the achievable speedup
    resolution = 30 / (30 / target - 1) - target
    assert abs(solved.layer_speedup - target) <= max(0.05 * target, resolution)
    if decay not in ("constant",) and target > 1:
        assert solved.config.max_layers > solved.config.min_layers  # a real decay, not a flat line


def test_solver_prefers_deep_start_for_linear_2x():
    solved = solve_schedule(30, 2.0, decay="linear", decay_length=64, num_steps=63)
    assert solved.config.max_layers >= 25
    assert abs(solved.layer_speedup - 2.0) <= 0.03


def test_cost_model_speedup_is_below_layer_speedup_when_head_is_heavy():
    cost = CostModel(layer_cost=3.54e6, fixed_cost=28.3e6)  # SmolLM2-135M proportions
    budgets = [15] * 10
    assert layer_speedup(30, budgets) == pytest.approx(2.0)
    assert cost_speedup(30, budgets, cost) == pytest.approx((30 * 3.54 + 28.3) / (15 * 3.54 + 28.3))
    assert cost_speedup(30, budgets, CostModel()) == pytest.approx(2.0)


def test_evaluate_schedule_reports_skipped_share():
    solved = evaluate_schedule(ScheduleConfig(10, 10, 5, decay="step", decay_length=4), 4)
    assert solved.budgets == [10, 10, 5, 5]
    assert solved.skipped_share == pytest.approx(10 / 40)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(max_layers=5, min_layers=8), "min_layers"),
        (dict(max_layers=40, min_layers=8), "max_layers"),
        (dict(max_layers=10, min_layers=2, warmup=2), "warmup"),
        (dict(max_layers=10, min_layers=4, decay_length=0), "decay_length"),
        (dict(max_layers=10, min_layers=4, decay="zigzag"), "decay"),
        (dict(max_layers=10, min_layers=4, order="random"), "order"),
        (dict(max_layers=10.5, min_layers=4), "max_layers"),
    ],
)
def test_invalid_settings_name_the_setting(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ScheduleConfig(num_layers=30, **kwargs)


@pytest.mark.parametrize(
    "target,kwargs,needle",
    [
        (0.5, {}, "target_speedup"),
        (float("nan"), {}, "target_speedup"),
        (float("inf"), {}, "target_speedup"),
        (16.0, {}, "unreachable"),
        (2.0, dict(decay_length=0), "decay_length"),
        (2.0, dict(warmup=30), "warmup"),
        (2.0, dict(decay="nope"), "decay"),
        (3.0, dict(min_layers_floor=12), "at least 12 layers per step"),
        (2.0, dict(min_layers_floor=31), "min_layers_floor"),
        (2.0, dict(min_layers_floor=0), "min_layers_floor"),
    ],
)
def test_solver_rejects_bad_settings(target, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        solve_schedule(30, target, **kwargs)


@pytest.mark.parametrize("decay", ["linear", "cosine", "constant"])
@pytest.mark.parametrize("floor", [4, 8, 12])
def test_solver_floor_keeps_every_step_that_deep_at_the_same_budget(decay, floor):
    default = solve_schedule(30, 2.0, decay=decay, decay_length=48, num_steps=47)
    floored = solve_schedule(30, 2.0, decay=decay, decay_length=48, num_steps=47, min_layers_floor=floor)
    assert min(floored.budgets) >= floor and floored.config.min_layers >= floor
    assert floored.layer_speedup == pytest.approx(2.0, rel=0.04)
    assert abs(floored.layer_speedup - 2.0) <= abs(default.layer_speedup - 2.0) + 0.06
    if decay == "linear":  # the default decays to warmup + 1: the floor changes the shape, not the budget
        assert default.config.min_layers < floor and floored.config.max_layers < default.config.max_layers


def test_schedule_imports_without_torch():
    code = "import sys, model.skipdecode.schedule; assert 'torch' not in sys.modules, 'schedule pulled in torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _exact_linear_budget(max_layers: int, min_layers: int, decay_length: int, step: int) -> int:
    """floor(f + 1/2) of f = min + (max - min)(D - k)/D in integers: half up, no floats."""
    k = min(step, decay_length)
    numerator = 2 * min_layers * decay_length + 2 * (max_layers - min_layers) * (decay_length - k) + decay_length
    return numerator // (2 * decay_length)


def test_linear_budgets_equal_exact_arithmetic_with_halves_rounded_up():
    assert ScheduleConfig(30, 30, 3, decay="linear", warmup=1, decay_length=6).budgets(6) == [30, 26, 21, 17, 12, 8]
    for max_layers in range(2, 31):
        for min_layers in range(2, max_layers + 1):
            for decay_length in (1, 2, 3, 4, 5, 6, 7, 10, 16, 33, 64, 100, 128):
                config = ScheduleConfig(30, max_layers, min_layers, decay="linear", warmup=1, decay_length=decay_length)
                expected = [_exact_linear_budget(max_layers, min_layers, decay_length, k) for k in range(decay_length + 2)]
                assert config.budgets(decay_length + 2) == expected, (max_layers, min_layers, decay_length)


def test_step_decay_switches_at_half_the_decay_length_exactly():
    config = ScheduleConfig(12, 10, 4, decay="step", warmup=1, decay_length=6)
    assert config.budgets(8) == [10, 10, 10, 4, 4, 4, 4, 4]


def test_the_cost_model_counts_the_skip_policys_side_work_on_the_steps_that_run_it():
    """A LoRA beside the weights (policy_layer_cost) costs every skipping step; gated, the full-depth
    steps run the original weights, ungated every step runs the policy."""
    plain = CostModel(layer_cost=10.0, fixed_cost=50.0)
    gated = CostModel(layer_cost=10.0, fixed_cost=50.0, policy_layer_cost=12.0)
    ungated = CostModel(layer_cost=10.0, fixed_cost=50.0, policy_layer_cost=12.0, policy_gated=False)
    assert gated.skip_step_cost(4, 8) == 4 * 12.0 + 50.0 and plain.skip_step_cost(4, 8) == 4 * 10.0 + 50.0
    assert gated.skip_step_cost(8, 8) == gated.step_cost(8) == 130.0  # a full-depth step: the original's
    assert ungated.skip_step_cost(8, 8) == 8 * 12.0 + 50.0
    budgets = [8, 4, 4, 2]
    assert cost_speedup(8, budgets, plain) == pytest.approx(130.0 / ((130 + 90 + 90 + 70) / 4))
    assert cost_speedup(8, budgets, gated) == pytest.approx(130.0 / ((130 + 98 + 98 + 74) / 4))
    assert cost_speedup(8, budgets, gated) < cost_speedup(8, budgets, plain)
    assert cost_speedup(8, [8, 8], ungated) < 1.0  # the policy at full depth is slower than the original
