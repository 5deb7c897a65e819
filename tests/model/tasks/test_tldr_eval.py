"""The TL;DR evaluation (model/tasks/tldr_eval.py) on a tiny model: every arm, its shares and intervals, the
prompt-depth arms and the speed rows."""

from __future__ import annotations

import pytest

from model.tasks.tldr import TldrPost

POSTS = [TldrPost(f"t3_{i}", "relationships", f"My boyfriend forgot dinner {i}", "He forgot our dinner again. " * 12,
                  "Boyfriend forgot our dinner, what do I do?") for i in range(3)]


@pytest.mark.slow
def test_every_arm_is_scored_against_the_full_models_and_the_prompt_depth_is_read_beside_it(tiny_folder):
    from model.generation.generator import TextGenerator
    from model.loading import load_model
    from model.tasks.tldr_eval import TldrEvalConfig, evaluate

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    config = TldrEvalConfig(speedups=(2.0,), prompt_depth_speedups=(2.0,), max_new_tokens=6, decay_length=4,
                            batch_size=2, speed_posts=2, speed_steps=4, speed_repeats=1, warmup=1, policy="none")
    report = evaluate(lambda speedup: generator, POSTS, config)
    arms = {arm["label"]: arm for arm in report["arms"]}
    assert list(arms) == ["1x", "2x", "2x, prompt at budget"]
    assert "shares" not in arms["1x"] and arms["1x"]["mean_layers_per_step"] == generator.num_layers
    for label in ("2x", "2x, prompt at budget"):
        for share in arms[label]["shares"].values():
            assert share["low"] <= share["share"] <= share["high"]
        assert arms[label]["mean_layers_per_step"] < generator.num_layers
    assert arms["2x"]["prefill_layers"] == generator.num_layers > arms["2x, prompt at budget"]["prefill_layers"]
    assert all(len(texts) == len(POSTS) for texts in report["outputs"].values())
    assert [row["prompt_at_full_depth"] for row in report["speed"]] == [True, False]
    for row in report["speed"]:
        assert row["full_first_token_s"] > 0 and row["skip_first_token_s"] > 0 and row["decode_speedup"] > 0
