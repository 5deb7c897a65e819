"""The playground through a real launched Gradio server and gradio_client."""

import dataclasses
import threading
import time

import pytest
from gradio_client import Client

from app.settings import Limits, PlaygroundSettings, trained_defaults
from app.ui import build_demo, launch_options
from model.generation.generator import TextGenerator
from model.generation.runs import GenerationRequest
from model.generation.schedules import ScheduleRequest
from tests.support import page_token_client

pytestmark = pytest.mark.server


class CountingGenerator(TextGenerator):
    """A TextGenerator that counts decoder steps, to prove cancellation stops the decoder itself."""

    def __init__(self, loaded):
        super().__init__(loaded)
        self.steps = 0
        for decoder in (self.skip_decoder, self.full_decoder):
            original = decoder.decode_step

            def counted(*args, _original=original, **kwargs):
                self.steps += 1
                return _original(*args, **kwargs)

            decoder.decode_step = counted


@pytest.fixture(scope="module")
def server(default_model):
    generator = CountingGenerator(default_model)
    # max_job_cost: these tests cancel long jobs (a 1500-token prefill), over the page's default bound
    demo = build_demo(lambda: generator, Limits(max_new_tokens=256, max_batch_size=4, max_prompt_chars=60000,
                                                max_job_cost=100_000),
                      queue_size=16)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **launch_options())
    yield demo, generator
    demo.close()


@pytest.fixture()
def client(server):
    demo, _ = server
    return Client(demo.local_url, verbose=False)


def test_generate_api_parameters_are_the_settings_schema(client, server):
    """Every API name of the schema, in order, with the schema's default (the loaded skip
    policy's placement for warmup and order); only the prompt is required."""
    _, generator = server
    info = client.view_api(return_format="dict", print_info=False)
    params = {p["parameter_name"]: p for p in info["named_endpoints"]["/generate"]["parameters"]}
    assert list(params) == list(PlaygroundSettings.api_names())
    assert not params["prompt"]["parameter_has_default"]
    defaults = {f.name: f.default for f in dataclasses.fields(PlaygroundSettings)} | trained_defaults(generator)
    for name in list(params)[1:]:
        assert params[name]["parameter_has_default"] and params[name]["parameter_default"] == defaults[name], name


def test_stream_completes_and_agrees_with_the_decoder(client, server):
    _, generator = server
    job = client.submit(prompt="Name three colours.", target_speedup=2.0, decay="linear", max_new_tokens=12,
                        api_name="/generate")
    messages = list(job)
    assert len(messages) > 5  # streamed, not one blob
    final = messages[-1]
    assert final["done"] is True
    reference = generator.generate(GenerationRequest(
        prompts=("Name three colours.",), schedule=ScheduleRequest(target_speedup=2.0, decay="linear"),
        max_new_tokens=12))
    assert final["skipdecode"][0] == reference.outputs[0]
    assert final["layers_per_step"] == reference.layers_per_step
    assert final["step_layers"] == [list(layers) for layers in reference.decode.step_layers]
    assert final["prefill_layers"] == list(range(30))
    cli_json = reference.to_json()  # one serializer: the API and the CLI JSON name and compute alike
    for key in ("prefill_layers", "planned_layer_speedup", "planned_cost_model_speedup", "achieved_layer_speedup",
                "schedule"):
        assert final[key] == cli_json[key], key
    full = generator.generate(GenerationRequest(prompts=("Name three colours.",), schedule=ScheduleRequest(full=True),
                                                max_new_tokens=12))
    assert final["full"][0] == full.outputs[0]
    # partial messages grow monotonically
    lengths = [len(m["skipdecode"][0]) + len(m["full"][0]) for m in messages]
    assert lengths == sorted(lengths)


