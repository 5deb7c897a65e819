"""Requests gradio would answer with a bare 500 or `{"error": null}` get a message instead.

An ASGI middleware in front of the gradio app (passed as ``app_kwargs`` at launch). It looks only
at POSTs that start work: ``.../queue/join`` (an unknown ``fn_index`` made gradio raise
KeyError → "Internal Server Error") and ``.../call/<api_name>`` (an unknown name, or the wrong
number of values, which gradio reports as an error event with no text). Everything else passes
through untouched.
"""

from __future__ import annotations

import json

JOIN_SUFFIX = "/queue/join"
CALL_MARK = "/call/"


class RequestGuard:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if scope["type"] != "http" or scope.get("method") != "POST" or not (
                path.endswith(JOIN_SUFFIX) or CALL_MARK in path):
            await self.app(scope, receive, send)
            return
        body, messages = await _read_body(receive)
        blocks = scope["app"].get_blocks() if hasattr(scope.get("app"), "get_blocks") else None
        problem = request_problem(path, body, blocks) if blocks is not None else None
        if problem is not None:
            status, detail = problem
            await _send_json(send, status, {"detail": detail, "error": detail})
            return
        replay = iter(messages)

        async def replayed_receive():
            return next(replay, None) or await receive()

        await self.app(scope, replayed_receive, send)


def request_problem(path: str, body: bytes, blocks) -> tuple[int, str] | None:
    """(HTTP status, message) for a request gradio would answer without a message, else None."""
    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return 400, "the request body is not JSON"
    if not isinstance(payload, dict):
        return 400, "the request body must be a JSON object"
    public = {fn.api_name: fn for fn in blocks.fns.values()
              if fn.api_name and getattr(fn, "api_visibility", "public") == "public"}
    if path.endswith(JOIN_SUFFIX):
        fn_index = payload.get("fn_index")
        if fn_index is not None and fn_index not in blocks.fns:
            return 400, f"unknown fn_index {fn_index!r}; the public endpoint is /generate"
        return None
    name = path.split(CALL_MARK, 1)[1].strip("/").split("/")[0]
    if "/" in path.split(CALL_MARK, 1)[1].strip("/"):
        return None  # .../call/<name>/<event_id> is the result stream (a GET); leave it to gradio
    fn = public.get(name)
    if fn is None:
        return 404, f"unknown endpoint {name!r}; the public endpoint is /generate"
    data = payload.get("data")
    expected = len(fn.inputs)
    if not isinstance(data, list) or len(data) != expected:
        got = len(data) if isinstance(data, list) else type(data).__name__
        return 422, (f"{name} takes a list of {expected} values in the documented order (see /gradio_api/info or "
                     f"README); got {got}")
    return None


async def _read_body(receive) -> tuple[bytes, list[dict]]:
    messages, chunks = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks), messages


async def _send_json(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
