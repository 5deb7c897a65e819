"""The heart of the suite: the decoder against transformers and against its teacher-forced twin.

Tests marked ``device`` run on SKIPDECODE_TEST_DEVICE (tests/support.py; default cpu)."""

import pytest
import torch

from model.skipdecode.decoder import (
    SamplingConfig,
    SkipDecoder,
    execution_mask,
    masked_forward,
    run_to_end,
    sample_next,
)
from model.skipdecode.schedule import ScheduleConfig, full_schedule
from tests.support import FAMILIES, NUM_LAYERS, TEST_DEVICE, left_padded_batch, tiny_model

LENGTHS = [7, 4, 9]  # different prompt lengths -> left padding
NEW_TOKENS = 12


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, tiny_model(request.param, device=TEST_DEVICE)


def skip_schedules():
    yield ScheduleConfig(NUM_LAYERS, 6, 2, decay="linear", warmup=1, decay_length=8)
    yield ScheduleConfig(NUM_LAYERS, 5, 3, decay="cosine", warmup=2, decay_length=6, order="first_last")
    yield ScheduleConfig(NUM_LAYERS, 5, 2, decay="power", warmup=1, decay_length=10, prompt_at_full_depth=False)


@pytest.mark.device
def test_full_schedule_greedy_equals_transformers_generate(family_model):
    family, model = family_model
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    decoder = SkipDecoder(model, eos_token_ids=(), pad_token_id=0)
    ours = decoder.generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=NEW_TOKENS)
    with torch.no_grad():
        reference = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
            do_sample=False, pad_token_id=0,
        )
    expected = reference[:, ids.shape[1]:].tolist()
    assert ours.tokens == expected, family
    assert ours.layers_per_step == [NUM_LAYERS] * (NEW_TOKENS - 1)


def _cached_logits(decoder, ids, mask, schedule, tokens):
    """Logits of every generated position from prefill + decode_step, feeding ``tokens``."""
    state, logits = decoder.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + tokens.shape[1])
    collected = [logits]
    for step in range(tokens.shape[1] - 1):
        collected.append(decoder.decode_step(state, tokens[:, step], schedule.step_layers(step)))
    return torch.stack(collected, dim=1)  # (B, N, V)


@pytest.mark.device
@pytest.mark.parametrize("schedule", list(skip_schedules()), ids=["linear", "cosine-first_last", "power-prompt_at_budget"])
def test_cached_skipdecode_logits_equal_teacher_forced_masked_forward(family_model, schedule):
    family, model = family_model
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    decoder = SkipDecoder(model)
    generated = torch.tensor(decoder.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens, device=ids.device)
    cached = _cached_logits(decoder, ids, mask, schedule, generated)

    sequence = torch.cat([ids, generated], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(generated)], dim=1)
    executes = execution_mask(schedule, ids.shape[1], sequence.shape[1])
    with torch.no_grad():
        forced = masked_forward(model, sequence, full_mask, executes)
    # position P - 1 + j predicts generated token j
    forced = forced[:, ids.shape[1] - 1: -1]
    torch.testing.assert_close(cached, forced, atol=2e-4, rtol=1e-4, msg=family)


@pytest.mark.device
def test_skipping_really_changes_the_output(family_model):
    """Guard against a decoder that ignores its schedule: skipping must change the logits."""
    _, model = family_model
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    decoder = SkipDecoder(model)
    tokens = torch.tensor(decoder.generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=6).tokens, device=ids.device)
    full = _cached_logits(decoder, ids, mask, full_schedule(NUM_LAYERS), tokens)
    skipped = _cached_logits(decoder, ids, mask, ScheduleConfig(NUM_LAYERS, 3, 2, decay_length=4), tokens)
    assert not torch.allclose(full[:, 1:], skipped[:, 1:], atol=1e-3)


