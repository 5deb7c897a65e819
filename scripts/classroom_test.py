"""A class behind one address: what it needs from the fair queue (issue 37).

Starts app.py on loopback (as scripts/load_test.py does). ``--pupils`` pupils on 127.0.0.1 (one NAT)
each do what a browser does on the wire: load the page (its signed page-token cookie), open the
heartbeat, then on "go" push one job from the teacher's settings and read its stream to the end.
``--browsers`` real Chromium pages (their own contexts: own cookies, as separate laptops) join the
same class and click Generate at the same "go", to show that real pages are counted like the
pupils. Meanwhile a visitor from another address (127.0.0.2) who loaded the page pushes one job.
Reports admitted/refused (with the message), click-to-first-message and click-to-end per pupil, the
sizes of the batches the wire pupils' runs shared (their pages' batch line), the visitor's wait, the
server's RSS, the machine and its load. Why pupils on the wire: 30 Chromium
renderers on the server's own 2 cores measure the renderers, not the queue (a first try: load
average 41, clicks spread over 138 s). Writes assets/load/classroom.json (or --json).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/classroom_test.py --pupils 30 --browsers 3

Loopback only; needs Chromium (/usr/bin/chromium) and playwright (requirements-dev.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx
import psutil
from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load_test  # noqa: E402  (the same server start, hardware and visitor helpers)

ROOT = Path(__file__).resolve().parents[1]
CLASSROOM_JSON = ROOT / "assets" / "load" / "classroom.json"
CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
LESSON = {"prompt": "Name three colours.", "target_speedup": "2", "max_new_tokens": "24"}  # the teacher's link


def wire_pupil(url: str, name: str, data: list, fn_index: int, go: threading.Event, timeout_s: float) -> dict:
    """One pupil on the wire: page load, heartbeat, then at ``go`` its job, read to the end."""
    readers = load_test.StreamReaders()
    result: dict = {"pupil": name, "kind": "wire"}
    with load_test.loopback_client(url, "127.0.0.1", read_s=timeout_s) as http:
        result["page_token_set"] = load_test.PAGE_COOKIE in http.get("/").cookies
        readers.start(http, f"/gradio_api/heartbeat/{name}")
        go.wait()
        pushed = time.time()
        joined = http.post("/gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": name})
        result["joined"] = joined.status_code
        if joined.status_code != 200:
            result["refused"] = load_test.message_of(joined.text)[:300]
        else:
            result.update(read_to_end(http, name, pushed, timeout_s))
        readers.stop.set()
    return result


# The size of the batch a job shared: the API message's field, or the page's batch line (app/page/views.py)
SHARED_BATCH = re.compile(r'"batch_requests":\s*(\d+)|One batch of (\d+) visitors')


def read_to_end(http, session: str, pushed: float, timeout_s: float) -> dict:
    """Seconds from the push to the first message and to the end of the job, whether it ended well, and
    the size of the batch it shared (its messages' ``batch_requests``, or a page's batch line)."""
    first = done = None
    end, batch = "", 1
    with http.stream("GET", f"/gradio_api/queue/data?session_hash={session}") as response:
        for line in response.iter_lines():
            if first is None and ('"process_generating"' in line or '"process_completed"' in line):
                first = round(time.time() - pushed, 2)
            shared = SHARED_BATCH.search(line)
            batch = int(shared.group(1) or shared.group(2)) if shared else batch
            if '"process_completed"' in line:
                done, end = round(time.time() - pushed, 2), line
                break
            if time.time() - pushed > timeout_s:
                break
    if done is None:
        return {"first_message_s": first, "done_s": None, "ok": False}
    ok = '"success":true' in end.replace(" ", "")
    return {"first_message_s": first, "done_s": done, "ok": ok, "batch": batch,
            **({} if ok else {"refused": load_test.message_of(end.removeprefix("data: "))[:300]})}


def browser_pupils(url: str, count: int, go: threading.Event, timeout_s: float, results: list) -> None:
    """``count`` real Chromium pages on the teacher's link, clicking Generate at ``go``."""
    link = url.rstrip("/") + "/?" + urlencode(LESSON)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        pages = []
        for _ in range(count):
            page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
            page.goto(link)
            page.wait_for_selector("#generate-btn", timeout=120_000)
            pages.append(page)
        go.wait()
        clicked = time.time()
        for page in pages:
            page.click("#generate-btn")
        results.extend(watch_pages(pages, clicked, timeout_s))
        browser.close()


