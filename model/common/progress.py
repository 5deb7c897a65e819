"""Progress lines on stderr: what start-up is doing (first start: conversions; later: loading)."""

import sys


def say(message: str) -> None:
    """One line on stderr about what start-up is doing (first start: conversions; later: loading)."""
    print(f"skipdecode: {message}", file=sys.stderr, flush=True)
