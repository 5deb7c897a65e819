"""Skip-policy training and evaluation on tiny models (CPU, seconds). The test marked ``device``
runs on SKIPDECODE_TEST_DEVICE (tests/support.py; default cpu); training itself stays on the CPU."""

import json
import random

import pytest
import torch

from model.evaluation.evaluation import EvalConfig, evaluate, rouge_l, write_report
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.schedule import ScheduleConfig, full_schedule
from model.training.data import DEFAULT_TRAIN_PROMPTS, Example, collate, read_jsonl, user_examples
from model.training.prompt_store import PromptStore
from model.training.scoring import distillation_loss, skip_policy_logits
from model.training.training import Budget, TrainConfig, draw_batch, draw_schedule, train
from tests.support import NUM_LAYERS, TEST_DEVICE, tiny_model


@pytest.mark.device
def test_training_forward_equals_the_decoders_cached_logits():
    model = tiny_model("llama", device=TEST_DEVICE)
    examples = [Example(prompt=[5, 6, 7, 8], target=[9, 10, 11, 12, 13, 14]),
                Example(prompt=[20, 21], target=[22, 23, 24])]
    ids, mask, target_mask, prompt_len = collate(examples, pad_id=0)
    ids, mask = ids.to(TEST_DEVICE), mask.to(TEST_DEVICE)
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


@pytest.mark.parametrize("family", ["llama", "qwen3", "opt", "gpt2"])
@pytest.mark.parametrize("order", ["warmup_top", "first_last"])
def test_a_frozen_prompt_gives_the_same_logits_and_gradients_as_the_whole_sequence(family, order):
    """Training's shortcut (scoring.skip_policy_logits with a PromptStore): each prompt prefilled once
    without gradients, then only the generated positions with them, equals the masked forward over the
    whole sequence, in the logits and in every trainable weight's gradient (a gated LoRA with trained,
    non-zero weights, and an entry bridge), also for a prompt kept from a batch of another prompt length."""
    from peft import LoraConfig, get_peft_model

    from model.skipdecode.skip_policy import EntryBridge, install_lora_gate
    from model.training.training import LORA_TARGETS

    torch.manual_seed(0)
    base = tiny_model(family)
    names = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()} & set(LORA_TARGETS)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=sorted(names)))
    install_lora_gate(model)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_" in name:
                weight.normal_(0, 0.2)  # lora_B starts at zero: a trained one does not
    bridge = EntryBridge(NUM_LAYERS, base.config.hidden_size, rank=4)
    with torch.no_grad():
        bridge.up.normal_(0, 0.1)
    short, long_, middle = (Example(prompt=[20, 21, 22], target=[23, 24, 25, 26]),
                            Example(prompt=list(range(5, 14)), target=list(range(30, 40))),
                            Example(prompt=[40, 41, 42, 43, 44], target=[45, 46, 47]))
    schedule = ScheduleConfig(NUM_LAYERS, 6, 2, decay="linear", warmup=1, decay_length=6, order=order)
    trainable = [w for w in model.parameters() if w.requires_grad] + list(bridge.parameters())
    store = PromptStore()

    def logits_and_grads(examples, prompts):
        ids, mask, target_mask, prompt_len = collate(examples, pad_id=0)
        for weight in trainable:
            weight.grad = None
        logits = skip_policy_logits(model, ids, mask, schedule, prompt_len, bridge=bridge, prompts=prompts)
        (logits.float().logsumexp(-1) * target_mask).sum().backward()
        real = target_mask.bool()  # a row's right padding is never read by the loss
        return logits.detach()[real], [weight.grad.clone() for weight in trainable]

    for examples in ([long_, short], [short, middle]):  # the short prompt, kept at P = 9, reused at P = 5
        whole, whole_grads = logits_and_grads(examples, None)
        kept, kept_grads = logits_and_grads(examples, store)
        torch.testing.assert_close(kept, whole, atol=1e-4, rtol=1e-4)
        assert any(grad.abs().sum() > 0 for grad in whole_grads)
        for got, expected in zip(kept_grads, whole_grads):
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-3)
    assert store.prefilled == 3 and len(store.rows) == 3  # each prompt prefilled once


