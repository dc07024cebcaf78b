"""End-to-end latency as histogram counts: a period's end to its calibrated reading in the outbox.

For every calibrated reading the tick hands the publisher (``Publisher.submit`` returned: the
message is in the persisted outbox), the latency is the gateway's wall clock at that moment
minus the end of the reading's period (``period_start + period_seconds``), floored at 0. It
holds what a subscriber waits for beyond the period itself: the period closing (the sensor's
next reading, or ``tick.grace_s`` without one), ``tick.settle_s``, the batched invoke and the
outbox write. It does not hold the broker's acknowledgement (``published_messages_total`` and
``outbox_messages`` show delivery), and a reading that reaches the gateway late (a node's
backlog, a replay at start) counts with its whole delay: this is how old a value is when it
leaves for the broker.

The daemon keeps the counts (no prometheus_client here: the stats topic carries them too); the
metrics collector renders them as a Prometheus histogram.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tesla_gateway.contract.calibrated import CalibratedReading

__all__ = ["BUCKETS_S", "HandoffLatency"]

# Upper bounds (le) in seconds: tens of milliseconds for a reading that closes its period at
# once, up to a minute for one closed by the grace fallback; beyond that, only +Inf.
BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)


class HandoffLatency:
    """Counts per bucket (the last one +Inf), their sum and count, since the daemon started."""

    def __init__(self, buckets_s: Sequence[float] = BUCKETS_S) -> None:
        self._bounds = np.asarray(buckets_s, dtype=np.float64)
        if self._bounds.size == 0 or np.any(np.diff(self._bounds) <= 0):
            raise ValueError("latency buckets must be increasing and not empty")
        self._counts = np.zeros(self._bounds.size + 1, dtype=np.int64)  # [buckets + +Inf]
        self._sum_s = 0.0

    def observe(self, readings: Sequence[CalibratedReading], now: float) -> None:
        """Readings handed to the publisher at wall-clock time ``now``."""
        if not readings:
            return
        ends = np.fromiter(
            (r.period_start + r.period_seconds for r in readings), np.float64, len(readings)
        )
        latency = np.maximum(now - ends, 0.0)  # a sensor clock slightly ahead: 0, not negative
        # side="left": a latency equal to a bound belongs to that bucket (Prometheus' le).
        bucket = np.searchsorted(self._bounds, latency, side="left")
        self._counts += np.bincount(bucket, minlength=self._counts.size)
        self._sum_s += float(latency.sum())

    @property
    def count(self) -> int:
        return int(self._counts.sum())

    def as_dict(self) -> dict[str, object]:
        """JSON-ready: the bounds, cumulative counts per bound (Prometheus' ``le``), count, sum."""
        cumulative = np.cumsum(self._counts)
        return {
            "buckets_s": self._bounds.tolist(),
            "cumulative": cumulative[:-1].tolist(),
            "count": int(cumulative[-1]),
            "sum_s": round(self._sum_s, 6),
        }
