"""When a serial node is told the time (the ``T`` line, docs/serial-protocol.md).

A node has no clock, yet a model that reads the hour of the day needs the wall time of its
periods (tesla_gateway/contract/time_of_day.py). The gateway tells it: after every hello (a
node that just booted or was asked who it is), then every hour (the board's crystal drifts),
and at once when the gateway's own clock steps (NTP's first answer on a Pi without a real-time
clock). The offset is the zone's *standard* one, as the hour channels use it. A gateway whose
clock is not set (before :data:`TIME_MIN_S`) or past :data:`TIME_MAX_S` teaches no node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from tesla_gateway.contract.time_of_day import utc_offset_for
from tesla_gateway.sources.line_protocol import TIME_MAX_S, TIME_MIN_S, encode_time

__all__ = ["TIME_RESEND_S", "NodeTime"]

TIME_RESEND_S = 3600.0  # a node is told the time again this often
_CHECK_S = 60.0  # how often the gateway's clock is compared with the monotonic one
_CLOCK_STEP_S = 2.0  # a larger disagreement between them is a step of the wall clock


class NodeTime:
    """One connection's schedule of ``T`` lines; the port's reader asks it what to send."""

    def __init__(
        self,
        zone: str | None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._zone = zone
        self._clock = clock
        self._monotonic = monotonic
        self._wanted = False  # a hello came: tell the node at once
        self._sent_wall: float | None = None
        self._sent_mono = monotonic()  # the hourly line counts from the connection's start
        self._log = structlog.get_logger("tesla_gateway.sources.serial")
        self._unset_logged = False

    def hello_seen(self) -> None:
        """A node (re)introduced itself: it may have just booted and lost the time."""
        self._wanted = True

    def next_check_s(self) -> float:
        """Seconds until the reader should ask :meth:`line_if_due` again without input."""
        if self._wanted and _settable(self._clock()):
            return 0.0
        hourly = TIME_RESEND_S - (self._monotonic() - self._sent_mono)
        return max(0.0, min(hourly, _CHECK_S))

    async def wait(self, readable: asyncio.Event) -> None:
        """Until the port has bytes, or until :meth:`line_if_due` may have a line."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.next_check_s()):
                await readable.wait()

    def line_if_due(self) -> bytes | None:
        """The ``T`` line to send now, or None (nothing due, or the gateway's clock unset)."""
        now, mono = self._clock(), self._monotonic()
        stepped = self._sent_wall is not None and (
            abs((now - self._sent_wall) - (mono - self._sent_mono)) > _CLOCK_STEP_S
        )
        if mono - self._sent_mono >= TIME_RESEND_S:
            self._wanted = True
            self._sent_mono = mono  # counted again from here, sent or withheld
        self._wanted |= stepped
        if not self._wanted:
            return None
        if not _settable(now):  # kept wanted: told once the clock is right
            self._sent_wall = None
            if not self._unset_logged:
                self._unset_logged = True
                self._log.warning(
                    "node_time_withheld",
                    gateway_time=now,
                    detail=(
                        "the gateway's clock is not set (NTP?)"
                        if now < TIME_MIN_S
                        else "the gateway's clock is past 2100 (a bad RTC or date -s?)"
                    )
                    + "; nodes are told once it is right",
                )
            return None
        self._unset_logged = False
        self._wanted = False
        self._sent_wall, self._sent_mono = now, mono
        unix_s = int(now)
        offset = utc_offset_for(self._zone, now)
        self._log.debug("node_time_sent", unix_s=unix_s, utc_offset_s=offset, stepped=stepped)
        return encode_time(unix_s, offset)


def _settable(now: float) -> bool:
    """Whether a node may be told this clock: a ``T`` line carries only times in its range."""
    return TIME_MIN_S <= now <= TIME_MAX_S
