"""Shared fixtures: tiny random models of every supported family, built from configs (no downloads).

SKIPDECODE_TEST_DEVICE (default ``cpu``; e.g. ``cuda``) is the device the tests marked ``device``
run on: parity with transformers, cache and batch equivalence, the skip policy's equivalence and the
decoder's other tensor tests. The tiny models are built on the CPU (same seed, same weights) and
moved. Everything else (int8/int4 CPU kernels, llama.cpp, threads, the app, the browser, the
default model) stays on the CPU whatever it says. ``-m device`` selects the tests that follow it.
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

VOCAB = 97
NUM_LAYERS = 6
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "opt", "gpt2")

_DEVICE_NAME = os.environ.get("SKIPDECODE_TEST_DEVICE", "").strip().lower() or "cpu"
try:
    TEST_DEVICE = torch.device(_DEVICE_NAME)
except RuntimeError as error:
    raise pytest.UsageError(f"SKIPDECODE_TEST_DEVICE={_DEVICE_NAME!r} is not a torch device ({error})") from None
if TEST_DEVICE.type == "cuda":
    # float32 comparisons against transformers stay tight: no TF32 matmuls or convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def pytest_configure(config):
    config.addinivalue_line("markers", "device: runs on SKIPDECODE_TEST_DEVICE (default cpu; e.g. cuda)")
    if TEST_DEVICE.type == "cpu":
        return
    try:  # a device asked for and not there is an error, never a silent run on the CPU
        torch.zeros(1, device=TEST_DEVICE)
    except (RuntimeError, AssertionError) as error:  # AssertionError: a torch built without CUDA
        raise pytest.UsageError(f"SKIPDECODE_TEST_DEVICE={_DEVICE_NAME}: torch cannot use it ({error})") from None


@pytest.fixture(scope="session")
def test_device() -> torch.device:
    """The device of the tests marked ``device`` (SKIPDECODE_TEST_DEVICE, default cpu)."""
    return TEST_DEVICE


def tiny_model(family: str, *, num_layers: int = NUM_LAYERS, vocab: int = VOCAB, seed: int = 0,
               device: torch.device | str = "cpu", hidden: int = 64, heads: int = 4, kv_heads: int = 2):
    """A random causal LM of ``family`` with 6 small layers, in eval mode, float32, SDPA attention,
    built on the CPU (the same weights on every device) and then moved to ``device``."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, max_position_embeddings=256, attn_implementation="sdpa")
    llama_like = dict(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, **common,
    )
    configs = {
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**llama_like)),
        "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(sliding_window=None, **llama_like)),
        "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**llama_like)),
        "qwen3": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(head_dim=16, **llama_like)),
        "opt": lambda: tf.OPTForCausalLM(tf.OPTConfig(
            hidden_size=64, ffn_dim=128, num_hidden_layers=num_layers, num_attention_heads=4,
            word_embed_proj_dim=64, pad_token_id=1, bos_token_id=2, eos_token_id=2, **common)),
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=vocab, n_embd=64, n_layer=num_layers, n_head=4, n_positions=256,
            bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")),
    }
    model = configs[family]()
    # Sharper logits than the default init: greedy choices are then far from ties, so the
    # token-for-token comparisons test the decoder, not float rounding.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model.to(device).eval()


def left_padded_batch(lengths: list[int], vocab: int = VOCAB, pad_id: int = 0, seed: int = 1,
                      device: torch.device | str = "cpu"):
    """Random prompts of the given lengths, left padded: (ids, mask), both (B, max(lengths)), drawn
    on the CPU (the same prompts on every device) and then moved to ``device``."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(3, vocab, (length,), generator=generator)
        mask[row, width - length:] = 1
    return ids.to(device), mask.to(device)


@pytest.fixture(scope="session")
def default_model():
    """The embedded SmolLM2-135M-Instruct, loaded once, offline."""
    from model.loading import load_model

    return load_model(device="cpu")


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, default_model):
    """A tiny random Llama with the default model's tokenizer, saved like any local model."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(
        vocab_size=len(default_model.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=default_model.eos_token_ids[0], pad_token_id=default_model.pad_token_id,
    )
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = tf.LlamaForCausalLM(config)
    # A PEAKED teacher: a random tiny model's next-token distribution is near uniform, so a
    # distillation loss on it starts near zero and measures float noise on other CPUs.
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(folder)
    default_model.tokenizer.save_pretrained(folder)
    return folder


def random_lora_adapter(model, folder, **extra):
    """A LoRA adapter on every Llama linear of ``model`` with random (nonzero) B, saved to ``folder``."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"], **extra)
    wrapped = get_peft_model(copy.deepcopy(model), config)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)  # a trained adapter's B is not zero
    wrapped.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_task_adapters(default_model, tmp_path_factory):
    """(root, loader): a tiny E2E task model and its 3x skip policy, trained in seconds on a tiny
    random Llama of 12 layers (3x is in reach) with the default model's tokenizer, laid out like
    assets/adapters (root/e2e/task, root/e2e/skip-3x); the loader loads them on that tiny model
    (load_task_model loads the default model)."""
    import json
    import shutil

    import transformers as tf

    from model.loading import load_model
    from model.tasks.e2e import dev_split, training_rows
    from model.tasks.task_models import task_adapter_dir
    from model.training.training import TrainConfig, train

    work = tmp_path_factory.mktemp("tiny-task")
    torch.manual_seed(0)
    base = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=len(default_model.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=12,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=default_model.eos_token_ids[0], pad_token_id=default_model.pad_token_id))
    base.save_pretrained(work / "model")
    default_model.tokenizer.save_pretrained(work / "model")
    root = work / "adapters"
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in training_rows(dev_split()[0][:4])))
    common = dict(model=str(work / "model"), data=str(data), max_steps=2, batch_size=2, lora_rank=2, lora_alpha=4,
                  eval_every=0, save_every=2, device="cpu", learning_rate=5e-2, warmup_steps=1, warmup_layers=1)
    train(TrainConfig(**common, output_dir=str(work / "task"), fixed_speedup=1.0, gate_lora=False))
    (root / "e2e").mkdir(parents=True)
    shutil.move(str(work / "task" / "adapter"), str(root / "e2e" / "task"))
    train(TrainConfig(**common, output_dir=str(work / "policy"), task_adapter=str(root / "e2e" / "task"),
                      fixed_speedup=3.0, fixed_decay_length=8, floor_share=2 / 3, gate_lora=True))
    shutil.move(str(work / "policy" / "adapter"), str(root / "e2e" / "skip-3x"))

    def loader(task, policy):
        return load_model(str(work / "model"), device="cpu", adapter=str(policy) if policy else None,
                          task_adapter=str(task_adapter_dir(task, root)))

    return root, loader


def page_token_client(url: str):
    """A gradio_client Client that earned a page session as a browser does: it loads the page and
    sends the page token that page set (a Client that did not is pooled with its address's API
    client: app/page_tokens.py)."""
    import httpx
    from gradio_client import Client

    from app.page_tokens import COOKIE

    token = httpx.get(url, timeout=30).cookies.get(COOKIE)
    assert token, "the page set no page token"
    return Client(url, verbose=False, headers={"cookie": f"{COOKIE}={token}"})
