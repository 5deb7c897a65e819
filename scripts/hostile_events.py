"""Hostile page events against a launched playground on loopback (issue 54): three probes of
oversized and unknown values and a seeded fuzz over the public API and every page event. Used by
`scripts/load_test.py --hostile` (under "event_fuzz"; `--hostile --event-fuzz` runs only this) and,
for its request generator and checks, by tests/app/test_hostile_events.py.

  spaces          the MR-feedback and task-switch events with "a" + 100,000 spaces + "x" while
                  another client loads /config: each answer's time and the other client's wait
                  (target: both under 1 s; the quadratic MR pattern took 16.8 s)
  over-cost task  {"prompt": "name[The Eagle], food[French]", "task": "e2e", "batch_size": 8,
                  "max_new_tokens": 40} at 3x, 4x, 3x, 4x through /call/v2/generate: status and time
                  (target: 422 under 1 s each, no policy loaded to decide it)
  unknown task    "translate" on the hidden task-view, task-switch and MR-feedback events: status
                  and message (target: 422 with the API's "task must be one of ..." message)
  fuzz            random MRs, prompts, settings and share-link queries at every event and the API
                  for --fuzz-seconds: requests, statuses, answers over 1 s, 500s (target 0), the
                  server's tracebacks (target 0), and the page still answering
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import httpx

ANSWER_S = 1.0  # any single request answered or refused within a second of arrival
SPACES = "a" + " " * 100_000 + "x"
OVER_COST = {"prompt": "name[The Eagle], food[French]", "task": "e2e", "batch_size": 8, "target_speedup": 3,
             "max_new_tokens": 40}
HIDDEN_TASK_EVENTS = ("ui_task_view", "ui_task_switch", "ui_mr_feedback")
SETTING_NAMES = ("prompt", "task", "target_speedup", "batch_size", "max_new_tokens", "decay", "temperature", "lens",
                 "min_layers", "max_layers", "seed", "top_p")


@dataclass(frozen=True)
class Event:
    """A page event as the page sends it: its fn_index, whether it joins the queue, its api name,
    and the values a fresh page holds for its inputs."""

    index: int
    queued: bool
    api_name: str
    values: tuple


def events_from_config(config: dict) -> list[Event]:
    """Every named event of a launched app, from its /config."""
    values = {component["id"]: component.get("props", {}).get("value") for component in config["components"]}
    return [Event(index, bool(dependency.get("queue", True)), dependency["api_name"],
                  tuple(values.get(i) for i in dependency.get("inputs", [])))
            for index, dependency in enumerate(config["dependencies"]) if dependency.get("api_name")]


def events_of(demo) -> list[Event]:
    """Every named event of an app built in this process (a test's)."""
    return [Event(index, bool(fn.queue), fn.api_name, tuple(component.value for component in fn.inputs))
            for index, fn in demo.fns.items() if fn.api_name]


def random_text(rng: random.Random) -> str:
    pieces = ["name[The Eagle]", "food[French]", ", ", "[", "]", " ", "\t", "é", "光", "<b>", "area[", "\x00",
              "customer rating[5 out of 5]", "near[Café Rouge]", "eatType[pub]", "%s", "{}", "\ud7ff", "name",
              "](javascript:x)", "<form><input>", "\u202e"]
    if rng.random() < 0.1:  # a long run of one character: what a backtracking pattern chokes on
        return rng.choice([" ", "[", ",", "é", "a "]) * rng.choice([10, 8000, 60000])
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))


def random_value(rng: random.Random, value):
    """The page's own value, or something no control would send."""
    if rng.random() >= 0.6:
        return value
    return rng.choice([None, -1, 0, 10**12, 1e308, -0.5, "", "x" * rng.randint(0, 300), True, [1], {"a": 1},
                       rng.choice(["chat", "e2e", "tldr", "translate", "E2E", "linear", "zigzag", "warmup_top"]),
                       random_text(rng), rng.uniform(-5, 50), rng.randint(-3, 300)])


def fuzz_requests(base: str, events: list[Event], rng: random.Random) -> Iterator[tuple[str, dict]]:
    """Endless (url, JSON body) pairs against ``base`` (the app's URL, no trailing slash): half to
    the page's events with random values, the rest to the public API with random settings or a
    share link's query of random names and values."""
    api = f"{base}/gradio_api"
    while True:
        kind = rng.random()
        if kind < 0.5:
            event = rng.choice(events)
            route = "queue/join" if event.queued else "run/predict"
            yield f"{api}/{route}", {"data": [random_value(rng, value) for value in event.values],
                                     "fn_index": event.index, "session_hash": f"fuzz{rng.randint(0, 9)}"}
        elif kind < 0.8:
            named = {name: random_value(rng, None) for name in rng.sample(SETTING_NAMES, rng.randint(0, 6))}
            named.setdefault("prompt", random_text(rng))
            yield f"{api}/call/v2/generate", named
        else:
            query = {rng.choice([*SETTING_NAMES, "zz", "%00"]): random_text(rng)[:200] for _ in range(rng.randint(0, 5))}
            yield f"{api}/call/v2/generate", {"prompt": "name[X]", "task": "e2e", **query}


