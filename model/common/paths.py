"""Where the project keeps what it prepares once per machine (converted weights, the native step)."""

import os
from pathlib import Path


def cache_root() -> Path:
    """Where converted weights live: $SKIPDECODE_CACHE_DIR, else ~/.cache/skipdecode-playground."""
    configured = os.environ.get("SKIPDECODE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "skipdecode-playground"
