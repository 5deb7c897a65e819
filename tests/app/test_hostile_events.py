"""Hostile page events (issue 54) as tests, on a launched server with the E2E task (tiny task models): a pasted
line of spaces stalls nobody, an over-cost task job is refused before it touches the model lane,
an unknown value on a hidden page event is a message (not a 500); and a seeded fuzz over the public
API and the page's events (``SKIPDECODE_FUZZ_SECONDS`` runs it longer: 600 for the issue's ten
minutes).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import threading
import time

import pytest

from app.settings import Limits
from tests.support import script_module

ANSWER_S = 1.0  # any single request is answered or refused within a second of arrival
SUITE_ANSWER_S = 3.0  # the fuzz inside the whole suite: the bar with a margin (the stall it catches: 16.8 s)
SPACES = "a" + " " * 100_000 + "x"  # the probe's body: 16.8 s before the MR reader was linear
OVER_COST = {"prompt": "name[The Eagle], food[French]", "task": "e2e", "batch_size": 8, "target_speedup": 3,
             "max_new_tokens": 40}


@pytest.fixture(scope="module")
def task_server(tiny_folder, tiny_task_adapters):
    """The app on a tiny general model, with the E2E task's tiny models behind a loader that counts
    its loads (a refused job must not load anything)."""
    from app.tasks import TaskGenerators
    from app.ui import build_demo, launch_options
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    root, loader = tiny_task_adapters
    loads: list[tuple] = []

    def counting_loader(task, policy):
        loads.append((task, policy))
        return loader(task, policy)

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    limits = Limits(max_new_tokens=96, max_batch_size=8, max_prompt_chars=3000, max_job_cost=200)
    demo = build_demo(lambda: generator, limits, tasks=TaskGenerators(root=root, loader=counting_loader))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **launch_options())
    yield demo, loads
    demo.close()


def page_event(demo, api_name: str) -> tuple[int, list]:
    """(fn_index, the values a fresh page would send) of a page event by its api name."""
    index, fn = next((i, fn) for i, fn in demo.fns.items() if fn.api_name == api_name)
    return index, [component.value for component in fn.inputs]


def post_timed(url: str, payload: dict) -> tuple[int, dict | str, float]:
    import httpx

    started = time.perf_counter()
    response = httpx.post(url, content=json.dumps(payload), headers={"content-type": "application/json"}, timeout=60)
    seconds = time.perf_counter() - started
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return response.status_code, body, seconds


def test_unloaded_task_policy_is_costed_without_loading_it(tiny_folder, tiny_task_adapters):
    from app.handlers import Playground
    from app.tasks import TaskGenerators
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    root, loader = tiny_task_adapters
    loads = []
    tasks = TaskGenerators(root=root, loader=lambda task, policy: loads.append(policy) or loader(task, policy))
    general = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    playground = Playground(lambda: general, Limits(max_new_tokens=96, max_job_cost=200), tasks=tasks)
    problem = playground.admission_problem("generate", OVER_COST)
    assert problem is not None and "units of model time" in problem[1], problem
    assert problem[0] in ("max_new_tokens", "batch_size"), problem
    assert playground.admission_problem("generate", OVER_COST | {"batch_size": 1, "max_new_tokens": 8}) is None
    assert loads == []  # neither job loaded a policy to be judged
    # the same verdict from a loaded generator of the task as from the general model's tokenizer
    tasks.get("e2e", 2.0)
    assert playground.admission_problem("generate", OVER_COST) == problem


@pytest.mark.server
def test_a_pasted_line_of_spaces_stalls_nobody(task_server):
    """The probe: the MR-feedback event and the task switch with 100 k spaces, while another
    client loads the page's config; each answered within a second."""
    import httpx

    demo, _ = task_server
    base = demo.local_url.rstrip("/")
    waited: list[float] = []

    def fetch_config() -> None:
        started = time.perf_counter()
        assert httpx.get(f"{base}/config", timeout=60).status_code == 200
        waited.append(time.perf_counter() - started)

    for api_name in ("ui_mr_feedback", "ui_task_switch"):
        index, _ = page_event(demo, api_name)
        other = threading.Thread(target=fetch_config)
        other.start()
        status, body, seconds = post_timed(f"{base}/gradio_api/run/predict",
                                           {"data": ["e2e", SPACES], "fn_index": index, "session_hash": "spaces1"})
        other.join()
        assert status in (200, 422) and seconds < ANSWER_S, (api_name, status, seconds, str(body)[:300])
        assert "100002 characters" in json.dumps(body), body  # refused by its length, with the number
        assert waited[-1] < ANSWER_S, (api_name, waited)
    # under the deployer's limit, the reader itself answers: a line of spaces within 3000 characters
    index, _ = page_event(demo, "ui_mr_feedback")
    status, body, seconds = post_timed(f"{base}/gradio_api/run/predict", {"data": ["e2e", SPACES[:2999] + "x"],
                                                                        "fn_index": index, "session_hash": "spaces1"})
    assert status == 200 and seconds < ANSWER_S and "3000 characters" in json.dumps(body), (status, body)