@pytest.mark.device
@pytest.mark.parametrize("schedule", list(skip_schedules())[:2], ids=["linear", "cosine-first_last"])
def test_a_row_in_a_padded_batch_equals_the_row_alone(family_model, schedule):
    family, model = family_model
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    decoder = SkipDecoder(model)
    batched = decoder.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS)
    for row, length in enumerate(LENGTHS):
        alone_ids = ids[row:row + 1, ids.shape[1] - length:]
        alone = decoder.generate(alone_ids, torch.ones_like(alone_ids), schedule, max_new_tokens=NEW_TOKENS)
        assert alone.tokens[0] == batched.tokens[row], (family, row)
        assert alone.layers_per_step == batched.layers_per_step


@pytest.mark.device
def test_every_row_gets_the_same_exit_and_events_stream(family_model):
    _, model = family_model
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    schedule = ScheduleConfig(NUM_LAYERS, 6, 2, decay_length=8)
    events = list(SkipDecoder(model).stream(ids, mask, schedule, max_new_tokens=NEW_TOKENS))
    assert [e.step for e in events] == list(range(-1, NEW_TOKENS - 1))
    assert events[0].layers == tuple(range(NUM_LAYERS))
    for event in events[1:]:
        assert event.layers == schedule.step_layers(event.step)
        assert len(event.token_ids) == len(LENGTHS) and event.seconds > 0


@pytest.mark.device
def test_eos_finishes_rows_independently_and_stops_when_all_done():
    model = tiny_model("llama", device=TEST_DEVICE)
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    free = SkipDecoder(model).generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=NEW_TOKENS)
    eos = free.tokens[0][3]  # row 0 emits this at step 3
    result = SkipDecoder(model, eos_token_ids=(eos,), pad_token_id=0).generate(
        ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=NEW_TOKENS
    )
    assert result.tokens[0] == free.tokens[0][: free.tokens[0].index(eos)]
    assert result.finish_reasons[0] == "eos"
    for row in range(1, len(LENGTHS)):
        expected = free.tokens[row]
        if eos in expected:
            expected = expected[: expected.index(eos)]
        assert result.tokens[row] == expected


@pytest.mark.device
def test_stop_check_and_cancel_end_generation():
    model = tiny_model("llama", device=TEST_DEVICE)
    ids, mask = left_padded_batch([5], device=TEST_DEVICE)
    decoder = SkipDecoder(model)
    stopped = decoder.generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=NEW_TOKENS,
                               stop_check=lambda row, tokens: len(tokens) >= 4)
    assert len(stopped.tokens[0]) == 4 and stopped.finish_reasons == ["stop"]
    # Cancel once two decode steps have been seen: the run ends there and says so.
    seen_steps = []
    stream = decoder.stream(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=NEW_TOKENS,
                            should_cancel=lambda: len(seen_steps) >= 2)
    while True:
        try:
            event = next(stream)
        except StopIteration as end:
            cancelled = end.value
            break
        if event.step >= 0:
            seen_steps.append(event)
    assert len(seen_steps) == 2 and len(cancelled.step_layers) == 2 and cancelled.cancelled
    assert len(cancelled.tokens[0]) == 3  # the prefill's token and two steps'


@pytest.mark.device
def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy():
    model = tiny_model("qwen2", device=TEST_DEVICE)
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    decoder = SkipDecoder(model)
    schedule = ScheduleConfig(NUM_LAYERS, 6, 3, decay_length=8)
    sampling = SamplingConfig(temperature=1.5, top_p=0.9, seed=7)
    first = decoder.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS, sampling=sampling)
    second = decoder.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS, sampling=sampling)
    greedy = decoder.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS)
    assert first.tokens == second.tokens
    assert first.tokens != greedy.tokens
    top1 = decoder.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS,
                            sampling=SamplingConfig(temperature=1.0, top_k=1, seed=3))
    assert top1.tokens == greedy.tokens


@pytest.mark.device
def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], device=TEST_DEVICE))
    counts = torch.zeros(4)
    generator = torch.Generator(device=TEST_DEVICE).manual_seed(0)
    for _ in range(400):
        counts[int(sample_next(logits, SamplingConfig(temperature=1.0, top_p=0.75), generator))] += 1
    assert counts[2] == 0 and counts[3] == 0 and counts[0] > counts[1] > 0


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(temperature=float("nan")), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2)])
def test_bad_sampling_settings_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


