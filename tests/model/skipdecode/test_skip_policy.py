"""The skip policy's learned parts act only where layers are bypassed, and the cached decoder
(original + merged weights, bridge) equals the gated teacher-forced forward that training uses.

Tests marked ``device`` run on SKIPDECODE_TEST_DEVICE (tests/support.py; default cpu)."""

import copy

import pytest
import torch

from model.skipdecode.decoder import SkipDecoder, execution_mask, masked_forward
from model.skipdecode.schedule import ScheduleConfig, full_schedule, ranked_layers
from model.skipdecode.skip_policy import EntryBridge, bypasses, entry_layers, gated, install_lora_gate
from model.training.losses import hidden_matching_loss
from model.training.scoring import skip_policy_logits
from tests.support import NUM_LAYERS, TEST_DEVICE, left_padded_batch, tiny_model

LENGTHS = [6, 3, 8]
NEW_TOKENS = 10
LORA_TARGETS = {"llama": ["q_proj", "v_proj", "down_proj"], "opt": ["q_proj", "fc1"], "gpt2": ["c_attn", "c_fc"]}


def _policy(family: str, device: torch.device | str = "cpu"):
    """A tiny model, its gated LoRA with NON-zero weights, the merged copy, and a non-identity bridge,
    built on the CPU (the same weights on every device) and moved to ``device``."""
    from peft import LoraConfig, get_peft_model

    base = tiny_model(family)
    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS[family],
                                                               fan_in_fan_out=family == "gpt2"))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.2)  # peft starts B at zero: make the adapter really act
    peft_model.eval()
    install_lora_gate(peft_model)
    merged = copy.deepcopy(peft_model).merge_and_unload().eval()
    hidden = base.config.hidden_size if family != "gpt2" else base.config.n_embd
    bridge = EntryBridge(NUM_LAYERS, hidden, rank=4)
    with torch.no_grad():
        bridge.up.normal_(0, 0.3)
    return base.to(device).eval(), peft_model.to(device), merged.to(device), bridge.to(device).eval()


SCHEDULES = {
    "linear-warmup1": ScheduleConfig(NUM_LAYERS, 6, 2, decay="linear", warmup=1, decay_length=7),
    "first_last": ScheduleConfig(NUM_LAYERS, 5, 3, decay="cosine", warmup=1, decay_length=6, order="first_last"),
    "prompt_at_budget": ScheduleConfig(NUM_LAYERS, 5, 2, decay="linear", warmup=1, decay_length=8,
                                       prompt_at_full_depth=False),
    "ranked": ScheduleConfig(NUM_LAYERS, 6, 2, warmup=0, decay_length=8, order="ranked", ranking=(0, 5, 2, 4, 1, 3)),
}


@pytest.mark.device
@pytest.mark.parametrize("family", ["llama", "opt", "gpt2"])
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_cached_decoder_with_two_weight_sets_equals_gated_teacher_forced(family, name):
    schedule = SCHEDULES[name]
    base, peft_model, merged, bridge = _policy(family, TEST_DEVICE)
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    decoder = SkipDecoder(base, skip_model=merged, bridge=bridge)
    generated = torch.tensor(decoder.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens, device=ids.device)

    state, logits = decoder.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + NEW_TOKENS)
    cached = [logits]
    for step in range(NEW_TOKENS - 1):
        cached.append(decoder.decode_step(state, generated[:, step], schedule.step_layers(step)))
    cached = torch.stack(cached, dim=1)  # (B, N, V)

    sequence = torch.cat([ids, generated], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(generated)], dim=1)
    with torch.no_grad():
        forced = skip_policy_logits(peft_model, sequence, full_mask, schedule, ids.shape[1], bridge=bridge)
        without_policy = skip_policy_logits(base, sequence, full_mask, schedule, ids.shape[1])
    torch.testing.assert_close(cached, forced, atol=3e-4, rtol=1e-4)
    # and the policy really changes what skipping steps compute (the test could fail)
    assert (cached - without_policy).abs().max() > 1e-2