@pytest.mark.server
def test_an_over_cost_task_job_is_refused_before_it_loads_a_policy(task_server):
    demo, loads = task_server
    base = demo.local_url.rstrip("/")
    before = len(loads)
    for speedup in (3, 4, 3, 4):  # alternating speedups reloaded a policy per refusal before
        status, body, seconds = post_timed(f"{base}/gradio_api/call/v2/generate",
                                           OVER_COST | {"target_speedup": speedup})
        assert status == 422 and seconds < ANSWER_S, (status, seconds, body)
        assert "units of model time" in json.dumps(body)
    assert len(loads) == before


@pytest.mark.server
@pytest.mark.parametrize("api_name", ["ui_task_view", "ui_task_switch", "ui_mr_feedback"])
@pytest.mark.parametrize("task", ["translate", None])  # null: the 10-minute fuzz's only 500s (a radio has no null)
def test_an_unknown_task_on_a_hidden_event_gets_the_apis_message(task_server, api_name, task):
    demo, _ = task_server
    index, values = page_event(demo, api_name)
    values[0] = task
    status, body, seconds = post_timed(f"{demo.local_url.rstrip('/')}/gradio_api/run/predict",
                                       {"data": values, "fn_index": index, "session_hash": "task1"})
    assert status == 422 and seconds < ANSWER_S, (status, body)
    assert f"task must be one of chat, e2e, tldr; got {task!r}" in json.dumps(body), body


# --- the fuzz: random MRs, prompts, settings and share-link queries at every event -----------------


def hostile_events():
    """scripts/hostile_events.py: the same probes and fuzz as `scripts/load_test.py --hostile` runs."""
    return script_module("hostile_events")


def test_the_fuzz_reaches_every_event_and_the_api_with_values_no_control_sends():
    script = hostile_events()
    events = [script.Event(0, False, "ui_mr_feedback", ("chat", "Hi")), script.Event(1, True, "ui_generate", (2.0,))]
    drawn = list(itertools.islice(script.fuzz_requests("http://h", events, random.Random(1)), 400))
    routes = collections.Counter(url.rsplit("/gradio_api/", 1)[1] for url, _ in drawn)
    assert set(routes) == {"run/predict", "queue/join", "call/v2/generate"} and min(routes.values()) > 40
    values = [value for _, body in drawn for value in body.get("data", [])]
    assert any(value not in ("chat", "Hi", 2.0) for value in values) and "chat" in values  # both kinds
    assert any(isinstance(v, str) and len(v) >= 8000 for _, body in drawn for v in [*body.get("data", []),
                                                                                     *body.values()])
    again = list(itertools.islice(script.fuzz_requests("http://h", events, random.Random(1)), 400))
    assert again == drawn  # seeded: a failure is replayed by its seed


@pytest.mark.server
def test_a_seeded_fuzz_gets_a_message_within_seconds_never_a_500_or_a_traceback(task_server, capfd):
    import httpx

    demo, _ = task_server
    script = hostile_events()
    report = script.fuzz(demo.local_url.rstrip("/"), script.events_of(demo), fuzz_seconds())
    assert report["requests"] >= 20, report
    assert report["http_500_or_empty"] == 0, report["examples"]
    # The bar is a second, which the ten-minute run holds (scripts/hostile_events.py: slowest 1.00 s,
    # a queued model run's join); inside the whole suite on a 2-core machine that join once took 1.22 s,
    # so the suite asserts with a margin that still catches the stall this guards against (16.8 s).
    slowest = max((entry["seconds"] for entry in report["slowest"]), default=0.0)
    assert slowest < SUITE_ANSWER_S, report["slowest"]
    started = time.perf_counter()
    assert httpx.get(demo.local_url, timeout=30).status_code == 200 and time.perf_counter() - started < ANSWER_S
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, (out + err)[-3000:]


def fuzz_seconds() -> float:
    """SKIPDECODE_FUZZ_SECONDS: 20 in CI; 600 for the issue's ten-minute run."""
    return float(os.environ.get("SKIPDECODE_FUZZ_SECONDS", "20"))
