"""Low-bit weights (model/lowbit/quantization.py, model/lowbit/gguf_weights.py): int8 and int4 close to float,
the GGUF's Q4_1 blocks held exactly, and the decoder keeps its parity with transformers and its
cache equivalence on the quantised weights."""

import copy

import numpy as np
import pytest
import torch

from model.lowbit.gguf_weights import rotary_row_order, unpack_q4_1
from model.lowbit.quantization import (
    HEAD_STAYS_INT8,
    INT4_GROUP,
    Int4Blocks,
    Int4WeightLinear,
    Int8WeightLinear,
    int4_supported,
    int8_supported,
    quantize_weights,
    resolve_quantize,
)
from model.skipdecode.architectures import adapter_for
from model.skipdecode.decoder import SkipDecoder, execution_mask, masked_forward
from model.skipdecode.schedule import ScheduleConfig, full_schedule
from tests.support import NUM_LAYERS, left_padded_batch, random_lora_adapter, tiny_model

pytestmark = pytest.mark.skipif(not int8_supported(), reason="no int8-weight CPU kernel in this torch build")


def test_every_linear_becomes_int8_and_logits_stay_close():
    model = tiny_model("llama")
    quantized = copy.deepcopy(model)
    replaced = quantize_weights(quantized, "int8").replaced
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert replaced == linears and not any(isinstance(m, torch.nn.Linear) for m in quantized.modules())
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference, low_bit = model(ids).logits, quantized(ids).logits
    relative = float((low_bit - reference).norm() / reference.norm())
    assert relative < 0.05, relative  # int8 per channel + bf16 activations: ~1%
    assert adapter_for(quantized).cost_model() == adapter_for(model).cost_model()  # int8 weights still count


def test_int8_weights_round_trip_within_half_a_step():
    linear = torch.nn.Linear(16, 8)
    quantized = Int8WeightLinear(linear)
    step = quantized.scales.float()[:, None]
    assert torch.all((quantized.dequantized_weight() - linear.weight).abs() <= step * 0.5 + 1e-3 * step)


# int4 needs out_features % 16 and in_features % 32: the tiny models' vocab of 97 does not fit (its
# LM head falls back to int8, tested below); 112 does.
@pytest.mark.parametrize(("family", "mode", "vocab"), [("llama", "int8", 97), ("qwen2", "int8", 97),
                                                       ("llama", "int4", 112), ("qwen2", "int4", 112)])
def test_decoder_on_low_bit_weights_matches_transformers_and_its_teacher_forced_twin(family, mode, vocab):
    if mode == "int4" and not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    model = tiny_model(family, vocab=vocab)
    with torch.no_grad():  # a PEAKED model: greedy choices have real margins on any CPU (no near-ties)
        model.get_output_embeddings().weight.mul_(40.0)
    report = quantize_weights(model, mode)
    two_stage = vocab % 16 == 0 and int4_supported()  # a 4-bit scan of the vocabulary fits the int4 kernel
    assert report.two_stage_head == ("lm_head" if two_stage else None)
    assert report.fallbacks == ({"lm_head": HEAD_STAYS_INT8} if mode == "int4" and not two_stage else {})
    assert "lm_head" in report.int8 and len(getattr(report, mode)) == report.replaced - (mode == "int4")
    ids, mask = left_padded_batch([5, 8])
    decoder = SkipDecoder(model)
    ours = decoder.generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=6)
    with torch.inference_mode():
        theirs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                pad_token_id=0, eos_token_id=None)
    assert [row[:6] for row in ours.tokens] == theirs[:, ids.shape[1]:].tolist()
    # Skipping on int8 weights: the cached decoder equals the teacher-forced masked forward.
    schedule = ScheduleConfig(NUM_LAYERS, NUM_LAYERS, 2, warmup=1, decay="linear", decay_length=5)
    skipped = decoder.generate(ids, mask, schedule, max_new_tokens=6)
    full_ids = torch.cat([ids, torch.tensor(skipped.tokens)], dim=1)
    full_mask = torch.cat([mask, torch.ones(2, 6, dtype=mask.dtype)], dim=1)
    executes = execution_mask(schedule, ids.shape[1], full_ids.shape[1])
    with torch.inference_mode():
        logits = masked_forward(model, full_ids, full_mask, executes)
    predicted = logits[:, ids.shape[1] - 1:-1].argmax(-1)
    assert predicted.tolist() == skipped.tokens


