"""The ONE place that touches gradio's private internals, checked against the version it was written for.

The fair queue and the request guard need what gradio keeps private: the queue's ``push``, its
per-lane event lists, the events' ids, sessions and liveness, ``blocks.fns`` and the function's
input components, and the context variable naming the event a handler runs for. All of it moves
between gradio releases, so it is read here only, and ``check_version`` refuses an untested gradio
at start-up instead of failing on a visitor's request.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator

import gradio

SUPPORTED_GRADIO = "6.31."  # requirements.txt pins gradio==6.31.0


def check_version(version: str = gradio.__version__) -> None:
    """Refuse to wire the fair queue into a gradio this module was not written for."""
    if not version.startswith(SUPPORTED_GRADIO):
        raise RuntimeError(
            f"app/serving/gradio_internals.py was written for gradio {SUPPORTED_GRADIO}x (the queue's push, its event "
            f"lists, blocks.fns); the installed gradio is {version}. Install the pinned one (requirements.txt) "
            "or re-check this module against the new release.")


# --- blocks and their functions ----------------------------------------------------------------


def queue_of(blocks) -> Any:
    return blocks._queue


def functions(blocks) -> dict[int, Any]:
    """fn_index -> gradio's BlockFunction of every event of the app."""
    return blocks.fns


def function_named(blocks, api_name: str):
    return next((fn for fn in blocks.fns.values() if fn.api_name == api_name), None)


def public_functions(blocks) -> dict[str, Any]:
    """api_name -> function of the documented (public) endpoints."""
    return {fn.api_name: fn for fn in blocks.fns.values()
            if fn.api_name and getattr(fn, "api_visibility", "public") == "public"}


def api_name_of(fn) -> str | None:
    return fn.api_name


def lane_of(fn) -> str | None:
    """The concurrency id (lane) a function runs in."""
    return getattr(fn, "concurrency_id", None)


def is_queued(fn) -> bool:
    return bool(fn.queue)


def input_count(fn) -> int:
    return len(fn.inputs)


_SPECS: dict[int, tuple[object, list]] = {}  # id(fn) -> (fn, its input specs): asked on every request


def input_specs(fn) -> list[tuple[str | None, str | None]]:
    """(setting name, JSON type) of each input of ``fn``, in the order of its data list. A control
    built from the settings schema has elem_id "setting-<name with dashes>"; a gr.api endpoint's
    inputs are its function's parameters; anything else (a gr.State) has no name."""
    cached = _SPECS.get(id(fn))
    if cached is None or cached[0] is not fn:
        cached = _SPECS[id(fn)] = (fn, _input_specs(fn))
    return cached[1]


def _input_specs(fn) -> list[tuple[str | None, str | None]]:
    parameters = [name for name, p in inspect.signature(fn.fn).parameters.items()
                  if name != "request" and p.kind is p.POSITIONAL_OR_KEYWORD] if fn.fn else []
    specs = []
    for index, component in enumerate(fn.inputs):
        elem_id = getattr(component, "elem_id", None) or ""
        if elem_id.startswith("setting-"):
            name = elem_id.removeprefix("setting-").replace("-", "_")
        elif type(component).__name__ == "Api" and index < len(parameters):
            name = parameters[index]
        else:
            name = None
        try:
            kind = component.api_info().get("type")
        except Exception:  # noqa: BLE001 - a component without a JSON schema accepts anything
            kind = None
        specs.append((name, kind if isinstance(kind, str) else None))
    return specs


_CHOICES: dict[int, tuple[object, list]] = {}  # id(fn) -> (fn, the choices of each input)


@dataclass(frozen=True)
class Choices:
    """What a closed input accepts: one of ``values`` (compared with their JSON types), or null
    where ``null_ok`` (a cleared dropdown; not a radio, not an example's index)."""

    values: tuple
    null_ok: bool

    def refuses(self, value) -> bool:
        if value is None:
            return not self.null_ok
        return not any(value == allowed and type(value) is type(allowed) for allowed in self.values)


def input_choices(fn) -> list[Choices | None]:
    """What each input of ``fn`` accepts when it is closed (a Radio, a Dropdown without custom
    values: its JSON schema's enum; an Examples table: an index of its rows), else None; in the
    order of its data list."""
    cached = _CHOICES.get(id(fn))
    if cached is None or cached[0] is not fn:
        cached = _CHOICES[id(fn)] = (fn, [_choices(component) for component in fn.inputs])
    return cached[1]


def _choices(component) -> Choices | None:
    if isinstance(component, gradio.Dataset):  # gradio indexes its rows with the value: a bare 500 otherwise
        return Choices(tuple(range(len(component.raw_samples))), null_ok=False)
    if getattr(component, "allow_custom_value", False):
        return None
    try:
        enum = component.api_info().get("enum")
    except Exception:  # noqa: BLE001 - a component without a JSON schema accepts anything
        return None
    # A dropdown may be cleared (the form's handlers read null as "leave out"); a radio always holds
    # one of its choices on the page, and its handlers (the task's) have no null meaning.
    return Choices(tuple(enum), null_ok=isinstance(component, gradio.Dropdown)) if isinstance(enum, list) else None