def test_batch_rows_share_one_exit_per_step(client):
    final = list(client.submit(prompt="Write a haiku about autumn.", target_speedup=3.0, decay="cosine", batch_size=3,
                               max_new_tokens=8, api_name="/generate"))[-1]
    assert len(final["skipdecode"]) == 3 and len(final["full"]) == 3
    steps = final["layers_per_step"]  # one depth per step, shared by the rows: non-increasing, below L
    assert steps and all(isinstance(n, int) for n in steps) and steps == sorted(steps, reverse=True)
    assert max(steps) < 30 and final["achieved_layer_speedup"] == pytest.approx(30 * len(steps) / sum(steps), rel=1e-3)


def test_cancel_stops_the_decoder_and_frees_the_slot(client, server):
    demo, generator = server
    job = client.submit(prompt="Tell me a very long story about the sea.", target_speedup=1.5, decay="linear",
                        max_new_tokens=256, temperature=0.7, seed=1, api_name="/generate")
    started = generator.steps
    deadline = time.time() + 60
    while generator.steps < started + 3 and time.time() < deadline:
        time.sleep(0.05)
    assert demo.playground.runs.active_count() == 1
    assert not demo.playground.runs.sessions()[0].startswith("no-session")
    job.cancel()
    deadline = time.time() + 20
    while demo.playground.runs.active_count() > 0 and time.time() < deadline:
        time.sleep(0.1)
    assert demo.playground.runs.active_count() == 0
    time.sleep(0.5)
    settled = generator.steps
    time.sleep(1.5)
    assert generator.steps == settled, "the decoder kept stepping after cancel"
    assert settled - started < 2 * 255  # it did not run to the end


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(prompt=""), "empty"),
        (dict(prompt=" \n\t "), "empty"),
        (dict(prompt="word " * 13000), "limit"),
        (dict(prompt="hi", target_speedup=40.0), "unreachable"),
        (dict(prompt="hi", target_speedup=0.5), "target_speedup"),
        (dict(prompt="hi", min_layers=20, max_layers=10), "min_layers"),
        (dict(prompt="hi", decay="zigzag"), "decay"),
        (dict(prompt="hi", max_new_tokens=100000), "max_new_tokens"),
        (dict(prompt="hi", batch_size=50), "batch_size"),
        (dict(prompt="hi", warmup=5, min_layers=3), "warmup"),
        (dict(prompt="hi", prompt_at_full_depth="no"), "true or false"),
        (dict(prompt="hi " * 1900, batch_size=4, max_new_tokens=256), "limit per request"),
    ],
)
def test_bad_input_gets_a_clear_message_and_the_server_keeps_serving(client, kwargs, needle):
    with pytest.raises(Exception, match=needle):
        client.predict(api_name="/generate", **kwargs)


def test_prompt_over_the_token_limit_is_refused_clearly(client):
    with pytest.raises(Exception, match="tokens; the limit is 2048 tokens"):
        client.predict(prompt="Summarise: " + "the quick brown fox " * 2100, max_new_tokens=256, api_name="/generate")


def test_still_serving_after_bad_input(client):
    final = client.predict(prompt="Say hi.", target_speedup=1.5, decay="power", max_new_tokens=4, api_name="/generate")
    assert final["done"] and final["full"][0]


