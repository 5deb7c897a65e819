"""The static KV cache's decoder (fixed shapes per layer set and batch: what a CUDA graph replays)
against today's eager decoder: the same tokens, the same logits to float tolerance, for three
families (a Llama-family one), batch 1 and a left-padded batch of 4, 1x/2x/3x, the prompt at full
depth and at the budget, with the skip policy's two weight sets and its bridge, sampled and
greedy. Then the graph runner: its bookkeeping on the CPU, graphs against eager on CUDA.

Tests marked ``device`` run on SKIPDECODE_TEST_DEVICE (tests/support.py; default cpu)."""

import pytest
import torch

from model.skipdecode.cuda_graphs import CudaGraphStep, GraphLRU, rounded_capacity
from model.skipdecode.decoder import SamplingConfig, SkipDecoder
from model.skipdecode.schedule import ScheduleConfig, full_schedule, solve_schedule
from model.skipdecode.static_decoder import EagerStep, StaticSkipDecoder, StepBuffers, layer_sets_needed, static_decoder
from tests.model.skipdecode.test_skip_policy import SCHEDULES as POLICY_SCHEDULES
from tests.model.skipdecode.test_skip_policy import _policy
from tests.support import NUM_LAYERS, TEST_DEVICE, left_padded_batch, tiny_model

NEW_TOKENS = 12
BATCHES = {"batch1": [6], "padded4": [7, 4, 9, 5]}
FAMILIES3 = ("llama", "opt", "gpt2")  # a Llama-family model (the lean layer) and two transformers layers


@pytest.fixture(scope="module", params=FAMILIES3)
def family_model(request):
    return request.param, tiny_model(request.param, device=TEST_DEVICE)


def _schedule(speedup: float, prompt_at_full_depth: bool) -> ScheduleConfig:
    if speedup == 1:
        return full_schedule(NUM_LAYERS)
    solved = solve_schedule(NUM_LAYERS, speedup, warmup=1, decay_length=NEW_TOKENS - 1,
                            prompt_at_full_depth=prompt_at_full_depth)
    assert abs(solved.layer_speedup - speedup) < 0.35  # really a 2x / 3x run, not a near-full one
    return solved.config


def _step_logits(decoder, ids, mask, schedule, tokens):
    """Logits of every generated position (B, N, V): prefill, then decode steps fed ``tokens``."""
    state, logits = decoder.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + tokens.shape[1])
    collected = [logits]
    for step in range(tokens.shape[1] - 1):
        collected.append(decoder.decode_step(state, tokens[:, step], schedule.step_layers(step)))
    return torch.stack(collected, dim=1)


RUNS = [(1, "prompt_full"), (2, "prompt_full"), (2, "prompt_at_budget"), (3, "prompt_full"), (3, "prompt_at_budget")]


@pytest.mark.device
@pytest.mark.parametrize(("speedup", "prompt"), RUNS, ids=[f"{s}x-{p}" for s, p in RUNS])  # 1x: no budget to be at
@pytest.mark.parametrize("batch", list(BATCHES))
def test_static_cache_decodes_token_for_token_as_the_eager_decoder(family_model, batch, speedup, prompt):
    family, model = family_model
    schedule = _schedule(speedup, prompt == "prompt_full")
    ids, mask = left_padded_batch(BATCHES[batch], device=TEST_DEVICE)
    eager = SkipDecoder(model)
    static = static_decoder(eager)
    expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS)
    got = static.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS)
    assert got.tokens == expected.tokens, family
    assert got.step_layers == expected.step_layers
    tokens = torch.tensor(expected.tokens, device=ids.device)
    torch.testing.assert_close(_step_logits(static, ids, mask, schedule, tokens),
                               _step_logits(eager, ids, mask, schedule, tokens), atol=2e-4, rtol=1e-4)


@pytest.mark.device
@pytest.mark.parametrize("family", FAMILIES3)
@pytest.mark.parametrize("name", ["linear-warmup1", "first_last", "prompt_at_budget", "ranked"])
def test_static_cache_runs_the_skip_policy_and_its_bridge_as_the_eager_decoder(family, name):
    schedule = POLICY_SCHEDULES[name]
    base, _, merged, bridge = _policy(family, TEST_DEVICE)
    ids, mask = left_padded_batch(BATCHES["padded4"], device=TEST_DEVICE)
    eager = SkipDecoder(base, skip_model=merged, bridge=bridge)
    static = static_decoder(eager)
    expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS)
    assert static.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens == expected.tokens
    tokens = torch.tensor(expected.tokens, device=ids.device)
    with_policy = _step_logits(static, ids, mask, schedule, tokens)
    torch.testing.assert_close(with_policy, _step_logits(eager, ids, mask, schedule, tokens), atol=2e-4, rtol=1e-4)
    # the policy's weights and bridge really act in the static step (this comparison could fail)
    without = _step_logits(static_decoder(SkipDecoder(base)), ids, mask, schedule, tokens)
    assert (with_policy - without).abs().max() > 1e-2


