"""The native decode step (model/lowbit/native_step.py, model/lowbit/lean_step.cpp): built where a C++ compiler
is, bit for bit the Python step on every low-bit layout with torch's kernels (int8, int4, int4 with
the skip policy's LoRA beside), with padding, GQA and a growing cache; its own 4-bit kernels (q4,
AVX2 and AVX-512 VNNI, chosen at run time) multiply exactly the weights torch's kernel does, more
precisely, and agree with each other; the fused layer computes the step of exactly its weights."""

import dataclasses
import shutil

import pytest
import torch

from model.common.hardware import cpu_flags
from model.lowbit.native_kernels import (
    Q4Blocks,
    amx_rows_setting,
    codes_of,
    int8_bf16_rows,
    int8_rows_mm,
    native_module,
    q4_bytes,
    q4_isa,
    q4_kernel_selected,
    q4_scan,
    set_int8_bf16_rows,
)
from model.lowbit.native_step import NativeDecode, projection_spec
from model.lowbit.quantization import (
    Int4Blocks,
    Int4WeightLinear,
    TwoStageHead,
    int4_supported,
    int8_supported,
    quantize_weights,
)
from model.skipdecode.decoder import SkipDecoder, execution_mask, masked_forward
from model.skipdecode.lean_layer import LeanLlamaLayer
from model.skipdecode.schedule import ScheduleConfig
from tests.support import NUM_LAYERS, left_padded_batch, random_lora_adapter, tiny_model

has_compiler = shutil.which("c++") is not None and shutil.which("ninja") is not None
has_q4 = has_compiler and int4_supported() and q4_isa() is not None
pytestmark = pytest.mark.skipif(not int8_supported(), reason="no int8-weight CPU kernel in this torch build")


@pytest.fixture()
def int8_rows_setting():
    """The int8 rows' threshold as it was, put back after the test (it is process-wide)."""
    before = int8_bf16_rows()
    yield before
    set_int8_bf16_rows(before)


def _int8_weights(rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=generator)
    scales = weight.abs().amax(1) / 127
    return torch.round(weight / scales[:, None]).to(torch.int8), scales.to(torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 31, 32, 64, 200])
def test_int8_rows_take_bfloat16_weights_from_the_threshold_and_torchs_kernel_below(rows, int8_rows_setting):
    weight, scales = _int8_weights(96, 160)
    x = torch.randn(rows, 160).to(torch.bfloat16)
    set_int8_bf16_rows(32)
    kernel = torch._weight_int8pack_mm(x, weight, scales)
    ours = int8_rows_mm(x, weight, scales)
    if rows < 32:
        assert torch.equal(ours, kernel)
    else:  # the integers are exact in bfloat16; the sum is rounded once before the scale: within a bf16 step
        assert torch.equal(ours, torch.nn.functional.linear(x, weight.to(torch.bfloat16)) * scales)
        assert ((ours.float() - kernel.float()).abs() <= 2 ** -7 * kernel.float().abs() + 1e-3).all()
    set_int8_bf16_rows(0)  # never: torch's kernel at any count
    assert torch.equal(int8_rows_mm(x, weight, scales), kernel)


@pytest.mark.skipif(not has_compiler, reason="no C++ compiler or ninja on this machine")
@pytest.mark.parametrize("rows", [4, 40])
def test_the_native_int8_rows_are_the_python_ones_bit_for_bit(rows, int8_rows_setting):
    module = native_module()
    weight, scales = _int8_weights(96, 160, seed=1)
    x = torch.randn(rows, 160).to(torch.bfloat16)
    for threshold in (0, 8):  # torch's kernel, then bfloat16 weights from 8 rows
        set_int8_bf16_rows(threshold)
        assert torch.equal(module.int8_rows_mm(x, weight, scales), int8_rows_mm(x, weight, scales))