def test_quantize_modes_are_checked():
    with pytest.raises(ValueError, match="quantize"):
        quantize_weights(tiny_model("llama"), "int3")
    assert resolve_quantize("auto", torch.device("cpu")) == "int8"  # a float model: int8, not int4 from float
    assert resolve_quantize("auto", torch.device("cpu"), exact_4bit=True) == ("int4" if int4_supported() else "int8")
    assert resolve_quantize("auto", torch.device("meta"), exact_4bit=True) == "none"  # a GPU runs bf16
    assert resolve_quantize("none", torch.device("cpu")) == "none"
    with pytest.raises(ValueError, match="quantize"):
        resolve_quantize("fp8", torch.device("cpu"))


int4_only = pytest.mark.skipif(not int4_supported(), reason="no int4-weight CPU kernel in this torch build")


@int4_only
def test_int4_from_float_is_within_half_a_step_and_the_kernel_multiplies_exactly_that():
    weight = torch.randn(48, 96, generator=torch.Generator().manual_seed(0))
    blocks = Int4Blocks.from_float(weight)
    step = blocks.scales.float().repeat_interleave(INT4_GROUP, dim=1)
    assert torch.all((blocks.dequantize() - weight).abs() <= 0.5 * step + 0.02 * step)
    assert int(blocks.codes.min()) >= 0 and int(blocks.codes.max()) <= 15
    # The kernel computes x @ dequantize().T: compare with a float matmul of the same weights.
    linear = Int4WeightLinear(blocks)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(1))
    reference = x.bfloat16().float() @ blocks.dequantize().t()
    assert torch.allclose(linear(x), reference, rtol=0.02, atol=0.02 * float(reference.abs().max()))
    assert torch.allclose(linear.dequantized_weight(), blocks.dequantize(), rtol=0.01, atol=1e-3)


def _q4_1_bytes(codes: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """ggml block_q4_1 rows: float16 d, float16 m, then weight j in the low and j+16 in the high nibble."""
    rows, blocks = d.shape
    grouped = codes.reshape(rows, blocks, 32)
    nibbles = (grouped[..., :16] | (grouped[..., 16:] << 4)).astype(np.uint8)
    head = np.concatenate([d.astype(np.float16)[..., None].view(np.uint8), m.astype(np.float16)[..., None].view(np.uint8)],
                          axis=-1).reshape(rows, blocks, 4)
    return np.concatenate([head, nibbles], axis=-1).reshape(rows, blocks * 20)


@int4_only
def test_gguf_q4_1_blocks_are_held_exactly_up_to_bfloat16_scale_and_zero():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (32, 64)).astype(np.uint8)
    d = rng.uniform(0.01, 0.1, (32, 2)).astype(np.float16)
    m = rng.uniform(-0.8, 0.0, (32, 2)).astype(np.float16)
    raw = _q4_1_bytes(codes, d, m)
    reference = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q4_1).copy())  # the gguf package's own reader
    got_codes, got_d, got_m = unpack_q4_1(raw)
    assert torch.equal(got_codes, torch.from_numpy(codes)) and torch.equal(got_d, torch.from_numpy(d))
    blocks = Int4Blocks.from_q4_1(got_codes, got_d, got_m)
    step = torch.from_numpy(d.astype(np.float32)).repeat_interleave(32, dim=1)
    error = (blocks.dequantize() - reference).abs()
    assert float((error / step).max()) < 0.1  # bf16 rounding of d and m + 8d only (a code off would be >= 1 step)
    # Exact where d and m are bfloat16 numbers already.
    exact = Int4Blocks.from_q4_1(got_codes, got_d.bfloat16().half(), torch.zeros_like(got_m))
    assert torch.equal(exact.dequantize(), got_codes.float().reshape(32, 2, 32).mul(
        got_d.bfloat16().float()[..., None]).reshape(32, 64))


