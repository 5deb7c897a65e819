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


def test_a_rerun_runs_only_the_changed_speedups_and_scores_the_kept_summaries_again(tiny_folder, tmp_path):
    from model.generation.generator import TextGenerator
    from model.loading import load_model
    from model.tasks.tldr_eval import StoredRun, TldrEvalConfig, evaluate
    from model.tasks.tldr_report import stored_run, write_report

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    asked: list[float] = []

    def models(speedup: float) -> TextGenerator:
        asked.append(speedup)
        return generator

    common = dict(speedups=(1.5, 2.0), prompt_depth_speedups=(1.5,), max_new_tokens=6, decay_length=4, batch_size=2,
                  speed_posts=1, speed_steps=2, speed_repeats=1, warmup=1, policy="none", output=str(tmp_path))
    first = evaluate(models, POSTS, TldrEvalConfig(**common))
    outputs = first.pop("outputs")
    write_report(tmp_path, {**first, "command": "first", "minutes": 1.0, "policies": {}, "posts_scored": 3,
                            "split": "reported", "weights": "float32", "note": "n",
                            "hardware": {"summary": "here"}}, outputs)
    config = TldrEvalConfig(**common, rerun=(2.0,))
    stored, earlier = stored_run(config)
    assert earlier["command"] == "first" and isinstance(stored, StoredRun)
    asked.clear()
    second = evaluate(models, POSTS, config, stored)
    assert set(asked) == {2.0}  # 1x, 1.5x and 1.5x with the prompt at budget were not run again
    kept = {arm["label"]: arm for arm in second["arms"]}
    for arm in first["arms"]:
        if arm["speedup"] != 2.0:
            assert kept[arm["label"]] == arm  # the same summaries scored again: the same scores and shares
    assert second["speed"][0] == first["speed"][0] and second["speed"][2] == first["speed"][2]
    assert second["outputs"]["1.5x"] == outputs["1.5x"]
    with pytest.raises(ValueError, match="other max_new_tokens"):
        stored_run(TldrEvalConfig(**{**common, "max_new_tokens": 8}, rerun=(2.0,)))
    with pytest.raises(ValueError, match="--rerun must name speedups"):
        TldrEvalConfig(**common, rerun=(5.0,))