def test_the_teacher_reads_the_students_prompts_and_gives_the_original_models_logits():
    """Teacher with the student's PromptStore: the model without its adapter over the whole sequence at
    full depth, though a trained gated LoRA is on the student and the prompt is read from the store."""
    from peft import LoraConfig, get_peft_model

    from model.skipdecode.skip_policy import install_lora_gate
    from model.training.training import Teacher

    torch.manual_seed(0)
    base = tiny_model("llama")
    with torch.no_grad():
        examples = [Example(prompt=list(range(5, 14)), target=list(range(30, 38))),
                    Example(prompt=[20, 21, 22], target=[23, 24, 25])]
        ids, mask, _, prompt_len = collate(examples, pad_id=0)
        original = skip_policy_logits(base, ids, mask, full_schedule(NUM_LAYERS), prompt_len)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    install_lora_gate(model)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_" in name:
                weight.normal_(0, 0.2)
    store = PromptStore()
    student = skip_policy_logits(model, ids, mask, ScheduleConfig(NUM_LAYERS, 6, 2, decay="linear", decay_length=6),
                                 prompt_len, prompts=store)
    teacher = Teacher(model, TrainConfig(data="x.jsonl", kl_weight=1.0), store).logits(ids, mask, prompt_len)
    real = collate(examples, pad_id=0)[2].bool()
    torch.testing.assert_close(teacher[real], original[real], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(student[real], original[real], atol=1e-2)  # the student's LoRA acts; the teacher's not
    assert store.prefilled == 2  # the teacher prefilled nothing again


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


@pytest.mark.slow
def test_length_grouped_batches_hold_one_reply_length():
    """--length-grouped: every batch is a window of the length-sorted examples, so its decay
    horizon (the batch's longest target) fits each of its rows; the windows still cover the set."""
    rng = random.Random(0)
    lengths = [rng.choice([30, 31, 32, 120, 128]) for _ in range(200)]
    examples = [Example(prompt=[1, 2], target=list(range(n))) for n in lengths]
    by_length = sorted(range(len(examples)), key=lambda i: len(examples[i].target))
    seen, spreads = set(), []
    for step in range(300):
        batch = draw_batch(examples, by_length, 8, random.Random(step))
        sizes = [len(e.target) for e in batch]
        assert sizes == sorted(sizes) and len(batch) == 8
        spreads.append(max(sizes) - min(sizes))
        seen |= {id(e) for e in batch}
    assert sum(s > 10 for s in spreads) < 0.05 * len(spreads)  # a short and a long reply rarely share a batch
    assert len(seen) > 0.9 * len(examples)
    mixed = [draw_batch(examples, None, 8, random.Random(step)) for step in range(50)]
    assert sum(max(len(e.target) for e in b) - min(len(e.target) for e in b) > 10 for b in mixed) > 40
    assert len(draw_batch(examples[:3], sorted(range(3)), 8, rng)) == 8  # fewer examples than a batch


def test_tiny_model_self_distillation_learns_the_skip_policy_and_round_trips(tiny_folder, tmp_path):
    """Asserts on a quantity with a real margin: the KL to the full model on a FIXED batch under
    the trained schedule, before vs after training (the tiny teacher is peaked: see tiny_folder).
    The learning rate never overshoots: at 3e-2 the loss climbed from 1.0 to 4-6 before it fell,
    and where it landed hung on the CPU's float rounding (0.56 of the start on an AVX-512 Xeon, under
    0.5 on an AVX2 EPYC). At 5e-3 it falls from the first steps and ends near 0.003 of the start for
    seeds 0, 1 and 2 alike, so the bound below holds with two orders of magnitude to spare."""
    from model.loading import gated_peft_copy, load_model

    out = tmp_path / "run"
    config = TrainConfig(model=str(tiny_folder), output_dir=str(out), prompts=str(_prompts_file(tmp_path)),
                         max_steps=40, batch_size=4, learning_rate=5e-3, warmup_steps=2, continuation_tokens=12,
                         fixed_speedup=2.0, warmup_layers=1, lora_rank=8, lora_alpha=16, bridge_rank=4,
                         save_every=20, eval_every=20, eval_prompts=2, eval_tokens=6, device="cpu")
    result = train(config)
    adapter = out / "adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "bridge.safetensors").is_file()
    info = json.loads((adapter / "training_info.json").read_text())
    assert info["skip_policy"]["gated"] is True
    from model.training.checkpoints import portable_path
    assert portable_path(str(DEFAULT_TRAIN_PROMPTS)) == "assets/prompts/train.jsonl"  # no machine paths
    assert len(list((out / "checkpoints").glob("step-*"))) == 2
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 40 and "heldout" in log[19] and "heldout" in log[39]
    assert [point["step"] for point in result.heldout] == [0, 20, 40]  # the held-out curve
    assert result.heldout[-1]["1x"]["agreement"] == 1.0  # gated: full depth is the original model

    loaded = load_model(str(tiny_folder), device="cpu", adapter=str(adapter))
    assert loaded.gated and loaded.bridge is not None
    examples = [Example(**json.loads(line)) for line in (out / "teacher_continuations-12-s0.jsonl").read_text().splitlines()]
    ids, mask, target_mask, prompt_len = collate(examples, loaded.pad_token_id)
    schedule = draw_schedule(4, target_mask.shape[1], config, random.Random(0))
    student = gated_peft_copy(loaded)
    with torch.no_grad():
        teacher = skip_policy_logits(loaded.model, ids, mask, full_schedule(4), prompt_len)
        before = distillation_loss(skip_policy_logits(loaded.model, ids, mask, schedule, prompt_len), teacher, target_mask)
        after = distillation_loss(skip_policy_logits(student, ids, mask, schedule, prompt_len, bridge=loaded.bridge),
                                  teacher, target_mask)
    assert float(before) > 0.05, float(before)  # a peaked teacher: there is something to learn
    assert max(result.losses) <= 1.5 * result.losses[0], result.losses  # no overshoot to recover from
    assert float(after) < 0.1 * float(before), (float(before), float(after))

    # the decoder (original + merged weights + bridge) gives the gated teacher-forced logits
    sequence_logits = skip_policy_logits(student, ids[:1], mask[:1], schedule, prompt_len, bridge=loaded.bridge)
    decoder = loaded.skip_decoder()
    state, logits = decoder.prefill(ids[:1, :prompt_len], mask[:1, :prompt_len], schedule.prefill_layers(), ids.shape[1])
    cached = [logits]
    for step in range(int(target_mask[0].sum()) - 1):
        cached.append(decoder.decode_step(state, ids[:1, prompt_len + step], schedule.step_layers(step)))
    n = len(cached)
    torch.testing.assert_close(torch.stack(cached, 1), sequence_logits[:, :n], atol=2e-4, rtol=1e-4)

    # resume: picks up at the newest checkpoint and finishes the remaining steps
    more = TrainConfig(**{**config.__dict__, "max_steps": 45, "resume": True})
    resumed = train(more)
    assert len(resumed.losses) == 5

    # a warm start from the exported adapter (LoRA + bridge, a new optimiser) begins where it ended
    warm = train(TrainConfig(**{**config.__dict__, "output_dir": str(tmp_path / "warm"), "max_steps": 1,
                                "init_adapter": str(adapter)}))
    for speedup, scores in resumed.heldout[-1].items():
        if isinstance(scores, dict):
            assert warm.heldout[0][speedup]["agreement"] == scores["agreement"], speedup
            assert abs(warm.heldout[0][speedup]["kl"] - scores["kl"]) < 1e-4, speedup
    assert abs(warm.heldout[0]["2x"]["kl"] - result.heldout[0]["2x"]["kl"]) > 0.1  # not the untrained start
    with pytest.raises(ValueError, match="does not fit this run"):
        train(TrainConfig(**{**config.__dict__, "output_dir": str(tmp_path / "misfit"), "lora_rank": 4,
                             "init_adapter": str(adapter)}))


@pytest.mark.slow
def test_user_jsonl_trains_with_cross_entropy(tiny_folder, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "Say hi", "completion": "Hi there, friend!"}) + "\n"
                    + json.dumps({"text": "Cats sleep a lot during the day."}) + "\n")
    result = train(TrainConfig(model=str(tiny_folder), output_dir=str(tmp_path / "run"), data=str(data),
                               max_steps=25, batch_size=2, learning_rate=1e-2, warmup_steps=1, save_every=25,
                               warmup_layers=1, lora_rank=8, device="cpu"))
    # At 1e-2 the last five steps' mean is 0.28-0.35 of the first five's for seeds 0-2 (at 3e-2,
    # 0.50-0.66: too close to the bound for another CPU's rounding); the bound keeps room either way.
    assert sum(result.losses[-5:]) / 5 < 0.6 * sum(result.losses[:5]) / 5, result.losses


