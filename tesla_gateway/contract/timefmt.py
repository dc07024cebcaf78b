"""The one timestamp format on our topics and in our files: UTC ISO-8601 with a 'Z'."""

from __future__ import annotations

import functools
from datetime import UTC, datetime

__all__ = ["iso8601"]


@functools.lru_cache(maxsize=4096)  # a tick's readings share their period's two timestamps
def iso8601(timestamp: float) -> str:
    """``2026-11-23T20:15:00Z`` for a POSIX timestamp (fractions of a second kept)."""
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")