@pytest.mark.device
def test_decoder_rejects_bad_lengths_and_foreign_schedules():
    model = tiny_model("gpt2", device=TEST_DEVICE)
    ids, mask = left_padded_batch([5], device=TEST_DEVICE)
    decoder = SkipDecoder(model)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=0)
    with pytest.raises(ValueError, match="context"):
        decoder.generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=300)
    with pytest.raises(ValueError, match="layers"):
        decoder.generate(ids, mask, full_schedule(NUM_LAYERS + 2), max_new_tokens=4)


def test_unsupported_family_gets_a_clear_error():
    import transformers as tf

    from model.skipdecode.architectures import adapter_for

    model = tf.BloomForCausalLM(tf.BloomConfig(vocab_size=50, hidden_size=32, n_layer=2, n_head=4))
    with pytest.raises(ValueError, match="not supported"):
        adapter_for(model)


@pytest.mark.device
def test_cancel_during_prefill_stops_between_layers_with_no_tokens():
    """The cancel check runs before each prefill layer: the third check stops the run two layers
    in, before any token or decode step, for every row of the batch."""
    model = tiny_model("llama", device=TEST_DEVICE)
    ids, mask = left_padded_batch([9, 5], device=TEST_DEVICE)
    decoder = SkipDecoder(model)
    layers_run, checks = [], []
    original = decoder.adapter.run_layer

    def counting(index, *args, **kwargs):
        layers_run.append(index)
        return original(index, *args, **kwargs)

    decoder.adapter.run_layer = counting
    result = decoder.generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=NEW_TOKENS,
                              should_cancel=lambda: checks.append(1) or len(checks) > 2)
    assert result.cancelled and result.tokens == [[], []] and result.step_layers == []
    assert len(checks) == 3 and layers_run == [0, 1]


@pytest.mark.device
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_trace_holds_the_row_after_every_layer_that_ran_and_its_last_entry_gives_the_token(family):
    model = tiny_model(family, device=TEST_DEVICE)
    ids, mask = left_padded_batch([4, 7], device=TEST_DEVICE)
    decoder = SkipDecoder(model)
    schedule = ScheduleConfig(NUM_LAYERS, NUM_LAYERS, 2, warmup=1, decay="linear", decay_length=6)
    stream = decoder.stream(ids, mask, schedule, max_new_tokens=6, trace_row=0)
    events = []
    while True:
        try:
            events.append(next(stream))
        except StopIteration:
            break
    assert len(events) == 6
    for event in events:
        assert [layer for layer, _ in event.trace] == list(event.layers)
        last_hidden = event.trace[-1][1]
        with torch.inference_mode():
            logits = decoder.adapter.logits(last_hidden[None, None])[0, -1]
        assert int(logits.argmax()) == event.token_ids[0]
    untraced = decoder.generate(ids, mask, schedule, max_new_tokens=6)
    assert untraced.tokens[0] == [e.token_ids[0] for e in events][: len(untraced.tokens[0])]  # tracing changes nothing
    with pytest.raises(ValueError, match="trace_row"):
        decoder.generate(ids, mask, schedule, max_new_tokens=2, trace_row=2)


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_accessors_read_the_model_not_a_family_default(family):
    """hidden_size is the embedding width of every family (GPT-2 names it n_embd); GGUF markers
    go so the weights can be saved."""
    from model.skipdecode.architectures import adapter_for, forget_gguf_quantization

    model = tiny_model(family)
    embedding = model.get_input_embeddings().weight
    assert adapter_for(model).hidden_size == embedding.shape[1]
    model.config.quantization_config, model.is_quantized = {"quant_method": "gguf"}, True
    forget_gguf_quantization(model)
    assert not hasattr(model.config, "quantization_config") and not model.is_quantized and model.hf_quantizer is None