def has_backend(fn) -> bool:
    """Whether ``fn`` runs on the server (an event of the page's own JavaScript has no function:
    gradio answers a request for it with a bare 500)."""
    return fn.fn is not None


def preprocess_problem(fn, position: int, value) -> str | None:
    """gradio's own refusal of ``value`` for input ``position`` of ``fn`` (a slider's range, an
    example's index, a type), as text; None when its component takes it. The same preprocess the
    event runs, called before it joins a queue, so its error is a message and not a 500."""
    try:
        fn.inputs[position].preprocess(value)
    except Exception as error:  # noqa: BLE001 - any refusal of any component becomes a message
        return str(error).strip("'\"") or type(error).__name__
    return None


def api_parameters(fn) -> list[tuple[str, bool]]:
    """(name, required) of a gr.api endpoint's parameters, in order (the /call/v2 body's keys)."""
    if not fn.fn:
        return []
    return [(name, p.default is inspect.Parameter.empty) for name, p in inspect.signature(fn.fn).parameters.items()
            if name != "request"]


# --- the queue ---------------------------------------------------------------------------------


def lanes(queue) -> list[list]:
    """The waiting events of each concurrency lane, in the order gradio will start them (mutable)."""
    return [event_queue.queue for event_queue in queue.event_queue_per_concurrency_id.values()]


def waiting_events(queue) -> Iterator:
    """Every event waiting in the queue (all lanes), not yet running."""
    for lane in lanes(queue):
        yield from lane


def waiting_count(queue) -> int:
    return sum(len(lane) for lane in lanes(queue))


def known_event(queue, event_id: str):
    """The event (waiting or running) with this id, or None once it has finished."""
    return queue.event_ids_to_events.get(event_id)


def event_id(event) -> str:
    return event._id


def event_alive(event) -> bool:
    """False once gradio saw the event's result stream close (its client went away)."""
    return bool(event.alive)


def current_event(queue):
    """The event the calling handler runs for (gradio sets its id in a context variable around each
    call of the handler), or None outside a queued call."""
    from gradio.context import LocalContext  # noqa: PLC0415

    current = LocalContext.event_id.get(None)
    return queue.event_ids_to_events.get(current) if current else None


def wrap_push(queue, before: Callable[[Any, Any], Awaitable[tuple[tuple | None, Any]]],
              after: Callable[[str, Any, Any], None]) -> None:
    """Wrap this queue's ``push``: ``before(body, request)`` returns (push's refusal tuple or None,
    a context); a refused job never reaches gradio; ``after(event_id, body, context)`` sees every
    admitted one."""
    push: Callable[..., Awaitable[tuple]] = queue.push

    async def fair_push(body, request, username):
        refusal, context = await before(body, request)
        if refusal is not None:
            return refusal
        admitted, event_id_, state = await push(body, request, username)
        if admitted:
            after(event_id_, body, context)
        return admitted, event_id_, state

    queue.push = fair_push


def queue_full(message: str) -> tuple:
    """push's refusal that gradio answers with HTTP 503 and ``message`` as the detail."""
    return False, message, "queue_full"


def invalid_value(parameter: str, message: str) -> tuple:
    """push's refusal that gradio answers with HTTP 422 in its validator format, which gradio_client
    raises as a ValidationError carrying ``message`` (a plain string detail would crash it)."""
    return False, [{"__type__": "validate", "is_valid": False, "parameter_name": parameter, "message": message}], \
        "validator_error"


def body_session(body) -> str | None:
    return body.session_hash


def body_function(blocks, body):
    """The function a pushed body asks for, or None."""
    return blocks.fns.get(body.fn_index) if body.fn_index is not None else None


def body_data(body) -> list:
    return list(body.data or [])


def drop_waiting(queue, event, message: str) -> bool:
    """Take a waiting event out of the queue and end it with ``message`` (its client reads an error
    event); False when it had already started or finished."""
    from gradio.server_messages import ProcessCompletedMessage  # noqa: PLC0415

    for lane in lanes(queue):
        if event in lane:
            lane.remove(event)
            break
    else:
        return False
    queue.event_ids_to_events.pop(event._id, None)
    # The page shows an error's text only when the payload says visible (as gradio's error_payload
    # writes it for a gr.Error); without it a dropped page job showed a bare "Error" badge.
    output = {"error": message, "visible": True, "duration": None, "title": "Refused"}
    queue.send_message(event, ProcessCompletedMessage(output=output, success=False, title="Refused"))
    return True


def reorder(queue, key: Callable[[Any], Any]) -> None:
    """Sort each lane's waiting events by ``key`` (the event that sorts first starts next)."""
    for lane in lanes(queue):
        lane.sort(key=key)


