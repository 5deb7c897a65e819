"""What the tests share besides fixtures (those are in tests/conftest.py): tiny random models of every
supported family built from configs (no downloads), random left-padded batches, a random LoRA
adapter, a page-token client, the device of the tests marked ``device`` and the repository's root.
A test imports them by name: ``from tests.support import NUM_LAYERS, tiny_model``.

SKIPDECODE_TEST_DEVICE (default ``cpu``; e.g. ``cuda``) is the device the tests marked ``device``
run on: parity with transformers, cache and batch equivalence, the skip policy's equivalence and the
decoder's other tensor tests. The tiny models are built on the CPU (same seed, same weights) and
moved. Everything else (int8/int4 CPU kernels, llama.cpp, threads, the app, the browser, the
default model) stays on the CPU whatever it says. ``-m device`` selects the tests that follow it.
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # the repository's root
VOCAB = 97
NUM_LAYERS = 6
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "opt", "gpt2")

DEVICE_NAME = os.environ.get("SKIPDECODE_TEST_DEVICE", "").strip().lower() or "cpu"
try:
    TEST_DEVICE = torch.device(DEVICE_NAME)
except RuntimeError as error:
    raise pytest.UsageError(f"SKIPDECODE_TEST_DEVICE={DEVICE_NAME!r} is not a torch device ({error})") from None
if TEST_DEVICE.type == "cuda":
    # float32 comparisons against transformers stay tight: no TF32 matmuls or convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


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


def page_token_client(url: str):
    """A gradio_client Client that earned a page session as a browser does: it loads the page and
    sends the page token that page set (a Client that did not is pooled with its address's API
    client: app/serving/page_tokens.py)."""
    import httpx
    from gradio_client import Client

    from app.serving.page_tokens import COOKIE

    token = httpx.get(url, timeout=30).cookies.get(COOKIE)
    assert token, "the page set no page token"
    return Client(url, verbose=False, headers={"cookie": f"{COOKIE}={token}"})


def script_module(name: str):
    """scripts/<name>.py imported as a module (scripts/ is not a package), registered in sys.modules
    under its name first: a dataclass looks its own module up there while the file runs."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_script(script: str, *args: str, timeout: int = 600):
    """``python <script> <args>`` (a path from the repository root: ``lab/bench/native_ab.py``) from the
    root, offline, the repository on the path; asserts it exited 0 (its stderr's end in the message)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# --- the browser tests' Chromium (tests/app/test_browser*.py) ------------------------------------
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def rendered_page(browser, url: str, width: int, height: int):
    """A new tab of ``browser`` on ``url``, once the app has rendered."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    page.wait_for_selector("#generate-btn", timeout=60_000)
    return page


def open_page(p, url: str, width: int, height: int):
    """(browser, page): Debian's Chromium launched headless by playwright ``p``, a tab on ``url``."""
    browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
    return browser, rendered_page(browser, url, width, height)


def wait_until(condition, timeout: float) -> bool:
    """Whether ``condition()`` held within ``timeout`` seconds (checked every 0.1 s)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False