@pytest.mark.device
def test_seeded_sampling_draws_the_same_tokens_on_the_static_cache():
    model = tiny_model("llama", device=TEST_DEVICE)
    ids, mask = left_padded_batch(BATCHES["padded4"], device=TEST_DEVICE)
    schedule = _schedule(2, True)
    sampling = SamplingConfig(temperature=1.0, top_p=0.9, seed=5)
    eager = SkipDecoder(model)
    expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS, sampling=sampling).tokens
    assert static_decoder(eager).generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS, sampling=sampling).tokens == expected
    greedy = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens
    assert expected != greedy  # the draw really samples


@pytest.mark.device
@pytest.mark.parametrize("family", FAMILIES3)
def test_unwritten_columns_are_hidden_whatever_they_hold(family):
    """The step attends over the whole capacity: the mask alone hides the columns not yet written.
    Filling them with huge values must change nothing; without the mask it would change everything."""
    model = tiny_model(family, device=TEST_DEVICE)
    ids, mask = left_padded_batch(BATCHES["padded4"], device=TEST_DEVICE)
    schedule = _schedule(2, True)
    decoder = static_decoder(SkipDecoder(model))
    clean_state, clean = decoder.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + 4)
    state, logits = decoder.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + 4)
    buffers = state.cache
    with torch.inference_mode():  # the buffers are the decoder's inference tensors
        for keys, values in zip(buffers._keys, buffers._values):
            keys[:, :, ids.shape[1]:] = 1e4
            values[:, :, ids.shape[1]:] = -1e4
    token = logits.argmax(-1)
    for step in range(3):
        layers = schedule.step_layers(step)
        clean = decoder.decode_step(clean_state, token, layers)
        poisoned = decoder.decode_step(state, token, layers)
        torch.testing.assert_close(poisoned, clean, atol=1e-5, rtol=1e-5)
        token = clean.argmax(-1)
    assert state.length == ids.shape[1] + 3 and buffers.lengths[schedule.step_layers(2)[-1]] == state.length


@pytest.mark.device
def test_the_logit_lens_trace_runs_on_the_static_buffers():
    model = tiny_model("llama", device=TEST_DEVICE)
    ids, mask = left_padded_batch(BATCHES["padded4"], device=TEST_DEVICE)
    schedule = _schedule(2, True)
    eager = SkipDecoder(model)
    expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens
    static = static_decoder(eager)
    events = list(static.stream(ids, mask, schedule, max_new_tokens=NEW_TOKENS, trace_row=1))
    assert [event.record.tokens for event in events][-1] == expected
    assert all(len(event.trace) == len(event.layers) for event in events)


def test_a_layer_set_that_breaks_the_prefix_gets_a_clear_error():
    model = tiny_model("llama")
    ids, mask = left_padded_batch([5, 3])
    decoder = static_decoder(SkipDecoder(model))
    state, logits = decoder.prefill(ids, mask, (0, 1, 2), ids.shape[1] + 4)  # a prefill at 3 layers
    with pytest.raises(RuntimeError, match="not nested"):
        decoder.decode_step(state, logits.argmax(-1), (0, 1, 2, 3))  # layer 3 never ran the prompt
    full = static_decoder(SkipDecoder(model))
    state, logits = full.prefill(ids, mask, tuple(range(NUM_LAYERS)), ids.shape[1] + 1)
    full.decode_step(state, logits.argmax(-1), tuple(range(NUM_LAYERS)))
    with pytest.raises(RuntimeError, match="capacity"):
        full.decode_step(state, logits.argmax(-1), tuple(range(NUM_LAYERS)))


def test_static_decoder_keeps_the_decoders_weights_bridge_and_tokens():
    base, _, merged, bridge = _policy("llama")
    eager = SkipDecoder(base, skip_model=merged, bridge=bridge, eos_token_ids=(3, 4), pad_token_id=2)
    static = static_decoder(eager)
    assert isinstance(static, StaticSkipDecoder) and isinstance(static.runner, EagerStep)
    assert static.model is base and static.skip_adapter.model is merged and static.bridge is bridge
    assert (static.eos_token_ids, static.pad_token_id) == ((3, 4), 2)


