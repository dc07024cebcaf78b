"""Per-sensor availability: a sensor is online while it reports, offline once it goes quiet.

The service calls :meth:`SensorAvailability.seen` for every admitted reading (a dict move, cheap
on the ingest path) and :meth:`SensorAvailability.expire` now and then; both return the sensors
whose state changed, which the publisher sends as retained ``online``/``offline`` on
``<prefix>/<sensor>/availability``. Sensors are kept in order of their last reading, so
:meth:`expire` looks only at the ones that went quiet. Time is monotonic: a wall-clock jump
cannot turn every sensor offline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

__all__ = ["SensorAvailability"]


class SensorAvailability:
    """Online sensors by the monotonic time of their last reading (oldest first)."""

    def __init__(
        self, offline_after_s: float, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.offline_after_s = offline_after_s
        self._monotonic = monotonic
        self._last: dict[str, float] = {}  # insertion order = order of last reading

    def __len__(self) -> int:
        return len(self._last)

    def seen(self, sensor_id: str) -> bool:
        """Record a reading; True if the sensor has just come online (new or back)."""
        came_online = self._last.pop(sensor_id, None) is None
        self._last[sensor_id] = self._monotonic()
        return came_online

    def expire(self) -> list[str]:
        """The sensors without a reading for ``offline_after_s``: offline from now on."""
        limit = self._monotonic() - self.offline_after_s
        quiet: list[str] = []
        for sensor_id, last in self._last.items():
            if last > limit:
                break
            quiet.append(sensor_id)
        for sensor_id in quiet:
            del self._last[sensor_id]
        return quiet

    def adopt(self, idle_s: Mapping[str, float]) -> tuple[list[str], list[str]]:
        """Sensors known at start (restored windows), by seconds since their last reading:
        (online, offline). The recent ones are tracked as online; the others are offline now.
        The retained state of the previous run is unknown, so both are to be published."""
        now = self._monotonic()
        online: list[str] = []
        offline: list[str] = []
        for sensor_id, idle in sorted(idle_s.items(), key=lambda item: -item[1]):
            if sensor_id in self._last:
                continue
            if idle < self.offline_after_s:
                self._last[sensor_id] = now - idle
                online.append(sensor_id)
            else:
                offline.append(sensor_id)
        return online, offline

    def forget(self, sensor_ids: Iterable[str]) -> None:
        """Evicted sensors: no longer tracked (their topic is cleared by the publisher)."""
        for sensor_id in sensor_ids:
            self._last.pop(sensor_id, None)