@pytest.mark.device
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_full_depth_with_the_policy_is_exactly_the_original_model(family):
    base, peft_model, merged, bridge = _policy(family, TEST_DEVICE)
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    schedule = full_schedule(NUM_LAYERS)
    original = SkipDecoder(base).generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS)
    with_policy = SkipDecoder(base, skip_model=merged, bridge=bridge).generate(ids, mask, schedule,
                                                                               max_new_tokens=NEW_TOKENS)
    assert with_policy.tokens == original.tokens
    sequence = torch.cat([ids, torch.tensor(original.tokens, device=ids.device)], 1)
    full_mask = torch.cat([mask, torch.ones(len(LENGTHS), NEW_TOKENS, dtype=mask.dtype, device=mask.device)], 1)
    with torch.no_grad():
        gated_logits = skip_policy_logits(peft_model, sequence, full_mask, schedule, ids.shape[1], bridge=bridge)
        original_logits = skip_policy_logits(base, sequence, full_mask, schedule, ids.shape[1])
    assert torch.equal(gated_logits, original_logits)  # bit for bit: the LoRA delta is multiplied by 0


def test_gate_is_one_exactly_where_a_position_bypasses_layers():
    schedule = ScheduleConfig(NUM_LAYERS, 6, 3, decay="linear", warmup=1, decay_length=4)
    executes = execution_mask(schedule, 3, 9)
    gate = bypasses(executes)
    assert gate.tolist() == [0.0, 0.0, 0.0] + [0.0 if schedule.budget(k) == NUM_LAYERS else 1.0 for k in range(6)]
    assert gate[3] == 0.0 and gate[-1] == 1.0


@pytest.mark.device
def test_gate_context_restores_and_ignores_models_without_lora():
    base, peft_model, _, _ = _policy("llama", TEST_DEVICE)
    executes = torch.ones(5, NUM_LAYERS, dtype=torch.bool)
    with gated(base, executes):  # no LoRA: nothing to gate, no error
        pass
    holder = peft_model._skipdecode_gate
    with gated(peft_model, executes):
        assert holder.value is not None and float(holder.value.sum()) == 0.0
    assert holder.value is None


def test_gate_lives_on_the_models_device():
    """The schedule is built on the CPU; a model on another device (a GPU in training) must get its
    gate there, or every LoRA hook fails with a device mismatch. 'meta' stands in for the GPU."""
    _, peft_model, _, _ = _policy("llama")
    peft_model.to("meta")
    executes = torch.zeros(5, NUM_LAYERS, dtype=torch.bool)
    with gated(peft_model, executes, batch_size=2):
        value = peft_model._skipdecode_gate.value
        assert value.device.type == "meta" and tuple(value.shape) == (2, 5)


def test_entry_layers_are_the_first_layers_after_each_gap():
    assert entry_layers((0, 4, 5)) == {4}
    assert entry_layers((0, 1, 2, 3, 4, 5)) == set()
    assert entry_layers((0, 2, 5)) == {2, 5}
    assert entry_layers((3, 4)) == {3}  # entered straight from the embedding


@pytest.mark.device
def test_bridge_starts_as_identity_and_round_trips(tmp_path):
    bridge = EntryBridge(NUM_LAYERS, 16, rank=4).to(TEST_DEVICE)
    hidden = torch.randn(2, 3, 16).to(TEST_DEVICE)
    assert torch.equal(bridge(2, hidden), hidden)
    with torch.no_grad():
        bridge.up.normal_()
    bridge.save(tmp_path)
    loaded = EntryBridge.load(tmp_path, device=TEST_DEVICE)
    torch.testing.assert_close(loaded(2, hidden), bridge(2, hidden))
    assert not torch.allclose(loaded(2, hidden), hidden)
    assert EntryBridge.load(tmp_path / "nothing-here") is None


