"""Every request gets a status and a message; nothing reaches gradio that it would answer with a
bare 500, ``{"error": null}``, a hang or a stored file.

An ASGI middleware in front of the gradio app (passed as ``app_kwargs`` at launch). It refuses:
  * uploads and any multipart body (the app takes no files);
  * request bodies over ``MAX_BODY_BYTES``, JSON that does not parse or is nested deeper than
    ``MAX_JSON_DEPTH`` (5000 levels made gradio raise RecursionError);
  * session ids that are not short tokens (a 1 MB ``session_hash`` was kept in memory);
  * work requests gradio would mishandle: an unknown ``fn_index`` or endpoint, the wrong number or
    JSON types of values (``queue/join``, ``/call/``, ``/call/v2/``, ``/run/``), any POST path with
    more after ``/call/<name>``.
And it reports to the app's fair queue (app/serving/fair_queue.py) which result streams and page heartbeats
are open, so a job nobody reads is dropped and a page session is told apart from a script.
"""

from __future__ import annotations

import json
import math
import re
from urllib.parse import parse_qs

from app.serving import gradio_internals as gi
from app.serving.page_tokens import cookie_header, token_in

MAX_BODY_BYTES = 256 * 1024  # the longest prompt (8000 characters, each up to 6 bytes escaped) fits 5 times
MAX_JSON_DEPTH = 32  # the app's values are flat; gradio's own bodies are a few levels deep
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
API_PREFIX = "/gradio_api"
MAX_DETAIL_CHARS = 300  # gradio's own refusal quoted in a page event's 422 (it may quote the value)
DEFAULT_MAX_CHARS = 8000  # a page event's text without a playground to ask (Limits.max_prompt_chars)
JSON_TYPES = {"string": (str,), "number": (int, float), "integer": (int, float), "boolean": (bool,)}


class RequestGuard:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope.get("path", ""), scope.get("method", "")
        blocks = scope["app"].get_blocks() if hasattr(scope.get("app"), "get_blocks") else None
        problem = head_problem(path, method, _headers(scope), scope.get("query_string", b"").decode("latin-1"))
        if problem is None and method in ("POST", "PUT", "PATCH"):
            body, messages, problem = await _read_body(receive)
            if problem is None:
                problem = body_problem(path, body, blocks)
            if problem is None:
                replay = iter(messages)

                async def replayed_receive():
                    return next(replay, None) or await receive()

                await self.app(scope, replayed_receive, send)
                return
        if problem is not None:
            status, detail = problem
            await _send_json(send, status, {"detail": detail, "error": detail})
            return
        await self._tracked(scope, receive, send, path, blocks)

    async def _tracked(self, scope, receive, send, path: str, blocks) -> None:
        """GETs: a result stream or page heartbeat is reported open to the fair queue while it lasts
        (a heartbeat with the page token its page load set); a page gets a fresh page token."""
        fair = getattr(blocks, "fair_queue", None)
        stream, heartbeat = stream_key(path, scope.get("query_string", b"").decode("latin-1")), heartbeat_key(path)
        if fair is None or (stream is None and heartbeat is None):
            await self.app(scope, receive, with_page_token(send, fair, _secure(scope)) if fair is not None else send)
            return
        if stream is not None:
            fair.stream_opened(stream)
        else:
            fair.heartbeat(heartbeat, True, token_in(_headers(scope).get("cookie", "")))
        try:
            await self.app(scope, receive, send)
        finally:
            if stream is not None:
                fair.stream_closed(stream)
            else:
                fair.heartbeat(heartbeat, False)


# --- what the path and headers alone decide ---------------------------------------------------------


def head_problem(path: str, method: str, headers: dict[str, str], query: str) -> tuple[int, str] | None:
    if path.rstrip("/").endswith(("/upload", "/upload_progress")) or \
            headers.get("content-type", "").startswith("multipart/"):
        return 415, "this app takes no files: uploads are refused"
    for session in parse_qs(query).get("session_hash", []):
        if not SESSION_ID.fullmatch(session):
            return 400, session_message(session)
    heartbeat = path.split("/heartbeat/", 1)[1].strip("/") if "/heartbeat/" in path else None
    if heartbeat is not None and not SESSION_ID.fullmatch(heartbeat):
        return 400, session_message(heartbeat)
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return 413, f"the request body is {int(declared)} bytes; the limit is {MAX_BODY_BYTES} bytes"
    return None


def session_message(session: str) -> str:
    shown = session[:20] + ("…" if len(session) > 20 else "")
    return (f"session_hash must be a short token (1-64 letters, digits, '-' or '_'); got {len(session)} characters "
            f"({shown!r})")


