"""Gradio controls built from the settings schema, and the adapter that hands event handlers
the settings as a dict keyed by field name."""

from __future__ import annotations

import inspect
from typing import Callable, Iterator

import gradio as gr

from app.settings import PlaygroundSettings


def control(name: str, low: float | None = None, high: float | None = None, **overrides) -> gr.components.Component:
    """The gradio control of one settings field: its label, default and help come from the schema."""
    meta = PlaygroundSettings.meta(name)
    default = PlaygroundSettings.__dataclass_fields__[name].default
    options = dict(label=meta["label"], value=default, elem_id=f"setting-{name.replace('_', '-')}")
    if meta["help"]:
        options["info"] = meta["help"]
    options.update(overrides)
    kind = meta["kind"]
    if kind == "text":
        return gr.Textbox(**options)
    if kind == "choice":
        return gr.Dropdown(list(meta["choices"]), **options)
    if kind == "bool":
        return gr.Checkbox(**options)
    step = meta["step"] or (1 if meta["integer"] else 0.1)
    return gr.Slider(low if low is not None else meta["low"], high, step=step, **options)


def with_settings(fn: Callable, controls: dict[str, gr.components.Component]) -> Callable:
    """Adapt a handler of (settings dict, request) to gradio's dict input {component: value}.
    The request parameter stays explicit so gradio injects the session into it."""
    names = {component: name for name, component in controls.items()}

    def settings_of(data: dict) -> dict:
        return {names[c]: v for c, v in data.items() if c in names}

    def restart_flag(data: dict):
        return next((v for c, v in data.items() if c not in names), None)

    if inspect.isgeneratorfunction(fn):
        def streaming(data: dict, request: gr.Request = None) -> Iterator:
            flag = restart_flag(data)
            yield from (fn(flag, settings_of(data), request) if flag is not None else fn(settings_of(data), request))
        return streaming

    def plain(data: dict, request: gr.Request = None):
        return fn(settings_of(data), request) if "request" in inspect.signature(fn).parameters else fn(settings_of(data))
    return plain