@pytest.mark.parametrize("rows", [4, 40])
def test_a_kept_bfloat16_copy_gives_the_same_rows_as_converting_at_each_call(rows, int8_rows_setting):
    weight, scales = _int8_weights(96, 160, seed=2)
    x = torch.randn(rows, 160).to(torch.bfloat16)
    for threshold in (0, 8):
        set_int8_bf16_rows(threshold)
        kept = int8_rows_mm(x, weight, scales, weight.to(torch.bfloat16))
        assert torch.equal(kept, int8_rows_mm(x, weight, scales))
        if has_compiler:
            module = native_module()
            assert torch.equal(module.int8_rows_mm(x, weight, scales, weight.to(torch.bfloat16)), kept)
            assert torch.equal(module.int8_rows_mm(x, weight, scales, weight.new_empty(0, dtype=torch.bfloat16)), kept)


def test_int8_modules_keep_a_bfloat16_copy_only_where_rows_use_it_and_fused_ones_share_it(int8_rows_setting):
    from model.lowbit.quantization import Int8WeightLinear, fuse_low_bit

    linears = [torch.nn.Linear(64, out, bias=False) for out in (32, 16, 16)]
    set_int8_bf16_rows(0)
    assert Int8WeightLinear(linears[0]).weight_bf16 is None  # no rows multiply as bfloat16: no second copy
    set_int8_bf16_rows(8)
    modules = [Int8WeightLinear(linear) for linear in linears]
    assert all(torch.equal(m.weight_bf16, m.weight_int8.to(torch.bfloat16)) for m in modules)
    fused = fuse_low_bit(modules)
    assert fused is not None and torch.equal(fused.weight_bf16, fused.weight_int8.to(torch.bfloat16))
    for m in modules:  # one copy: the originals' are views of the fused one's rows
        assert m.weight_bf16.untyped_storage().data_ptr() == fused.weight_bf16.untyped_storage().data_ptr()
        assert torch.equal(m.weight_bf16, m.weight_int8.to(torch.bfloat16))
    assert "weight_bf16" not in fused.state_dict()  # not persistent: rebuilt at load, never cached


def test_the_int8_rows_setting_reads_its_variable_and_defaults_by_the_cpu(environment_settings, int8_rows_setting):
    import model.lowbit.native_kernels as kernels

    default = kernels.default_int8_bf16_rows(cpu_flags())
    assert kernels.default_int8_bf16_rows(["avx512_bf16", "amx_bf16"]) == 8
    assert kernels.default_int8_bf16_rows(["avx2", "avx512f", "avx512_bf16"]) == 0  # opt in: a batch rounds otherwise
    for text, expected in (("0", 0), ("48", 48), ("", default)):
        environment_settings(SKIPDECODE_INT8_BF16_ROWS=text)
        kernels._int8_bf16_rows.clear()
        assert int8_bf16_rows() == expected
    with pytest.raises(ValueError, match="SKIPDECODE_INT8_BF16_ROWS must be a number; got 'lots'"):
        environment_settings(SKIPDECODE_INT8_BF16_ROWS="lots")  # refused, named (it used to keep the default)


@pytest.mark.skipif(not has_compiler, reason="no C++ compiler or ninja on this machine")
def test_the_native_step_builds_where_a_compiler_is():
    assert native_module() is not None  # a build error here would make every CPU step the slower one


def _lean_layers(model) -> list[LeanLlamaLayer]:
    return [LeanLlamaLayer.of(layer, model.config) for layer in model.model.layers]


def _steps(decoder: SkipDecoder, ids, mask, schedule: ScheduleConfig, tokens: int) -> list[torch.Tensor]:
    """Logits of the prompt and of each decode step, feeding the greedy token."""
    state, logits = decoder.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + tokens)
    out = [logits]
    for step in range(tokens):
        logits = decoder.decode_step(state, logits.argmax(-1), schedule.step_layers(step))
        out.append(logits)
    return out


