"""Entry point (HuggingFace Spaces runs this file): load the model once, build the UI, launch."""

from __future__ import annotations

import os
from functools import lru_cache

from app.ui import build_demo


@lru_cache(maxsize=1)
def get_generator():
    """The model is loaded once, on first use (not at import, so tests and Spaces start fast)."""
    from model.generation import TextGenerator  # noqa: PLC0415
    from model.loading import load_model  # noqa: PLC0415

    return TextGenerator(load_model(os.environ.get("SKIPDECODE_MODEL") or None))


def main() -> None:
    get_generator()  # load at start-up: the first visitor should not wait for it
    demo = build_demo(get_generator)
    demo.queue(max_size=int(os.environ.get("SKIPDECODE_QUEUE_SIZE", "32")))
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
    )


if __name__ == "__main__":
    main()