def test_rotary_row_order_undoes_llama_cpp_permutation_like_transformers():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = np.arange(48 * 2).reshape(48, 2)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(rows, 4, 4)
    assert torch.equal(torch.from_numpy(rows)[rotary_row_order(48, 4)], torch.from_numpy(np.ascontiguousarray(theirs)))


@int4_only
def test_int4_layers_the_kernel_cannot_hold_fall_back_to_int8_with_the_reason():
    model = tiny_model("llama")
    odd = torch.nn.Linear(64, 40)  # out_features 40: no multiple of 16
    model.model.layers[0].mlp.extra = odd
    report = quantize_weights(model, "int4")
    assert sorted(report.int8) == ["lm_head", "model.layers.0.mlp.extra"]
    assert "out_features 40" in report.fallbacks["model.layers.0.mlp.extra"]
    assert report.fallbacks["lm_head"] == HEAD_STAYS_INT8  # the head is int8 by choice, whatever its shape
    assert isinstance(model.lm_head, Int8WeightLinear) and isinstance(model.model.layers[0].mlp.up_proj, Int4WeightLinear)
    assert isinstance(model.model.layers[0].mlp.extra, Int8WeightLinear)
    assert "int8 instead of int4" in report.summary()
    del model.model.layers[0].mlp.extra
    assert adapter_for(model).cost_model() == adapter_for(tiny_model("llama")).cost_model()  # int4 weights count


