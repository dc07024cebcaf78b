"""Steps of the wall clock, found against a steady clock.

A gateway's wall clock can step: a bad NTP answer moved one a day ahead for 15 s and back. The
windows lean on it for readings without a time of their own (their stamp is their arrival), for
arrivals (the wall-clock fallback's grace deadlines) and for clock sanity's "ahead of the gateway
clock"; after that step every such reading was ``late`` for 24 hours, its open period a day
ahead. NTP's slewing moves the wall clock at most 0.5 ms per second, so between two observations
(every arrival and every tick) the wall clock and a steady one advance alike; a difference
beyond ``threshold_s`` is a step, and the ticker re-anchors the windows by it
(:meth:`tesla_gateway.windows.store.WindowStore.clock_stepped`). The steady clock is
``CLOCK_BOOTTIME`` where there is one: it runs on through a suspend, as the wall clock does, so
a resume is not taken for a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["STEP_THRESHOLD_S", "ClockSteps"]

STEP_THRESHOLD_S = 60.0  # a minute: far beyond any slew between two observations


def _steady_clock() -> Callable[[], float]:
    boottime = getattr(time, "CLOCK_BOOTTIME", None)  # Linux
    if boottime is None:
        return time.monotonic
    return lambda: time.clock_gettime(boottime)


class ClockSteps:
    """Compares each wall-clock reading with a steady clock; :meth:`observe` returns a step."""

    def __init__(
        self,
        *,
        steady: Callable[[], float] | None = None,
        threshold_s: float = STEP_THRESHOLD_S,
    ) -> None:
        self._steady = steady if steady is not None else _steady_clock()
        self._threshold_s = threshold_s
        self._offset: float | None = None  # wall minus steady at the last observation

    def observe(self, wall: float) -> float:
        """How far the wall clock (now ``wall``) stepped since the last observation, beyond
        what the steady clock says passed: seconds, positive forward; 0.0 for no step."""
        offset = wall - self._steady()
        previous, self._offset = self._offset, offset
        if previous is None:
            return 0.0
        step = offset - previous
        return step if abs(step) > self._threshold_s else 0.0
