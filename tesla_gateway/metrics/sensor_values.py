"""The newest raw and calibrated value per (sensor, feature), for the opt-in per-sensor gauges.

Filled from what each tick hands the publisher and emptied of a sensor when admission evicts
it, so it never holds more than ``max_sensors`` sensors (times the configured features) and an
evicted sensor's series vanish at the next scrape. Only the daemon's ``[metrics]
sensor_gauges = true`` keeps one; nothing here needs prometheus_client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from tesla_gateway.contract.calibrated import CalibratedReading, published_value

__all__ = ["LatestValues", "SensorValue"]


class SensorValue(NamedTuple):
    """One (sensor, feature)'s newest period as published."""

    period_start: float  # Unix seconds
    raw: float  # the period's mean raw reading, µg/m³
    calibrated: float | None  # None when the period was published without a calibration
    model: str | None  # the model that calibrated it (None without one)


class LatestValues:
    """Per (sensor id, feature), the newest period handed to the publisher."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], SensorValue] = {}

    def record(self, readings: Iterable[CalibratedReading]) -> None:
        """Keep each reading unless a newer period of its (sensor, feature) is already kept."""
        values = self._values
        for reading in readings:
            key = (reading.sensor_id, reading.feature)
            kept = values.get(key)
            if kept is None or reading.period_start >= kept.period_start:
                calibrated = reading.calibrated
                values[key] = SensorValue(  # the values as published: to 0.1 µg/m³
                    reading.period_start,
                    published_value(reading.raw),
                    None if calibrated is None else published_value(calibrated),
                    reading.model_name,
                )

    def forget(self, sensor_ids: Iterable[str]) -> None:
        """Evicted sensors: their values go (and with them their series)."""
        gone = set(sensor_ids)
        if gone:
            self._values = {key: v for key, v in self._values.items() if key[0] not in gone}

    def values(self) -> Mapping[tuple[str, str], SensorValue]:
        return self._values

    def __len__(self) -> int:
        return len(self._values)
