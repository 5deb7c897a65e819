"""Bytes on the wire of one page Generate (issue #37): what the page's result stream carries.

Starts `python app.py` on a free loopback port (unless --url is given; the job cost cap is raised
so a long prompt is admitted), loads the page as a visitor does (its page token, its heartbeat),
pushes one Generate job through the page's own event (`ui_generate`, the controls' values from
/config with the overrides below) and reads its result stream (`/gradio_api/queue/data`): every
byte of it, per message and per output. The outputs are rebuilt from the stream as the page's
client does (gradio's diffs applied), so the report also says how many heatmap columns the last
figure holds.

    HF_HUB_OFFLINE=1 python lab/serving/page_stream_bytes.py --prompt-words 1100 --lens

Prints one JSON object: total bytes, messages, the largest message, bytes per output, how many
messages changed each output, the heatmap's first (full) figure in bytes and its last figure's
columns (prompt + generated positions), and ``heatmap_resent_whole``: the bytes the heatmap would
have cost had every change sent the whole figure (as the page did before issue #37).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx
from gradio_client.utils import apply_diff

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]  # load_test, a product script, and the repository
from load_test import StreamReaders, free_port, loopback_client, page_event, start_server, with_settings  # noqa: E402

from app.page.live_plot import figure_from_value, figure_json  # noqa: E402

WORDS = ("the sea keeps its old sailors in stories told at night by the harbour fire while gulls "
         "circle over the nets and the tide turns slowly under a grey sky").split()


def long_prompt(words: int) -> str:
    """A plain English prompt of ``words`` words (about 1.3 tokens a word with SmolLM2's tokenizer)."""
    text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return "Summarise this passage in one sentence: " + text


def output_names(url: str, api_name: str) -> list[str]:
    """The elem_id of each output of a page event, in order."""
    config = httpx.get(url.rstrip("/") + "/config", timeout=30).json()
    dependency = next(d for d in config["dependencies"] if d.get("api_name") == api_name)
    components = {c["id"]: c for c in config["components"]}
    return [components[i].get("props", {}).get("elem_id") or str(i) for i in dependency["outputs"]]


def read_job(response, names: list[str]) -> dict:
    """Tally one job's SSE stream: bytes (all of it), messages, bytes per output, the values."""
    tally = {"bytes": 0, "messages": 0, "largest_message": 0, "per_output": dict.fromkeys(names, 0),
             "changed": dict.fromkeys(names, 0), "heatmap_resent_whole": 0}
    values: list = [None] * len(names)
    buffer = b""
    for chunk in response.iter_bytes():
        tally["bytes"] += len(chunk)
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            message = json.loads(line[5:])
            tally["messages"] += 1
            tally["largest_message"] = max(tally["largest_message"], len(line))
            kind = message.get("msg")
            if kind in ("process_generating", "process_completed") and message.get("output", {}).get("data"):
                _apply(message["output"]["data"], kind == "process_generating", names, values, tally)
            if kind == "process_completed" or kind == "close_stream":
                return tally | {"values": values, "success": message.get("success")}
    return tally | {"values": values, "success": None}


def _apply(data: list, diffs: bool, names: list[str], values: list, tally: dict) -> None:
    """One message's outputs onto ``values``: a streaming message's are diffs (after the first,
    gradio's edits lists), the completion's are the last values (update dicts leave a value as it is)."""
    for i, (name, item) in enumerate(zip(names, data)):
        tally["per_output"][name] += len(json.dumps(item))
        if diffs and _is_edits(item):
            if item:
                tally["changed"][name] += 1
            new = apply_diff(values[i], item)
        else:
            tally["changed"][name] += values[i] != item
            new = item
        if not _no_value(new):  # gr.skip(): an update without a value leaves the value as it is
            if name == "heatmap" and new and new != values[i]:  # what resending the figure whole would cost
                tally["heatmap_resent_whole"] += len(figure_json(figure_from_value(new)).encode())
            values[i] = new


def _no_value(item) -> bool:
    return isinstance(item, dict) and item.get("__type__") == "update" and "value" not in item


def _is_edits(item) -> bool:
    return isinstance(item, list) and all(isinstance(e, list) and len(e) == 3 and e[0] in (
        "replace", "append", "add", "delete") for e in item)


def heatmap_figures(value: str | None) -> tuple[int, dict | None]:
    """(bytes of the first figure, the last figure) of the heatmap's value: the live plot's lines
    (the first figure, then its patches: app/page/live_plot.py; a server before issue #37 sent one)."""
    if not value or not isinstance(value, str):
        return 0, None
    return len(value.split("\n", 1)[0].encode()), figure_from_value(value)


def page_generate(url: str, session: str, **overrides) -> dict:
    """One Generate as a page sends it: its stream's tally (see read_job), the heatmap's first
    figure in bytes, the last figure (``heatmap_figure``) and its positions."""
    fn_index, names, values = page_event(url, "ui_generate")
    outputs = output_names(url, "ui_generate")
    data = with_settings(names, values, **overrides)
    readers = StreamReaders()
    with loopback_client(url, "127.0.0.1", read_s=900) as visitor:
        visitor.get("/")  # the page token
        readers.start(visitor, f"/gradio_api/heartbeat/{session}")
        time.sleep(1.0)
        started = time.time()
        joined = visitor.post("/gradio_api/queue/join", json={"data": data, "fn_index": fn_index,
                                                              "session_hash": session})
        if joined.status_code != 200:
            raise SystemExit(f"refused: {joined.text[:300]}")
        with visitor.stream("GET", f"/gradio_api/queue/data?session_hash={session}") as response:
            tally = read_job(response, outputs)
        readers.stop.set()
    tally["seconds"] = round(time.time() - started, 1)
    first, figure = heatmap_figures(tally["values"][outputs.index("heatmap")])
    tally["heatmap_first_figure_bytes"] = first
    if figure:
        # the cells' columns (the prompt folded into one band beside them), and the sequence they reach
        xs = figure["data"][0]["x"]
        tally["heatmap_columns"] = len(xs)
        tally["heatmap_positions"] = round(max(xs)) + 1 if xs else 0
    tally["heatmap_figure"] = figure  # the figure the page drew last
    tally["status"] = tally.pop("values")[outputs.index("status")]
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running playground (default: start app.py on a free port)")
    parser.add_argument("--prompt-words", type=int, default=1100, help="prompt length in words (1100: ~1500 tokens)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--lens", action="store_true", help="the logit lens on")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        os.environ.setdefault("SKIPDECODE_MAX_JOB_COST", "4000")  # a ~1500-token prompt is over the default 400
        port = free_port()
        server = start_server(port)
        url = f"http://127.0.0.1:{port}"
    try:
        result = page_generate(url, f"bytes{os.getpid()}", prompt=long_prompt(args.prompt_words),
                               max_new_tokens=args.max_new_tokens, lens=args.lens)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
    result.pop("heatmap_figure")
    print(json.dumps({"prompt_words": args.prompt_words, "max_new_tokens": args.max_new_tokens, "lens": args.lens}
                     | result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
