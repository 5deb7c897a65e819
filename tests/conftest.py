"""Shared fixtures (the default model, a tiny local model folder, tiny trained task adapters) and
the ``device`` marker. Helpers a test imports by name are in tests/support.py, which also sets
HF_HUB_OFFLINE=1 before anything can reach a hub and reads SKIPDECODE_TEST_DEVICE.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from model.common.settings import Settings, use_settings
from tests.support import DEVICE_NAME, TEST_DEVICE


def pytest_configure(config):
    config.addinivalue_line("markers", "device: runs on SKIPDECODE_TEST_DEVICE (default cpu; e.g. cuda)")
    if TEST_DEVICE.type == "cpu":
        return
    try:  # a device asked for and not there is an error, never a silent run on the CPU
        torch.zeros(1, device=TEST_DEVICE)
    except (RuntimeError, AssertionError) as error:  # AssertionError: a torch built without CUDA
        raise pytest.UsageError(f"SKIPDECODE_TEST_DEVICE={DEVICE_NAME}: torch cannot use it ({error})") from None


@pytest.fixture
def environment_settings():
    """``environment_settings(SKIPDECODE_NATIVE="0")``: the process's settings read, as at a start, from the
    environment with these variables (``""``: unset), for the rest of the test; the settings before come
    back after it. The settings are read once per process, so setting os.environ in a test changes nothing."""
    with contextlib.ExitStack() as stack:
        def use(**variables: str) -> Settings:
            return stack.enter_context(use_settings(Settings.from_environment({**os.environ, **variables})))

        yield use


@pytest.fixture(scope="session")
def test_device() -> torch.device:
    """The device of the tests marked ``device`` (SKIPDECODE_TEST_DEVICE, default cpu)."""
    return TEST_DEVICE


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