@int4_only
def test_int4_model_equals_the_float_model_with_its_dequantised_weights():
    model = tiny_model("llama", vocab=112)
    quantized = copy.deepcopy(model)
    quantize_weights(quantized, "int4")
    head = quantized.lm_head  # its two stages are tested on their own (below): here the layers are
    quantized.lm_head = Int8WeightLinear.from_tensors(head.exact_int8, head.exact_scales)
    with torch.no_grad():  # the float model with exactly the int4 values
        for (name, module), (_, low_bit) in zip(model.named_modules(), quantized.named_modules()):
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(low_bit.dequantized_weight())
    ids = torch.randint(0, 112, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference, low_bit = model(ids).logits, quantized(ids).logits
    relative = float((low_bit - reference).norm() / reference.norm())
    assert relative < 0.03, relative  # bf16 activations only (int4 vs the ORIGINAL float weights: ~15%)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_fused_projections_equal_the_separate_ones_and_share_their_weights(mode):
    from model.lowbit.quantization import fuse_low_bit

    if mode == "int4" and not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    torch.manual_seed(0)
    make = Int8WeightLinear if mode == "int8" else Int4WeightLinear.from_linear
    parts = [make(torch.nn.Linear(128, n, bias=False)) for n in (128, 64, 64)]  # q, k, v of a 2-kv-head model
    x = torch.randn(3, 1, 128)
    with torch.no_grad():
        separate = torch.cat([p(x) for p in parts], dim=-1)
        fused = fuse_low_bit(parts)
        assert fused is not None and fused.out_features == 256
        assert torch.equal(fused(x), separate)
        assert torch.equal(torch.cat([p(x) for p in parts], dim=-1), separate)  # the originals still compute the same
    name = "weight_int8" if mode == "int8" else "weight_int4pack"
    fused_storage = getattr(fused, name).untyped_storage().data_ptr()
    assert all(getattr(p, name).untyped_storage().data_ptr() == fused_storage for p in parts)  # no second copy


def test_projections_that_cannot_be_fused_are_left_alone():
    from model.lowbit.quantization import fuse_low_bit

    torch.manual_seed(0)
    mixed = [Int8WeightLinear(torch.nn.Linear(64, 64, bias=False)), torch.nn.Linear(64, 64, bias=False)]
    biased = [Int8WeightLinear(torch.nn.Linear(64, 64)), Int8WeightLinear(torch.nn.Linear(64, 64))]
    assert fuse_low_bit(mixed) is None and fuse_low_bit(biased) is None
    if int4_supported():  # rows of 16: the packed layout interleaves rows in wider blocks on some CPUs
        small = [Int4WeightLinear.from_linear(torch.nn.Linear(64, n, bias=False)) for n in (48, 16)]
        before = [p.weight_int4pack.data_ptr() for p in small]
        fused = fuse_low_bit(small)
        if fused is None:
            assert [p.weight_int4pack.data_ptr() for p in small] == before


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_prepared_low_bit_weights_restore_from_the_start_up_cache_exactly(mode, tmp_path):
    from model.lowbit.weight_cache import restore_low_bit, save_low_bit

    if mode == "int4" and not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    original = tiny_model("llama")
    skip = copy.deepcopy(original)
    with torch.no_grad():  # a different second weight set, as a merged adapter is
        for parameter in skip.model.layers.parameters():
            parameter.add_(0.01)
    fresh_original, fresh_skip = copy.deepcopy(original), copy.deepcopy(skip)
    quantize_weights(original, mode)
    quantize_weights(skip, "int8")
    path = tmp_path / "prepared.safetensors"
    save_low_bit(path, {"original": original, "skip": skip})
    restored = restore_low_bit(path, {"original": fresh_original, "skip": fresh_skip})
    assert restored == 2 * (7 * NUM_LAYERS + 1)  # every projection of every layer and the head, both sets
    ids, mask = left_padded_batch([5, 8])
    with torch.no_grad():
        for prepared, from_cache in ((original, fresh_original), (skip, fresh_skip)):
            assert torch.equal(prepared(input_ids=ids, attention_mask=mask).logits,
                               from_cache(input_ids=ids, attention_mask=mask).logits)
    assert not torch.equal(original(input_ids=ids).logits, skip(input_ids=ids).logits)


def test_start_up_cache_is_keyed_by_model_and_adapter_content_mode_and_dtype(tmp_path):
    from model.lowbit.weight_cache import cache_file, file_key

    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"a" * 5000)
    first = cache_file(tmp_path, file_key(model_file), "int8")
    assert first == cache_file(tmp_path, file_key(model_file), "int8")
    assert cache_file(tmp_path, file_key(model_file), "int4") != first
    assert cache_file(tmp_path, file_key(model_file), "int8", torch.bfloat16) != first
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"x" * 3000)
    skip = cache_file(tmp_path, file_key(model_file), "int8", adapter=adapter)
    assert skip != first
    (adapter / "adapter_model.safetensors").write_bytes(b"y" * 3000)  # retrained: same size, new content
    assert cache_file(tmp_path, file_key(model_file), "int8", adapter=adapter) != skip
    model_file.write_bytes(b"b" * 5000)  # a new file, same size and path
    assert cache_file(tmp_path, file_key(model_file), "int8") != first