def watch_pages(pages: list, clicked: float, timeout_s: float) -> list[dict]:
    results = [{"pupil": f"browser{i}", "kind": "chromium", "first_message_s": None, "done_s": None}
               for i in range(len(pages))]
    while time.time() - clicked < timeout_s and any(r["done_s"] is None and "refused" not in r for r in results):
        for page, result in zip(pages, results):
            if result["done_s"] is not None or "refused" in result:
                continue
            state = page.evaluate("""() => ({tokens: document.querySelectorAll('#skip-output .tok').length,
                status: (document.querySelector('#status') || {innerText: ''}).innerText,
                toast: Array.from(document.querySelectorAll('.toast-body')).map(t => t.innerText).join(' | ')})""")
            now = round(time.time() - clicked, 2)
            if state["tokens"] and result["first_message_s"] is None:
                result["first_message_s"] = now
            if "Done" in state["status"]:
                result.update(done_s=now, ok=True)
            elif state["toast"]:
                result["refused"] = state["toast"][:300]
        time.sleep(0.2)
    return results


def summary(values: list[float | None]) -> dict:
    done = sorted(v for v in values if v is not None)
    if not done:
        return {"count": 0}
    return {"count": len(done), "median": round(statistics.median(done), 2), "max": done[-1]}


def run_class(url: str, pupils: int, browsers: int, timeout_s: float) -> dict:
    with httpx.Client(base_url=url, timeout=30) as http:
        fn_index = load_test.generate_fn_index(http)
    data = load_test.api_values(url, prompt=LESSON["prompt"], target_speedup=2.0,
                                max_new_tokens=int(LESSON["max_new_tokens"]))
    go, results, visitor = threading.Event(), [], {}
    threads = [threading.Thread(target=lambda i=i: results.append(
        wire_pupil(url, f"pupil{i:02d}", data, fn_index, go, timeout_s))) for i in range(pupils)]
    threads.append(threading.Thread(target=browser_pupils, args=(url, browsers, go, timeout_s, results)))
    for thread in threads:
        thread.start()
    time.sleep(max(5.0, 1.5 * pupils / 10 + 12 * browsers))  # every page is loaded, its heartbeat open
    go.set()
    time.sleep(0.5)
    visitor.update(load_test.page_visitor_job(url, "127.0.0.2", "classvisitor", data, fn_index))
    for thread in threads:
        thread.join(timeout_s)
    refused = [r["refused"] for r in results if r.get("refused")]
    return {"pupils_on_the_wire": pupils, "pupils_in_chromium": browsers, "teacher_link": "/?" + urlencode(LESSON),
            "admitted_and_done": sum(bool(r.get("ok")) for r in results), "refused": len(refused),
            "refusal_examples": sorted(set(refused))[:3],
            "neither_in_time": sum(not r.get("ok") and not r.get("refused") for r in results),
            "first_message_s": summary([r.get("first_message_s") for r in results]),
            "done_s": summary([r.get("done_s") for r in results]),
            "chromium_done_s": summary([r.get("done_s") for r in results if r["kind"] == "chromium"]),
            "batches_seen": sorted({r["batch"] for r in results if "batch" in r}),  # the wire pupils' batch sizes
            "visitor_other_address": visitor, "pupils_detail": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pupils", type=int, default=30, help="pupils on the wire")
    parser.add_argument("--browsers", type=int, default=3, help="pupils in real Chromium pages")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the class's jobs")
    parser.add_argument("--json", default=None, help=f"write the report here (default {CLASSROOM_JSON})")
    args = parser.parse_args()
    port = load_test.free_port()
    server = load_test.start_server(port)
    url = f"http://127.0.0.1:{port}/"
    process = psutil.Process(server.pid)
    try:
        load_before = [round(x, 2) for x in os.getloadavg()]
        rss_before = load_test.rss_mb(process)
        started = time.time()
        report = {"command": load_test.command_line(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "hardware": {**load_test.hardware(), "cpu_flags": load_test.cpu_flags()},
                  **run_class(url, args.pupils, args.browsers, args.timeout)}
        report["seconds"] = round(time.time() - started, 1)
        report["rss_mb"] = {"before": rss_before, "after": load_test.rss_mb(process)}
        report["load_average"] = {"before_1_5_15_min": load_before,
                                  "after_1_5_15_min": [round(x, 2) for x in os.getloadavg()]}
    finally:
        server.terminate()
        server.wait(30)
    print(json.dumps({k: v for k, v in report.items() if k != "pupils_detail"}, indent=2))
    Path(args.json or CLASSROOM_JSON).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["refused"] == 0 and report["neither_in_time"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