@pytest.mark.slow
def test_a_prepared_run_is_tokenized_and_solved_once_and_streams_like_the_request(tiny_folder):
    from model.generation.generator import TextGenerator
    from model.generation.runs import GenerationRequest
    from model.generation.schedules import ScheduleRequest
    from model.loading import load_model

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    request = GenerationRequest(prompts=("Hello there", "Name a fruit"), schedule=ScheduleRequest(target_speedup=2.0),
                                max_new_tokens=6)
    run = generator.prepare(request)
    assert run.ids.shape == run.mask.shape and run.ids.shape[0] == 2
    assert generator.schedules.schedule_for(request.schedule, 6) is run.schedule  # solved once, then kept
    full = generator.with_schedule(run, ScheduleRequest(full=True))
    assert full.ids is run.ids and full.schedule.config.min_layers == generator.num_layers
    encode, calls = generator.text._encode_one, []
    generator.text._encode_one = lambda *args, **kwargs: calls.append(args) or encode(*args, **kwargs)
    from_run = run_to_end(generator.stream(run))
    assert calls == []  # streaming a prepared run does not tokenize again
    assert from_run.decode.tokens == generator.generate(request).decode.tokens
    assert len(calls) == 2  # a plain request is prepared on the way: each prompt tokenized once
    checked = generator.prepare(request, solve=False)  # an admission check: tokenized, the schedule only checked
    assert checked.schedule is None and torch.equal(checked.ids, run.ids) and checked.positions == run.positions
    with pytest.raises(ValueError, match="only checked"):
        next(generator.stream(checked))


@pytest.mark.device
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_llama_family_layers_run_the_lean_path_and_equal_transformers_layer(family):
    from model.skipdecode.architectures import adapter_for
    from model.skipdecode.kv_cache import PrefixKVCache, position_ids_from_mask
    from model.skipdecode.lean_layer import LeanLlamaLayer

    model = tiny_model(family, device=TEST_DEVICE)
    adapter = adapter_for(model)
    ids, mask = left_padded_batch(LENGTHS, device=TEST_DEVICE)
    lean = LeanLlamaLayer.of(adapter.layers[1], model.config)
    assert lean is not None
    positions = position_ids_from_mask(mask)
    with torch.no_grad():
        hidden = adapter.embed(ids, positions)
        inputs = adapter.layer_inputs(hidden, mask.bool(), positions)
        ours, theirs = PrefixKVCache(NUM_LAYERS, 32), PrefixKVCache(NUM_LAYERS, 32)
        out = lean(hidden, inputs, ours)
        expected = adapter.layers[1](hidden, attention_mask=inputs.mask, position_ids=positions, past_key_values=theirs,
                                     use_cache=True, position_embeddings=inputs.extra["position_embeddings"])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    length = ids.shape[1]
    assert ours.lengths == theirs.lengths and ours.lengths[1] == length  # the same keys and values were cached
    for mine, reference in ((ours._keys[1], theirs._keys[1]), (ours._values[1], theirs._values[1])):
        torch.testing.assert_close(mine[:, :, :length], reference[:, :, :length], atol=1e-5, rtol=1e-5)


@pytest.mark.device
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fused_rms_norm_is_the_modules_math_and_steps_aside_where_it_is_not(family):
    from model.skipdecode.lean_layer import FusedRMSNorm, fused_rms_norm

    norm = tiny_model(family, device=TEST_DEVICE).model.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.normal_()  # not the all-ones start: the weight must really be applied
        x = torch.randn(2, 5, norm.weight.shape[0]).to(TEST_DEVICE) * 3
        fused = fused_rms_norm(norm)
        assert isinstance(fused, FusedRMSNorm)
        torch.testing.assert_close(fused(x), norm(x), atol=1e-6, rtol=1e-5)
        halves = x.to(torch.bfloat16)  # another dtype: the module itself, bit for bit
        norm.to(torch.bfloat16)
        assert torch.equal(fused(halves), norm(halves))
    layer_norm = torch.nn.LayerNorm(8)
    assert fused_rms_norm(layer_norm) is layer_norm


