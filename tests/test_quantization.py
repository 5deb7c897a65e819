"""int8 weights (model/quantization.py): close to float, and the decoder keeps its parity with
transformers and its cache equivalence on the quantised weights."""

import copy

import pytest
import torch

from conftest import NUM_LAYERS, left_padded_batch, tiny_model
from model.architectures import adapter_for
from model.decoder import SkipDecoder, execution_mask, masked_forward
from model.quantization import Int8WeightLinear, int8_supported, quantize_weights, resolve_quantize
from model.schedule import ScheduleConfig, full_schedule

pytestmark = pytest.mark.skipif(not int8_supported(), reason="no int8-weight CPU kernel in this torch build")


def test_every_linear_becomes_int8_and_logits_stay_close():
    model = tiny_model("llama")
    quantized = copy.deepcopy(model)
    replaced = quantize_weights(quantized, "int8")
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


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_decoder_on_int8_weights_matches_transformers_and_its_teacher_forced_twin(family):
    model = tiny_model(family)
    with torch.no_grad():  # a PEAKED model: greedy choices have real margins on any CPU (no near-ties)
        model.get_output_embeddings().weight.mul_(40.0)
    quantize_weights(model, "int8")
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
        quantize_weights(tiny_model("llama"), "int4")
    assert resolve_quantize("auto", torch.device("cpu")) == "int8"
    assert resolve_quantize("none", torch.device("cpu")) == "none"
    with pytest.raises(ValueError, match="quantize"):
        resolve_quantize("fp8", torch.device("cpu"))
