"""A new gradio session (every API call is one) starts without making its blocks' configs; a deep link
still reads every config, the same as gradio made them (app/serving/gradio_internals.py)."""

from __future__ import annotations

import pytest

from app.ui import build_demo
from model.generation.generator import TextGenerator


@pytest.fixture(scope="module")
def demo(tiny_folder):
    from model.loading import load_model

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    return build_demo(lambda: generator, landing="chat")


def _made_by_gradio(state) -> dict:
    """Every block's config as gradio 6.31's own ``SessionState.__init__`` makes them, in its order."""
    config = state.blocks_config
    return {key: config.config_for_block(key, [], block) for key, block in config.blocks.items()}


def test_a_new_session_makes_no_config_until_a_deep_link_reads_them(demo, monkeypatch):
    from gradio.blocks import BlocksConfig
    from gradio.state_holder import SessionState

    made = []
    original = BlocksConfig.config_for_block
    monkeypatch.setattr(BlocksConfig, "config_for_block",
                        staticmethod(lambda *args: made.append(args[0]) or original(*args)))
    state = SessionState(demo)
    assert made == []  # gradio's own made ~160 here, for every API call
    assert list(state.components) == [config for config in _made_by_gradio(state).values() if config]
    assert len(made) >= len(demo.blocks)


def test_a_value_set_before_the_deep_link_is_kept_in_gradios_order(demo):
    from gradio.state_holder import SessionState

    state = SessionState(demo)
    key = next(key for key, config in _made_by_gradio(state).items() if "props" in config and "value" in config["props"])
    state._update_value_in_config(key, "a visitor's value")  # what gradio does as an event's output arrives
    expected = _made_by_gradio(state)
    expected[key]["props"]["value"] = "a visitor's value"
    assert list(state.config_values.items()) == list(expected.items())
    other = SessionState(demo)  # another session sees the default, not this one's value
    assert other.config_values.get(key) is None and dict(other.config_values.items())[key] != expected[key]