def stream_key(path: str, query: str) -> str | None:
    """The session or event id whose results this GET streams (queue/data or /call/<name>/<id>)."""
    if path.endswith("/queue/data"):
        sessions = parse_qs(query).get("session_hash", [])
        return sessions[0] if sessions else None
    if "/call/" in path:
        parts = path.split("/call/", 1)[1].strip("/").split("/")
        if len(parts) == 2 or (len(parts) == 3 and parts[0] == "v2"):
            return parts[-1]
    return None


def heartbeat_key(path: str) -> str | None:
    return path.split("/heartbeat/", 1)[1].strip("/") or None if "/heartbeat/" in path else None


# --- what the body decides ----------------------------------------------------------------------------


def body_problem(path: str, body: bytes, blocks) -> tuple[int, str] | None:
    """(HTTP status, message) for a POST body that is too deep, not JSON, or asks for work gradio
    would answer without a message; None to let it through."""
    payload, problem = parse_json(body)
    if problem is not None:
        return problem
    if isinstance(payload, dict) and "session_hash" in payload:
        session = payload["session_hash"]
        if session is not None and not (isinstance(session, str) and SESSION_ID.fullmatch(session)):
            return 400, session_message(str(session))
    if blocks is None or API_PREFIX not in path:
        return None
    if path.endswith("/queue/join"):
        return join_problem(payload, blocks)
    if "/call/" in path:
        return call_problem(path.split("/call/", 1)[1].strip("/"), payload, blocks)
    route = re.search(r"/(?:run|api)/([^/]+)/?$", path)
    if route is not None:
        return run_problem(route.group(1), payload, blocks)
    return None


def parse_json(body: bytes) -> tuple[object, tuple[int, str] | None]:
    try:
        payload = json.loads(body or b"{}")
    except RecursionError:
        return None, (400, f"the request body is nested too deeply; the limit is {MAX_JSON_DEPTH} levels")
    except ValueError:
        return None, (400, "the request body is not JSON")
    depth = json_depth(payload)
    if depth > MAX_JSON_DEPTH:
        return None, (400, f"the request body is nested {depth} levels deep; the limit is {MAX_JSON_DEPTH} levels")
    return payload, None