@pytest.mark.skipif(not has_compiler, reason="no C++ compiler or ninja on this machine")
@pytest.mark.parametrize("mode, lora", [("int8", False), ("int8-bf16", False), ("int4", False), ("int4", True)])
def test_the_native_step_equals_the_python_step_bit_for_bit(mode, lora, tmp_path, monkeypatch, int8_rows_setting,
                                                           environment_settings):
    from model.loading import lora_side_copy

    if mode == "int4" and not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    if mode == "int8-bf16":  # every int8 projection of the batch of 2 through bfloat16 weights (int8_rows_mm)
        set_int8_bf16_rows(2)
        mode = "int8"
    environment_settings(SKIPDECODE_INT4_KERNEL="torch")  # the same kernels as the Python step
    # 8 heads of 32 over 2 key/value heads: q/k/v rows that the int4 kernel's packed layout fuses
    model = tiny_model("llama", hidden=256, heads=8, kv_heads=2, vocab=112)
    adapter = random_lora_adapter(model, tmp_path / "adapter") if lora else None
    quantize_weights(model, mode)
    skip_model = lora_side_copy(model, adapter) if lora else model
    leans = _lean_layers(model) + _lean_layers(skip_model)
    assert all(lean.native is not None for lean in leans)  # every layer of both takes the native step
    calls = []
    monkeypatch.setattr(NativeDecode, "__call__", _counting(NativeDecode.__call__, calls))
    ids, mask = left_padded_batch([5, 9], vocab=112)  # padding: the step's attention mask
    schedule = ScheduleConfig(NUM_LAYERS, NUM_LAYERS, 2, warmup=1, decay="linear", decay_length=6)
    decoder = SkipDecoder(model, skip_model=skip_model)
    native = _steps(decoder, ids, mask, schedule, 8)
    assert calls, "the native step never ran"
    for lean in leans:
        lean.native = None  # the Python step
    python = _steps(decoder, ids, mask, schedule, 8)
    assert len(calls) == sum(len(schedule.step_layers(s)) for s in range(8))  # none in the Python run
    for ours, theirs in zip(native, python):
        assert torch.equal(ours, theirs)


def _counting(function, calls):
    def counted(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)
    return counted


@pytest.mark.skipif(not has_compiler, reason="no C++ compiler or ninja on this machine")
@pytest.mark.parametrize("kernel", ["torch", "native"])
def test_the_native_step_follows_a_weight_re_pointed_after_it_was_built(kernel, environment_settings):
    if kernel == "native" and not has_q4:
        pytest.skip("q4_matmul needs an x86 CPU with AVX2")
    environment_settings(SKIPDECODE_INT4_KERNEL=kernel)
    if not int4_supported():
        pytest.skip("no int4-weight CPU kernel in this torch build")
    model = tiny_model("llama", hidden=256, heads=8, kv_heads=2, vocab=112)
    quantize_weights(model, "int4")
    lean = _lean_layers(model)[2]
    assert lean.native is not None
    other = tiny_model("llama", hidden=256, heads=8, kv_heads=2, vocab=112, seed=5)
    quantize_weights(other, "int4")
    down, replacement = model.model.layers[2].mlp.down_proj, other.model.layers[2].mlp.down_proj
    ids, mask = left_padded_batch([4, 6], vocab=112)
    schedule = ScheduleConfig(NUM_LAYERS, NUM_LAYERS, 2, warmup=1, decay="linear", decay_length=4)
    decoder = SkipDecoder(model)
    before = _steps(decoder, ids, mask, schedule, 3)
    down.weight_int4pack = replacement.weight_int4pack  # re-pointed, as a shared base is by the LoRA
    down.scales_and_zeros = replacement.scales_and_zeros
    native = _steps(decoder, ids, mask, schedule, 3)
    for layer in _lean_layers(model):
        layer.native = None
    python = _steps(decoder, ids, mask, schedule, 3)
    assert not torch.equal(native[-1], before[-1])
    if kernel == "torch":
        assert all(torch.equal(a, b) for a, b in zip(native, python))
    else:  # q4_matmul's activations are more precise than the Python step's bfloat16: close, not equal
        assert all(_relative(a, b) < 0.02 for a, b in zip(native, python))


