"""systemd's watchdog is pinged only while the ingest and tick loops make progress.

Each loop beats (sets its ``*_beat`` to ``time.monotonic()``) at least every heartbeat, work or
no work; a loop stuck longer than the systemd watchdog period (twice the ping interval), or
``PROGRESS_TIMEOUT_S``, withholds the ping, so systemd restarts a daemon that is alive but stuck.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from tesla_gateway.daemon.sd_notify import SdNotifier

__all__ = ["HEARTBEAT_S", "PROGRESS_TIMEOUT_S", "ProgressWatchdog"]

_log = structlog.get_logger(__name__)

HEARTBEAT_S = 1.0  # the ingest and tick loops wake at least this often
PROGRESS_TIMEOUT_S = 30.0  # WATCHDOG=1 only if both loops beat within this


class ProgressWatchdog:
    """The loops' last beats, and the task that pings systemd while both are recent."""

    def __init__(self, notifier: SdNotifier) -> None:
        self._notifier = notifier
        self.ingest_beat = time.monotonic()
        self.tick_beat = time.monotonic()

    async def run(self) -> None:
        interval = self._notifier.watchdog_interval_s
        if interval is None:
            return
        # Both loops beat at least every HEARTBEAT_S; a stall longer than the systemd watchdog
        # period itself (twice our ping interval), or PROGRESS_TIMEOUT_S, withholds the ping.
        timeout = max(3 * HEARTBEAT_S, min(PROGRESS_TIMEOUT_S, 2 * interval))
        while True:
            now = time.monotonic()
            if now - self.ingest_beat < timeout and now - self.tick_beat < timeout:
                self._notifier.watchdog()
            else:
                _log.error(
                    "watchdog_withheld",
                    ingest_idle_s=round(now - self.ingest_beat, 1),
                    tick_idle_s=round(now - self.tick_beat, 1),
                )
            await asyncio.sleep(interval)