@pytest.mark.device
@pytest.mark.parametrize("module", ["modeling_llama", "modeling_mistral", "modeling_qwen2", "modeling_qwen3"])
def test_rotating_q_and_k_together_is_each_familys_own_rotary(module):
    import importlib

    from model.skipdecode.lean_layer import STANDARD_ROTARY_MODULES, rotate_together

    family = importlib.import_module(f"transformers.models.{module.split('_', 1)[1]}.{module}")
    assert module in STANDARD_ROTARY_MODULES
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 5, 8).to(TEST_DEVICE), torch.randn(2, 2, 5, 8).to(TEST_DEVICE)  # GQA: 4 query heads, 2 key heads
    angles = torch.randn(2, 5, 4).to(TEST_DEVICE).repeat(1, 1, 2)  # (B, T, D): the two halves share their angles
    cos, sin = angles.cos(), angles.sin()
    expected_q, expected_k = family.apply_rotary_pos_emb(q, k, cos, sin)
    together = rotate_together(torch.cat([q, k], dim=1), cos, sin)
    torch.testing.assert_close(together, torch.cat([expected_q, expected_k], dim=1), atol=1e-6, rtol=1e-6)


@pytest.mark.device
def test_a_decode_steps_rotation_matrices_are_the_llama_rotary_per_row():
    """x @ R == x * cos + rotate_half(x) * sin, each row at its own position (left padding), built
    once per step and shared."""
    from model.skipdecode.kv_cache import LayerInputs
    from model.skipdecode.lean_layer import rotate_together, step_rotation

    torch.manual_seed(0)
    heads = torch.randn(2, 6, 1, 8).to(TEST_DEVICE)  # (B, Hq + Hkv, 1, D): one new position per row
    angles = torch.randn(2, 1, 4).to(TEST_DEVICE).repeat(1, 1, 2)  # rows at different positions
    cos, sin = angles.cos(), angles.sin()
    inputs = LayerInputs(mask=None, position_ids=torch.tensor([[3], [7]], device=TEST_DEVICE), extra={"position_embeddings": (cos, sin)})
    rotation = step_rotation(inputs)
    assert rotation.shape == (2, 1, 8, 8) and step_rotation(inputs) is rotation  # built once per step
    torch.testing.assert_close(torch.matmul(heads, rotation), rotate_together(heads, cos, sin), atol=1e-6, rtol=1e-6)


def test_a_layer_the_lean_path_does_not_know_runs_transformers_forward():
    from model.skipdecode.lean_layer import LeanLlamaLayer

    model = tiny_model("llama")
    model.config.hidden_act = "gelu"
    assert LeanLlamaLayer.fits(model.model.layers[0], model.config) is False
    assert LeanLlamaLayer.of(model.model.layers[0], model.config) is None


def test_lean_layers_follow_replaced_projections_and_free_their_model():
    import gc
    import weakref

    from model.lowbit.quantization import int8_supported, quantize_weights
    from model.skipdecode.lean_layer import LeanLlamaLayer

    if not int8_supported():
        pytest.skip("no int8-weight CPU kernel in this torch build")
    model = tiny_model("llama")
    ids, mask = left_padded_batch(LENGTHS)
    SkipDecoder(model).generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=3)  # builds the lean layers
    float_lean = LeanLlamaLayer.of(model.model.layers[0], model.config)
    quantize_weights(model, "int8")  # every projection replaced: the lean layer must not run the old ones
    int8_lean = LeanLlamaLayer.of(model.model.layers[0], model.config)
    assert int8_lean is not float_lean and int8_lean.qkv is not None  # rebuilt, and fused now
    SkipDecoder(model).generate(ids, mask, full_schedule(NUM_LAYERS), max_new_tokens=3)
    alive = weakref.ref(model)
    del model, float_lean, int8_lean
    gc.collect()
    assert alive() is None  # the lean-layer cache does not keep a model (and its weights) alive