def test_without_the_native_step_the_python_step_runs(environment_settings):
    import model.lowbit.native_kernels as native_step

    environment_settings(SKIPDECODE_NATIVE="0")
    native_step.native_module.cache_clear()
    try:
        assert native_step.native_module() is None
        model = tiny_model("llama", hidden=256, heads=8, kv_heads=2, vocab=112)
        quantize_weights(model, "int8")
        assert all(lean.native is None for lean in _lean_layers(model))
        ids, mask = left_padded_batch([4, 6], vocab=112)
        result = SkipDecoder(model).generate(ids, mask, ScheduleConfig(NUM_LAYERS, NUM_LAYERS, 2, warmup=1,
                                                                       decay="linear", decay_length=4),
                                             max_new_tokens=3)
        assert [len(row) for row in result.tokens] == [3, 3]
    finally:
        native_step.native_module.cache_clear()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.skipif(not has_q4, reason="q4_matmul needs an x86 CPU with AVX2 and a C++ compiler")
@pytest.mark.parametrize("rows, cols", [(192, 96), (48, 64), (1024, 576)])
def test_torchs_packed_int4_codes_unpack_exactly(rows, cols):
    codes = torch.randint(0, 16, (rows, cols), dtype=torch.int32, generator=torch.Generator().manual_seed(rows))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert torch.equal(codes_of(q4_bytes(packed, rows, cols), rows, cols).int(), codes)
    halves = codes.to(torch.uint8).view(rows, cols // 32, 2, 16)  # q4_matmul's bytes: q[j] | q[j + 16] << 4
    assert torch.equal(q4_bytes(packed, rows, cols), (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(rows, cols // 2))


@pytest.mark.skipif(not has_q4, reason="q4_matmul needs an x86 CPU with AVX2 and a C++ compiler")
def test_q4_matmul_multiplies_the_int4_weights_more_precisely_than_torchs_kernel():
    torch.manual_seed(0)
    weight = torch.randn(320, 576) * 0.05
    source = Int4Blocks.from_float(weight)
    module = Int4WeightLinear(source)
    # (out, in): the values both kernels multiply, (code - 8) scale + zero with the packed bfloat16 scale, zero
    scale, zero = (module.scales_and_zeros[..., i].t().double().repeat_interleave(32, dim=1) for i in (0, 1))
    exact_weight = (source.codes.double() - 8.0) * scale + zero
    blocks = Q4Blocks.of(module)
    assert blocks is not None
    x = torch.randn(5, 576) * 3.0
    reference = x.double() @ exact_weight.double().T
    ours, torchs = blocks(x).double(), module.torch_forward(x).double()
    assert ours.shape == (5, 320)
    # int16 activations (~1e-5) against torch's bfloat16 ones (~2e-3): a 10x margin asked, ~40x measured
    assert _relative(ours, reference) * 10 < _relative(torchs, reference) < 0.01
    # a row of a batch below the tiles' threshold (vector kernels) reads like one decode row, bit for bit; from
    # it (AMX tiles where the CPU has them) the same integers, only the float additions' order differs
    assert torch.equal(blocks(x[2:3]), blocks(x[:3])[2:3])
    assert _relative(blocks(x)[2:3], blocks(x[2:3])) < 1e-5


@pytest.mark.skipif(not has_q4, reason="q4_matmul needs an x86 CPU with AVX2 and a C++ compiler")
@pytest.mark.parametrize("lora", [False, True])
def test_the_q4_decode_step_keeps_parity_with_transformers_and_stays_close(lora, tmp_path, environment_settings):
    from model.loading import lora_side_copy

    environment_settings(SKIPDECODE_INT4_KERNEL="native")
    assert q4_kernel_selected()
    model = tiny_model("llama", hidden=256, heads=8, kv_heads=2, vocab=112)
    with torch.no_grad():  # a PEAKED model: greedy choices far from ties on any CPU
        model.get_output_embeddings().weight.mul_(5.0)
    adapter = random_lora_adapter(model, tmp_path / "adapter") if lora else None
    quantize_weights(model, "int4")
    skip_model = lora_side_copy(model, adapter) if lora else model
    leans = _lean_layers(model) + _lean_layers(skip_model)
    assert all(lean.native is not None for lean in leans)
    ids, mask = left_padded_batch([5, 9], vocab=112)
    decoder = SkipDecoder(model, skip_model=skip_model)
    if not lora:  # full depth through q4_matmul (layers and the head's scan) = transformers' generate
        ours = decoder.generate(ids, mask, ScheduleConfig(NUM_LAYERS, NUM_LAYERS, NUM_LAYERS), max_new_tokens=6)
        with torch.inference_mode():
            theirs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                    pad_token_id=0, eos_token_id=None)
        assert [row[:6] for row in ours.tokens] == theirs[:, ids.shape[1]:].tolist()
    schedule = ScheduleConfig(NUM_LAYERS, NUM_LAYERS, 2, warmup=1, decay="linear", decay_length=6)
    if not lora:  # skipping through q4_matmul: the cached decoder = its teacher-forced twin
        skipped = decoder.generate(ids, mask, schedule, max_new_tokens=6)
        full_ids = torch.cat([ids, torch.tensor(skipped.tokens)], dim=1)
        full_mask = torch.cat([mask, torch.ones(2, 6, dtype=mask.dtype)], dim=1)
        with torch.inference_mode():
            logits = masked_forward(model, full_ids, full_mask, execution_mask(schedule, ids.shape[1], full_ids.shape[1]))
        assert logits[:, ids.shape[1] - 1:-1].argmax(-1).tolist() == skipped.tokens
    native = _steps(decoder, ids, mask, schedule, 6)
    for lean in leans:
        lean.native = None
    python = _steps(decoder, ids, mask, schedule, 6)
    # the same weights; the activations' precision differs (16 bits against bfloat16's 8), and the
    # two-stage head's rescored candidates with it: ~2% apart measured, a wrong layout is ~100% off
    assert all(_relative(a, b) < 0.1 for a, b in zip(native, python))


@pytest.mark.skipif(not has_q4, reason="q4_matmul needs an x86 CPU with AVX2 and a C++ compiler")
def test_a_padded_batchs_native_run_builds_no_attention_mask(monkeypatch, environment_settings):
    """The native run reads which keys a row may attend to from the decoder's key_valid, so a padded
    batch's decode step builds no (B, 1, 1, K) mask for it; the Python step still gets one."""
    environment_settings(SKIPDECODE_INT4_KERNEL="native")
    model = tiny_model("llama", hidden=256, heads=8, kv_heads=2, vocab=112)
    quantize_weights(model, "int4")
    decoder = SkipDecoder(model)
    masks = []
    built = decoder.adapter.layer_mask
    monkeypatch.setattr(decoder.adapter, "layer_mask", lambda *args: masks.append(1) or built(*args))
    ids, mask = left_padded_batch([5, 9], vocab=112)
    schedule = ScheduleConfig(NUM_LAYERS, NUM_LAYERS, NUM_LAYERS)
    state, logits = decoder.prefill(ids, mask, schedule.prefill_layers(), ids.shape[1] + 4)
    masks.clear()
    native = [decoder.decode_step(state, logits.argmax(-1), schedule.step_layers(0))]
    native.append(decoder.decode_step(state, native[-1].argmax(-1), schedule.step_layers(1)))
    assert state.has_padding and not masks
    for lean in _lean_layers(model):
        lean.native = None  # the Python step: one mask a step (every layer has the same cached length)
    decoder.decode_step(state, native[-1].argmax(-1), schedule.step_layers(2))
    assert len(masks) == 1


# --- the fused layer (every op of a q4 decode step in decode_kernels.h) -----------------------------


def _exact_projection(spec):
    """A q4 projection (projection_spec's kind 3 or 4) as float64 arithmetic on exactly the values the
    kernels multiply: the 4-bit weights (q - 8) scale + zero, and a LoRA's int8 B times its scales."""
    kind, tensors, out = spec
    qs, sz = tensors[0], tensors[1]
    rows, cols = qs.shape[0], qs.shape[1] * 2
    weight = (codes_of(qs, rows, cols).double() - 8.0) * sz[..., 0].double().repeat_interleave(32, dim=1) \
        + sz[..., 1].double().repeat_interleave(32, dim=1)
    lora_b = None
    if kind == 4:
        window, start, scale = tensors[2:5]
        lora_b = torch.zeros(out, rows - out, dtype=torch.float64)
        columns = start.long()[:, None] + torch.arange(window.shape[1])[None]
        lora_b.scatter_(1, columns, window.double() * scale.double()[:, None])

    def call(x):
        both = x.reshape(-1, cols).double() @ weight.T
        y = both[:, :out] if lora_b is None else both[:, :out] + both[:, out:] @ lora_b.T
        return y.float().reshape(*x.shape[:-1], out)
    return call


def _fused_setup(tmp_path, lora):
    """A tiny int4 Llama (GQA, a padded batch), its skip model (with a LoRA beside the 4-bit weights
    or none), every lean layer's projections replaced by exact float arithmetic (prefill and the
    Python step then compute exactly what the kernels are asked to) and a float head."""
    from model.loading import lora_side_copy

    model = tiny_model("llama", hidden=256, heads=8, kv_heads=2, vocab=112)
    head = torch.nn.Linear(256, 112, bias=False)
    head.weight.data.copy_(model.get_output_embeddings().weight)
    adapter = random_lora_adapter(model, tmp_path / "adapter") if lora else None
    quantize_weights(model, "int4")
    skip_model = lora_side_copy(model, adapter) if lora else model
    for m in {id(model): model, id(skip_model): skip_model}.values():
        m.lm_head = head
    leans = _lean_layers(model) + (_lean_layers(skip_model) if lora else [])
    for lean in leans:
        assert lean.native is not None and lean.native.fused
        exact = [_exact_projection(projection_spec(p)) for p in lean.native._projections]
        lean.qkv, lean.o_proj, lean.gate_up, lean.down_proj = exact
    return SkipDecoder(model, skip_model=skip_model), leans


@pytest.mark.skipif(not has_q4, reason="the q4 kernels need an x86-64 CPU with AVX2 and a C++ compiler")
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("isa", ["avx512-vnni", "avx2", "avx2-lanes", "amx"])
def test_the_fused_layer_computes_the_decode_step_of_its_weights(isa, lora, tmp_path, monkeypatch):
    """Each instruction set's fused layer (norms, q4 matmuls, the LoRA's B, rotary, cache writes,
    attention over the cached prefix with a padded row and grouped key/value heads, SiLU gate,
    residuals; consecutive layers in one call) against the Python step on exactly its weights, in
    float: over a prefill, then decode steps that skip layers (caches of different lengths). "amx":
    the projections on AMX tiles (from one row here; the LoRA's stacked rows leave a tail of columns
    to the vector kernel). "avx2-lanes": loaded with the kernels on AVX2, so the weights carry AVX2's
    own lane layout and its lane kernel runs (on an AVX-512 CPU "avx2" finds AVX-512's layout and runs
    AVX2's row kernel)."""
    module = native_module()
    amx_rows = 1 if isa == "amx" else 0
    if isa == "amx" and not module.q4_amx():
        pytest.skip("this CPU (or its kernel) has no AMX-INT8 for this process")
    lanes_at_load = isa == "avx2-lanes"
    isa = {"amx": "avx512-vnni", "avx2-lanes": "avx2"}.get(isa, isa)
    if isa not in module.q4_isas():
        pytest.skip(f"this CPU has no {isa}")
    runs = []
    import model.skipdecode.lean_layer as lean_layer
    counting = dataclasses.replace(lean_layer._low_bit_parts, native_run=_counting(
        lean_layer._low_bit_parts.native_run, runs))
    monkeypatch.setattr(lean_layer, "_low_bit_parts", counting)
    if lanes_at_load:
        assert module.set_q4_isa("avx2")
    try:
        decoder, leans = _fused_setup(tmp_path, lora)
    finally:
        module.set_q4_isa("auto")
    if lanes_at_load:  # every projection's lanes in AVX2's layout: (O, K/32, 16)
        assert all(projection_spec(p)[1][-2].dim() == 3 for lean in leans for p in lean.native._projections)
    ids, mask = left_padded_batch([5, 9], vocab=112)
    schedule = ScheduleConfig(NUM_LAYERS, NUM_LAYERS, 2, warmup=1, decay="linear", decay_length=6)
    assert module.set_q4_isa(isa)
    module.set_q4_amx_rows(amx_rows)
    try:
        fused = _steps(decoder, ids, mask, schedule, 6)
    finally:
        module.set_q4_isa("auto")
        module.set_q4_amx_rows(amx_rows_setting())
    assert len(runs) == 6  # each decode step's layers: one native call
    for lean in leans:
        lean.native = None
    reference = _steps(decoder, ids, mask, schedule, 6)
    assert torch.equal(fused[0], reference[0])  # the prefill: the same exact projections
    # 16-bit activations: ~1e-4 apart measured; a wrong rotary, head mapping or mask is ~100% off
    assert all(_relative(a, b) < 2e-3 for a, b in zip(fused[1:], reference[1:]))


@pytest.mark.skipif(not has_q4, reason="the q4 kernels need an x86-64 CPU with AVX2 and a C++ compiler")
def test_the_q4_kernels_take_the_cpus_best_instruction_set_and_agree_across_them():
    module = native_module()
    flags = set(cpu_flags())
    best = "avx512-vnni" if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags else "avx2"
    assert q4_isa() == best  # the path this machine takes (SKIPDECODE_Q4_ISA unset in tests)
    assert module.q4_isas()[0] == best and "avx2" in module.q4_isas()
    assert not module.set_q4_isa("sse2") and q4_isa() == best
    torch.manual_seed(0)
    weight = torch.randn(176, 96) * 0.05  # 3 blocks a row: a partial group of 4
    source = Int4Blocks.from_float(weight)
    blocks = Q4Blocks.of(Int4WeightLinear(source))
    scale, zero = (blocks.sz[..., i].double().repeat_interleave(32, dim=1) for i in (0, 1))
    exact = (source.codes.double() - 8.0) * scale + zero
    for rows in (1, 2, 5, 8, 11):  # a decode row, tiles of 4 and their remainders
        x = torch.randn(rows, 96) * 2.0
        x[:, 7] = 40.0  # an outlier dimension, as SmolLM2 has
        reference = x.double() @ exact.T
        out = {}
        try:
            for isa in module.q4_isas():
                assert module.set_q4_isa(isa)
                out[isa] = (blocks(x).double(), module.q4_matmul(x, blocks.qs, blocks.sz, True).double())
        finally:
            module.set_q4_isa("auto")
        for isa, (fine, coarse) in out.items():
            assert _relative(fine, reference) < 1e-3  # 16-bit activations: ~5e-5 measured
            assert _relative(coarse, reference) < 0.05  # the head's 8-bit scan (AVX-512): ~1e-2
        if len(out) == 2:  # the same integer dot products: only float additions differ (~3e-7)
            assert _relative(out["avx2"][0], out["avx512-vnni"][0]) < 1e-5


@pytest.mark.skipif(not has_q4, reason="the q4 kernels need an x86-64 CPU with AVX2 and a C++ compiler")
@pytest.mark.parametrize("tied", [True, False])
def test_the_native_two_stage_head_rescores_the_scans_top_candidates(tied):
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 2048, bias=False)
    with torch.no_grad():
        linear.weight.mul_(4.0)
    head = TwoStageHead.from_linear(linear, tied_rows=linear.weight.detach() if tied else None)
    x = torch.randn(3, 1, 256)
    ours = head(x)  # one native call: the scan, each row's top 32, their rescoring
    logits = head.scan_logits(x).reshape(3, -1)  # the Python path's stages
    flat = x.reshape(3, 256)
    ranked = head.ranking(x).reshape(3, -1)  # the native scan (AVX-512: 8-bit activations; AVX2: 16-bit)
    # through the scan's own layouts, as the head runs it: on AVX2 the lane kernel and the layout-free one add
    # the same products in another order (an AVX2-only CPU, emulated, failed the layout-free comparison)
    scan = q4_scan(head.scan)
    assert torch.equal(ranked, native_module().q4_matmul(flat, *scan.tensors(), True, *scan.layouts()))
    top = ranked.topk(head.candidates, dim=-1).indices
    exact = head.dequantized_weight()[top] @ flat.unsqueeze(-1)
    exact = exact.squeeze(-1)
    assert torch.allclose(ours.reshape(3, -1).gather(1, top), exact, rtol=1e-4, atol=1e-4)
    assert torch.equal(ours.reshape(3, -1).argmax(-1), top.gather(1, exact.argmax(-1, keepdim=True)).squeeze(1))
    outside = torch.ones_like(ranked, dtype=torch.bool).scatter_(1, top, False)
    assert torch.equal(ours.reshape(3, -1)[outside], ranked[outside])  # the rest keep the scan's values
    assert _relative(ranked, logits) < 0.05  # the 8-bit scan is the 16-bit one's ranking, coarser


@pytest.mark.skipif(not has_q4, reason="the q4 kernels need an x86-64 CPU with AVX2 and a C++ compiler")
@pytest.mark.parametrize("isa", ["avx512-vnni", "avx2"])
def test_the_native_argmax_picks_torchs_ids_ties_and_nan_included(isa, environment_settings):
    """Greedy decoding's argmax (decode steps' greedy_ids) natively: on each instruction set the ids
    torch gives, for a vocabulary's width and widths that leave a vector's tail, with the largest value
    twice in a row (the first), a row of -inf, a NaN (the first NaN, as torch), a non-contiguous view."""
    from model.lowbit.native_step import native_argmax
    from model.skipdecode.lean_layer import greedy_ids

    module = native_module()
    if isa not in module.q4_isas():
        pytest.skip(f"this CPU has no {isa}")
    generator = torch.Generator().manual_seed(0)
    assert module.set_q4_isa(isa)
    try:
        for rows, width in [(1, 49152), (8, 49152), (3, 17), (5, 1), (3, 100)]:
            logits = torch.randn(rows, width, generator=generator) * 5
            if rows >= 3 and width > 10:
                logits[0, 3] = logits[0, width - 2] = 1e3  # a tie: the first
                logits[1] = float("-inf")
                logits[-1, width // 2] = float("nan")
                logits[-1, width - 1] = float("nan")
            expected = logits.argmax(dim=-1)
            assert torch.equal(native_argmax(logits), expected), (rows, width)
            assert torch.equal(greedy_ids(logits), expected)
        wide = torch.randn(4, 2 * 333, generator=generator)[:, ::2]  # a strided view
        assert torch.equal(native_argmax(wide), wide.argmax(dim=-1))
    finally:
        module.set_q4_isa("auto")
    half = torch.randn(2, 50, generator=generator).to(torch.bfloat16)
    assert native_argmax(half) is None and torch.equal(greedy_ids(half), half.argmax(dim=-1))  # torch's own
    environment_settings(SKIPDECODE_NATIVE="0")  # the Python path everywhere: torch's argmax too
    logits = torch.randn(3, 40, generator=generator)
    assert native_argmax(logits) is None and torch.equal(greedy_ids(logits), logits.argmax(dim=-1))


def test_a_build_killed_mid_way_leaves_no_lock_that_stops_the_next_start(tmp_path):
    """torch's build lock is a file deleted when its build ends: a build killed mid-way left it, and
    every later start waited on it forever. The builders' OS lock (released with its process) makes
    such a file stale, so the next builder removes it."""
    import multiprocessing

    from model.lowbit.native_kernels import builders_lock

    (tmp_path / "lock").touch()  # what a killed build leaves
    with builders_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
    holder = multiprocessing.get_context("fork").Process(target=_hold_builders_lock, args=(tmp_path,))
    holder.start()
    holder.join(30)  # it took the lock and died holding it (os._exit): the OS released it
    with builders_lock(tmp_path):
        pass


def _hold_builders_lock(folder):
    import os

    from model.lowbit.native_kernels import builders_lock

    with builders_lock(folder):
        os._exit(0)
