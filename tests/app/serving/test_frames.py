"""Frames (issue #51): the page and the API send the steps since their last message together, at
most 20 messages a second, and no step's tokens, layers or timings are lost between frames."""

import time

import pytest

from app.serving.frames import FRAME_S, FrameClock, NewSteps
from app.settings import Limits
from tests.support import page_token_client

STEP_LAYER_S = 0.004  # each layer of a decode step sleeps this long: steps of ~10-20 ms, several a frame


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_frame_is_due_at_once_then_at_most_once_an_interval_and_always_at_the_end():
    clock = FakeClock()
    frames = FrameClock(0.05, clock)
    assert frames.due()  # the first step shows at once
    clock.now += 0.03
    assert not frames.due()
    assert frames.due(last=True)  # the last message is never held back
    clock.now += 0.049
    assert not frames.due()
    clock.now += 0.002
    assert frames.due()
    sent = 0
    for _ in range(1000):  # 1,000 steps of 1 ms: one second, 20 frames and the first
        clock.now += 0.001
        sent += frames.due()
    assert 19 <= sent <= 21


@pytest.fixture(scope="module")
def tiny_generator(tiny_folder):
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    return TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))


def by_stream(entries: list[dict]) -> dict[str, list[dict]]:
    return {name: [e for e in entries if e["stream"] == name] for name in ("skipdecode", "full")}


@pytest.mark.slow
def test_new_steps_carry_every_step_of_both_streams_once_in_the_order_they_ran(tiny_generator):
    """Taken at uneven points of a batch-2 race, the frames' steps put together are the decoder's
    own record of each stream: every step once, its tokens (text and id per row), layers, seconds."""
    from app.handlers import Playground

    checked = Playground(lambda: tiny_generator, Limits()).checked(dict(
        prompt="Name a fruit.", target_speedup=1.5, max_new_tokens=9, batch_size=2, temperature=0.0))
    steps, frames, ran, counts = NewSteps(), [], [], {"skip": 0, "full": 0}
    for index, update in enumerate(checked.race()):
        steps.add(update)
        progress = update.skip if update.moved == "skip" else update.full
        if len(progress.depths) > counts[update.moved]:  # a step ran (not just the stream's end)
            counts[update.moved] = len(progress.depths)
            ran.append("skipdecode" if update.moved == "skip" else "full")
        if index % 3 == 1 or update.done:  # frames of one, two or three updates
            frames.append(steps.take())
    assert len(frames) > 4 and all(frames[:-1])
    entries = [entry for frame in frames for entry in frame]
    for name, progress in (("skipdecode", update.skip), ("full", update.full)):
        mine, record = by_stream(entries)[name], progress.record
        assert [e["step"] for e in mine] == list(range(len(record.step_layers) + 1))  # prefill = step 0
        assert [e["layers"] for e in mine] == [list(record.prefill_layers)] + [list(s) for s in record.step_layers]
        assert [e["seconds"] for e in mine] == pytest.approx([record.prefill_seconds, *record.step_seconds], abs=1e-5)
        for row in range(2):
            assert [e["token_ids"][row] for e in mine if e["token_ids"][row] is not None] == progress.ids(row)
            assert [e["tokens"][row] for e in mine if e["tokens"][row] is not None] == progress.token_texts(row)
    assert [e["stream"] for e in entries] == ran  # in the order the race ran them
    assert len(by_stream(entries)["skipdecode"]) > 8 and len(by_stream(entries)["full"]) > 8


@pytest.fixture(scope="module")
def framed_server(tiny_folder):
    """The app on a tiny model whose decode steps sleep STEP_LAYER_S a layer: a run of 48 tokens
    lasts about a second and a half, many steps a frame."""
    from app.ui import build_demo, launch_options
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    adapters = {id(a): a for d in (generator.skip_decoder, generator.full_decoder) for a in (d.adapter, d.skip_adapter)}
    for adapter in adapters.values():
        original = adapter.run_layer

        def slow(index, hidden, *args, _original=original, **kwargs):
            if hidden.shape[1] == 1:
                time.sleep(STEP_LAYER_S)
            return _original(index, hidden, *args, **kwargs)

        adapter.run_layer = slow
    demo = build_demo(lambda: generator, Limits(max_new_tokens=64, max_job_cost=1000))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **launch_options())
    yield demo, generator
    demo.close()


