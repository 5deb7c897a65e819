"""Load test of the playground's API on loopback (bounded in clients and time).

Starts `python app.py` on a free 127.0.0.1 port (unless --url is given), then runs N concurrent
gradio_client sessions for a fixed time, each one visitor with its own address (sent as
X-Forwarded-For to a server started to trust it, as behind a Space's proxy: the fair queue limits
each address). Each session loops over a mix of requests:
  normal     a short greedy generation: must finish, answer ITS prompt, and give the same text as
             every other session that asked the same prompt (greedy + same settings = same output;
             any difference would mean outputs crossed sessions)
  cancelled  submitted and cancelled after a random short delay
  bad        an empty prompt or an impossible speedup: must be refused with a message
Reports completed requests by kind, errors by type, latency percentiles, and the server's
resident memory before and after (after the run and a short idle).

    python scripts/load_test.py --clients 20 --duration 120

--hostile runs a bounded hostile mix instead (under 3 minutes with the defaults), then reports:
  cancel storm     5 `/generate` jobs with ~1500-token prompts, each cancelled as soon as it is
                   processing (or after 1 s); the server's CPU seconds (its children included) in
                   the 5 s window that starts 2 s after the last cancel (target < 0.5 CPU-s)
  long sessions    3 concurrent `/generate` sessions with ~1500-token prompts, finished normally
                   (the step handler is private: the API cannot reach it)
  REST refusals    POST /gradio_api/run/generate and /gradio_api/call/generate (api_open=False
                   should refuse them) and /gradio_api/queue/join with an unknown fn_index: status
                   codes and whether the body carries a message
  queue flood      one client submits 20 jobs at once while another job runs: accepted and refused
                   ("Queue is full"), its share of the queue (accepted waiting / queue size), then a
                   second client must still get a normal answer; the same flood through REST
                   /call/generate (no session) is measured too, and its accepted jobs cancelled
  REST flood       one script floods /generate by /call/, /call/v2/ and queue/join with made-up
                   session ids (reading every stream) while a page-like visitor submits one job:
                   the visitor's first message against the job run alone (target: within the running
                   job plus one per other client: 2 x the job + its first message)
  preview storm    4 loops on the page's schedule preview (outside the queue), new settings each
                   call, during one generation: its first message against alone
  messages         every answer and exception whose text is empty, "None", "Internal Server
                   Error" or a bare traceback counts as an error without a message (target 0)
Also the server's RSS before (after a warm-up request), after the mix and after 10 s idle (target:
within 5% of the baseline), and the hardware. Printed as JSON and written to --json (default
assets/load/hostile.json).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/load_test.py --hostile
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import httpx
import psutil
from gradio_client import Client
from gradio_client.client import Job
from gradio_client.utils import QueueError, Status

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Name three colours.", "What is the capital of France?", "Write a haiku about rain.",
           "Give one tip for sleeping well.", "Say hello in French."]
BAD_REQUESTS = [dict(prompt="   "), dict(prompt="hi", target_speedup=99.0), dict(prompt="hi", decay="zigzag")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, distinct_visitors: bool = False) -> subprocess.Popen:
    """The app on loopback. ``distinct_visitors``: it reads each client's address from
    X-Forwarded-For (as behind a Space's proxy), so sessions that send their own address count as
    different visitors for the fair queue's per-address limits."""
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), HF_HUB_OFFLINE="1")
    if distinct_visitors:
        env["SKIPDECODE_TRUST_FORWARDED_FOR"] = "1"
    env.setdefault("MALLOC_ARENA_MAX", "2")  # as scripts/start.sh runs the app
    process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process
        except OSError:
            if process.poll() is not None:
                raise SystemExit(f"server exited: {process.stderr.read()[-2000:]}")
            time.sleep(1)
    process.kill()
    raise SystemExit("server did not start within 180 s")


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.completed = collections.Counter()
        self.errors = collections.Counter()
        self.latency = collections.defaultdict(list)
        self.outputs: dict[str, set[str]] = collections.defaultdict(set)
        self.mixups = 0

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.completed[kind] += 1
            self.latency[kind].append(seconds)

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors[kind] += 1


