"""Load test of the playground's API on loopback (bounded in clients and time).

Starts `python app.py` on a free 127.0.0.1 port (unless --url is given), then runs N concurrent
gradio_client sessions for a fixed time. Each session loops over a mix of requests:
  normal     a short greedy generation: must finish, answer ITS prompt, and give the same text as
             every other session that asked the same prompt (greedy + same settings = same output;
             any difference would mean outputs crossed sessions)
  cancelled  submitted and cancelled after a random short delay
  bad        an empty prompt or an impossible speedup: must be refused with a message
Reports completed requests by kind, errors by type, latency percentiles, and the server's
resident memory before and after (after the run and a short idle).

    python scripts/load_test.py --clients 20 --duration 120
"""

from __future__ import annotations

import argparse
import collections
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

import psutil
from gradio_client import Client

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Name three colours.", "What is the capital of France?", "Write a haiku about rain.",
           "Give one tip for sleeping well.", "Say hello in French."]
BAD_REQUESTS = [dict(prompt="   "), dict(prompt="hi", target_speedup=99.0), dict(prompt="hi", decay="zigzag")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), HF_HUB_OFFLINE="1")
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
    client = Client(url, verbose=False)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running app on loopback (default: start one)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--json", default=None, help="write the report here too")
    args = parser.parse_args()
    if not 1 <= args.clients <= 64 or not 1 <= args.duration <= 1800:
        raise SystemExit("--clients must be 1..64 and --duration 1..1800 s (the test is bounded)")

    server = None
    url = args.url
    if url is None:
        port = free_port()
        server = start_server(port)
        url = f"http://127.0.0.1:{port}/"
    if not url.startswith(("http://127.0.0.1", "http://localhost")):
        raise SystemExit("loopback only: --url must be http://127.0.0.1:... or http://localhost:...")
    process = psutil.Process(server.pid) if server else None
    try:
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
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
