"""The scale claim (docs/TRAINING.md: "the same on several GPUs / nodes"), on two CPU processes:
`accelerate launch --num_processes 2` of the training command on a tiny random Llama, gloo between
the processes. Each process draws its own batches and schedules (the rng is seeded by its rank), so
only the gradients' all-reduce can keep them equal: after the steps both hold the same weights, the
adapter moved, and exactly one checkpoint (and one adapter, one log line a step) is written.

`accelerate launch --cpu` starts a single process (its several-CPU launcher is mpirun's); the
torchrun launcher (`--multi_gpu`) starts the two, and `train --device cpu` makes each a CPU rank.
Run as a script, this file is the command each process runs: `python -m model train` with a record
of its own rank's losses and trained weights beside the checkpoint.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support import ROOT

STEPS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_cpu_processes_train_one_set_of_weights_and_write_one_checkpoint(tiny_folder, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n" for i in range(8)))
    output = tmp_path / "run"
    launch = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--multi_gpu",
              "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port())]
    train = ["--model", str(tiny_folder), "--prompts", str(prompts), "--output-dir", str(output),
             "--steps", str(STEPS), "--save-every", str(STEPS), "--eval-every", "0", "--batch-size", "2",
             "--continuation-tokens", "6", "--warmup", "1", "--lora-rank", "4", "--lora-alpha", "8",
             "--lr", "5e-2", "--warmup-steps", "1", "--device", "cpu", "--threads", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([*launch, __file__, *train], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]

    ranks = [torch.load(output / f"rank-{rank}.pt") for rank in (0, 1)]
    assert [(r["rank"], r["world"], r["step"]) for r in ranks] == [(0, 2, STEPS), (1, 2, STEPS)]
    assert len(ranks[0]["losses"]) == len(ranks[1]["losses"]) == STEPS
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank trained on its own batches and schedules
    first, second = ranks[0]["weights"], ranks[1]["weights"]
    assert first.keys() == second.keys() and any("lora_B" in name for name in first)
    for name in first:
        assert torch.equal(first[name], second[name]), f"{name} differs between the processes"
    assert any(weight.abs().max() > 0 for name, weight in first.items() if "lora_B" in name)  # B starts at zero

    assert [p.name for p in (output / "checkpoints").iterdir()] == [f"step-{STEPS:06d}"]
    assert json.loads((output / "adapter" / "training_info.json").read_text())["step"] == STEPS
    assert len((output / "train_log.jsonl").read_text().splitlines()) == STEPS  # the main process logs


def _train_recording_this_rank() -> int:
    """`python -m model train` (argv), recording this rank's losses and, at the checkpoint, its
    trainable weights in OUTPUT/rank-<rank>.pt."""
    from model.cli import main
    from model.training import training

    losses: list[float] = []
    step, save = training.train_step, training.save_checkpoint

    def recorded_step(*args, **kwargs) -> float:
        losses.append(step(*args, **kwargs))
        return losses[-1]

    def recorded_save(accelerator, model, output: Path, at_step: int, config, seconds: float) -> None:
        save(accelerator, model, output, at_step, config, seconds)
        weights = {name: p.detach().cpu().clone() for name, p in accelerator.unwrap_model(model).named_parameters()
                   if p.requires_grad}
        torch.save({"rank": accelerator.process_index, "world": accelerator.num_processes, "step": at_step,
                    "losses": list(losses), "weights": weights}, Path(output) / f"rank-{accelerator.process_index}.pt")

    training.train_step, training.save_checkpoint = recorded_step, recorded_save
    return main(["train", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(_train_recording_this_rank())