@pytest.mark.device
def test_masked_forward_applies_the_bridge_only_at_entries():
    model = tiny_model("llama", device=TEST_DEVICE)
    bridge = EntryBridge(NUM_LAYERS, 64, rank=4)
    with torch.no_grad():
        bridge.up.normal_(0, 0.3)
    bridge.to(TEST_DEVICE)
    ids, mask = left_padded_batch([5], device=TEST_DEVICE)
    executes = torch.ones(5, NUM_LAYERS, dtype=torch.bool)
    with torch.no_grad():
        plain = masked_forward(model, ids, mask, executes)
        bridged = masked_forward(model, ids, mask, executes, bridge=bridge)
        executes[4, 1:4] = False
        skipping = masked_forward(model, ids, mask, executes, bridge=bridge)
        skipping_plain = masked_forward(model, ids, mask, executes)
    assert torch.equal(plain, bridged)  # full depth everywhere: the bridge never runs
    torch.testing.assert_close(skipping[:, :4], plain[:, :4])  # positions before the bypass are unchanged
    assert (skipping[:, 4] - skipping_plain[:, 4]).abs().max() > 1e-3


@pytest.mark.device
def test_hidden_matching_loss_is_zero_for_identical_states_and_positive_otherwise():
    schedule = ScheduleConfig(NUM_LAYERS, 6, 2, decay="linear", warmup=1, decay_length=4)
    states = [torch.randn(2, 9, 8).to(TEST_DEVICE) for _ in range(NUM_LAYERS + 1)]
    target_mask = torch.ones(2, 5, dtype=torch.bool, device=TEST_DEVICE)
    assert float(hidden_matching_loss(states, states, schedule, 4, target_mask)) == 0.0
    moved = [s + 0.5 for s in states]
    assert float(hidden_matching_loss(moved, states, schedule, 4, target_mask)) > 0.01


def test_ranked_order_is_nested_and_validated():
    ranking = (0, 5, 2, 4, 1, 3)
    sets = [set(ranked_layers(ranking, n)) for n in range(1, 7)]
    assert all(a < b for a, b in zip(sets, sets[1:]))
    with pytest.raises(ValueError, match="ranking of all"):
        ScheduleConfig(NUM_LAYERS, 6, 2, warmup=0, order="ranked", ranking=(0, 1, 2))
    with pytest.raises(ValueError, match="start with the warmup"):
        ScheduleConfig(NUM_LAYERS, 6, 2, warmup=1, order="ranked", ranking=(5, 0, 1, 2, 3, 4))


def test_exported_adapter_is_half_the_size_and_acts_like_the_trained_one(tmp_path):
    from model.loading import merged_copy
    from model.skipdecode.skip_policy import export_adapter

    base, peft_model, _, bridge = _policy("llama")
    trained = tmp_path / "trained"
    peft_model.save_pretrained(trained)
    bridge.save(trained)
    (trained / "training_info.json").write_text('{"skip_policy": {"gated": true}}')
    shipped = tmp_path / "shipped"
    names = {path.name for path in export_adapter(trained, shipped)}
    assert names == {"adapter_config.json", "training_info.json", "bridge.json",
                     "adapter_model.safetensors", "bridge.safetensors"}
    assert not (shipped / "README.md").exists()
    for weights in ("adapter_model.safetensors", "bridge.safetensors"):
        assert (shipped / weights).stat().st_size < 0.6 * (trained / weights).stat().st_size

    ids = torch.randint(0, base.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = base(ids).logits
        full_precision = merged_copy(base, trained)(ids).logits
        bf16 = merged_copy(base, shipped)(ids).logits
    adapter_effect = (full_precision - plain).abs().max()
    assert adapter_effect > 0.1
    assert (bf16 - full_precision).abs().max() < 0.05 * adapter_effect  # bf16 rounding: ~0.4% of the weights
    assert torch.equal(EntryBridge.load(shipped).up, bridge.up.to(torch.bfloat16).float())


def _saved_lora(folder, seed: int, rank: int):
    """A tiny Llama's gated-policy LoRA (rank ``rank``, alpha 2r, non-zero B) saved to ``folder``."""
    from peft import LoraConfig, get_peft_model

    base = tiny_model("llama")
    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(r=rank, lora_alpha=2 * rank,
                                                               target_modules=LORA_TARGETS["llama"]))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.normal_(0, 0.2)
    peft_model.save_pretrained(folder)
    (folder / "training_info.json").write_text('{"config": {"order": "ranked"}}')
    return base