def session(url: str, stop_at: float, tally: Tally, seed: int, max_new_tokens: int) -> None:
    rng = random.Random(seed)
    # One visitor per session: its own address (the fair queue limits each address; all sessions
    # of this test come from loopback, so without it they would share one visitor's share).
    client = Client(url, verbose=False, headers={"X-Forwarded-For": f"10.0.{seed // 250}.{seed % 250 + 1}"})
    while time.time() < stop_at:
        kind = rng.choices(["normal", "cancelled", "bad"], weights=[70, 15, 15])[0]
        start = time.time()
        try:
            if kind == "normal":
                prompt = rng.choice(PROMPTS)
                final = client.predict(prompt=prompt, target_speedup=2.0, decay="linear",
                                       max_new_tokens=max_new_tokens, api_name="/generate")
                if final["prompts"][0] != prompt:
                    with tally.lock:
                        tally.mixups += 1
                with tally.lock:
                    tally.outputs[prompt].add(final["skipdecode"][0] + "\x00" + final["full"][0])
            elif kind == "cancelled":
                job = client.submit(prompt=rng.choice(PROMPTS), max_new_tokens=max_new_tokens, api_name="/generate")
                time.sleep(rng.uniform(0.1, 1.5))
                job.cancel()
            else:
                try:
                    client.predict(api_name="/generate", **rng.choice(BAD_REQUESTS))
                    tally.error("bad request accepted")
                    continue
                except Exception as error:  # noqa: BLE001 (any refusal is expected; its message is checked)
                    if "must" not in str(error) and "empty" not in str(error) and "unreachable" not in str(error):
                        tally.error(f"bad request: unclear message {str(error)[:60]!r}")
                        continue
            tally.add(kind, time.time() - start)
        except Exception as error:  # noqa: BLE001 (counted and reported by type)
            tally.error(f"{kind}: {type(error).__name__}: {str(error)[:80]}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_normal(url: str, process: psutil.Process | None, args: argparse.Namespace) -> int:
    """The normal mix: N sessions for --duration seconds; exit status 1 on server errors or mix-ups."""
    warm = Client(url, verbose=False)
    warm.predict(prompt=PROMPTS[0], max_new_tokens=args.max_new_tokens, api_name="/generate")  # warm-up
    time.sleep(2)
    memory_before = process.memory_info().rss / 2**20 if process else None
    tally = Tally()
    stop_at = time.time() + args.duration
    threads = [threading.Thread(target=session, args=(url, stop_at, tally, seed, args.max_new_tokens), daemon=True)
               for seed in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.duration + 300)
    time.sleep(5)
    memory_after = process.memory_info().rss / 2**20 if process else None
    inconsistent = {p: len(v) for p, v in tally.outputs.items() if len(v) > 1}
    all_latency = [s for values in tally.latency.values() for s in values]
    report = {
        "clients": args.clients, "duration_s": args.duration, "max_new_tokens": args.max_new_tokens,
        "completed": dict(tally.completed), "errors": dict(tally.errors),
        "server_errors": sum(n for k, n in tally.errors.items() if not k.startswith("bad request")),
        "cross_session_mixups": tally.mixups + len(inconsistent), "inconsistent_prompts": inconsistent,
        "latency_s": {kind: {"p50": round(percentile(v, 0.5), 2), "p90": round(percentile(v, 0.9), 2),
                             "p99": round(percentile(v, 0.99), 2), "mean": round(statistics.mean(v), 2)}
                      for kind, v in tally.latency.items() if v},
        "latency_all_p50_s": round(percentile(all_latency, 0.5), 2),
        "server_rss_mb_before": round(memory_before, 1) if memory_before else None,
        "server_rss_mb_after": round(memory_after, 1) if memory_after else None,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["server_errors"] == 0 and report["cross_session_mixups"] == 0 else 1


# --- the hostile mix ---------------------------------------------------------------------------
HOSTILE_JSON = ROOT / "assets" / "load" / "hostile.json"
RUNNING = (Status.PROCESSING, Status.ITERATING, Status.PROGRESS)
WAITING = (Status.JOINING_QUEUE, Status.IN_QUEUE, Status.SENDING_DATA)
NO_MESSAGE_TEXTS = {"", "none", "null", "{}", "internal server error"}
# Three-letter words are one token each ("sea " x 1500 = 6000 characters, 1531 tokens with the chat
# template), so every long prompt stays under the app's 8000-character and 2048-token limits.
LONG_WORDS = ["sea", "sky", "sun", "red", "cat", "dog", "owl", "fox", "bee", "ice", "map"]


def long_prompt(word: str, repeats: int) -> str:
    """About ``repeats`` tokens (one per short word), under the app's 8000-character limit."""
    return " ".join([word] * repeats)


def lacks_message(text: str) -> bool:
    """Empty, "None", "Internal Server Error" or a bare traceback: nothing a visitor can act on."""
    stripped = text.strip()
    return stripped.lower() in NO_MESSAGE_TEXTS or stripped.startswith("Traceback (most recent call last)")


class Observations:
    """Every answer and exception text of the hostile run, so those without a message can be counted.
    A CancelledError is gradio_client's own (a job cancelled on this side before the server answered):
    it is kept apart, as it is no answer of the server."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[dict] = []
        self.local_cancellations = 0

    def answer(self, step: str, text: str) -> None:
        with self.lock:
            self.items.append({"step": step, "text": text})

    def exception(self, step: str, error: BaseException) -> str:
        """Records the exception's message (its type is not a message); returns "Type: message"."""
        if isinstance(error, concurrent.futures.CancelledError):
            with self.lock:
                self.local_cancellations += 1
            return "CancelledError (gradio_client, local)"
        self.answer(step, str(error))
        return f"{type(error).__name__}: {str(error)[:200]}"

    def without_message(self) -> list[dict]:
        with self.lock:
            return [item for item in self.items if lacks_message(item["text"])]


class ServerLog:
    """Drains the server's stderr (a full pipe would block the server) and counts its tracebacks."""

    def __init__(self, server: subprocess.Popen | None) -> None:
        self.tracebacks = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        if server is not None and server.stderr is not None:
            threading.Thread(target=self._read, args=(server.stderr,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.tracebacks += line.startswith("Traceback (most recent call last)")
            self.tail.append(line.rstrip()[:300])

    def report(self) -> dict:
        return {"tracebacks": self.tracebacks, "tail": list(self.tail)[-12:]}


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU time of the process and its (waited-for) children."""
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def rss_mb(process: psutil.Process | None) -> float | None:
    return round(process.memory_info().rss / 2**20, 1) if process else None


def hardware() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    return {"cpu_model": model, "logical_cores": os.cpu_count(), "physical_cores": psutil.cpu_count(logical=False),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1)}


def wait_for_status(job: Job, codes: tuple[Status, ...], timeout: float) -> bool:
    """True once the job reports one of ``codes``; False when it ends or ``timeout`` passes first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if job.status().code in codes:
            return True
        if job.done():
            return False
        time.sleep(0.05)
    return False


def job_outcome(job: Job, step: str, observations: Observations, timeout: float) -> str:
    """The job's end, recorded: "ok", "ok, cancelled message", or the exception as "Type: message"."""
    try:
        final = job.result(timeout=timeout)
    except BaseException as error:  # noqa: BLE001 (every outcome is recorded, its message checked)
        return observations.exception(step, error)
    observations.answer(step, json.dumps(final)[:2000])
    if isinstance(final, dict) and final.get("cancelled"):
        return f"cancelled message: {final.get('error')}"
    return "ok"


def cancel_one(url: str, prompt: str, max_new_tokens: int, processing_timeout: float) -> tuple[Job, bool]:
    """Submits one long-prompt job and cancels it as soon as it is processing (or after the timeout)."""
    job = Client(url, verbose=False).submit(prompt=prompt, max_new_tokens=max_new_tokens, api_name="/generate")
    processing = wait_for_status(job, RUNNING, processing_timeout)
    job.cancel()
    return job, processing


def cpu_per_second(process: psutil.Process | None, seconds: int) -> list[float] | None:
    """The server's CPU seconds in each of the next ``seconds`` one-second intervals."""
    if process is None:
        time.sleep(seconds)
        return None
    samples = [cpu_seconds(process)]
    for _ in range(seconds):
        time.sleep(1.0)
        samples.append(cpu_seconds(process))
    return [round(b - a, 2) for a, b in zip(samples, samples[1:])]


def cancel_storm(url: str, process: psutil.Process | None, observations: Observations, jobs: int, words: int,
                 max_new_tokens: int) -> dict:
    """Long-prompt jobs cancelled one after another; the server's CPU in the 5 s window that starts
    2 s after the last cancel (a cancelled run should stop computing), with an idle reference."""
    idle = cpu_per_second(process, 5)
    started = time.time()
    cancelled = [cancel_one(url, long_prompt(LONG_WORDS[i % len(LONG_WORDS)], words), max_new_tokens, 1.0)
                 for i in range(jobs)]
    last_cancel = time.time()
    after = cpu_per_second(process, 10)
    outcomes = collections.Counter(job_outcome(job, "cancel storm", observations, 30) for job, _ in cancelled)
    return {"jobs": jobs, "prompt_words": words, "prompt_chars": len(long_prompt(LONG_WORDS[0], words)),
            "max_new_tokens": max_new_tokens,
            "cancelled_while_processing": sum(processing for _, processing in cancelled),
            "storm_seconds": round(last_cancel - started, 1),
            "server_cpu_s_in_window_2_to_7_s_after_last_cancel": round(sum(after[2:7]), 2) if after else None,
            "target_cpu_s": 0.5, "server_cpu_s_per_second_after_last_cancel": after,
            "server_cpu_s_idle_5_s_before": round(sum(idle), 2) if idle else None, "outcomes": dict(outcomes)}


def long_session(url: str, prompt: str, max_new_tokens: int, observations: Observations) -> dict:
    """One session: a long-prompt generation finished normally, its own prompt answered. An empty
    text is noted, not failed: the model may end at once on a prompt of one repeated word."""
    start = time.time()
    try:
        final = Client(url, verbose=False).predict(prompt=prompt, max_new_tokens=max_new_tokens, api_name="/generate")
    except Exception as error:  # noqa: BLE001 (recorded and reported)
        return {"ok": False, "error": observations.exception("long sessions", error)}
    observations.answer("long sessions", json.dumps(final)[:2000])
    checks = {"done": bool(final.get("done")), "own_prompt": final["prompts"][0] == prompt}
    empty = [name for name in ("skipdecode", "full") if not final[name][0].strip()]
    return {"ok": all(checks.values()), **({} if all(checks.values()) else {"failed": checks}),
            "empty_texts": empty, "seconds": round(time.time() - start, 1)}


def long_sessions(url: str, observations: Observations, sessions: int, words: int, max_new_tokens: int) -> dict:
    """Several sessions at once, each with its own long prompt, all finished normally."""
    results: list[dict] = [{} for _ in range(sessions)]

    def run(index: int) -> None:
        word = LONG_WORDS[(5 + index) % len(LONG_WORDS)]
        results[index] = long_session(url, long_prompt(word, words), max_new_tokens, observations)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return {"sessions": sessions, "prompt_words": words, "max_new_tokens": max_new_tokens,
            "finished_ok": sum(bool(r.get("ok")) for r in results),
            "seconds": [r.get("seconds") for r in results], "errors": [r["error"] for r in results if "error" in r],
            "failed_checks": [r["failed"] for r in results if "failed" in r],
            "empty_texts": [r.get("empty_texts") for r in results]}


def message_of(text: str) -> str:
    """The message a body carries: "detail", "error" or "message" of a JSON object, else the text.
    A JSON null there reads "None" (no message)."""
    try:
        body = json.loads(text)
    except ValueError:
        return text
    if isinstance(body, dict):
        for key in ("detail", "error", "message"):
            if key in body:
                return str(body[key])
    return text


def rest_probe(url: str, path: str, payload: dict, observations: Observations) -> dict:
    """POSTs one request that should be refused (on a connection of its own): its status and whether
    its body says why."""
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            response = http.post(path, json=payload)
    except httpx.HTTPError as error:
        return {"status": None, "refused": True, "has_message": False, "body": observations.exception(path, error)}
    message = message_of(response.text)
    observations.answer(f"REST {path}", message)
    return {"status": response.status_code, "refused": response.status_code >= 400,
            "has_message": not lacks_message(message), "body": response.text[:200]}


def call_result(url: str, event_id: str, observations: Observations) -> dict:
    """Reads a /call/ event's stream to its end: its last event and what its data says."""
    with httpx.Client(base_url=url, timeout=120) as http:
        lines = http.get(f"gradio_api/call/generate/{event_id}").text.strip().splitlines()
    events = [line.removeprefix("event:").strip() for line in lines if line.startswith("event:")]
    data = [line.removeprefix("data:").strip() for line in lines if line.startswith("data:")]
    message = message_of(data[-1]) if data else ""
    observations.answer("REST /call/generate result", message)
    return {"event": events[-1] if events else None, "data": data[-1][:200] if data else None,
            "has_message": not lacks_message(message)}


def rest_refusals(url: str, observations: Observations) -> dict:
    """The REST routes that bypass the queue must be refused with a message; so must an unknown fn_index."""
    report = {
        "run_generate": rest_probe(url, "gradio_api/run/generate", {"data": ["hi"]}, observations),
        "call_generate": rest_probe(url, "gradio_api/call/generate", {"data": ["hi"]}, observations),
        "queue_join_unknown_fn_index": rest_probe(
            url, "gradio_api/queue/join", {"data": [], "fn_index": 99999, "session_hash": "hostile-probe"},
            observations),
    }
    call = report["call_generate"]
    if not call["refused"]:  # accepted into the queue: what does the REST client get back?
        call["result"] = call_result(url, json.loads(call["body"])["event_id"], observations)
    return report


def classify_submission(job: Job, deadline: float) -> str:
    """ "refused" (gradio_client's QueueError), "accepted" (queued or running) or "unknown" (neither
    by the deadline, a time.time())."""
    while time.time() < deadline:
        if job.done():
            return "refused" if isinstance(job.exception(), QueueError) else "accepted"
        if job.status().code in WAITING + RUNNING:
            return "accepted"
        time.sleep(0.05)
    return "unknown"


def generate_fn_index(http: httpx.Client) -> int:
    config = http.get("config").json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == "generate")


def rest_call_flood(url: str, submissions: int, observations: Observations) -> dict:
    """The same flood through REST /call/generate (no session hash: each call is its own session).
    Counts accepted vs refused, then cancels the accepted ones (removed from the queue)."""
    with httpx.Client(base_url=url, timeout=30) as http:
        responses = [http.post("gradio_api/call/generate", json={"data": ["hi"]}) for _ in range(submissions)]
        accepted = [r.json()["event_id"] for r in responses if r.status_code == 200]
        for response in responses:
            if response.status_code != 200:
                observations.answer("REST /call flood", message_of(response.text))
        fn_index = generate_fn_index(http)
        for event_id in accepted:  # a queued /call/ event's session hash is its own id
            http.post("gradio_api/cancel", json={"event_id": event_id, "session_hash": event_id, "fn_index": fn_index})
    return {"submitted": submissions, "accepted": len(accepted), "refused": submissions - len(accepted),
            "statuses": dict(collections.Counter(r.status_code for r in responses))}


def queue_flood(url: str, observations: Observations, submissions: int, queue_size: int, words: int) -> dict:
    """While one job runs, one client submits ``submissions`` jobs at once: how many the queue takes
    from it, and whether a second client still gets a normal answer afterwards."""
    runner = Client(url, verbose=False).submit(prompt=long_prompt(LONG_WORDS[-1], words), max_new_tokens=8,
                                               api_name="/generate")
    runner_running = wait_for_status(runner, RUNNING, 60)
    flooder = Client(url, verbose=False)
    jobs = [flooder.submit(prompt=PROMPTS[i % len(PROMPTS)], max_new_tokens=4, api_name="/generate")
            for i in range(submissions)]
    deadline = time.time() + 15
    verdicts = collections.Counter(classify_submission(job, deadline) for job in jobs)
    refusals = collections.Counter(job_outcome(job, "queue flood (refused)", observations, 1)
                                   for job in jobs if job.done() and isinstance(job.exception(), QueueError))
    rest = rest_call_flood(url, submissions, observations)
    start = time.time()
    second = long_session(url, PROMPTS[4], 8, observations)
    outcomes = collections.Counter(job_outcome(job, "queue flood (accepted)", observations, 120)
                                   for job in jobs if not (job.done() and isinstance(job.exception(), QueueError)))
    return {"submitted": submissions, "while_another_job_runs": runner_running,
            "accepted": verdicts["accepted"], "refused": verdicts["refused"], "unclassified": verdicts["unknown"],
            "refusal_messages": dict(refusals), "queue_size": queue_size,
            "max_queue_share_of_one_client": round(verdicts["accepted"] / queue_size, 3),
            "accepted_outcomes": dict(outcomes),
            "runner_outcome": job_outcome(runner, "queue flood (runner)", observations, 120),
            "second_client": {**second, "seconds_including_wait": round(time.time() - start, 1)},
            "rest_call_flood_no_session": {**rest, "max_queue_share": round(rest["accepted"] / queue_size, 3)}}


VICTIM_JOB = dict(prompt=PROMPTS[0], target_speedup=2.0, max_new_tokens=32)


def api_values(url: str, **overrides) -> list:
    """/generate's values in the documented order: its defaults, with ``overrides``."""
    info = httpx.get(url.rstrip("/") + "/gradio_api/info", timeout=30).json()["named_endpoints"]["/generate"]
    values = {p["parameter_name"]: p["parameter_default"] if p["parameter_has_default"] else "Hi"
              for p in info["parameters"]}
    return list((values | overrides).values())


def first_message_seconds(job: Job, timeout: float = 300) -> float | None:
    """Seconds from now until the job's first message (its first token), None if it ended without one."""
    start = time.time()
    while time.time() - start < timeout:
        if job.outputs():
            return round(time.time() - start, 2)
        if job.done():
            return None
        time.sleep(0.01)
    return None


def timed_job(url: str, observations: Observations, step: str) -> dict:
    """One page-like session's job (gradio_client keeps the page's heartbeat open): seconds to its
    first message and to its end."""
    client = Client(url, verbose=False)
    time.sleep(1.0)  # its heartbeat is open, as a page's is before its first click
    start = time.time()
    job = client.submit(**VICTIM_JOB, api_name="/generate")
    first = first_message_seconds(job)
    outcome = job_outcome(job, step, observations, 300)
    return {"first_message_s": first, "total_s": round(time.time() - start, 1), "outcome": outcome}


class RestFlood:
    """One script flooding /generate by every route the server answers (REST /call/ and /call/v2/
    without a session, queue/join with a made-up session id each time), reading every accepted
    job's stream (the worst case: nothing is dropped as abandoned)."""

    def __init__(self, url: str, observations: Observations) -> None:
        self.base, self.observations = url.rstrip("/") + "/gradio_api", observations
        self.stop, self.tally, self.lock = threading.Event(), collections.Counter(), threading.Lock()
        self.values = api_values(url, **VICTIM_JOB)
        with httpx.Client(base_url=url, timeout=30) as http:
            self.fn_index = generate_fn_index(http)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _read(self, path: str) -> None:
        try:
            with httpx.Client(timeout=300) as http, http.stream("GET", f"{self.base}/{path}") as response:
                for _ in response.iter_lines():
                    if self.stop.is_set():
                        return
        except httpx.HTTPError:
            pass

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=30) as http:
            while not self.stop.is_set():
                session = os.urandom(6).hex()
                for route, body, stream in (
                        ("call/generate", {"data": self.values}, "call/generate/{id}"),
                        ("call/v2/generate", dict(VICTIM_JOB), "call/v2/generate/{id}"),
                        ("queue/join", {"data": self.values, "fn_index": self.fn_index, "session_hash": session},
                         f"queue/data?session_hash={session}")):
                    try:
                        response = http.post(route, json=body)
                    except httpx.HTTPError as error:
                        with self.lock:
                            self.tally[(route, type(error).__name__)] += 1
                        continue
                    with self.lock:
                        self.tally[(route, response.status_code)] += 1
                    if response.status_code == 200:
                        path = stream.format(id=response.json()["event_id"])
                        threading.Thread(target=self._read, args=(path,), daemon=True).start()
                    else:
                        self.observations.answer(f"REST flood {route}", message_of(response.text))
                time.sleep(0.05)

    def report(self) -> dict:
        with self.lock:
            tally = dict(self.tally)
        accepted = sum(n for (_, status), n in tally.items() if status == 200)
        return {"requests": sum(tally.values()), "accepted": accepted, "refused": sum(tally.values()) - accepted,
                "by_route_and_status": {f"{route} {status}": n for (route, status), n in sorted(tally.items(),
                                                                                              key=str)}}


def rest_flood_victim(url: str, observations: Observations) -> dict:
    """The issue's REST flood with a normal visitor beside it: the visitor's first message (its first
    token) against the bound "the jobs running plus one per other client" (here: one running, one
    of the flood's pooled client), measured in units of the same job run alone."""
    alone = timed_job(url, observations, "victim alone")
    flood = RestFlood(url, observations)
    flood.thread.start()
    try:
        time.sleep(max(5.0, 2 * alone["total_s"]))  # the flood has the lane and its queue share
        victim = timed_job(url, observations, "victim under the flood")
    finally:
        flood.stop.set()
        flood.thread.join(60)
    job_s = alone["total_s"]
    bound = round(2 * job_s + alone["first_message_s"], 1)  # one running + one flood job, then its own prefill
    return {"job": VICTIM_JOB, "alone": alone, "under_flood": victim, "flood": flood.report(),
            "bound_s": bound, "victim_within_bound": victim["first_message_s"] is not None
            and victim["first_message_s"] <= bound}


def preview_storm(url: str, observations: Observations, loops: int = 4) -> dict:
    """Four loops on the page's schedule preview (it runs outside the queue) with a new target
    speedup each call, while one generation runs: that generation's first message against alone."""
    config = httpx.get(url.rstrip("/") + "/config", timeout=30).json()
    dependency = next(d for d in config["dependencies"] if d.get("api_name") == "ui_schedule")
    components = {c["id"]: c for c in config["components"]}
    names = [components[i].get("props", {}).get("elem_id") or "" for i in dependency["inputs"]]
    base = [components[i].get("props", {}).get("value") for i in dependency["inputs"]]
    speed = names.index("setting-target-speedup")
    stop, calls, slowest = threading.Event(), collections.Counter(), [0.0]

    def loop(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=url, timeout=60) as http:
            while not stop.is_set():
                data = list(base)
                data[speed] = round(rng.uniform(1.0, 3.0), 3)
                started = time.time()
                response = http.post("gradio_api/run/ui_schedule", json={"data": data, "session_hash": f"p{seed}"})
                slowest[0] = max(slowest[0], time.time() - started)
                calls[response.status_code] += 1

    alone = timed_job(url, observations, "preview storm (alone)")
    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(loops)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        during = timed_job(url, observations, "preview storm (during)")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    return {"loops": loops, "calls_by_status": dict(calls), "slowest_call_s": round(slowest[0], 2),
            "first_message_s_alone": alone["first_message_s"], "first_message_s_during": during["first_message_s"]}


def command_line() -> str:
    threads = os.environ.get("OMP_NUM_THREADS")
    prefix = f"OMP_NUM_THREADS={threads} " if threads else ""
    prefix += "HF_HUB_OFFLINE=1 " if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
    return prefix + "python " + " ".join(sys.argv)


def memory_report(before: float | None, after: float | None, idle: float | None) -> dict:
    within = round(abs(idle - before) / before * 100, 1) if before and idle else None
    return {"rss_mb_before": before, "rss_mb_after_mix": after, "rss_mb_after_10s_idle": idle,
            "idle_vs_before_percent": within, "target_percent": 5.0}


def run_hostile(url: str, server: subprocess.Popen | None, args: argparse.Namespace) -> int:
    """The hostile mix, then its report; exit status 1 when a target is missed."""
    started = time.time()
    process = psutil.Process(server.pid) if server else None
    log = ServerLog(server)
    Client(url, verbose=False).predict(prompt=PROMPTS[0], max_new_tokens=args.max_new_tokens, api_name="/generate")
    time.sleep(2)
    before = rss_mb(process)
    observations = Observations()
    storm = cancel_storm(url, process, observations, jobs=5, words=args.prompt_words, max_new_tokens=64)
    sessions = long_sessions(url, observations, sessions=3, words=args.prompt_words, max_new_tokens=8)
    rest = rest_refusals(url, observations)
    flood = queue_flood(url, observations, submissions=20, queue_size=args.queue_size, words=args.prompt_words)
    victim = rest_flood_victim(url, observations)
    previews = preview_storm(url, observations)
    after = rss_mb(process)
    time.sleep(10)
    missing = observations.without_message()
    report = {
        "mode": "hostile", "command": command_line(), "url": url, "hardware": hardware(),
        "memory": memory_report(before, after, rss_mb(process)),
        "cancel_storm": storm, "long_sessions": sessions, "rest_refusals": rest, "queue_flood": flood,
        "rest_flood_and_victim": victim, "preview_storm": previews,
        "errors_without_message": {"count": len(missing), "target": 0, "examples": missing[:10],
                                   "answers_checked": len(observations.items),
                                   "local_cancelled_errors_not_counted": observations.local_cancellations},
        "server_stderr": log.report(),
        "seconds": round(time.time() - started, 1),
    }
    report["targets_missed"] = missed_targets(report)
    print(json.dumps(report, indent=2))
    Path(args.json or HOSTILE_JSON).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["targets_missed"] else 0


def missed_targets(report: dict) -> list[str]:
    """The targets of the hostile mix that this run missed, in words."""
    missed = []
    cpu = report["cancel_storm"]["server_cpu_s_in_window_2_to_7_s_after_last_cancel"]
    if cpu is not None and cpu >= 0.5:
        missed.append(f"server CPU after the last cancel {cpu} s >= 0.5 s")
    drift = report["memory"]["idle_vs_before_percent"]
    if drift is not None and drift > 5.0:
        missed.append(f"RSS after idle {drift}% away from the baseline (> 5%)")
    refused = {name: probe["status"] for name, probe in report["rest_refusals"].items() if not probe["refused"]}
    if refused:
        missed.append(f"REST calls not refused: {refused}")
    if report["errors_without_message"]["count"]:
        missed.append(f"{report['errors_without_message']['count']} errors without a message")
    second = report["queue_flood"]["second_client"]
    if not second.get("ok"):
        missed.append("the second client got no normal answer after the flood")
    victim = report["rest_flood_and_victim"]
    if not victim["victim_within_bound"]:
        missed.append(f"the visitor's first message under the REST flood took {victim['under_flood']['first_message_s']}"
                      f" s (bound {victim['bound_s']} s)")
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running app on loopback (default: start one)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--json", default=None, help="write the report here too (--hostile: default "
                                                     "assets/load/hostile.json)")
    parser.add_argument("--hostile", action="store_true", help="run the bounded hostile mix instead")
    parser.add_argument("--prompt-words", type=int, default=1500, help="--hostile: words in a long prompt")
    parser.add_argument("--queue-size", type=int, default=int(os.environ.get("SKIPDECODE_QUEUE_SIZE", "32")),
                        help="--hostile: the server's queue size (for the queue share)")
    args = parser.parse_args()
    if not 1 <= args.clients <= 64 or not 1 <= args.duration <= 1800:
        raise SystemExit("--clients must be 1..64 and --duration 1..1800 s (the test is bounded)")
    if not 1 <= args.prompt_words <= 1900:
        raise SystemExit("--prompt-words must be 1..1900 (the app's prompt limits: 8000 characters, 2048 tokens)")

    server = None
    url = args.url
    if url is None:
        port = free_port()
        server = start_server(port, distinct_visitors=not args.hostile)
        url = f"http://127.0.0.1:{port}/"
    if not url.startswith(("http://127.0.0.1", "http://localhost")):
        raise SystemExit("loopback only: --url must be http://127.0.0.1:... or http://localhost:...")
    process = psutil.Process(server.pid) if server else None
    try:
        return run_hostile(url, server, args) if args.hostile else run_normal(url, process, args)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