@pytest.mark.parametrize("mode, beside", [("int8", False), ("int4", True)])
def test_int4_runs_the_lora_beside_and_int8_merges_it(mode, beside, tiny_folder, tmp_path):
    import transformers as tf

    from model.loading import load_model
    from model.lowbit.quantization import LowBitLoraLinear

    if mode == "int4" and not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    adapter = random_lora_adapter(tf.AutoModelForCausalLM.from_pretrained(tiny_folder), tmp_path / "adapter")
    loaded = load_model(str(tiny_folder), device="cpu", adapter=str(adapter), quantize=mode)
    projection = loaded.skip_model.model.layers[0].self_attn.q_proj
    assert isinstance(projection, LowBitLoraLinear) is beside
    if beside:
        assert projection.base is loaded.model.model.layers[0].self_attn.q_proj
    else:
        assert isinstance(projection, Int8WeightLinear) and projection is not loaded.model.model.layers[0].self_attn.q_proj
    # the cost model counts the LoRA's A and B where they run beside the weights; merged, they cost nothing
    cost, base = loaded.cost_model(), loaded.adapter.cost_model()
    lora = sum(m.side_weight_count for m in loaded.skip_model.modules() if isinstance(m, LowBitLoraLinear))
    if beside:
        assert lora > 0 and cost.policy_layer_cost == base.layer_cost + lora / loaded.num_layers
        assert cost.policy_gated is loaded.gated
    else:
        assert cost == base


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_lora_runs_beside_shared_low_bit_weights_with_its_exact_delta(mode, tmp_path):
    from model.loading import lora_side_copy, merged_copy
    from model.lowbit.quantization import LowBitLoraLinear

    if mode == "int4" and not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    model = tiny_model("llama")
    adapter = random_lora_adapter(model, tmp_path / "adapter")
    merged = merged_copy(model, adapter)
    quantize_weights(model, mode)
    side = lora_side_copy(model, adapter)
    wrapped = side.model.layers[1].self_attn.q_proj
    original = model.model.layers[1].self_attn.q_proj
    assert isinstance(wrapped, LowBitLoraLinear) and wrapped.base is original  # shared, not copied
    assert side.model.layers[1].input_layernorm is model.model.layers[1].input_layernorm
    lowbit_tensors = {t.data_ptr() for t in model.buffers()}
    assert all(t.data_ptr() in lowbit_tensors for name, t in side.named_buffers() if "lora" not in name)
    x = torch.randn(2, 3, original.in_features)
    with torch.no_grad():  # the delta is the adapter's own: merged float weights minus the original's
        delta = merged.model.layers[1].self_attn.q_proj(x) - x @ tiny_model("llama").model.layers[1].self_attn.q_proj.weight.T
        torch.testing.assert_close(wrapped(x) - original(x), delta, atol=1e-5, rtol=1e-4)
    ids, mask = left_padded_batch([5, 8])
    schedule = ScheduleConfig(NUM_LAYERS, NUM_LAYERS, 2, warmup=1, decay="linear", decay_length=5)
    with_policy, without = SkipDecoder(model, skip_model=side), SkipDecoder(model)
    state, _ = with_policy.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + 2)
    bare_state, _ = without.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + 2)
    token = torch.tensor([3, 5])
    skipping = schedule.step_layers(1)
    assert len(skipping) < NUM_LAYERS
    assert not torch.allclose(with_policy.decode_step(state, token, skipping),
                              without.decode_step(bare_state, token, skipping))  # the LoRA acts on a bypass
    full = SkipDecoder(model, skip_model=side).generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=4)
    assert full.tokens == SkipDecoder(model).generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=4).tokens


def test_adapters_that_cannot_run_beside_low_bit_weights_are_merged(tmp_path):
    from model.skipdecode.skip_policy import side_lora_config

    model = tiny_model("llama")
    assert side_lora_config(random_lora_adapter(model, tmp_path / "plain")) is not None
    assert side_lora_config(random_lora_adapter(model, tmp_path / "dora", use_dora=True)) is None
    assert side_lora_config(random_lora_adapter(model, tmp_path / "saved", modules_to_save=["lm_head"])) is None
    assert side_lora_config(None) is None


