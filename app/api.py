"""The public ``generate`` endpoint's function: keyword parameters named and ordered like the
settings schema (gradio documents them from its signature); it delegates to the handler."""

from __future__ import annotations

import inspect
from typing import AsyncIterator, Callable

import gradio as gr

from app.handlers import Playground
from app.settings import PlaygroundSettings

PYTHON_TYPES = {"str": str, "float": float, "int": int, "bool": bool}


def api_function(playground: Playground, defaults: dict | None = None) -> Callable:
    """``defaults`` overrides schema defaults (the loaded skip policy's placement)."""
    fields = {name: PlaygroundSettings.__dataclass_fields__[name] for name in PlaygroundSettings.api_names()}
    defaults = defaults or {}
    parameters = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=PYTHON_TYPES[str(spec.type)],
                          default=inspect.Parameter.empty if name == "prompt" else defaults.get(name, spec.default))
        for name, spec in fields.items()
    ]
    parameters.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request,
                                        default=None))
    signature = inspect.Signature(parameters, return_annotation=AsyncIterator[dict])

    async def generate(*args, **kwargs) -> AsyncIterator[dict]:
        """Stream SkipDecode and the full model side by side. Each message: both texts so far,
        the layers each SkipDecode step ran, and the live figures. The last has "done": true."""
        bound = signature.bind_partial(*args, **kwargs)
        request = bound.arguments.pop("request", None)
        async for message in playground.api_stream_async(dict(bound.arguments), request):
            yield message

    generate.__signature__ = signature
    generate.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": AsyncIterator[dict]}
    return generate
