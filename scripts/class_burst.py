"""A class pressing Generate together: N visitors from N addresses through the public API at once.

Starts `python app.py` on a free loopback port (client addresses from X-Forwarded-For, as behind a
Space's proxy, so each visitor is its own address), then every visitor POSTs /gradio_api/call/generate
at the same moment and reads its stream. Reports, per burst, each visitor's first message and done
times (median and max) and the last done, with the largest batch the server formed; each visitor's
text is checked to answer its own prompt (the API message names the prompt it answers). Runs the
server once with the batcher (SKIPDECODE_BATCH_ROWS as given) and, with --compare-alone, once with
every job alone (SKIPDECODE_BATCH_ROWS=1), the same bursts, so the two are measured on one machine;
with --compare-one-read, once with a batch's prompts read in one go (SKIPDECODE_PROMPT_PARTS=1: no
first tokens shown while the rest of the class's prompts are read).

    python scripts/class_burst.py --task e2e --speedup 3 --visitors 30 --bursts 3 --compare-alone
    python scripts/class_burst.py --task chat --speedup 2 --visitors 30 --bursts 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from load_test import api_values, free_port, hardware, start_server  # noqa: E402

from app.serving.batcher import CPU_ROWS  # noqa: E402
from model.common.hardware import cpu_flags  # noqa: E402

CHAT_PROMPTS = ("Name three colours.", "What is the capital of France?", "List five animals that live in the ocean.",
                "Explain what a computer does.", "What are the benefits of exercise?",
                "Write a short story about a robot who learns to paint.")


def prompts_for(task: str, visitors: int) -> list[str]:
    """One prompt per visitor: test-set MRs for E2E (each its own), the example prompts in turn for chat."""
    if task == "e2e":
        from model.tasks.e2e import reported_records  # noqa: PLC0415

        mrs = sorted({record.mr for record in reported_records()})
        return mrs[:visitors]
    return [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(visitors)]


def visit(url: str, values: list, address: str, go: threading.Barrier, out: dict) -> None:
    """One visitor: its job posted once every visitor is ready (``go``: no thread polls the clock, so the
    clients do not take the server's cores while they wait), its stream read to the end."""
    headers = {"X-Forwarded-For": address}
    with httpx.Client(base_url=url, timeout=300, headers=headers) as http:
        go.wait()
        started = time.perf_counter()
        posted = http.post("gradio_api/call/generate", json={"data": values})
        if posted.status_code != 200:
            out.update(error=f"{posted.status_code}: {posted.text[:200]}")
            return
        event_id = posted.json()["event_id"]
        last = None
        with http.stream("GET", f"gradio_api/call/generate/{event_id}") as stream:
            for line in stream.iter_lines():
                if line.startswith("event:") and "first" not in out and "generating" in line:
                    out["first"] = time.perf_counter() - started
                if line.startswith("data:"):
                    last = line.removeprefix("data:").strip()
                if line.startswith("event:") and ("complete" in line or "error" in line):
                    out["event"] = line.removeprefix("event:").strip()
        out["done"] = time.perf_counter() - started
        message = json.loads(last)[-1] if last and last.startswith("[") else {}
        out["message"] = message if isinstance(message, dict) else {}


def burst(url: str, task: str, speedup: float, new_tokens: int, prompts: list[str], round_: int) -> dict:
    """Every visitor at once; the burst's figures and whether every text answered its own prompt."""
    base = {"target_speedup": speedup, "max_new_tokens": new_tokens, "task": task, "temperature": 0.0}
    outs: list[dict] = [{} for _ in prompts]
    go = threading.Barrier(len(prompts))
    threads = [threading.Thread(target=visit, args=(url, api_values(url, prompt=prompt, **base),
                                                     f"10.{round_}.{i // 250}.{i % 250 + 1}", go, outs[i]))
               for i, prompt in enumerate(prompts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    errors = [out.get("error") or out.get("event") for out in outs if out.get("error") or out.get("event") != "complete"]
    firsts = [out["first"] for out in outs if "first" in out]
    dones = [out["done"] for out in outs if "done" in out]
    own = sum(_answers(out.get("message", {}), prompt, task) for out, prompt in zip(outs, prompts))
    rows = [out.get("message", {}).get("batch_requests", 1) for out in outs]
    return {"visitors": len(prompts), "errors": errors[:5], "answered_own_prompt": own,
            "first_median_s": round(statistics.median(firsts), 2) if firsts else None,
            "first_max_s": round(max(firsts), 2) if firsts else None,
            "done_median_s": round(statistics.median(dones), 2) if dones else None,
            "last_done_s": round(max(dones), 2) if dones else None,
            "largest_batch": max(rows) if rows else None, "batches_seen": sorted(set(rows))}


def _answers(message: dict, prompt: str, task: str) -> bool:
    """The message answers this visitor's prompt (the API names the prompts its texts answer)."""
    shown = message.get("prompts") or []
    return bool(shown) and (prompt in shown[0] if task == "chat" else prompt.split(",")[0] in shown[0]) \
        and bool(message.get("skipdecode", [""])[0].strip())


def run_server(rows: int, args, prompt_parts: int | None = None) -> dict:
    """The bursts against a server of ``rows`` batch rows (and ``prompt_parts``, where given), and its
    resident memory: after a warm-up burst (the baseline) and 10 s after the last burst."""
    import psutil  # noqa: PLC0415

    os.environ["SKIPDECODE_BATCH_ROWS"] = str(rows)
    if prompt_parts is None:
        os.environ.pop("SKIPDECODE_PROMPT_PARTS", None)
    else:
        os.environ["SKIPDECODE_PROMPT_PARTS"] = str(prompt_parts)
    port = free_port()
    server = start_server(port, distinct_visitors=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        prompts = prompts_for(args.task, args.visitors)
        burst(url, args.task, args.speedup, args.max_new_tokens, prompts[:2], 99)  # warm: the task's policy loaded
        time.sleep(10)
        baseline = psutil.Process(server.pid).memory_info().rss
        bursts = [burst(url, args.task, args.speedup, args.max_new_tokens, prompts, round_)
                  for round_ in range(args.bursts)]
        time.sleep(10)
        after = psutil.Process(server.pid).memory_info().rss
    finally:
        server.terminate()
        server.wait(30)
    return summary(bursts) | {"rss_baseline_mb": round(baseline / 2**20), "rss_10s_after_mb": round(after / 2**20)}


def summary(bursts: list[dict]) -> dict:
    keys = ("first_median_s", "first_max_s", "done_median_s", "last_done_s")
    return {key: statistics.median(b[key] for b in bursts if b[key] is not None) for key in keys} | {
        "answered_own_prompt": min(b["answered_own_prompt"] for b in bursts),
        "largest_batch": max(b["largest_batch"] or 0 for b in bursts), "bursts": bursts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["e2e", "chat"], default="e2e")
    parser.add_argument("--speedup", type=float, default=3.0)
    parser.add_argument("--visitors", type=int, default=30)
    parser.add_argument("--bursts", type=int, default=3, help="bursts per server (medians over them)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-rows", type=int, default=CPU_ROWS, help="SKIPDECODE_BATCH_ROWS of the batched server")
    parser.add_argument("--compare-alone", action="store_true", help="also a server running every job alone")
    parser.add_argument("--compare-one-read", action="store_true",
                        help="also a server reading a batch's prompts in one go (SKIPDECODE_PROMPT_PARTS=1)")
    parser.add_argument("--json", default=None, help="write the report here too")
    args = parser.parse_args()
    # a time limit's SIGTERM ends the run through its finally blocks: the server it started is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = {"command": " ".join(sys.argv), "hardware": hardware(), "cpu_flags": cpu_flags(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "task": args.task, "speedup": args.speedup,
              "visitors": args.visitors, "max_new_tokens": args.max_new_tokens,
              "batched": run_server(args.batch_rows, args)}
    if args.compare_one_read:
        report["one_read"] = run_server(args.batch_rows, args, prompt_parts=1)
    if args.compare_alone:
        report["alone"] = run_server(1, args)
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