def test_two_stage_head_picks_the_int8_heads_winner_and_scores_it_exactly():
    from model.lowbit.quantization import TwoStageHead

    if not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 4096, bias=False)
    head, int8 = TwoStageHead.from_linear(linear, candidates=16), Int8WeightLinear(linear)
    x = torch.randn(200, 1, 64)
    with torch.no_grad():
        two_stage, reference = head(x), int8(x)
        exact = x @ int8.dequantized_weight().T  # the int8 rows in float32 (the kernel rounds to bf16)
    assert two_stage.shape == reference.shape
    assert torch.equal(two_stage.argmax(-1), exact.argmax(-1))  # the winner: the int8 head's, at full precision
    with torch.no_grad():
        top = head.ranking(x).topk(16, dim=-1).indices  # the candidates the 4-bit scan found
    torch.testing.assert_close(two_stage.gather(-1, top), exact.gather(-1, top), atol=1e-4, rtol=1e-4)
    tail = (two_stage - exact).abs().max()
    assert 0 < tail < 0.25 * exact.abs().max()  # outside the candidates: 4-bit values, close


def _tied(model):
    """The model with its LM head sharing the input embedding's weight (as SmolLM2's does)."""
    model.lm_head.weight = model.model.embed_tokens.weight
    model.config.tie_word_embeddings = True
    return model


