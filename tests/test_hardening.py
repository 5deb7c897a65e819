"""Input validation at the API boundary: fuzzed parameters, limits, and what no input may do."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.settings import Limits, PlaygroundSettings, clean_prompt, parse_settings

LIMITS = Limits(max_new_tokens=64, max_batch_size=4, max_prompt_chars=500)

anything = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
prompts = st.one_of(
    st.text(max_size=700),  # any unicode, control characters included
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=50).map(lambda t: t + "\ud800"),  # lone surrogate
    st.just(""), st.just("   \n\t"), st.just("x" * 600), st.just("\x00\x07hello\x1b[31m"),
    anything,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=prompts, target_speedup=anything, decay=st.one_of(st.sampled_from(["linear", "cosine", "zigzag"]), anything),
       warmup=anything, decay_length=anything, min_layers=anything, max_layers=anything,
       order=st.one_of(st.sampled_from(["warmup_top", "first_last"]), anything), batch_size=anything,
       max_new_tokens=anything, temperature=anything, top_p=anything, seed=anything)
def test_any_parameter_mix_is_either_accepted_or_a_clear_value_error(**kwargs):
    try:
        settings_ = parse_settings(LIMITS, **kwargs)
    except ValueError as error:
        assert str(error) and "\n" not in str(error)
        return
    assert isinstance(settings_, PlaygroundSettings)
    assert settings_.prompt.strip() and len(settings_.prompt) <= LIMITS.max_prompt_chars
    settings_.prompt.encode("utf-8")  # never a lone surrogate downstream
    assert 1 <= settings_.max_new_tokens <= LIMITS.max_new_tokens
    assert 1 <= settings_.batch_size <= LIMITS.max_batch_size
    assert math.isfinite(settings_.target_speedup) and settings_.target_speedup >= 1
    assert 0 <= settings_.temperature and 0 < settings_.top_p <= 1


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(target_speedup=st.floats(min_value=1.0, max_value=20.0), warmup=st.integers(0, 31),
       min_layers=st.integers(0, 32), max_layers=st.integers(0, 32),
       decay=st.sampled_from(["linear", "exponential", "cosine", "power", "step", "constant"]),
       max_new_tokens=st.integers(1, 64), decay_length=st.integers(0, 100))
def test_any_schedule_setting_solves_or_says_why(default_generator, **kwargs):
    try:
        settings_ = parse_settings(LIMITS, "hello", **kwargs)
        solved = default_generator.schedule_for(settings_.schedule_request(), settings_.max_new_tokens)
    except ValueError as error:
        assert str(error)
        return
    assert all(b2 <= b1 for b1, b2 in zip(solved.budgets, solved.budgets[1:]))


@pytest.fixture(scope="module")
def default_generator(default_model):
    from model.generation import TextGenerator

    return TextGenerator(default_model)


@pytest.mark.parametrize("raw,expected", [("hi\x00there", "hithere"), ("a\tb\nc", "a\tb\nc"), ("x\ud800y", "x?y"),
                                          ("\x1b[31mred", "[31mred")])
def test_prompts_are_cleaned_of_control_characters_and_surrogates(raw, expected):
    assert clean_prompt(raw, LIMITS) == expected


@pytest.mark.parametrize("name,value,needle", [
    ("max_new_tokens", 65, "max_new_tokens must be <= 64"),
    ("batch_size", 5, "batch_size must be <= 4"),
    ("target_speedup", float("nan"), "finite"),
    ("seed", 1.5, "whole number"),
    ("temperature", "hot", "number"),
])
def test_limits_are_named_in_the_message(name, value, needle):
    with pytest.raises(ValueError, match=needle):
        parse_settings(LIMITS, "hello", **{name: value})


def test_prompt_limit_is_named():
    with pytest.raises(ValueError, match="limit is 500"):
        parse_settings(LIMITS, "y" * 501)


def test_the_api_cannot_choose_a_model_or_remote_code():
    import inspect

    from app.handlers import Playground
    from app.settings import Limits
    from app.ui import api_function

    parameters = set(inspect.signature(api_function(Playground(lambda: None, Limits()))).parameters)
    assert {"prompt", "target_speedup", "decay", "request"} <= parameters
    assert not parameters & {"model", "adapter", "trust_remote_code", "path", "device"}
