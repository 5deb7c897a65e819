"""Where the project keeps what it prepares once per machine (converted weights, the native step)."""

from pathlib import Path

from model.common.settings import settings


def cache_root() -> Path:
    """Where converted weights live: $SKIPDECODE_CACHE_DIR, else ~/.cache/skipdecode-playground."""
    configured = settings().cache_dir
    return configured if configured is not None else Path.home() / ".cache" / "skipdecode-playground"