@int4_only
def test_a_tied_head_is_rescored_with_the_embeddings_float_rows():
    from model.lowbit.quantization import TwoStageHead

    model = _tied(tiny_model("llama", vocab=4096))
    embedding = model.model.embed_tokens.weight
    float_head = embedding.detach().clone()
    report = quantize_weights(model, "int8")
    head = model.lm_head
    assert report.two_stage_head == "lm_head" and isinstance(head, TwoStageHead) and head.tied
    assert head._tied[0] is embedding  # the embedding's own rows: no second copy
    assert not any(name.endswith("exact_int8") for name, _ in head.named_buffers())
    x = torch.randn(200, 1, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        two_stage, exact = head(x), x @ float_head.T
        top = head.ranking(x).topk(head.candidates, dim=-1).indices
    assert torch.equal(two_stage.argmax(-1), exact.argmax(-1))  # the winner: the FLOAT head's
    torch.testing.assert_close(two_stage.gather(-1, top), exact.gather(-1, top), atol=1e-5, rtol=1e-5)
    untied = quantize_weights(tiny_model("llama", vocab=4096), "int8")  # an untied head keeps int8 rows
    assert untied.two_stage_head == "lm_head"


@int4_only
def test_a_tied_two_stage_head_restores_from_the_cache_onto_the_fresh_embedding(tmp_path):
    from model.lowbit.weight_cache import restore_low_bit, save_low_bit

    original = _tied(tiny_model("llama", vocab=112))  # a vocabulary the 4-bit scan can hold
    fresh = copy.deepcopy(original)
    quantize_weights(original, "int4")
    path = tmp_path / "prepared.safetensors"
    save_low_bit(path, {"original": original})
    restore_low_bit(path, {"original": fresh})
    assert fresh.lm_head.tied and fresh.lm_head._tied[0] is fresh.model.embed_tokens.weight
    ids, mask = left_padded_batch([5, 8])
    ids = ids % 112
    with torch.no_grad():
        assert torch.equal(original(input_ids=ids, attention_mask=mask).logits,
                           fresh(input_ids=ids, attention_mask=mask).logits)


def test_an_int4_lora_rides_in_its_base_kernel_call(tmp_path):
    """The skip policy's A is stacked (4-bit) under the int4 base's rows: one kernel call gives the
    base output (bit for bit the shared module's) and x A^T; the delta stays the adapter's within
    A's 4-bit rounding, and the lean layer uses it for every projection."""
    from model.loading import lora_side_copy
    from model.lowbit.quantization import Int4LoraLinear, LowBitLoraLinear
    from model.skipdecode.lean_layer import LeanLlamaLayer

    if not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    model = tiny_model("llama")
    adapter = random_lora_adapter(model, tmp_path / "adapter")  # rank 4: padded to the kernel's 16 rows
    quantize_weights(model, "int4")
    side = lora_side_copy(model, adapter)
    wrapped = side.model.layers[1].mlp.down_proj
    original = model.model.layers[1].mlp.down_proj
    x = torch.randn(3, 5, original.in_features)
    with torch.no_grad():
        base_before, beside = original(x), wrapped(x)
        lean = Int4LoraLinear.of(wrapped)
        assert lean is not None and lean.stacked.out_features == original.out_features + 16
        assert torch.equal(original(x), base_before)  # re-pointed at the stacked rows: same values
        assert original.weight_int4pack.data_ptr() == lean.stacked.weight_int4pack.data_ptr()  # no second copy
        delta, error = beside - base_before, lean(x) - beside
        assert delta.norm() > 0.1 * base_before.norm()  # a delta worth keeping ...
        assert error.norm() < 0.1 * delta.norm(), (error.norm(), delta.norm())  # ... kept within 4-bit A's rounding
    layer = LeanLlamaLayer.of(side.model.layers[1], side.config)
    plain = LeanLlamaLayer.of(model.model.layers[1], model.config)
    module = lambda call: getattr(call, "module", getattr(call, "__self__", call))  # noqa: E731 (the lean layer holds calls)
    assert isinstance(module(plain.o_proj), Int4WeightLinear)
    # q/k/v fuse where the packed rows concatenate on this CPU (probed; the tiny k/v rows may not)
    projections = [layer.gate_up, layer.o_proj, layer.down_proj] + ([layer.qkv] if plain.qkv is not None else [])
    assert all(isinstance(module(m), Int4LoraLinear) for m in projections)
    assert isinstance(side.model.layers[1].self_attn.o_proj, LowBitLoraLinear)  # the model itself is untouched


def test_an_int4_loras_b_in_int8_rows_matches_its_float_b(tmp_path, monkeypatch):
    """B's rows in int8 (a quarter of float32's bytes at every skipping step) move the LoRA's output
    by B's rounding only: a small fraction of the delta; float B stays where int8 has no kernel."""
    import model.lowbit.quantization as quantization
    from model.loading import lora_side_copy
    from model.lowbit.quantization import Int4LoraLinear, int8_supported

    if not (int4_supported() and int8_supported()):
        pytest.skip("no int4- or int8-weight CPU kernel in this torch build")
    model = tiny_model("llama")
    adapter = random_lora_adapter(model, tmp_path / "adapter")
    quantize_weights(model, "int4")
    wrapped = lora_side_copy(model, adapter).model.layers[0].mlp.gate_proj
    x = torch.randn(4, wrapped.in_features)
    with torch.no_grad():
        base, int8_b = wrapped.base(x), Int4LoraLinear.of(wrapped)
        monkeypatch.setattr(quantization, "int8_supported", lambda: False)
        float_b = Int4LoraLinear.of(wrapped)
        assert int8_b.lora_b_int8 is not None and float_b.lora_b_int8 is None
        delta, error = float_b(x) - base, int8_b(x) - float_b(x)
        assert error.norm() < 0.02 * delta.norm(), (error.norm(), delta.norm())
        assert torch.equal(int8_b(x[:1]), int8_b(x)[:1])  # one decode row reads like a row of a batch


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_projections_decode_call_reads_its_current_buffers(mode):
    """The lean layer's call skips nn.Module's lookups but must follow a buffer re-pointed later
    (fusing) or replaced (``.to``); 3-D input takes the module's own forward."""
    if mode == "int4" and not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32, bias=False)
    module = Int8WeightLinear(linear) if mode == "int8" else Int4WeightLinear.from_linear(linear)
    call, x = module.decode_call(), torch.randn(3, 64)
    assert call.module is module and torch.equal(call(x), module(x))
    other = Int8WeightLinear(torch.nn.Linear(64, 32, bias=False)) if mode == "int8" else Int4WeightLinear.from_linear(torch.nn.Linear(64, 32, bias=False))
    for name, tensor in other.named_buffers():
        setattr(module, name, tensor)  # re-pointed after the call was built
    assert torch.equal(call(x), other(x))
    assert torch.equal(call(x[None]), other(x[None]))
