"""Skip-policy training and evaluation on tiny models (CPU, seconds)."""

import json

import pytest
import torch

from conftest import NUM_LAYERS, tiny_model
from model.decoder import SkipDecoder
from model.evaluation import EvalConfig, evaluate, rouge_l, write_report
from model.schedule import ScheduleConfig
from model.training import (
    Example,
    TrainConfig,
    collate,
    draw_schedule,
    read_jsonl,
    skip_policy_logits,
    train,
    user_examples,
)


def test_training_forward_equals_the_decoders_cached_logits():
    model = tiny_model("llama")
    examples = [Example(prompt=[5, 6, 7, 8], target=[9, 10, 11, 12, 13, 14]),
                Example(prompt=[20, 21], target=[22, 23, 24])]
    ids, mask, target_mask, prompt_len = collate(examples, pad_id=0)
    schedule = ScheduleConfig(NUM_LAYERS, 6, 2, decay="linear", decay_length=5)
    with torch.no_grad():
        forced = skip_policy_logits(model, ids, mask, schedule, prompt_len)  # (B, N, V)
    decoder = SkipDecoder(model)
    prompt_ids, prompt_mask = ids[:, :prompt_len], mask[:, :prompt_len]
    state, logits = decoder.prefill(prompt_ids, prompt_mask, schedule.prefill_layers(), ids.shape[1])
    cached = [logits]
    for step in range(ids.shape[1] - prompt_len - 1):
        cached.append(decoder.decode_step(state, ids[:, prompt_len + step], schedule.step_layers(step)))
    cached = torch.stack(cached, 1)
    for row, example in enumerate(examples):
        n = len(example.target)  # right padding after a row's target is never attended by it
        torch.testing.assert_close(forced[row, :n], cached[row, :n], atol=2e-4, rtol=1e-4)


def test_random_schedules_cover_the_apps_range():
    import random

    config = TrainConfig(speedup_range=(1.5, 4.0))
    rng = random.Random(0)
    drawn = [draw_schedule(30, 63, config, rng) for _ in range(40)]
    assert len({s.decay for s in drawn}) >= 4
    speedups = [30 * 63 / sum(s.budgets(63)) for s in drawn]
    assert min(speedups) < 2.2 and max(speedups) > 3.0
    fixed = draw_schedule(30, 63, TrainConfig(fixed_speedup=2.0), rng)
    assert fixed.decay == "linear" and abs(30 * 63 / sum(fixed.budgets(63)) - 2.0) < 0.1


def _prompts_file(tmp_path, count=6):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Tell me fact number {i} about cats."}) + "\n" for i in range(count)))
    return path