@pytest.mark.slow
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
                                 dict(decays=("zigzag",)), dict(batch_size=1.5), dict(flip_weight=-1),
                                 dict(flip_weight=float("nan"))])
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


@pytest.mark.slow
def test_eval_runs_end_to_end_on_a_tiny_model(tiny_folder, tmp_path):
    report = evaluate(EvalConfig(model=str(tiny_folder), adapter=None, prompts=str(_prompts_file(tmp_path, 5)),
                                 continuation_tokens=8, speedups=(1.0, 2.0), batch_size=3, device="cpu",
                                 quantize=("int8",)),
                      progress=lambda line: None)
    assert [r.target_speedup for r in report.rows] == [1.0, 2.0]
    full_row = report.rows[0]
    assert full_row.agreement == 1.0 and full_row.perplexity_ratio == pytest.approx(1.0, abs=1e-3)
    assert full_row.rouge_l == pytest.approx(1.0)
    assert report.rows[1].agreement < 1.0
    json_path, md_path = write_report(report, tmp_path / "eval")
    assert json.loads(json_path.read_text())["rows"][1]["variant"] == "no adapter"
    assert "| no adapter | 2x |" in md_path.read_text()
    (quantized,) = report.quantization  # int8 weights against the float full model
    assert quantized.weights == "int8" and 0.8 <= quantized.agreement <= 1.0 and quantized.token_match >= 0.5
    assert "| int8 |" in md_path.read_text()