def json_depth(value: object) -> int:
    """Nesting depth of parsed JSON, without recursion (a hostile body is deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def join_problem(payload, blocks) -> tuple[int, str] | None:
    if not isinstance(payload, dict):
        return 400, "the request body must be a JSON object"
    fn_index = payload.get("fn_index")
    fn = gi.functions(blocks).get(fn_index) if isinstance(fn_index, int) and not isinstance(fn_index, bool) else None
    if fn is None:
        return 400, f"unknown fn_index {fn_index!r}; the public endpoint is /generate"
    if not gi.is_queued(fn):
        return 400, f"fn_index {fn_index} runs outside the queue; it cannot join it"
    public = fn in gi.public_functions(blocks).values()  # the API's settings are named when its job is pushed
    return values_problem(fn, payload.get("data"), f"fn_index {fn_index}", None if public else page_max_chars(blocks))


def call_problem(rest: str, payload, blocks) -> tuple[int, str] | None:
    """POST /call/<name> (a list of values) or /call/v2/<name> (named values); nothing else."""
    parts = rest.split("/")
    public = gi.public_functions(blocks)
    if len(parts) == 2 and parts[0] == "v2":
        fn = public.get(parts[1])
        if fn is None:
            return 404, f"unknown endpoint {parts[1]!r}; the public endpoint is /generate"
        return named_values_problem(fn, payload, parts[1])
    if len(parts) != 1:
        return 404, f"unknown endpoint path /call/{rest}; POST /gradio_api/call/generate (see README)"
    fn = public.get(parts[0])
    if fn is None:
        return 404, f"unknown endpoint {parts[0]!r}; the public endpoint is /generate"
    if not isinstance(payload, dict):
        return 400, "the request body must be a JSON object with \"data\": [values]"
    return values_problem(fn, payload.get("data"), parts[0], None)


def run_problem(name: str, payload, blocks) -> tuple[int, str] | None:
    """/run/<name>: the page runs its quick, unqueued events here; bad data gets a message, not a 500."""
    if not isinstance(payload, dict):
        return 400, "the request body must be a JSON object"
    if name == "predict" and "fn_index" in payload:
        fn_index = payload.get("fn_index")
        fn = gi.functions(blocks).get(fn_index) if isinstance(fn_index, int) and not isinstance(fn_index, bool) else None
        label = f"fn_index {fn_index!r}"
    else:
        fn = gi.function_named(blocks, name)
        label = name
    if fn is None:
        return 404, f"unknown endpoint {label}; the public endpoint is /generate (through the queue)"
    if gi.is_queued(fn):
        return None  # gradio refuses a queued function here itself, with a message (api_open=False)
    return values_problem(fn, payload.get("data"), label, page_max_chars(blocks))


def values_problem(fn, data, label: str, max_chars: int | None) -> tuple[int, str] | None:
    """The wrong number or JSON types of values; for a page event (``max_chars`` given: not the
    public API, whose settings are named when its job is pushed) also ``page_values_problem``."""
    expected = gi.input_count(fn)
    if not isinstance(data, list) or len(data) != expected:
        got = len(data) if isinstance(data, list) else type(data).__name__
        return 422, (f"{label} takes a list of {expected} values in the documented order (see /gradio_api/info or "
                     f"README); got {got}")
    pushed = gi.is_queued(fn)  # a queued job's settings are checked (with their own messages) when it is pushed
    for position, ((name, kind), value) in enumerate(zip(gi.input_specs(fn), data), 1):
        # Never a number that is not finite: gradio's Number rounds it with int() (a bare 500).
        wrong = not_finite(value) or (None if name is not None and pushed else type_problem(kind, value))
        if wrong:
            return 422, f"{label}: value {position} ({name or 'unnamed'}) {wrong}"
    return page_values_problem(fn, data, max_chars) if max_chars is not None else None


def page_max_chars(blocks) -> int:
    """The longest text a page event takes: what the page's prompt box holds (Limits.max_page_text_chars,
    a few times the prompt's limit: the handlers name an over-long prompt's length on the page)."""
    limits = getattr(getattr(blocks, "playground", None), "limits", None)
    return getattr(limits, "max_page_text_chars", DEFAULT_MAX_CHARS)


def page_values_problem(fn, data: list, max_chars: int) -> tuple[int, str] | None:
    """A page event's values before its handler runs (the handlers are quick, but not on any text):
    text over the prompt's limit, and a closed choice's unknown value (gradio's own refusal of it
    is a bare 500), each with the message the API gives for the same setting."""
    if not gi.has_backend(fn):
        return 400, "this event runs in the page's own script; the server has nothing to run for it"
    for position, ((name, _), choices, value) in enumerate(zip(gi.input_specs(fn), gi.input_choices(fn), data), 1):
        shown = name or f"value {position}"
        if isinstance(value, str) and len(value) > max_chars:
            return 422, f"the {shown} is {len(value)} characters; the limit is {max_chars}"
        if choices is not None and choices.refuses(value):
            return 422, f"{shown} must be one of {', '.join(map(str, choices.values[:12]))}; got {value!r}"
        refused = gi.preprocess_problem(fn, position - 1, value)
        if refused:
            return 422, f"{shown}: {refused[:MAX_DETAIL_CHARS]}"
    return None


def named_values_problem(fn, payload, name: str) -> tuple[int, str] | None:
    if not isinstance(payload, dict):
        return 400, "the request body must be a JSON object of named values"
    parameters = gi.api_parameters(fn)
    known = {parameter for parameter, _ in parameters}
    unknown = sorted(set(payload) - known - {"oauth_token"})
    if unknown:
        return 422, f"{name}: unknown parameter(s) {', '.join(map(repr, unknown))}; the parameters are {', '.join(known)}"
    missing = [parameter for parameter, required in parameters if required and parameter not in payload]
    if missing:
        return 422, f"{name}: missing required parameter(s) {', '.join(missing)}"
    return None  # the values themselves are settings, checked when the job is pushed


def not_finite(value) -> str | None:
    """NaN and +-Infinity (Python's JSON reads them) are no setting's value."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number; got {value}"
    return None


def type_problem(kind: str | None, value) -> str | None:
    """What is wrong with ``value`` for a JSON-schema ``kind`` (None: anything goes, null included:
    the settings check names a missing value)."""
    allowed = JSON_TYPES.get(kind or "")
    if allowed is None or value is None:
        return None
    if isinstance(value, bool) and kind != "boolean":
        return f"must be a {kind}; got a boolean"
    if not isinstance(value, allowed):
        return f"must be a {kind}; got {type(value).__name__}"
    return None


# --- ASGI plumbing ------------------------------------------------------------------------------------


def with_page_token(send, fair, secure: bool):
    """``send`` that adds a page token cookie to an HTML response (a page load: app/serving/page_tokens.py)."""
    async def tokened_send(message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            if content_type.lower().startswith(b"text/html"):
                headers.append((b"set-cookie", cookie_header(fair.tokens.issue(), secure)))
                message = {**message, "headers": headers}
        await send(message)
    return tokened_send


def _secure(scope) -> bool:
    """Served over HTTPS (directly, or behind a proxy that says so)."""
    return scope.get("scheme") == "https" or _headers(scope).get("x-forwarded-proto", "") == "https"


def _headers(scope) -> dict[str, str]:
    return {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}


async def _read_body(receive) -> tuple[bytes, list[dict], tuple[int, str] | None]:
    """The whole body (kept to replay to gradio), or a 413 as soon as it passes the limit."""
    messages, chunks, size = [], [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return b"", [], (413, f"the request body is over {MAX_BODY_BYTES} bytes (the limit)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks), messages, None


async def _send_json(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