def test_tiny_model_self_distillation_loss_falls_and_adapter_round_trips(tiny_folder, tmp_path):
    out = tmp_path / "run"
    config = TrainConfig(model=str(tiny_folder), output_dir=str(out), prompts=str(_prompts_file(tmp_path)),
                         max_steps=40, batch_size=4, learning_rate=3e-2, warmup_steps=2, continuation_tokens=12,
                         fixed_speedup=2.0, lora_rank=8, lora_alpha=16, save_every=20, device="cpu")
    result = train(config)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    adapter = out / "adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "training_info.json").is_file()
    assert len(list((out / "checkpoints").glob("step-*"))) == 2
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 40

    # round trip: the saved adapter, loaded and merged, gives the trained model's logits exactly
    from peft import PeftModel

    from model.loading import load_model

    loaded = load_model(str(tiny_folder), device="cpu", adapter=str(adapter))
    assert loaded.skip_model is not loaded.model
    ids = torch.tensor([[5, 9, 14, 200, 31, 7]])
    mask = torch.ones_like(ids)
    schedule = ScheduleConfig(4, 4, 2, decay_length=3)
    reference = PeftModel.from_pretrained(load_model(str(tiny_folder), device="cpu", adapter=None).model, adapter)
    with torch.no_grad():
        merged = skip_policy_logits(loaded.skip_model, ids, mask, schedule, 3)
        unmerged = skip_policy_logits(reference, ids, mask, schedule, 3)
        original = skip_policy_logits(loaded.model, ids, mask, schedule, 3)
    torch.testing.assert_close(merged, unmerged, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(merged, original, atol=1e-3)  # the adapter really changed the model

    # resume: picks up at the newest checkpoint and finishes the remaining steps
    more = TrainConfig(**{**config.__dict__, "max_steps": 45, "resume": True})
    assert len(train(more).losses) == 5


def test_user_jsonl_trains_with_cross_entropy(tiny_folder, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "Say hi", "completion": "Hi there, friend!"}) + "\n"
                    + json.dumps({"text": "Cats sleep a lot during the day."}) + "\n")
    result = train(TrainConfig(model=str(tiny_folder), output_dir=str(tmp_path / "run"), data=str(data),
                               max_steps=25, batch_size=2, learning_rate=3e-2, warmup_steps=1, save_every=25,
                               lora_rank=8, device="cpu"))
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"prompt": "a", "completion": "b"}\n{not json}\n', "line 2"),
        ('["a list"]\n', "line 1"),
        ('{"prompt": "a"}\n', "record 1"),
        ('{"prompt": "a", "completion": ""}\n', "record 1"),
        ("", "no records"),
    ],
)
def test_bad_jsonl_names_the_line(tmp_path, default_model, content, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=needle):
        user_examples(path, default_model.tokenizer, lambda p: p, 64)


@pytest.mark.parametrize("bad", [dict(max_steps=0), dict(learning_rate=-1), dict(speedup_range=(3, 2)),
                                 dict(decays=("zigzag",)), dict(batch_size=1.5)])
def test_bad_training_options_are_rejected(bad):
    with pytest.raises(ValueError):
        TrainConfig(**bad)


def test_missing_data_file_is_clear():
    with pytest.raises(ValueError, match="does not exist"):
        read_jsonl("/no/such/file.jsonl")


def test_rouge_l():
    assert rouge_l("the cat sat", "the cat sat") == 1.0
    assert rouge_l("a b c d", "a c d e") == pytest.approx(0.75)
    assert rouge_l("x", "y") == 0.0


def test_eval_runs_end_to_end_on_a_tiny_model(tiny_folder, tmp_path):
    report = evaluate(EvalConfig(model=str(tiny_folder), adapter=None, prompts=str(_prompts_file(tmp_path, 5)),
                                 continuation_tokens=8, speedups=(1.0, 2.0), batch_size=3, device="cpu"),
                      progress=lambda line: None)
    assert [r.target_speedup for r in report.rows] == [1.0, 2.0]
    full_row = report.rows[0]
    assert full_row.agreement == 1.0 and full_row.perplexity_ratio == pytest.approx(1.0, abs=1e-3)
    assert full_row.rouge_l == pytest.approx(1.0)
    assert report.rows[1].agreement < 1.0
    json_path, md_path = write_report(report, tmp_path / "eval")
    assert json.loads(json_path.read_text())["rows"][1]["variant"] == "no adapter"
    assert "| no adapter | 2x |" in md_path.read_text()


def test_full_finetune_self_distillation_uses_a_frozen_teacher(tiny_folder, tmp_path):
    config = TrainConfig(model=str(tiny_folder), output_dir=str(tmp_path / "full"), prompts=str(_prompts_file(tmp_path)),
                         max_steps=12, batch_size=4, learning_rate=1e-3, warmup_steps=1, continuation_tokens=8,
                         fixed_speedup=2.0, full_finetune=True, save_every=12, device="cpu")
    result = train(config)
    assert sum(result.losses[-3:]) / 3 < sum(result.losses[:3]) / 3
    from model.loading import load_model

    loaded = load_model(str(tiny_folder), device="cpu", adapter=str(tmp_path / "full" / "adapter"))
    assert loaded.skip_model is not loaded.model
