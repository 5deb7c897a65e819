"""The page on a GPU that replays CUDA graphs: a run that captures says "Preparing the GPU" while it
does and how many graphs it captured when done; a later run that only replays says nothing of it.
The graph runner here is CudaGraphStep itself (its LRU, buffers and keys) with the capture replaced
by one that runs on the CPU: the page's lines come from the runner's own report()."""

import gc
import time

import pytest
import torch

from app.settings import Limits
from model.skipdecode.cuda_graphs import CapturedStep, CudaGraphStep
from model.skipdecode.static_decoder import static_step


class CpuReplay:
    """A stand-in for torch.cuda.CUDAGraph: replay recomputes the step into the captured output."""

    def __init__(self, step, logits: torch.Tensor) -> None:
        self.step, self.logits = step, logits

    def replay(self) -> None:
        self.logits.copy_(self.step())


class CapturesOnCpu(CudaGraphStep):
    def _capture(self, decoder, buffers, layers) -> CapturedStep:
        def step():
            return static_step(decoder, buffers, layers)
        logits = step().clone()  # the warm-up: the same column written with the same values as the replay
        time.sleep(0.06)  # a capture takes time (~25 ms a layer set on an H200): a frame falls due meanwhile
        self.captured += 1
        self.capture_seconds += 0.25
        return CapturedStep(CpuReplay(step, logits), logits, logits.numel() * logits.element_size(), 0.25)


@pytest.fixture()
def graphed_generator(tiny_folder):
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    loaded = load_model(str(tiny_folder), device="cpu", adapter=None)
    loaded.graph_runner = CapturesOnCpu()  # as with_cuda_graphs sets a CudaGraphStep on a CUDA device
    return TextGenerator(loaded)


def statuses(playground, values: dict) -> list[str]:
    return [message[0] for message in playground.generate(values)]


@pytest.mark.slow
def test_a_run_that_captures_graphs_says_so_and_a_run_that_replays_them_does_not(graphed_generator):
    from app.handlers import Playground

    runner = graphed_generator.loaded.graph_runner
    playground = Playground(lambda: graphed_generator, Limits())
    values = dict(prompt="Name a fruit.", target_speedup=1.5, max_new_tokens=12, batch_size=1, temperature=0.0)
    first = statuses(playground, values)
    assert runner.captured >= 2  # the full model's layer set and SkipDecode's
    assert any(s.startswith("Preparing the GPU: ") and "CUDA graph" in s for s in first[:-1])
    assert first[-1].endswith(f"This run prepared the GPU: {runner.captured} CUDA graphs captured in "
                              f"{0.25 * runner.captured:.1f} s; later runs replay them.")
    captured = runner.captured
    gc.collect()  # the first run's decode states are gone: its buffers (and their graphs) are free again
    second = statuses(playground, values)
    assert runner.captured == captured  # every layer set replayed
    assert "**Done.**" in second[-1] and not any("GPU" in s for s in second)


def test_the_page_says_nothing_of_graphs_where_there_are_none(tiny_folder):
    from app.handlers import prepared_line, preparing_line
    from model.skipdecode.cuda_graphs import CaptureReport

    before, same = CaptureReport(3, 1.0, 3, 10, 0), CaptureReport(3, 1.0, 3, 10, 0)
    assert preparing_line(before, same) == "" and prepared_line(before, same) == ""
    one = CaptureReport(4, 1.5, 4, 12, 0)
    assert preparing_line(before, one).startswith("Preparing the GPU: 1 CUDA graph, 0.5 s")
    assert prepared_line(None, one) == " This run prepared the GPU: 4 CUDA graphs captured in 1.5 s; later runs replay them."


def test_the_task_models_replay_graphs_where_the_general_model_does(monkeypatch, tiny_folder):
    import model.loading as loading
    from app import tasks
    from model.loading import load_model

    def tiny(*_args, **_kwargs):
        return load_model(str(tiny_folder), device="cpu", adapter=None)

    monkeypatch.setattr(loading, "cuda_graphs_by_default", lambda device: True)  # as on a CUDA device
    monkeypatch.setattr(tasks.task_models, "load_task_model", tiny)
    generator = tasks.TaskGenerators().get("e2e", 3.0)
    assert isinstance(generator.loaded.graph_runner, CudaGraphStep)
    monkeypatch.setattr(loading, "cuda_graphs_by_default", lambda device: False)  # a CPU, ZeroGPU, or =0
    assert tasks.TaskGenerators().get("e2e", 3.0).loaded.graph_runner is None
