"""The compiled layers' step (one compiled function per layer kind and batch bucket, every layer and
layer set reusing it) against the eager decoder: token for token and logits within float32
tolerance for Llama-family models, OPT and GPT-2, batch 1 and a padded batch, 1x/2x/3x, the skip
policy and its bridge; the pure steps uncompiled first (every family), then compiled by inductor on
the CPU. Then the batch buckets (a batch padded up to its bucket, padding rows never shown) and the
fallbacks (a layer with no pure step, a compile that fails).

Tests marked ``device`` run on SKIPDECODE_TEST_DEVICE (tests/support.py; default cpu)."""

import pytest
import torch
from torch import nn

from model.skipdecode.compiled_layers import CompiledStep, layer_kind
from model.skipdecode.cuda_graphs import CudaGraphStep
from model.skipdecode.decoder import SamplingConfig, SkipDecoder
from model.skipdecode.static_decoder import BATCH_BUCKETS, EagerStep, batch_bucket, static_decoder
from tests.model.skipdecode.test_skip_policy import SCHEDULES as POLICY_SCHEDULES
from tests.model.skipdecode.test_skip_policy import _policy
from tests.model.skipdecode.test_static_decoder import BATCHES, _schedule, _step_logits
from tests.support import FAMILIES, NUM_LAYERS, TEST_DEVICE, left_padded_batch, tiny_model

NEW_TOKENS = 12
COMPILED_FAMILIES = ("llama", "opt", "gpt2")  # the three kinds of step; Llama's covers its family


def _runs_as_eager(eager: SkipDecoder, step: CompiledStep | None, ids, mask, schedule, buckets=None,
                   sampling: SamplingConfig | None = None) -> None:
    """``step`` (or static_step) behind the static decoder gives the eager decoder's tokens, and the
    same logits at every generated position to float32 tolerance."""
    runner = EagerStep(step, batch_buckets=buckets) if step is not None else EagerStep(batch_buckets=buckets)
    static = static_decoder(eager, runner)
    expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS, sampling=sampling or SamplingConfig())
    got = static.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS, sampling=sampling or SamplingConfig())
    assert got.tokens == expected.tokens
    assert got.step_layers == expected.step_layers
    tokens = torch.tensor(expected.tokens, device=ids.device)
    torch.testing.assert_close(_step_logits(static, ids, mask, schedule, tokens),
                               _step_logits(eager, ids, mask, schedule, tokens), atol=2e-4, rtol=1e-4)


# (batch, speedup, prompt at full depth): every batch, depth and prompt placement, in three runs a family
PURE_RUNS = [("batch1", 1, True), ("padded4", 2, True), ("padded4", 3, False), ("batch1", 3, True)]


@pytest.mark.device
@pytest.mark.parametrize(("batch", "speedup", "prompt_full"), PURE_RUNS,
                         ids=[f"{b}-{s}x-{'prompt_full' if f else 'prompt_at_budget'}" for b, s, f in PURE_RUNS])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_pure_layer_steps_decode_as_the_eager_decoder(family, batch, speedup, prompt_full):
    model = tiny_model(family, device=TEST_DEVICE)
    eager = SkipDecoder(model)
    assert all(layer_kind(eager.adapter, index) is not None for index in range(NUM_LAYERS))  # none falls back
    ids, mask = left_padded_batch(BATCHES[batch], device=TEST_DEVICE)
    _runs_as_eager(eager, CompiledStep(compile=False), ids, mask, _schedule(speedup, prompt_full))


@pytest.mark.device
@pytest.mark.parametrize("family", COMPILED_FAMILIES)
@pytest.mark.parametrize("name", ["linear-warmup1", "prompt_at_budget"])
def test_the_pure_layer_steps_run_the_skip_policy_and_its_bridge(family, name):
    base, _, merged, bridge = _policy(family, TEST_DEVICE)
    ids, mask = left_padded_batch(BATCHES["padded4"], device=TEST_DEVICE)
    eager = SkipDecoder(base, skip_model=merged, bridge=bridge)
    assert layer_kind(eager.skip_adapter, 0) is not None  # the merged copy has a pure step too
    _runs_as_eager(eager, CompiledStep(compile=False), ids, mask, POLICY_SCHEDULES[name])


# --- compiled by inductor (on the CPU here; on a GPU with SKIPDECODE_TEST_DEVICE=cuda) -------------------


@pytest.fixture(scope="module")
def compiled_steps():
    """One CompiledStep per family for the module: its compiled functions serve every test after the first."""
    return {family: CompiledStep() for family in COMPILED_FAMILIES}