# --- streaming diffs ---------------------------------------------------------------------------

gradio_diff = gradio.utils.diff  # gradio's own (read before ``fix_streaming_diffs`` replaces it)


def streaming_diff(old: Any, new: Any, path: list | None = None) -> list[list]:
    """gradio's streaming diff (``gradio.utils.diff``: the edits a generator's next value is sent as,
    which both clients apply in order) with its index bug fixed. gradio 6.31 shifts every "delete"
    under a list by the deletes before it, its elements' own nested deletes included, so a message
    whose list items each lose a nested item (a frame's steps, app/serving/frames.py: each step's layers)
    reached the client wrong or raised IndexError. Here only a list's own trailing deletes shift
    (each removes the item at the first index past the common length)."""
    path = path or []
    if old == new:
        return []
    if type(old) is not type(new):
        return [["replace", path, new]]
    if isinstance(old, str) and new.startswith(old):
        return [["append", path, new[len(old):]]]
    if isinstance(old, list):
        common = min(len(old), len(new))
        edits = [edit for i in range(common) for edit in streaming_diff(old[i], new[i], [*path, i])]
        edits += [["delete", [*path, common], None] for _ in range(common, len(old))]
        return edits + [["add", [*path, i], new[i]] for i in range(common, len(new))]
    if isinstance(old, dict):
        edits = [edit for key in old for edit in (streaming_diff(old[key], new[key], [*path, key]) if key in new
                                                   else [["delete", [*path, key], None]])]
        return edits + [["add", [*path, key], new[key]] for key in new if key not in old]
    return [["replace", path, new]]


def fix_streaming_diffs() -> None:
    """Make gradio's server send ``streaming_diff``'s edits (Blocks.handle_streaming_diffs calls
    ``gradio.utils.diff`` through the module)."""
    check_version()
    gradio.utils.diff = streaming_diff


# --- a new session's state: its blocks' configs made when first asked ------------------------------


class _ConfigsOnDemand(dict):
    """A session's ``config_values`` (block id -> its config for gradio's deep links), each made when
    first read instead of all when the session starts. Gradio fills them only to save a deep link;
    every API call is a session of its own, and making all ~160 configs took ~9 ms each on a quiet
    2-core CPU and more than 30 ms on a loaded one, on the server's one event loop: a class's 30 clicks
    reached the batcher spread over a second. The values are the same, made from the same blocks, where
    gradio 6.31 reads them (items(), as the deep link does; its writers insert a key before they read it);
    ``get``, ``[]`` and ``in`` see those made so far."""

    def __init__(self, session, block_ids: frozenset) -> None:
        super().__init__()
        # a weak reference: the session holds this dict, and no cycle should keep an evicted session alive
        self._session, self._block_ids, self._filled = weakref.ref(session), block_ids, False

    def _ordered(self) -> list[tuple[Any, Any]]:
        """Every config in the blocks' order, as gradio made them, then any others set since. Made in place
        (``setdefault``: a config the event loop sets meanwhile is kept; nothing is cleared), for the deep
        link's worker thread."""
        session = self._session()
        blocks = session.blocks_config.blocks if session is not None else {}
        if not self._filled and session is not None:
            for key, block in list(blocks.items()):
                if key in self._block_ids and not dict.__contains__(self, key):
                    self.setdefault(key, session.blocks_config.config_for_block(key, [], block))
            self._filled = True
        first = [key for key in blocks if key in self._block_ids and dict.__contains__(self, key)]
        taken = set(first)
        return [(key, dict.__getitem__(self, key)) for key in first] + \
            [(key, value) for key, value in list(dict.items(self)) if key not in taken]

    def items(self):  # the deep link reads them all (``SessionState.components``)
        return self._ordered()

    def values(self):
        return [value for _, value in self._ordered()]

    def __iter__(self):
        return iter([key for key, _ in self._ordered()])

    def __len__(self) -> int:
        return len(self._ordered())


@dataclass(frozen=True)
class _NoConfigs:
    """The blocks as gradio's ``SessionState.__init__`` reads them, less the blocks whose configs it makes."""

    default_config: Any
    blocks: dict = field(default_factory=dict)


def make_session_configs_on_demand() -> None:
    """Make gradio's new sessions build their blocks' configs when a deep link first asks for them
    (``_ConfigsOnDemand``): ``SessionState.__init__`` made them all, for every API call."""
    check_version()
    from gradio.state_holder import SessionState  # noqa: PLC0415

    if getattr(SessionState, "_configs_on_demand", False):
        return

    def __init__(self, blocks) -> None:
        original_init(self, _NoConfigs(blocks.default_config))
        self.config_values = _ConfigsOnDemand(self, frozenset(blocks.blocks))

    original_init = SessionState.__init__
    SessionState.__init__ = __init__
    SessionState._configs_on_demand = True
