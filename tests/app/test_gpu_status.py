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


def test_the_preparing_line_counts_the_layers_compiled_beside_the_graphs():
    from app.handlers import prepared_line, preparing_line
    from model.skipdecode.cuda_graphs import CaptureReport

    before = CaptureReport(3, 1.0, 3, 10, 0, compiled=1, compile_seconds=0.5)
    now = CaptureReport(5, 4.0, 5, 14, 0, compiled=3, compile_seconds=2.7)
    assert preparing_line(before, now).startswith("Preparing the GPU: 2 kinds of layer compiled (2.2 s), 2 CUDA graphs, 3.0 s")
    assert prepared_line(None, now).startswith(" This run prepared the GPU: 3 kinds of layer compiled (2.7 s), 5 CUDA graphs")
    replayed = CaptureReport(5, 4.0, 5, 14, 0, compiled=3, compile_seconds=2.7)
    assert preparing_line(now, replayed) == ""  # nothing new: nothing said


@pytest.mark.slow  # races the tiny model's first settings at batch 1 and 4 through both decoders
def test_the_server_prepares_the_gpu_in_the_background_and_pages_say_so_meanwhile(graphed_generator):
    from app.handlers import GPU_PREPARING, GPU_WARM_UP_PROMPT, Playground

    runner = graphed_generator.loaded.graph_runner
    playground = Playground(lambda: graphed_generator, Limits())
    values = dict(prompt="Name a fruit.", target_speedup=1.5, max_new_tokens=12, batch_size=1, temperature=0.0)
    playground.preparing_gpu.set()  # as while prepare_gpu runs (set here, so the page's run surely meets it)
    during = statuses(playground, values)
    playground.preparing_gpu.clear()
    assert all(s.startswith(GPU_PREPARING) for s in during[:-1]) and GPU_PREPARING not in during[-1]
    thread = playground.prepare_gpu([1, 4])
    assert thread is not None and playground.preparing_gpu.is_set()
    thread.join(120)
    assert not thread.is_alive() and not playground.preparing_gpu.is_set()
    assert {buffers.batch for _, buffers in runner._buffers} >= {1, 4}  # both buckets' buffers and graphs made
    captured = runner.captured
    gc.collect()
    after = statuses(playground, {"prompt": GPU_WARM_UP_PROMPT})  # the page's first settings, as prepared
    assert runner.captured == captured and not any("GPU" in s for s in after)  # the page's first run only replays


def test_without_graphs_there_is_nothing_to_prepare(tiny_folder):
    from app.handlers import Playground
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    playground = Playground(lambda: generator, Limits())
    assert playground.prepare_gpu([1, 4]) is None and not playground.preparing_gpu.is_set()


def test_the_graphs_capture_the_compiled_layers_unless_told_not_to(environment_settings, monkeypatch, tmp_path):
    from model.loading import graph_step
    from model.skipdecode.compiled_layers import CompiledStep

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    environment_settings(SKIPDECODE_COMPILE_LAYERS="", SKIPDECODE_CACHE_DIR=str(tmp_path))
    assert isinstance(graph_step(), CompiledStep)
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")  # compiled code kept across starts
    environment_settings(SKIPDECODE_COMPILE_LAYERS="0")
    assert graph_step() is static_step


def test_the_warm_up_holds_the_model_one_step_at_a_time(graphed_generator):
    """A visitor's run takes its steps between the warm-up's: the lock is held per step, never per run."""
    import threading

    from model.generation.runs import GenerationRequest
    from model.generation.schedules import ScheduleRequest

    class CountingLock:
        def __init__(self) -> None:
            self.lock, self.entries = threading.Lock(), 0

        def __enter__(self):
            self.lock.acquire()
            self.entries += 1
            return self

        def __exit__(self, *_exc) -> None:
            self.lock.release()

    generator = graphed_generator
    run = generator.prepare(GenerationRequest(prompts=["Name a fruit."], max_new_tokens=6,
                                              schedule=ScheduleRequest(target_speedup=1.5)))
    lock = CountingLock()
    assert generator.warm_up([run], [1, 2], lock) == 2
    assert lock.entries >= 2 * 6  # the prefill and every step of both runs, each under the lock on its own