@pytest.mark.device
@pytest.mark.parametrize("family", COMPILED_FAMILIES)
def test_compiled_layers_decode_token_for_token_as_the_eager_decoder(compiled_steps, family):
    step = compiled_steps[family]
    model = tiny_model(family, device=TEST_DEVICE)
    eager = SkipDecoder(model)
    for batch in BATCHES:
        ids, mask = left_padded_batch(BATCHES[batch], device=TEST_DEVICE)
        for speedup in (1, 2, 3):
            _runs_as_eager(eager, step, ids, mask, _schedule(speedup, True))
    # one compiled function per (kind, batch): batch 1 and batch 4, whatever the layer sets (1x, 2x and 3x
    # meet 1 + many + many of them) and the layers (six share it)
    assert step.report().compiled == 2 and step.report().failed == 0


@pytest.mark.device
@pytest.mark.parametrize("family", COMPILED_FAMILIES)
def test_compiled_layers_run_the_skip_policy_bridge_and_sampling(compiled_steps, family):
    step = compiled_steps[family]
    base, _, merged, bridge = _policy(family, TEST_DEVICE)
    ids, mask = left_padded_batch(BATCHES["padded4"], device=TEST_DEVICE)
    eager = SkipDecoder(base, skip_model=merged, bridge=bridge)
    _runs_as_eager(eager, step, ids, mask, POLICY_SCHEDULES["linear-warmup1"])
    _runs_as_eager(eager, step, ids, mask, POLICY_SCHEDULES["linear-warmup1"],
                   sampling=SamplingConfig(temperature=1.0, seed=3))


@pytest.mark.device
def test_a_compiled_layer_serves_any_capacity_without_compiling_again(compiled_steps):
    from torch._dynamo.utils import counters

    step = compiled_steps["llama"]
    eager = SkipDecoder(tiny_model("llama", device=TEST_DEVICE))
    ids, mask = left_padded_batch(BATCHES["padded4"], device=TEST_DEVICE)
    _runs_as_eager(eager, step, ids, mask, _schedule(2, True))  # compiled now (or by an earlier test)
    frames = counters["frames"]["ok"]
    longer_ids, longer_mask = left_padded_batch([30, 17, 22, 9], device=TEST_DEVICE)  # another capacity
    _runs_as_eager(eager, step, longer_ids, longer_mask, _schedule(3, True))
    assert counters["frames"]["ok"] == frames  # dynamo traced nothing new: the capacity is dynamic


def test_a_compile_that_fails_leaves_its_kind_eager_and_the_tokens_unchanged(monkeypatch, capsys):
    def broken_compile(function, **_options):
        def fails(*_args):
            raise RuntimeError("inductor: no C++ compiler")
        return fails

    monkeypatch.setattr(torch, "compile", broken_compile)
    step = CompiledStep()
    eager = SkipDecoder(tiny_model("llama"))
    ids, mask = left_padded_batch(BATCHES["padded4"])
    _runs_as_eager(eager, step, ids, mask, _schedule(2, True))
    assert step.report().failed == 1 and step.report().compiled == 0
    assert "compiling a llama layer failed" in capsys.readouterr().err


def test_a_layer_without_a_pure_step_runs_eagerly_beside_compiled_ones():
    class WrappedLinear(nn.Linear):  # stands for a LoRA wrapper or a low-bit projection
        pass

    model = tiny_model("llama")
    attn = model.model.layers[2].self_attn
    wrapped = WrappedLinear(attn.q_proj.in_features, attn.q_proj.out_features, bias=False)
    wrapped.load_state_dict(attn.q_proj.state_dict())
    attn.q_proj = wrapped
    eager = SkipDecoder(model)
    assert layer_kind(eager.adapter, 2) is None and layer_kind(eager.adapter, 1) is not None
    ids, mask = left_padded_batch(BATCHES["padded4"])
    _runs_as_eager(eager, CompiledStep(compile=False), ids, mask, _schedule(2, True))


def test_layers_of_one_model_and_its_merged_copy_share_one_kind():
    base, _, merged, _ = _policy("llama")
    decoder = SkipDecoder(base, skip_model=merged)
    kinds = {layer_kind(adapter, index).kind for adapter in (decoder.adapter, decoder.skip_adapter)
             for index in range(NUM_LAYERS)}
    assert len(kinds) == 1
    other = SkipDecoder(tiny_model("llama", hidden=32, heads=2, kv_heads=1))
    assert layer_kind(other.adapter, 0).kind not in kinds  # another shape: another kind