# --- the graph runner's bookkeeping (no CUDA needed) -----------------------------------------


@pytest.mark.parametrize("speedup", [1.5, 2, 3, 4])
@pytest.mark.parametrize("decay", ["linear", "cosine", "exponential"])
def test_a_run_needs_at_most_max_minus_min_plus_one_layer_sets(speedup, decay):
    solved = solve_schedule(30, speedup, decay=decay, warmup=2, decay_length=64)
    config = solved.config
    sets = layer_sets_needed(config, 200)
    assert len(sets) <= config.max_layers - config.min_layers + 1
    assert len(set(sets)) == len(sets)  # distinct, in order of first use
    assert [len(s) for s in sets] == sorted({len(s) for s in sets}, reverse=True)  # depth only falls
    assert {tuple(config.step_layers(step)) for step in range(199)} == set(sets)
    assert len(layer_sets_needed(full_schedule(30), 200)) == 1


def test_graph_lru_evicts_the_least_recently_used_by_count_and_by_bytes():
    lru = GraphLRU(max_count=3, max_bytes=100)
    assert lru.put("a", 1, 10) == [] and lru.put("b", 2, 10) == [] and lru.put("c", 3, 10) == []
    assert lru.get("a") == 1  # a is now the most recent
    assert lru.put("d", 4, 10) == ["b"]  # count bound: the least recently used goes
    assert lru.keys() == ["c", "a", "d"]
    assert lru.put("e", 5, 85) == ["c", "a"]  # count drops c; then 10 + 10 + 85 > 100 bytes drops a
    assert lru.keys() == ["d", "e"] and lru.nbytes == 95 and lru.evictions == 3
    assert lru.put("huge", 6, 500) == ["d", "e"] and lru.keys() == ["huge"]  # the newest always stays
    assert lru.get("missing") is None and "huge" in lru and len(lru) == 1
    with pytest.raises(ValueError, match="room for one graph"):
        GraphLRU(0, 100)


def test_capacities_round_up_so_runs_share_graphs_but_never_pass_the_context():
    assert rounded_capacity(1, 2048) == 256 and rounded_capacity(256, 2048) == 256
    assert rounded_capacity(257, 2048) == 512
    assert rounded_capacity(2000, 2048) == 2048 and rounded_capacity(300, 300) == 300
    assert rounded_capacity(5, 8192, multiple=64) == 64


def test_the_graph_runner_leases_buffers_per_model_batch_and_capacity_and_frees_them_with_the_run():
    model = tiny_model("llama")
    other = tiny_model("llama", seed=1)
    runner = CudaGraphStep()
    decoder, second = SkipDecoder(model), SkipDecoder(other)
    device = torch.device("cpu")
    first = runner.lease(decoder, 2, 256, device)
    assert isinstance(first, StepBuffers) and first.free
    state = type("State", (), {})()  # any object a weak reference can point at
    first.claim(state)
    concurrent = runner.lease(decoder, 2, 256, device)  # a race's second stream: its own buffers
    assert concurrent is not first
    assert runner.lease(decoder, 4, 256, device) is not first and runner.lease(second, 2, 256, device) is not first
    del state  # the run is over: its buffers (and the graphs captured on them) serve the next run
    assert first.free and runner.lease(decoder, 2, 256, device) in (first, concurrent)
    assert runner.report().graphs == 0 and runner.capacity_for(10, 2048) == 256


# --- graphs on CUDA ------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or TEST_DEVICE.type != "cuda",
                                reason="CUDA graphs need a CUDA device (SKIPDECODE_TEST_DEVICE=cuda)")


@pytest.mark.device
@needs_cuda
@pytest.mark.parametrize("family", FAMILIES3)
@pytest.mark.parametrize("speedup", [1, 2, 3], ids=["1x", "2x", "3x"])
def test_cuda_graphs_decode_token_for_token_as_eager(family, speedup):
    model = tiny_model(family, device=TEST_DEVICE)
    ids, mask = left_padded_batch(BATCHES["padded4"], device=TEST_DEVICE)
    schedule = _schedule(speedup, True)
    eager = SkipDecoder(model)
    runner = CudaGraphStep()
    graphs = static_decoder(eager, runner)
    expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS)
    assert graphs.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens == expected.tokens
    needed = len(layer_sets_needed(schedule, NEW_TOKENS))
    assert runner.report().graphs == needed and runner.report().seconds > 0
    assert graphs.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens == expected.tokens
    assert runner.report().graphs == needed  # the second request replays, captures nothing