@pytest.mark.server
def test_the_api_client_gets_every_step_once_in_frames_and_the_whole_result_last(framed_server):
    demo, generator = framed_server
    client = page_token_client(demo.local_url)
    started = time.time()
    job = client.submit(prompt="Tell me about the sea.", target_speedup=1.5, max_new_tokens=48, temperature=0.0,
                        batch_size=2, api_name="/generate")
    final = job.result(timeout=120)
    wall_s = time.time() - started
    partial = [m for m in job.outputs() if not m["done"]]
    messages = partial + [final]
    entries = [entry for message in messages for entry in message["new_steps"]]
    streams = by_stream(entries)
    for name, mine in streams.items():
        assert [e["step"] for e in mine] == list(range(len(mine))), name  # each step once, in order
    skip = streams["skipdecode"]
    assert [e["layers"] for e in skip] == [final["prefill_layers"], *final["step_layers"]]
    assert [len(layers) for layers in final["step_layers"]] == final["layers_per_step"]
    assert all(len(e["layers"]) == final["num_layers"] for e in streams["full"])
    for row in range(2):  # the frames' tokens spell the final texts
        for name in ("skipdecode", "full"):
            ids = [e["token_ids"][row] for e in streams[name] if e["token_ids"][row] is not None]
            assert generator.text.decode_text(ids) == final[name][row]
    # Frames, not one message a step: at most one per FRAME_S (and the last), several steps each.
    assert len(messages) <= wall_s / FRAME_S + 2, (len(messages), wall_s)
    assert len(entries) >= 2 * len(messages) and len(entries) > 60, (len(entries), len(messages))
    assert all("step_layers" not in m and "lens" not in m for m in partial)
    assert [layers for m in partial for layers in m["new_step_layers"]] == final["step_layers"][:sum(
        len(m["new_step_layers"]) for m in partial)]


@pytest.mark.server
def test_the_page_sends_frames_and_its_last_one_draws_every_step(framed_server):
    """The page's own Generate event, its stream read and applied as the page does
    (lab/serving/page_stream_bytes.py): at most one message per frame, and the heatmap the page draws
    last is the whole run's, every step of it, as the same greedy run in-process draws it."""
    import json

    from app.page.views import RaceRenderer
    from lab.serving import page_stream_bytes as script

    demo, _ = framed_server
    overrides = dict(prompt="Tell me about the sea.", max_new_tokens=48, target_speedup=1.5, temperature=0.0)
    result = script.page_generate(demo.local_url, "frames0001", **overrides)
    assert result["success"] and "Done" in result["status"], result["status"]
    # gradio adds a few messages of its own (estimation, start, completion) to the frames.
    assert result["messages"] <= result["seconds"] / FRAME_S + 8, (result["messages"], result["seconds"])
    _, names, values = script.page_event(demo.local_url, "ui_generate")
    settings = {name: value for name, value in zip(names, script.with_settings(names, values, **overrides)) if name}
    checked = demo.playground.checked(settings)
    update = list(checked.race())[-1]
    expected = json.loads(json.dumps(RaceRenderer(checked.settings).heatmap(update, highlight_last=False)))
    assert result["heatmap_figure"]["data"] == expected["data"]
    assert len(update.skip.step_layers) > 20


def random_json(rng, depth: int = 0):
    kind = rng.randrange(5 if depth < 3 else 3)
    if kind == 0:
        return rng.randrange(4)
    if kind == 1:
        return rng.choice(["", "a", "ab", "abc", "b"])
    if kind == 2:
        return None
    if kind == 3:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {key: random_json(rng, depth + 1) for key in rng.sample("wxyz", rng.randrange(4))}


def test_streamed_values_reach_the_client_whole_through_the_fixed_diff():
    """gradio_client applies a stream's edits in order (the page's client does the same); with the
    fixed diff every next value arrives as it was sent, lists of lists that shrink included."""
    import random

    from gradio_client.utils import apply_diff

    from app.serving.gradio_internals import gradio_diff, streaming_diff

    frame = {"new_steps": [{"layers": [0, 1, 2, 3]}, {"layers": [0, 1, 2, 3]}, {"layers": [0, 1]}]}
    after = {"new_steps": [{"layers": [0, 1, 2]}, {"layers": [0, 1, 2]}]}
    # gradio 6.31's own diff: each step's lost layer shifts the next delete (a step's layers and the
    # wrong step go missing)
    assert apply_diff(frame, gradio_diff(frame, after)) == {"new_steps": [{"layers": [0, 1, 3]}, {"layers": [0, 1]}]}
    assert apply_diff(frame, streaming_diff(frame, after)) == after
    rng = random.Random(51)
    for _ in range(3000):
        old, new = random_json(rng), random_json(rng)
        assert apply_diff(old, streaming_diff(old, new)) == new, (old, new)