def test_concurrent_sessions_get_their_own_outputs(server):
    demo, _ = server
    results = {}

    def run(name, prompt):
        client = page_token_client(demo.local_url)
        results[name] = client.predict(prompt=prompt, target_speedup=1.0, max_new_tokens=10, api_name="/generate")

    threads = [threading.Thread(target=run, args=("a", "What is the capital of France?")),
               threading.Thread(target=run, args=("b", "Write a Python function that adds two numbers."))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert "Paris" in results["a"]["full"][0]
    assert "Paris" not in results["b"]["full"][0] and "def" in results["b"]["full"][0]


def test_step_mode_advances_both_streams_one_token_at_a_time(server):
    demo, _ = server

    class Session:
        session_hash = "step-test"

    values = dict(prompt="Name three colours.", target_speedup=2.0, decay="linear", warmup=1, max_new_tokens=6)
    statuses = [demo.playground.step(values, request=Session())[0] for _ in range(7)]
    assert statuses[0].startswith("prefill (the prompt, up to position ") and "SkipDecode ran 30/30 layers" in statuses[0]
    prompt_length = int(statuses[0].split("position ")[1].split(")")[0]) + 1
    for k in range(5):  # decode step k feeds generated token k, at position prompt length + k
        assert statuses[k + 1].startswith(f"step {k} (position {prompt_length + k}): "), statuses
    assert "complete" in statuses[6] or statuses[6].startswith("step 4")


# --- hardening: one hostile client must not tie the server up -----------------------------------


def test_a_subnormal_temperature_is_greedy_not_a_crash(client):
    final = client.predict(prompt="Name three colours.", temperature=1e-300, max_new_tokens=6, api_name="/generate")
    greedy = client.predict(prompt="Name three colours.", temperature=0.0, max_new_tokens=6, api_name="/generate")
    assert final["done"] and final["skipdecode"] == greedy["skipdecode"]


def test_the_largest_documented_seed_is_accepted(client):
    final = client.predict(prompt="Hi", seed=2**63 - 1, temperature=0.7, max_new_tokens=3, api_name="/generate")
    assert final["done"]


def test_rest_routes_that_bypass_the_queue_are_closed(server):
    import httpx

    demo, _ = server
    response = httpx.post(demo.local_url.rstrip("/") + "/gradio_api/run/generate", json={"data": ["hi"]}, timeout=30)
    assert response.status_code >= 400, response.text[:200]


def test_uploads_are_refused_and_nothing_leaks(server):
    import httpx

    demo, _ = server
    base = demo.local_url.rstrip("/")
    upload = httpx.post(base + "/gradio_api/upload", files={"files": ("big.bin", b"x" * 50_000)}, timeout=30)
    assert upload.status_code >= 400
    config = httpx.get(base + "/config", timeout=30)
    page = httpx.get(base + "/", timeout=30)
    assert config.json().get("analytics_enabled") is False
    for text in (config.text, page.text):
        assert ".venv" not in text and "site-packages" not in text
    assert httpx.get(base + "/monitoring/summary", timeout=30).status_code >= 400
    script = httpx.get(base + "/gradio_api/file=" + "app/../.venv/lib", timeout=30)
    assert script.status_code >= 400  # the static path exposes one file, not plotly's package folder


def test_two_api_runs_of_one_session_do_not_cancel_each_other(server):
    demo, _ = server

    class Session:
        session_hash = "same-client"

    values = dict(prompt="Name three colours.", max_new_tokens=5)
    first = demo.playground.api_stream(values, Session())
    second = demo.playground.api_stream(values, Session())
    finals = {}
    for name, stream in [("a", first), ("b", second), ("a", first), ("b", second)]:
        finals[name] = next(stream)
    for name, stream in (("a", first), ("b", second)):
        for message in stream:
            finals[name] = message
    assert finals["a"]["done"] and finals["b"]["done"]
    assert not finals["a"].get("cancelled") and not finals["b"].get("cancelled")


def test_a_cancelled_api_run_says_so(server):
    demo, _ = server

    class Session:
        session_hash = "cancel-me"

    stream = demo.playground.api_stream(dict(prompt="Write a long story.", max_new_tokens=40), Session())
    next(stream)
    for key in demo.playground.runs.sessions():
        if key.startswith("cancel-me"):
            demo.playground.runs.cancel(key, reason="stop")
    messages = list(stream)
    assert messages[-1]["cancelled"] is True and "cancelled" in messages[-1]["error"] and not messages[-1]["done"]


def test_skip_policy_off_is_the_untouched_model_skipping_and_1x_is_the_full_model(client, server):
    _, generator = server
    prompt = "Name three colours."
    off = client.predict(prompt=prompt, target_speedup=2.0, max_new_tokens=10, skip_policy=False, api_name="/generate")
    untouched = generator.generate(GenerationRequest(
        prompts=(prompt,), schedule=ScheduleRequest(target_speedup=2.0, skip_policy=False), max_new_tokens=10))
    assert off["skipdecode"][0] == untouched.outputs[0]
    assert untouched.adapter is None
    one_x = client.predict(prompt=prompt, target_speedup=1.0, max_new_tokens=10, api_name="/generate")
    assert one_x["layers_per_step"] == [30] * len(one_x["layers_per_step"])
    assert one_x["skipdecode"] == one_x["full"]  # the skip policy never acts at full depth
    assert one_x["full_model_same_next_token"] == 1.0  # on its own prefix the full model picks every token


def test_api_defaults_are_the_adapters_trained_placement(client, server):
    _, generator = server
    info = client.view_api(return_format="dict", print_info=False)
    parameters = {p["parameter_name"]: p for p in info["named_endpoints"]["/generate"]["parameters"]}
    assert parameters["warmup"]["parameter_default"] == generator.schedules.default_warmup
    assert parameters["order"]["parameter_default"] == generator.schedules.default_order
    final = client.predict(prompt="Hi", max_new_tokens=4, api_name="/generate")
    assert final["schedule"]["warmup"] == generator.schedules.default_warmup
    assert final["schedule"]["order"] == generator.schedules.default_order
    assert final["skipdecode_decode_tokens_per_second"] > 0 and final["skipdecode_prefill_seconds"] > 0


def test_lens_top1_at_the_last_layer_that_ran_is_the_generated_token(client, server):
    _, generator = server
    final = client.predict(prompt="What is photosynthesis?", target_speedup=2.0, max_new_tokens=8, lens=True,
                           api_name="/generate")
    lens = final["lens"]
    ids = generator.loaded.tokenizer(final["skipdecode"][0], add_special_tokens=False)["input_ids"]
    assert len(lens) == len(final["layers_per_step"]) + 1 == 8  # one entry per generated token
    assert [entry["layer"] for entry in lens[0]] == final["prefill_layers"]
    for entry, layers in zip(lens[1:], final["step_layers"]):
        assert [reading["layer"] for reading in entry] == layers  # executed layers only, in order
    generated = [entry[-1]["token_id"] for entry in lens]
    assert generator.text.decode_text(generated) == final["skipdecode"][0]
    assert ids == generated or generator.text.decode_text(ids) == generator.text.decode_text(generated)
    assert all(0 < reading["prob"] <= 1 for entry in lens for reading in entry)
    plain = client.predict(prompt="What is photosynthesis?", target_speedup=2.0, max_new_tokens=8, api_name="/generate")
    assert "lens" not in plain and plain["skipdecode"] == final["skipdecode"]  # the lens changes nothing


def test_one_session_cannot_fill_the_queue(server):
    demo, generator = server
    hog = page_token_client(demo.local_url)  # a page session: 2 jobs may wait
    running = hog.submit(prompt="Tell me a very long story about the sea.", max_new_tokens=256, temperature=0.7,
                         api_name="/generate")
    deadline = time.time() + 60
    while demo.playground.runs.active_count() == 0 and time.time() < deadline:
        time.sleep(0.05)
    waiting = [hog.submit(prompt=f"Question {i}?", max_new_tokens=2, api_name="/generate") for i in range(4)]
    refused = []
    for job in waiting:
        try:
            job.result(timeout=1)
        except Exception as error:  # noqa: BLE001 - gradio_client raises QueueError or a timeout
            refused.append(type(error).__name__ + str(error))
    queue_full = [r for r in refused if "Queue is full" in r]
    assert len(queue_full) == 2, refused  # 2 may wait per session; the rest are turned away at once
    other = page_token_client(demo.local_url).submit(prompt="Hi", max_new_tokens=2, api_name="/generate")
    running.cancel()
    assert other.result(timeout=120)["done"] is True  # another visitor still gets in
    for job in waiting:
        job.cancel()


def test_cancelling_an_api_job_stops_its_long_prefill(client, server):
    demo, _ = server
    playground = demo.playground
    job = client.submit(prompt="sea " * 1500, max_new_tokens=64, api_name="/generate")  # ~1500-token prefill
    deadline = time.time() + 60
    while playground.runs.active_count() == 0 and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # inside the prefill
    job.cancel()
    cancelled_at = time.time()

    def model_free() -> bool:
        if playground.compute.acquire(blocking=False):
            playground.compute.release()
            return playground.runs.active_count() == 0
        return False

    while not model_free() and time.time() - cancelled_at < 30:
        time.sleep(0.02)
    # One layer of a 1500-token prefill is well under a second; the whole uncancelled run is many.
    assert time.time() - cancelled_at < 1.5, "the cancelled job kept the model busy"


def test_malformed_calls_get_a_message_not_a_bare_500(server):
    import httpx

    demo, _ = server
    base = demo.local_url.rstrip("/") + "/gradio_api"
    unknown_fn = httpx.post(f"{base}/queue/join", json={"data": ["hi"], "fn_index": 99999, "session_hash": "x"})
    assert unknown_fn.status_code == 400 and "fn_index" in unknown_fn.json()["detail"]
    unknown_name = httpx.post(f"{base}/call/nonesuch", json={"data": ["hi"]})
    assert unknown_name.status_code == 404 and "/generate" in unknown_name.json()["detail"]
    too_few = httpx.post(f"{base}/call/generate", json={"data": ["hi"]})
    assert too_few.status_code == 422 and "values" in too_few.json()["detail"]
    not_json = httpx.post(f"{base}/call/generate", content=b"{", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and "JSON" in not_json.json()["detail"]
    # a well-formed call still joins the queue
    info = Client(demo.local_url, verbose=False).view_api(return_format="dict", print_info=False)
    values = [p["parameter_default"] if p["parameter_has_default"] else "Hi"
              for p in info["named_endpoints"]["/generate"]["parameters"]]
    values[info_index(info, "max_new_tokens")] = 2
    started = httpx.post(f"{base}/call/generate", json={"data": values})
    assert started.status_code == 200 and "event_id" in started.json()


def info_index(info: dict, name: str) -> int:
    return [p["parameter_name"] for p in info["named_endpoints"]["/generate"]["parameters"]].index(name)


def test_lens_kl_to_the_full_model_is_zero_after_the_last_layer_at_full_depth(server):
    _, generator = server
    request = GenerationRequest(prompts=("What is photosynthesis?",), schedule=ScheduleRequest(target_speedup=1.0),
                                max_new_tokens=6)
    stream = generator.stream(request, trace_row=0)
    traces = []
    while True:
        try:
            traces.append(next(stream).trace)
        except StopIteration as end:
            result = end.value
            break
    full = generator.judge.log_probs(generator.prepare(request).prompt_ids(), result.decode.tokens[0])
    kl = generator.lens.kl(traces, full, request.schedule)
    # At 1x SkipDecode IS the full model: on its own prefix the full model picks every one of its tokens.
    assert generator.judge.choices(full) == list(result.decode.tokens[0])
    assert len(kl) == 6 and all(set(entry) == set(range(30)) for entry in kl)
    assert all(entry[29] < 1e-3 for entry in kl)  # the last layer's lens IS the full model at 1x
    assert all(entry[5] > 0.1 for entry in kl)  # an early layer's guess is far from it


def test_stop_while_queued_ends_the_run_as_it_starts(server):
    """A Stop pressed after the Generate click but before its run starts (it waits in the queue)
    ends that run at once: one 'Stopped.' update, no decoder step, the panes left as they were."""
    demo, generator = server

    class Session:
        session_hash = "stop-while-queued"

    playground, key = demo.playground, "stop-while-queued"
    playground.arm(Session())
    playground.stop(Session())  # nothing runs yet: the Stop is remembered for the queued run
    before = generator.steps
    updates = list(playground.generate(dict(prompt="Write a long story.", max_new_tokens=40), Session()))
    assert len(updates) == 1 and updates[0][0] == "Stopped."
    assert generator.steps == before and not playground.runs.is_running(key)
    # the Stop was for that run only: the next Generate click runs
    playground.arm(Session())
    updates = list(playground.generate(dict(prompt="Name three colours.", max_new_tokens=4), Session()))
    assert "Done" in updates[-1][0] and generator.steps > before


def test_a_stale_stop_does_not_cancel_a_later_run():
    """Stop with nothing queued or running (after a run ended, say) is not held against the next run;
    a run started without a Generate click (the API, a restart) is never cancelled by an old Stop."""
    from app.serving.sessions import SessionRuns

    runs = SessionRuns()
    runs.cancel("s")  # idle Stop
    assert not runs.start("s").cancelled
    runs.finish("s", runs._runs["s"])
    runs.arm("s")
    runs.cancel("s")  # Stop while queued...
    runs.arm("s")  # ...then a new Generate click: that one must run
    assert not runs.start("s").cancelled
    runs.arm("s")
    runs.cancel("s", reason="restart")  # a settings restart is not a Stop
    assert not runs.start("s").cancelled
    runs.arm("t")
    runs.cancel("t")
    assert runs.start("t").cancelled and not runs.start("t").cancelled  # once, for that run only


def test_a_clicks_checks_refuse_with_the_servers_words_and_pass_a_good_run(server):
    """The page's checks before a push (Playground.refusal): the same reasons the push gives, on one
    status line; a good run passes with the status left to the run; the queue's own refusal too."""
    import html
    from types import SimpleNamespace

    import gradio as gr

    from app.handlers import REFUSED

    demo, _ = server
    playground = demo.playground
    values = trained_defaults(playground.get_generator()) | {"prompt": "Name three colours."}
    status, allowed = playground.refusal(values)
    assert allowed and isinstance(status, type(gr.skip()))
    for change, words in (({"prompt": "  "}, "the prompt is empty"),
                          ({"prompt": "x" * 70000}, "the prompt is 70000 characters; the limit is 60000"),
                          ({"prompt": "word " * 3000}, "tokens; the limit is 2048 tokens"),
                          ({"min_layers": 20, "max_layers": 5}, "must not exceed max_layers")):
        status, allowed = playground.refusal(values | change)
        status = html.unescape(status)  # escaped for Markdown: the reason may quote the visitor
        assert not allowed and status.startswith(f"**{REFUSED}**") and words in status and "\n" not in status, status
    request = SimpleNamespace(session_hash="no-such-page", client=SimpleNamespace(host="10.9.8.7"), headers={})
    assert demo.fair_queue.refusal_for(request) is None  # an empty queue takes it


def _visitors_together(demo, count: int, visit) -> None:
    """``count`` page sessions (each with its page token), each calling ``visit(client, index)`` in its own
    thread at the same moment (a barrier), as a class presses Generate together."""
    clients = [page_token_client(demo.local_url) for _ in range(count)]
    start = threading.Barrier(count)

    def run(index: int) -> None:
        start.wait()
        visit(clients[index], index)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)


def _first_message(job, timeout_s: float):
    """A submitted job's first streamed message, once it came (None after ``timeout_s``)."""
    deadline = time.time() + timeout_s
    while not job.outputs() and time.time() < deadline:
        time.sleep(0.01)
    messages = job.outputs()
    return messages[0] if messages else None


def test_a_burst_of_visitors_shares_one_batch_each_reading_its_own_text_and_one_may_leave(server):
    """Six page sessions press Generate together: their jobs run as one SkipDecode batch (the API says how
    many shared it), each message answers its own prompt, two visitors with one prompt read one text,
    and the visitor who leaves after its first message takes nothing from the others."""
    demo, _ = server
    prompts = ["What is the capital of France?", "Name three colours.", "What is the capital of France?",
               "Write a Python function that adds two numbers.", "List five animals that live in the ocean.",
               "Explain what a computer does."]
    batches_before = demo.playground.batcher.largest
    results: dict[int, dict] = {}

    def visit(client, index: int) -> None:
        job = client.submit(prompt=prompts[index], target_speedup=2.0, max_new_tokens=24, api_name="/generate")
        if index == 5:  # this visitor leaves once its first message came
            _first_message(job, 60)
            job.cancel()
            return
        results[index] = job.result(timeout=120)

    _visitors_together(demo, len(prompts), visit)
    assert sorted(results) == [0, 1, 2, 3, 4]
    assert max(message["batch_requests"] for message in results.values()) >= 3  # they shared a batch
    assert demo.playground.batcher.largest >= max(3, batches_before)
    for index, message in results.items():
        assert message["done"] and message["prompts"] == [prompts[index]] and len(message["skipdecode"]) == 1
        assert message["batch_rows"] >= message["batch_requests"]
    assert results[0]["skipdecode"] == results[2]["skipdecode"]  # one prompt, one text
    assert "Paris" in results[0]["full"][0] and "def" in results[3]["full"][0]  # each its own answer
    assert "Paris" not in results[1]["full"][0]


def test_a_burst_of_long_prompts_shows_each_part_its_first_token_as_it_is_read(server):
    """Six visitors with long prompts press Generate together: the batch reads their prompts in parts, so
    the first part's visitors get their first message (SkipDecode's first token, the full model's pane
    still empty) before the whole read is done, and every text is still its own."""
    demo, _ = server
    topics = ["the sea", "a mountain village", "a busy railway station", "an old library", "a desert road",
              "a winter market"]
    prompts = [f"Here is a note about {topic}. " + " ".join(
        f"Sentence {n} about {topic} describes its colours, its sounds and the people who pass through it."
        for n in range(8)) + " Give it a title." for topic in topics]
    firsts: dict[int, dict] = {}
    finals: dict[int, dict] = {}

    def visit(client, index: int) -> None:
        job = client.submit(prompt=prompts[index], target_speedup=2.0, max_new_tokens=6, api_name="/generate")
        firsts[index] = _first_message(job, 120)
        finals[index] = job.result(timeout=120)

    _visitors_together(demo, len(prompts), visit)
    assert sorted(finals) == list(range(len(prompts)))
    assert max(message["batch_requests"] for message in finals.values()) >= 4  # they shared a batch
    for index, first in firsts.items():
        assert first["skipdecode"][0] and not first["full"][0]  # SkipDecode's first token, the full pane empty
        assert finals[index]["prompts"] == [prompts[index]]
    shared = [index for index in finals if finals[index]["batch_requests"] >= 4]
    early = [index for index in shared
             if firsts[index]["skipdecode_prefill_seconds"] < 0.8 * finals[index]["skipdecode_prefill_seconds"]]
    assert early, [(firsts[i]["skipdecode_prefill_seconds"], finals[i]["skipdecode_prefill_seconds"]) for i in shared]


def test_the_generations_run_in_the_batch_lane_and_their_pushes_reach_the_batcher(server):
    """The batcher gathers by lane: every generation event is in it, step mode is not, and an admitted
    push of the lane tells the batcher a job is on its way."""
    from app.serving import gradio_internals as gi
    from app.serving.batcher import LANE

    demo, _ = server
    lanes = {gi.api_name_of(fn): gi.lane_of(fn) for fn in gi.functions(demo).values() if gi.api_name_of(fn)}
    for name in ("generate", "ui_generate", "ui_lesson_0", "ui_lesson_1", "ui_lesson_link", "ui_restart_0"):
        assert lanes[name] == LANE, name
    assert lanes["ui_step"] != LANE
    batcher = demo.playground.batcher
    before = batcher._coming
    demo.fair_queue.admitted(lanes["ui_step"])
    assert batcher._coming == before
    demo.fair_queue.admitted(LANE)
    assert batcher._coming == before + 1
    batcher._coming = before
