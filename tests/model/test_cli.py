"""`python -m model generate`: the JSON contract, the plain output, and bad input."""

import json
import os
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow  # every test here spawns the CLI (most on a folder made from the default model)


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "model", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_json_contract_on_the_default_model():
    done = run_cli("generate", "--prompt", "Name three colours.", "--speedup", "2", "--max-new-tokens", "16", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for key in ("model", "device", "num_layers", "outputs", "layers_per_step", "planned_layer_speedup", "tokens_per_second"):
        assert key in out
    assert out["num_layers"] == 30 and out["device"] == "cpu"
    assert out["prefill_layers"] == list(range(30))  # the layers the prompt ran, as the API writes them
    steps = out["layers_per_step"]
    assert all(b <= a for a, b in zip(steps, steps[1:])) and max(steps) < 30
    assert abs(out["planned_layer_speedup"] - 2.0) <= 0.1  # the policy, solved for the target
    assert out["achieved_layer_speedup"] == pytest.approx(30 * len(steps) / sum(steps), rel=1e-3)
    assert 1.0 < out["planned_cost_model_speedup"] < out["planned_layer_speedup"]
    assert isinstance(out["outputs"][0], str) and out["tokens_per_second"] > 0


def test_batch_full_and_plain_text_on_a_local_folder(tiny_folder):
    done = run_cli("generate", "--model", str(tiny_folder), "--prompt", "Hello", "--prompt", "A longer prompt here",
                   "--full", "--max-new-tokens", "5", "--json", "--raw", "--temperature", "0.8", "--seed", "3")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["outputs"]) == 2 and out["num_layers"] == 4 and out["prefill_layers"] == [0, 1, 2, 3]
    assert set(out["layers_per_step"]) <= {4} and out["planned_layer_speedup"] == out["achieved_layer_speedup"] == 1.0
    assert not {"layer_speedup", "cost_model_speedup"} & set(out)  # the legacy keys are gone
    plain = run_cli("generate", "--model", str(tiny_folder), "--prompt", "Hello", "--speedup", "1.5", "--max-new-tokens", "4")
    assert plain.returncode == 0, plain.stderr
    assert not plain.stdout.lstrip().startswith("{") and "layer speedup" in plain.stderr


def test_static_cache_generates_the_same_text_as_the_eager_decoder(tiny_folder):
    """--static-cache (the CUDA graphs' step, run eagerly) on the CPU default's low-bit weights."""
    common = ("generate", "--model", str(tiny_folder), "--prompt", "Hello", "--prompt", "A longer prompt here",
              "--speedup", "1.5", "--max-new-tokens", "6", "--json", "--raw")
    eager, static = run_cli(*common), run_cli(*common, "--static-cache")
    assert eager.returncode == 0 and static.returncode == 0, eager.stderr + static.stderr
    eager_out, static_out = json.loads(eager.stdout), json.loads(static.stdout)
    assert static_out["outputs"] == eager_out["outputs"] and static_out["layers_per_step"] == eager_out["layers_per_step"]
    assert min(static_out["layers_per_step"]) < static_out["num_layers"]  # the run really skipped layers


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--prompt", "   "], "empty"),
        (["--prompt", "x", "--min-layers", "3", "--max-layers", "2"], "min_layers"),
        (["--prompt", "x", "--speedup", "0.5"], "target_speedup"),
        (["--prompt", "x", "--speedup", "99"], "unreachable"),
        (["--prompt", "x", "--warmup", "3", "--min-layers", "3"], "warmup"),
        (["--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens"),
        (["--prompt", "x", "--temperature", "-1"], "temperature"),
        (["--prompt", "x", "--decay", "zigzag"], "decay"),
        (["--prompt", "x", "--speedup", "fast"], "speedup"),
        (["--prompt", "x", "--device", "quantum"], "device"),
        (["--prompt", "x", "--max-new-tokens", "100000"], "context"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(tiny_folder, args, needle):
    done = run_cli("generate", "--model", str(tiny_folder), *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert needle in done.stderr and "error:" in done.stderr


def test_missing_model_is_a_clear_error_offline():
    done = run_cli("generate", "--model", "no-such-org/no-such-model", "--prompt", "x")
    assert done.returncode == 2 and "Traceback" not in done.stderr and "error:" in done.stderr


def test_eval_can_leave_out_the_no_adapter_rows():
    from model.cli import build_parser, eval_config

    parser = build_parser()
    assert eval_config(parser.parse_args(["eval"])).include_no_adapter is True
    config = eval_config(parser.parse_args(["eval", "--adapter-only", "--speedups", "2"]))
    assert config.include_no_adapter is False and config.speedups == (2.0,)
