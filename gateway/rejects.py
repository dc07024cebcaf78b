"""Counting rejected input without flooding the log.

A broken node can send hundreds of bad lines a second; logging each would bury everything else.
The first reject of a burst is logged with its detail, the rest are counted and summarised at
most once per ``summary_interval_s``. Counting never raises: bad input must not stop a source.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import structlog

from gateway.readings import ReadingRejectedError, RejectReason

__all__ = ["RejectCounter"]


class RejectCounter:
    """Counts rejects by (source, reason); logs the first of a burst and periodic summaries."""

    def __init__(
        self,
        *,
        summary_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        logger: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self._interval = summary_interval_s
        self._clock = clock
        self._log = logger if logger is not None else structlog.get_logger("gateway.rejects")
        self._totals: Counter[tuple[str, RejectReason]] = Counter()
        self._suppressed: Counter[tuple[str, RejectReason]] = Counter()
        self._last_log: float | None = None

    def reject(self, reason: RejectReason, *, source: str, detail: str = "") -> None:
        """Count one reject; log it if it opens a burst, else fold it into the next summary."""
        key = (source, reason)
        self._totals[key] += 1
        now = self._clock()
        quiet = self._last_log is None or now - self._last_log >= self._interval
        if quiet and not self._suppressed:
            self._log.warning(
                "reading_rejected", source=source, reason=reason.value, detail=detail[:200]
            )
            self._last_log = now
            return
        self._suppressed[key] += 1
        if quiet:
            self._log_summary(now)

    def reject_error(self, error: ReadingRejectedError, *, source: str) -> None:
        """Shorthand for the common ``except ReadingRejectedError`` path."""
        self.reject(error.reason, source=source, detail=error.detail)

    def flush(self) -> None:
        """Log the pending summary now (at shutdown, or from a periodic stats task)."""
        if self._suppressed:
            self._log_summary(self._clock())

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

    def _log_summary(self, now: float) -> None:
        counts = {
            f"{source}:{reason.value}": n
            for (source, reason), n in sorted(self._suppressed.items())
        }
        self._log.warning(
            "readings_rejected_summary",
            suppressed=sum(self._suppressed.values()),
            counts=counts,
            total=sum(self._totals.values()),
        )
        self._suppressed.clear()
        self._last_log = now
