"""Counting rejected input, and telling the operator about it without flooding the log.

Every reject is counted by (source, reason) for the stats topic. Each one is also a candidate log
line naming the sensor (when known), where it came from (MQTT topic or serial port) and why; the
lines are throttled per (sensor, reason): the first is logged, then at most one per
``interval_s`` carrying how many were suppressed since the last. A flood of distinct keys (random
sensor ids) is bounded too: at most ``max_lines_per_interval`` lines per interval overall, the rest
folded into one summary line. Counting never raises: bad input must not stop a source.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from tesla_gateway.contract.readings import (
    SENSOR_ID_PATTERN,
    Reading,
    ReadingRejectedError,
    RejectReason,
)

__all__ = ["RejectCounter"]

_MAX_THROTTLE_KEYS = 4096  # (sensor, reason) pairs remembered; the oldest is forgotten beyond


@dataclass(slots=True)
class _Throttle:
    logged_at: float
    suppressed: int = 0


class RejectCounter:
    """Counts rejects by (source, reason); logs them throttled per (sensor, reason)."""

    def __init__(
        self,
        *,
        summary_interval_s: float = 60.0,
        max_lines_per_interval: int = 100,
        clock: Callable[[], float] = time.monotonic,
        logger: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self._interval = summary_interval_s
        self._max_lines = max_lines_per_interval
        self._clock = clock
        self._log = (
            logger if logger is not None else structlog.get_logger("tesla_gateway.ingest.rejects")
        )
        self._totals: Counter[tuple[str, RejectReason]] = Counter()
        self._throttles: OrderedDict[tuple[str, RejectReason], _Throttle] = OrderedDict()
        self._budget_since = clock()
        self._lines_in_budget = 0
        self._over_budget: Counter[str] = Counter()  # reason -> rejects not logged (budget)

    def reject(
        self,
        reason: RejectReason,
        *,
        source: str,
        detail: str = "",
        sensor: str | None = None,
        where: str | None = None,
    ) -> None:
        """Count one reject; log it unless its (sensor, reason) was logged within the interval.

        ``sensor`` is the sensor id when known (an invalid one is left to ``detail``), ``where``
        the MQTT topic or serial port it came in on.
        """
        self._totals[source, reason] += 1
        if sensor is not None and not SENSOR_ID_PATTERN.fullmatch(sensor):
            sensor = None
        now = self._clock()
        key = (sensor if sensor is not None else f"<{source}>", reason)
        throttle = self._throttles.get(key)
        if throttle is not None and now - throttle.logged_at < self._interval:
            throttle.suppressed += 1
            return
        if now - self._budget_since >= self._interval:
            self._flush_over_budget(now)
        if self._lines_in_budget >= self._max_lines:
            self._over_budget[reason.value] += 1
            return
        self._lines_in_budget += 1
        self._log.warning(
            "reading_rejected",
            sensor=sensor,
            source=source,
            where=where[:200] if where is not None else None,
            reason=reason.value,
            detail=detail[:200],
            suppressed=throttle.suppressed if throttle is not None else 0,
        )
        self._throttles[key] = _Throttle(logged_at=now)
        self._throttles.move_to_end(key)
        while len(self._throttles) > _MAX_THROTTLE_KEYS:
            self._throttles.popitem(last=False)

    def reject_error(
        self,
        error: ReadingRejectedError,
        *,
        source: str,
        sensor: str | None = None,
        where: str | None = None,
    ) -> None:
        """Shorthand for the common ``except ReadingRejectedError`` path."""
        self.reject(
            error.reason,
            source=source,
            detail=error.detail,
            sensor=error.sensor_id if error.sensor_id is not None else sensor,
            where=where,
        )

    def reject_dropped(self, reading: Reading, *, where: str | None = None) -> None:
        """Count the covariates an accepted reading lost (``bad_covariate``), one reject each."""
        for fault in reading.dropped:
            self.reject_error(fault, source=reading.source, sensor=reading.sensor_id, where=where)

    def flush(self, *, final: bool = False) -> None:
        """Log what was suppressed for keys whose interval has passed (all of them if
        ``final``, at shutdown), in one summary line, never one per key. Called periodically,
        so a flood that stopped still has its count told."""
        now = self._clock()
        if final or now - self._budget_since >= self._interval:
            self._flush_over_budget(now)
        due = [
            (key, throttle)
            for key, throttle in self._throttles.items()
            if throttle.suppressed and (final or now - throttle.logged_at >= self._interval)
        ]
        if not due:
            return
        counts = Counter({f"{sensor}:{reason.value}": t.suppressed for (sensor, reason), t in due})
        self._log.warning(
            "readings_rejected_summary",
            suppressed=sum(counts.values()),
            counts=dict(counts.most_common(20)),
            total=sum(self._totals.values()),
        )
        for _, throttle in due:
            throttle.suppressed = 0
            throttle.logged_at = now

    def count(self, reason: RejectReason | None = None, *, source: str | None = None) -> int:
        """Total rejects so far, optionally for one reason and/or one source."""
        return sum(
            n
            for (src, why), n in self._totals.items()
            if (reason is None or why is reason) and (source is None or src == source)
        )

    def snapshot(self) -> dict[str, object]:
        """JSON-ready totals for the stats topic."""
        by_reason: Counter[str] = Counter()
        by_source: dict[str, dict[str, int]] = {}
        for (source, reason), n in sorted(self._totals.items()):
            by_reason[reason.value] += n
            by_source.setdefault(source, {})[reason.value] = n
        return {
            "total": sum(self._totals.values()),
            "by_reason": dict(sorted(by_reason.items())),
            "by_source": by_source,
        }

    def _flush_over_budget(self, now: float) -> None:
        """Start a new line budget; say how many rejects the last one could not log."""
        if self._over_budget:
            self._log.warning(
                "readings_rejected_over_budget",
                not_logged=sum(self._over_budget.values()),
                by_reason=dict(sorted(self._over_budget.items())),
                max_lines_per_interval=self._max_lines,
                total=sum(self._totals.values()),
            )
            self._over_budget.clear()
        self._budget_since = now
        self._lines_in_budget = 0