def post_timed(client: httpx.Client, url: str, payload: dict) -> tuple[int, object, float]:
    """(status, parsed body or text, seconds) of one POST."""
    started = time.perf_counter()
    response = client.post(url, content=json.dumps(payload), headers={"content-type": "application/json"})
    seconds = time.perf_counter() - started
    try:
        return response.status_code, response.json(), seconds
    except ValueError:
        return response.status_code, response.text, seconds


def fuzz(base: str, events: list[Event], seconds: float, seed: int = 54) -> dict:
    """The fuzz for ``seconds``: how many requests, their statuses, the 500s and empty answers
    (each an example), the answers slower than ANSWER_S."""
    rng, statuses, bad, slow = random.Random(seed), {}, [], []
    deadline = time.time() + seconds
    with httpx.Client(timeout=60) as client:
        for url, payload in fuzz_requests(base, events, rng):
            if time.time() > deadline:
                break
            status, body, took = post_timed(client, url, payload)
            statuses[status] = statuses.get(status, 0) + 1
            if status == 500 or not body:  # a 503 is the queue's "full" with its message
                bad.append({"url": url, "body": str(payload)[:200], "status": status, "answer": str(body)[:200]})
            if took > ANSWER_S:
                slow.append({"seconds": round(took, 2), "url": url, "body": str(payload)[:200]})
    return {"requests": sum(statuses.values()), "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "http_500_or_empty": len(bad), "examples": bad[:5], "over_1s": len(slow), "slowest": sorted(
                slow, key=lambda item: -item["seconds"])[:5], "seed": seed, "seconds": seconds}


def spaces_probe(base: str, events: list[Event]) -> dict:
    """The line of spaces at the MR-feedback and task-switch events while another client loads /config."""
    found = {}
    with httpx.Client(timeout=120) as client:
        for name in ("ui_mr_feedback", "ui_task_switch"):
            event = next(e for e in events if e.api_name == name)
            waited: list[float] = []

            def other_client() -> None:
                started = time.perf_counter()
                httpx.get(f"{base}/config", timeout=120)
                waited.append(time.perf_counter() - started)

            other = threading.Thread(target=other_client)
            other.start()
            status, body, took = post_timed(client, f"{base}/gradio_api/run/predict",
                                            {"data": ["e2e", SPACES], "fn_index": event.index, "session_hash": "r5spaces"})
            other.join()
            found[name] = {"status": status, "seconds": round(took, 3), "config_waited_s": round(waited[0], 3),
                           "message": str(body)[:200]}
    return found


def over_cost_probe(base: str) -> list[dict]:
    with httpx.Client(timeout=120) as client:
        return [{"target_speedup": speedup, "status": status, "seconds": round(took, 3), "message": str(body)[:240]}
                for speedup in (3, 4, 3, 4)
                for status, body, took in [post_timed(client, f"{base}/gradio_api/call/v2/generate",
                                                      OVER_COST | {"target_speedup": speedup})]]


def unknown_task_probe(base: str, events: list[Event]) -> dict:
    found = {}
    with httpx.Client(timeout=60) as client:
        for name in HIDDEN_TASK_EVENTS:
            event = next(e for e in events if e.api_name == name)
            status, body, took = post_timed(client, f"{base}/gradio_api/run/predict",
                                            {"data": ["translate", *event.values[1:]], "fn_index": event.index,
                                             "session_hash": "r5task"})
            found[name] = {"status": status, "seconds": round(took, 3), "message": str(body)[:200]}
    return found


def probe_and_fuzz(url: str, fuzz_seconds: float) -> dict:
    """Every probe, then the fuzz, then whether the page still answers."""
    base = url.rstrip("/")
    events = events_from_config(httpx.get(f"{base}/config", timeout=60).json())
    report = {"spaces": spaces_probe(base, events), "over_cost_task": over_cost_probe(base),
              "unknown_task": unknown_task_probe(base, events), "fuzz": fuzz(base, events, fuzz_seconds)}
    started = time.perf_counter()
    page = httpx.get(url, timeout=60)
    report["page_after"] = {"status": page.status_code, "seconds": round(time.perf_counter() - started, 3)}
    return report


def missed(report: dict) -> list[str]:
    """The probes' and the fuzz's targets this run missed, in words."""
    misses = [f"{name}: {probe['status']} in {probe['seconds']} s, /config waited {probe['config_waited_s']} s"
              for name, probe in report["spaces"].items()
              if probe["seconds"] > ANSWER_S or probe["config_waited_s"] > ANSWER_S or probe["status"] >= 500]
    misses += [f"over-cost task job at {probe['target_speedup']}x: {probe['status']} in {probe['seconds']} s"
               for probe in report["over_cost_task"] if probe["status"] != 422 or probe["seconds"] > ANSWER_S]
    misses += [f"unknown task at {name}: {probe['status']}" for name, probe in report["unknown_task"].items()
               if probe["status"] != 422 or "task must be one of" not in probe["message"]]
    fuzzed = report["fuzz"]
    if fuzzed["http_500_or_empty"] or fuzzed["over_1s"]:
        misses.append(f"fuzz: {fuzzed['http_500_or_empty']} 500s or empty answers, {fuzzed['over_1s']} over 1 s")
    if report["page_after"]["status"] != 200 or report["page_after"]["seconds"] > ANSWER_S:
        misses.append(f"the page after the probes and fuzz: {report['page_after']}")
    return misses