@pytest.mark.device
@needs_cuda
@pytest.mark.parametrize("family", FAMILIES3)
def test_cuda_graphs_run_the_skip_policy_and_bridge_and_sample_as_eager(family):
    base, _, merged, bridge = _policy(family, TEST_DEVICE)
    ids, mask = left_padded_batch(BATCHES["padded4"], device=TEST_DEVICE)
    schedule = POLICY_SCHEDULES["linear-warmup1"]
    eager = SkipDecoder(base, skip_model=merged, bridge=bridge)
    graphs = static_decoder(eager, CudaGraphStep(max_graphs=2))  # fewer graphs than layer sets: evictions
    for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0, seed=3)):
        expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS, sampling=sampling).tokens
        assert graphs.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS, sampling=sampling).tokens == expected
    assert graphs.runner.report().evicted > 0 and graphs.runner.report().kept <= 2


def test_a_layer_set_whose_capture_fails_runs_eagerly_and_is_not_captured_again(monkeypatch):
    model = tiny_model("llama")
    ids, mask = left_padded_batch(BATCHES["padded4"])
    schedule = POLICY_SCHEDULES["linear-warmup1"]  # 6 -> 2 layers: five layer sets
    runner = CudaGraphStep()
    tries = []

    def refuse(decoder, buffers, layers):
        tries.append(layers)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(runner, "_capture", refuse)
    eager = SkipDecoder(model)
    expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens
    graphs = static_decoder(eager, runner)
    assert graphs.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens == expected
    assert len(tries) == len(layer_sets_needed(schedule, NEW_TOKENS)) == len(runner.failed) > 1
    assert graphs.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens == expected
    assert len(tries) == len(runner.failed)  # each failed layer set was tried once, then ran eagerly
    assert len(runner.graphs) == 0


def test_free_buffers_past_the_bound_go_with_their_graphs(monkeypatch):
    import model.skipdecode.cuda_graphs as cuda_graphs

    monkeypatch.setattr(cuda_graphs, "MAX_FREE_BUFFERS", 1)
    model = tiny_model("llama")
    decoder, runner, cpu = SkipDecoder(model), CudaGraphStep(), torch.device("cpu")
    first, second = runner.lease(decoder, 1, 256, cpu), runner.lease(decoder, 1, 512, cpu)
    runner.graphs.put((first, model, None, (0, 1)), "graph of the first", 10)
    runner.graphs.put((second, model, None, (0, 1)), "graph of the second", 10)
    third = runner.lease(decoder, 1, 768, cpu)  # three free buffers, one may stay: the two oldest go
    assert runner.lease(decoder, 1, 256, cpu) is not first
    assert len(runner.graphs) == 0 and third.free


def test_a_server_replays_graphs_on_cuda_only_and_never_on_zero_gpu(environment_settings):
    from model.loading import LoadedModel, cuda_graphs_by_default, with_cuda_graphs

    environment_settings(SPACES_ZERO_GPU="", SKIPDECODE_CUDA_GRAPHS="")
    cuda = torch.device("cuda")
    assert cuda_graphs_by_default(cuda) and not cuda_graphs_by_default(torch.device("cpu"))  # on by default
    environment_settings(SPACES_ZERO_GPU="", SKIPDECODE_CUDA_GRAPHS="1")
    assert cuda_graphs_by_default(cuda) and not cuda_graphs_by_default(torch.device("cpu"))
    environment_settings(SPACES_ZERO_GPU="", SKIPDECODE_CUDA_GRAPHS="0")
    assert not cuda_graphs_by_default(cuda)
    environment_settings(SKIPDECODE_CUDA_GRAPHS="1", SPACES_ZERO_GPU="true")
    assert not cuda_graphs_by_default(cuda)
    tokenizer = type("Tokenizer", (), {"eos_token_id": None, "pad_token_id": 0, "chat_template": None})()
    loaded = LoadedModel(name="tiny", model=tiny_model("llama"), tokenizer=tokenizer, device=torch.device("cpu"),
                         dtype=torch.float32)
    assert not isinstance(with_cuda_graphs(loaded).full_decoder(), StaticSkipDecoder)  # on the CPU: eager
    with_cuda_graphs(loaded, enabled=True)
    full, skip = loaded.full_decoder(), loaded.skip_decoder()
    assert isinstance(full, StaticSkipDecoder) and isinstance(skip, StaticSkipDecoder)
    assert full.runner is skip.runner is loaded.graph_runner  # one runner: one bound for both decoders' graphs