@pytest.mark.slow
def test_full_finetune_self_distillation_uses_a_frozen_teacher(tiny_folder, tmp_path):
    config = TrainConfig(model=str(tiny_folder), output_dir=str(tmp_path / "full"), prompts=str(_prompts_file(tmp_path)),
                         max_steps=12, batch_size=4, learning_rate=1e-3, warmup_steps=1, continuation_tokens=8,
                         fixed_speedup=2.0, warmup_layers=1, full_finetune=True, save_every=12, eval_every=0,
                         device="cpu")
    result = train(config)
    assert sum(result.losses[-3:]) / 3 < sum(result.losses[:3]) / 3
    from model.loading import load_model

    loaded = load_model(str(tiny_folder), device="cpu", adapter=str(tmp_path / "full" / "adapter"))
    assert loaded.skip_model is not loaded.model


def test_budget_counts_training_time_only_and_resumes():
    import time

    budget = Budget(max_minutes=None, spent_seconds=30.0)
    assert 30.0 <= budget.seconds < 31.0 and not budget.exhausted
    with budget.paused():  # held-out evaluation is not training time
        time.sleep(0.3)
    assert budget.seconds < 30.25
    spent = Budget(max_minutes=0.5, spent_seconds=0.0)
    assert not spent.exhausted
    end = time.process_time() + 0.2
    while time.process_time() < end:  # burn CPU time: a budget counts CPU, not wall
        pass
    assert 0.2 / 60 <= spent.cpu_minutes < 0.5
    assert Budget(max_minutes=0.001, spent_seconds=1.0).exhausted


def test_flip_weight_weighs_the_positions_whose_top_token_differs():
    """Two positions: the student's top token is the teacher's at the first (small KL), not at the
    second (large KL). flip_weight 3 weighs the second 4x in a weighted mean; 0 is the plain mean."""
    teacher = torch.log_softmax(torch.tensor([[[4.0, 0.0, 0.0], [4.0, 0.0, 0.0]]]), -1)
    student = torch.log_softmax(torch.tensor([[[3.0, 0.0, 0.0], [0.0, 3.0, 0.0]]]), -1)
    mask = torch.ones(1, 2, dtype=torch.bool)
    from model.training.scoring import kl_per_position

    agreeing, flipped = kl_per_position(student, teacher)[0].tolist()
    assert flipped > 10 * agreeing
    assert float(distillation_loss(student, teacher, mask)) == pytest.approx((agreeing + flipped) / 2)
    assert float(distillation_loss(student, teacher, mask, flip_weight=3.0)) == pytest.approx((agreeing + 4 * flipped) / 5)
    padded = torch.tensor([[True, False]])  # a padded position counts for nothing, flipped or not
    assert float(distillation_loss(student, teacher, padded, flip_weight=3.0)) == pytest.approx(agreeing)


