"""What both payload decoders apply: the limits from config and the time rules of the wire.

The full rules (:mod:`tesla_gateway.sources.payloads`) and the C fast path
(:mod:`tesla_gateway.sources.payloads_fast`) must read a payload alike; what they share lives
here, so neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_ISO_LENGTH", "MILLISECONDS_THRESHOLD", "PayloadRules", "epoch_seconds"]

# Epoch numbers at or above this are milliseconds: 1e11 s is the year 5138, 1e11 ms is 1973.
MILLISECONDS_THRESHOLD: Final = 1e11
MAX_ISO_LENGTH: Final = 40


@dataclass(frozen=True, slots=True)
class PayloadRules:
    """Limits applied to every payload; built once from the source's config."""

    max_payload_bytes: int = 65_536
    max_batch: int = 1_000
    max_future_s: float = 300.0
    max_age_s: float | None = 7 * 24 * 3600.0
    allowed_sensors: frozenset[str] | None = None


def epoch_seconds(number: float) -> float:
    """Unix seconds from a numeric time: at or above the threshold it is milliseconds."""
    return number / 1000.0 if abs(number) >= MILLISECONDS_THRESHOLD else number