def test_mixed_adapter_interpolates_the_two_deltas(tmp_path):
    import json

    from model.loading import merged_copy
    from model.skipdecode.skip_policy import mix_adapters

    base = _saved_lora(tmp_path / "a", seed=1, rank=4)
    _saved_lora(tmp_path / "b", seed=2, rank=2)
    merged = {name: merged_copy(base, tmp_path / name).state_dict() for name in ("a", "b")}
    exact = mix_adapters(tmp_path / "a", tmp_path / "b", tmp_path / "mix", weight=0.25, rank=6, dtype=torch.float32)
    assert exact.kept_energy_min > 0.999999  # rank 4 + 2 <= 6: nothing cut
    mixed = merged_copy(base, tmp_path / "mix").state_dict()
    original = base.state_dict()
    changed = [key for key in original if not torch.equal(merged["a"][key], original[key])]
    assert len(changed) == 3 * NUM_LAYERS  # q, v and down of every layer
    for key in changed:
        expected = 0.25 * merged["a"][key] + 0.75 * merged["b"][key]
        assert (mixed[key] - expected).abs().max() < 1e-5 * merged["a"][key].abs().max()
    info = json.loads((tmp_path / "mix" / "training_info.json").read_text())
    assert info["config"]["order"] == "ranked" and info["mixed"]["weight"] == 0.25  # the first's placement kept

    padded = mix_adapters(tmp_path / "a", tmp_path / "b", tmp_path / "mix8", weight=0.25, rank=8, dtype=torch.float32)
    assert padded.rank == 8 and padded.kept_energy_min > 0.999999  # rank 8 > 4 + 2: zero directions stored
    widened = merged_copy(base, tmp_path / "mix8").state_dict()
    assert all((widened[key] - mixed[key]).abs().max() < 1e-5 * merged["a"][key].abs().max() for key in changed)
    truncated = mix_adapters(tmp_path / "a", tmp_path / "b", tmp_path / "mix4", weight=0.5)  # rank 4 < 4 + 2
    assert json.loads((tmp_path / "mix4" / "adapter_config.json").read_text())["r"] == 4
    assert 0.5 < truncated.kept_energy_min < 0.999
    only_first = mix_adapters(tmp_path / "a", tmp_path / "b", tmp_path / "mix1", weight=1.0, dtype=torch.float32)
    assert only_first.kept_energy_min > 0.999999  # the first's delta alone has rank 4
    first_again = merged_copy(base, tmp_path / "mix1").state_dict()
    assert all((first_again[key] - merged["a"][key]).abs().max() < 1e-5 for key in changed)


def test_mixing_refuses_adapters_that_do_not_match(tmp_path):
    import json

    from model.skipdecode.skip_policy import mix_adapters

    _saved_lora(tmp_path / "a", seed=1, rank=4)
    _saved_lora(tmp_path / "b", seed=2, rank=4)
    with pytest.raises(ValueError, match="within"):
        mix_adapters(tmp_path / "a", tmp_path / "b", tmp_path / "out", weight=1.5)
    with pytest.raises(ValueError, match="not an adapter folder"):
        mix_adapters(tmp_path / "a", tmp_path, tmp_path / "out", weight=0.5)
    config = json.loads((tmp_path / "b" / "adapter_config.json").read_text())
    (tmp_path / "b" / "adapter_config.json").write_text(json.dumps(dict(config, lora_alpha=4)))
    with pytest.raises(ValueError, match="scale"):
        mix_adapters(tmp_path / "a", tmp_path / "b", tmp_path / "out", weight=0.5)
    (tmp_path / "b" / "adapter_config.json").write_text(json.dumps(dict(config, use_rslora=True)))
    with pytest.raises(ValueError, match="plain LoRA"):
        mix_adapters(tmp_path / "a", tmp_path / "b", tmp_path / "out", weight=0.5)
