"""Frames: a streamed run sends the steps since its last message together, not one message a step.

A decode step on the CPU takes a few milliseconds; sending each as its own gradio message made the
server's own work (output processing, diffing, the event stream) cost 2-4 s of a 256-token race on
the same two cores (issue #51). The race still yields after every step; the page and the API send
a message only when a frame is due (``FrameClock``: the first step at once, then at most one
message every ``FRAME_S``, and always the last), and each API message lists every step it covers
(``NewSteps``), so no step's tokens, layers or timings are lost between frames.
"""

from __future__ import annotations

import time
from typing import Callable

from model.race import RaceUpdate, StreamProgress

FRAME_S = 0.05  # at most 20 messages a second (and the last): a person reads no faster
# A shared batch's jobs together send at most this many messages a second: each message is rendered by
# its own handler on the same cores the batch decodes on (15 jobs at 20 a second took more than the model)
BATCH_MESSAGES_PER_S = 40.0
API_STREAMS = {"skip": "skipdecode", "full": "full"}  # the race's stream keys -> the API's names


class FrameClock:
    """When a streamed run sends its next message: the first update at once (the first token shows
    without waiting), the last always, and in between at most one per ``every_s``."""

    def __init__(self, every_s: float = FRAME_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.last: float | None = None

    def due(self, last: bool = False) -> bool:
        """Whether to send now; a True answer starts the next frame's interval."""
        now = self.clock()
        if last or self.last is None or now - self.last >= self.every_s:
            self.last = now
            return True
        return False


def frame_interval(update: RaceUpdate) -> float:
    """The seconds between a job's messages: FRAME_S, or longer for a job of a shared batch, so that
    the batch's jobs together keep to BATCH_MESSAGES_PER_S (every step still reaches the API: NewSteps)."""
    share = update.batch
    return FRAME_S if share is None else max(FRAME_S, share.requests / BATCH_MESSAGES_PER_S)


def step_entry(name: str, progress: StreamProgress, step: int) -> dict:
    """Step ``step`` of one stream (0: the prefill, which makes the first token) as the API sends it:
    per row the token it added (text and id; None for a row that had already stopped), the layers
    it ran and its seconds (the decoder's own timing)."""
    ids = [progress.ids(row) for row in range(progress.rows)]
    texts = [progress.token_texts(row) for row in range(progress.rows)]
    record = progress.record
    assert record is not None  # a step ran, so the stream has its record
    layers = record.prefill_layers if step == 0 else record.step_layers[step - 1]
    seconds = record.prefill_seconds if step == 0 else record.step_seconds[step - 1]
    return {"stream": name, "step": step,
            "tokens": [row[step] if step < len(row) else None for row in texts],
            "token_ids": [row[step] if step < len(row) else None for row in ids],
            "layers": list(layers), "seconds": round(seconds, 6)}


class NewSteps:
    """The steps of both streams that no message has carried yet, in the order they ran. ``add``
    every update of the race (one stream moved one step, or finished); ``take`` when a message goes."""

    def __init__(self) -> None:
        self.seen = dict.fromkeys(API_STREAMS, 0)  # steps recorded so far, per stream
        self.pending: list[dict] = []

    def add(self, update: RaceUpdate) -> None:
        progress = update.skip if update.moved == "skip" else update.full
        ran = len(progress.depths)  # the prefill and every decode step so far
        for step in range(self.seen[update.moved], ran):
            self.pending.append(step_entry(API_STREAMS[update.moved], progress, step))
        self.seen[update.moved] = max(self.seen[update.moved], ran)

    def take(self) -> list[dict]:
        taken, self.pending = self.pending, []
        return taken