# --- batch buckets ------------------------------------------------------------------------------------


def test_a_batch_runs_in_the_smallest_bucket_that_holds_it():
    assert [batch_bucket(b) for b in (1, 2, 3, 5, 8, 9, 33, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert batch_bucket(65) == 65 and batch_bucket(3, None) == 3 and BATCH_BUCKETS[-1] == 64


@pytest.mark.device
@pytest.mark.parametrize("family", COMPILED_FAMILIES)
def test_a_batch_padded_up_to_its_bucket_decodes_as_the_eager_decoder(family):
    eager = SkipDecoder(tiny_model(family, device=TEST_DEVICE))
    ids, mask = left_padded_batch([6, 3, 8, 5, 4], device=TEST_DEVICE)  # 5 rows in buffers of 8
    _runs_as_eager(eager, None, ids, mask, _schedule(2, True), buckets=BATCH_BUCKETS)
    _runs_as_eager(eager, CompiledStep(compile=False), ids, mask, _schedule(3, True), buckets=BATCH_BUCKETS)


@pytest.mark.device
def test_padding_rows_are_never_shown_and_stale_rows_change_nothing():
    eager = SkipDecoder(tiny_model("llama", device=TEST_DEVICE))
    runner = CudaGraphStep()  # its buffers are leased again: rows of an earlier, bigger run stay in them
    static = static_decoder(eager, runner)
    schedule = _schedule(2, True)
    big_ids, big_mask = left_padded_batch([7, 4, 9, 5], device=TEST_DEVICE, seed=3)
    ids, mask = left_padded_batch([6, 8, 3], device=TEST_DEVICE)
    if TEST_DEVICE.type != "cuda":  # the runner's eager path on the CPU: the buffers and their lease alone
        runner.run = lambda decoder, buffers, layers: runner.step(decoder, buffers, layers)
    static.generate(big_ids, big_mask, schedule, max_new_tokens=NEW_TOKENS)
    state, logits = static.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + NEW_TOKENS)
    buffers = state.cache
    assert (buffers.batch, buffers.rows) == (4, 3) and logits.shape[0] == 3
    assert state.key_valid.shape[0] == 3 and buffers.layer(0)[0].shape[0] == 3 and state.cache.copy().lengths
    del state
    expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS)
    got = static.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS)
    assert got.tokens == expected.tokens and len(got.tokens) == 3


# --- on CUDA: compiled layers inside the graphs, bfloat16 ----------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or TEST_DEVICE.type != "cuda",
                                reason="CUDA graphs need a CUDA device (SKIPDECODE_TEST_DEVICE=cuda)")
BF16_LOGIT_BOUND = 0.25  # teacher-forced logits of a bf16 run against bf16 eager: |diff| <= this + 2% of |logit|


def _first_difference(got: list[list[int]], expected: list[list[int]]) -> str:
    for row, (a, b) in enumerate(zip(got, expected)):
        for position, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"row {row} first differs at token {position} ({x} against {y})"
    return "no token differs"


@pytest.mark.device
@needs_cuda
@pytest.mark.parametrize("family", COMPILED_FAMILIES)
@pytest.mark.parametrize("lengths", [[6], [7, 4, 9]], ids=["batch1", "padded3-in-4"])
def test_compiled_layers_in_cuda_graphs_match_eager_within_bf16_tolerance(family, lengths):
    model = tiny_model(family, device=TEST_DEVICE).to(torch.bfloat16)
    ids, mask = left_padded_batch(lengths, device=TEST_DEVICE)
    eager = SkipDecoder(model)
    runner = CudaGraphStep(step=CompiledStep())
    graphs = static_decoder(eager, runner)
    for speedup in (1, 2, 3):
        schedule = _schedule(speedup, True)
        expected = eager.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens
        got = graphs.generate(ids, mask, schedule, max_new_tokens=NEW_TOKENS).tokens
        tokens = torch.tensor(expected, device=ids.device)
        want = _step_logits(eager, ids, mask, schedule, tokens).float()
        have = _step_logits(graphs, ids, mask, schedule, tokens).float()
        worst = ((have - want).abs() - 0.02 * want.abs()).max().item()
        assert worst <= BF16_LOGIT_BOUND, f"{family} {speedup}x: {worst:.3f} over; {_first_difference(got, expected)}"
        print(f"{family} {speedup}x batch {len(lengths)}: {_first_difference(got, expected)}")
    report = runner.report()
    assert report.compiled == 1 and report.graphs > 0  # one kind, one bucket: compiled once for every layer set