def test_flip_weight_weighs_the_cross_entropy_where_the_top_token_misses_the_text():
    """--data (and train-task) texts: a position whose student argmax is not the text's token (the
    second, a missed stop) weighs 1 + flip_weight in the cross-entropy's weighted mean."""
    from model.training.losses import cross_entropy_loss

    student = torch.log_softmax(torch.tensor([[[3.0, 0.0, 0.0], [3.0, 0.0, 0.0]]]), -1)  # (B=1, N=2, V=3)
    ids = torch.tensor([[2, 0, 1]])  # a prompt token, then the text: token 0 (the argmax), token 1 (not)
    mask = torch.ones(1, 2, dtype=torch.bool)
    hit, miss = (-student[0, 0, 0]).item(), (-student[0, 1, 1]).item()
    assert cross_entropy_loss(student, ids, mask, 1).item() == pytest.approx((hit + miss) / 2)
    assert cross_entropy_loss(student, ids, mask, 1, flip_weight=3.0).item() == pytest.approx((hit + 4 * miss) / 5)
    padded = torch.tensor([[True, False]])  # a padded position counts for nothing, missed or not
    assert cross_entropy_loss(student, ids, padded, 1, flip_weight=3.0).item() == pytest.approx(hit)


@pytest.mark.slow
def test_train_passes_the_flip_weight_to_the_distillation_loss(tiny_folder, tmp_path, monkeypatch):
    import model.training.training as training

    data = tmp_path / "data"
    data.mkdir()
    (data / "sequences.jsonl").write_text("".join(
        json.dumps({"prompt": [1000 + i, 2000 + i], "target": [3000 + i + k for k in range(12)]}) + "\n" for i in range(4)))
    seen = []
    real = training.distillation_loss

    def recording(student, teacher, target_mask, flip_weight=0.0):
        seen.append(flip_weight)
        return real(student, teacher, target_mask, flip_weight=flip_weight)

    monkeypatch.setattr(training, "distillation_loss", recording)
    training.train(TrainConfig(model=str(tiny_folder), output_dir=str(tmp_path / "run"), sequences=str(data),
                               max_steps=2, batch_size=2, warmup_steps=1, fixed_speedup=2.0, warmup_layers=1,
                               lora_rank=4, save_every=2, eval_every=0, device="cpu", flip_weight=2.5))
    assert seen == [2.5, 2.5]
    info = json.loads((tmp_path / "run" / "adapter" / "training_info.json").read_text())
    assert info["config"]["flip_weight"] == 2.5


@pytest.mark.slow
def test_train_passes_the_flip_weight_to_the_cross_entropy_on_data(tiny_folder, tmp_path, monkeypatch):
    """With --data (how train-task trains a policy) the flip weight reaches the cross-entropy."""
    import model.training.training as training

    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "Say hi", "completion": "Hi there, friend!"}) + "\n")
    seen = []
    real = training.cross_entropy_loss

    def recording(student, ids, target_mask, prompt_len, flip_weight=0.0):
        seen.append(flip_weight)
        return real(student, ids, target_mask, prompt_len, flip_weight=flip_weight)

    monkeypatch.setattr(training, "cross_entropy_loss", recording)
    training.train(TrainConfig(model=str(tiny_folder), output_dir=str(tmp_path / "run"), data=str(data),
                               max_steps=2, batch_size=1, warmup_steps=1, fixed_speedup=2.0, warmup_layers=1,
                               lora_rank=4, save_every=2, eval_every=0, device="cpu", flip_weight=1.5))
    assert seen == [1.5, 1.5]


def test_a_one_speedup_range_trains_only_that_speedups_schedules_over_every_decay():
    """`train --speedup-range S S` (a policy for one speedup): every drawn schedule holds S over the
    batch's steps whatever its decay; the shared range spreads."""
    from model.skipdecode.schedule import layer_speedup

    rng = random.Random(0)
    for speedup in (1.5, 2.0, 3.0):
        config = TrainConfig(speedup_range=(speedup, speedup), schedule_mix="focused", warmup_layers=0)
        drawn = [draw_schedule(30, 64, config, rng) for _ in range(40)]
        achieved = [layer_speedup(30, schedule.budgets(64)) for schedule in drawn]
        assert all(abs(a - speedup) < 0.1 * speedup for a in achieved), (speedup, achieved)
        assert len({schedule.decay for schedule in drawn}) >= 3  # every decay, not one schedule
    shared = [layer_speedup(30, draw_schedule(30, 64, TrainConfig(schedule_mix="focused", warmup_layers=0),
                                              rng).budgets(64)) for _ in range(40)]
    assert max(shared) - min(shared) > 1.0  # the shared policy's draw spans 1.5x-3x
