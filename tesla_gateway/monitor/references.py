"""Co-located reference stations: their readings on the model's grid, paired with sensor periods.

A reference station publishes readings on MQTT in the same JSON schema as the sensors (parsed
and validated by the same :class:`tesla_gateway.sources.mqtt_source.MqttSource`); its readings never
enter the windows. :class:`ReferenceGrid` averages them onto the model's grid
(:func:`tesla_gateway.contract.series.period_index`) and closes a period in event time,
when a reading of a
later period arrives, or by a wall-clock fallback. :class:`ReferencePairing` joins each closed
reference period with the closed period of every co-located sensor, whichever closes first,
and with the sensor's covariate means (rh, temp_c) of that period.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tesla_gateway.contract.calibrated import CalibratedReading
from tesla_gateway.contract.readings import COVARIATES, SENSOR_ID_PATTERN, Feature, Reading
from tesla_gateway.contract.series import period_index
from tesla_gateway.monitor.pairs import PairRow
from tesla_gateway.sources.mqtt_source import MqttSourceConfig

__all__ = ["Pair", "ReferenceConfig", "ReferenceGrid", "ReferencePairing"]


class ReferenceConfig(BaseModel):
    """``[[references]]``: one co-located reference station and the sensors beside it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=SENSOR_ID_PATTERN.pattern,
        description="Name of the reference station (stats, logs, drift messages, client id).",
    )
    feature: Feature = Field(description="Feature the reference measures (pm10, pm2_5, pm1).")
    colocated_with: list[str] = Field(
        min_length=1, description="Sensor ids installed beside this reference."
    )
    mqtt: MqttSourceConfig = Field(
        description=(
            "Where the reference publishes: topics (required; outside the sensors' filters), "
            "broker, payload limits. Every reading on these topics is the reference's; payloads "
            "follow the sensor schema (docs/mqtt.md), the value is the one named by 'feature'."
        )
    )

    @field_validator("colocated_with")
    @classmethod
    def _valid_ids(cls, value: list[str]) -> list[str]:
        for sensor_id in value:
            if not SENSOR_ID_PATTERN.fullmatch(sensor_id):
                raise ValueError(f"{sensor_id!r} must match {SENSOR_ID_PATTERN.pattern}")
        if len(set(value)) != len(value):
            raise ValueError("sensor ids must be unique")
        return value

    @model_validator(mode="after")
    def _explicit_topics(self) -> Self:
        if "topics" not in self.mqtt.model_fields_set:
            raise ValueError(
                "mqtt.topics must be given: the default ('sensors/+/raw') is the sensors' topics"
            )
        return self


@dataclass(frozen=True, slots=True)
class Pair:
    """A sensor's closed period and the reference's mean over the same period."""

    row: PairRow
    reading: CalibratedReading


class ReferenceGrid:
    """A reference's readings averaged per grid period; periods close in order."""

    def __init__(self, period_seconds: int, *, retain_periods: int) -> None:
        self.period_seconds = period_seconds
        self._retain = retain_periods
        self._open: int | None = None
        self._sum = 0.0
        self._count = 0
        self._seen: set[float] = set()
        self._last_arrival = -math.inf
        self._means: dict[int, float] = {}
        self.closed_through: int | None = None  # every period up to this one is closed
        self.accepted = 0
        self.late = 0
        self.duplicates = 0

    def add(self, timestamp: float, value: float, arrival: float) -> bool:
        """Average one reading in; True when it closed earlier periods (event time)."""
        period = period_index(timestamp, self.period_seconds)
        if (self.closed_through is not None and period <= self.closed_through) or (
            self._open is not None and period < self._open
        ):
            self.late += 1
            return False
        closed = False
        if self._open is not None and period > self._open:
            self._close(through=period - 1)
            closed = True
        elif self._open is None and (
            self.closed_through is None or period - 1 > self.closed_through
        ):
            self.closed_through = period - 1  # the periods before it passed without a reading
            closed = True
        if timestamp in self._seen:
            self.duplicates += 1
            return closed
        self._open = period
        self._seen.add(timestamp)
        self._sum += value
        self._count += 1
        self._last_arrival = arrival
        self.accepted += 1
        return closed

    def close_idle(self, now: float, grace_s: float) -> bool:
        """Wall-clock fallback: close the open period ``grace_s`` after its end/last reading."""
        if self._open is None:
            return False
        end = (self._open + 1) * self.period_seconds
        if now < max(end, self._last_arrival) + grace_s:
            return False
        self._close(through=self._open)
        return True

    def mean(self, period: int) -> float | None:
        return self._means.get(period)

    def _close(self, *, through: int) -> None:
        if self._open is not None and self._count:
            self._means[self._open] = self._sum / self._count
        self._open = None
        self._sum = 0.0
        self._count = 0
        self._seen.clear()
        self.closed_through = through
        oldest = through - self._retain
        for period in [p for p in self._means if p < oldest]:
            del self._means[period]


class ReferencePairing:
    """Pairs one reference's closed periods with its co-located sensors' closed periods."""

    def __init__(self, config: ReferenceConfig, *, max_pending_periods: int) -> None:
        self.config = config
        self.sensors = frozenset(config.colocated_with)
        self._max_pending = max_pending_periods
        self.grid: ReferenceGrid | None = None
        self._pending: dict[str, deque[tuple[int, CalibratedReading]]] = {}
        # sensor -> period -> [rh sum, rh count, temp sum, temp count]
        self._covariates: dict[str, dict[int, list[float]]] = {}
        self.paired = 0
        self.unpaired = 0  # the reference had no reading in the sensor's period
        self.expired = 0  # waited longer than max_pending_periods for the reference
        self.resets = 0

    # -- inputs -----------------------------------------------------------------------------

    def observe_covariates(self, reading: Reading, period_seconds: int) -> None:
        """Accumulate a co-located sensor's rh / temp_c into its period (O(1) per reading)."""
        values = reading.values
        if not any(name in values for name in COVARIATES):
            return
        self._ensure_grid(period_seconds)
        period = period_index(reading.timestamp, period_seconds)
        periods = self._covariates.setdefault(reading.sensor_id, {})
        sums = periods.get(period)
        if sums is None:
            if len(periods) > self._max_pending:
                del periods[min(periods)]
            sums = periods[period] = [0.0, 0.0, 0.0, 0.0]
        for index, name in enumerate(COVARIATES):
            value = values.get(name)
            if value is not None:
                sums[2 * index] += value
                sums[2 * index + 1] += 1

    def observe_reference(self, reading: Reading, period_seconds: int, now: float) -> list[Pair]:
        """A reference reading; returns the pairs completed by the periods it closed."""
        value = reading.values.get(self.config.feature)
        if value is None:
            return []
        grid = self._ensure_grid(period_seconds)
        if grid.add(reading.timestamp, value, now):
            return self._resolve()
        return []

    def observe_sensor(self, reading: CalibratedReading) -> list[Pair]:
        """A co-located sensor's closed period; paired now if the reference period is closed."""
        grid = self._ensure_grid(reading.period_seconds)
        period = round(reading.period_start / reading.period_seconds)
        queue = self._pending.setdefault(reading.sensor_id, deque())
        if len(queue) >= self._max_pending:
            queue.popleft()
            self.expired += 1
        queue.append((period, reading))
        if grid.closed_through is not None and period <= grid.closed_through:
            return self._resolve(only=reading.sensor_id)
        return []

    def close_idle(self, now: float, grace_s: float) -> list[Pair]:
        if self.grid is not None and self.grid.close_idle(now, grace_s):
            return self._resolve()
        return []

    # -- pairing ----------------------------------------------------------------------------

    def _ensure_grid(self, period_seconds: int) -> ReferenceGrid:
        grid = self.grid
        if grid is None or grid.period_seconds != period_seconds:
            if grid is not None:
                self.resets += 1  # the model's period changed: pending periods are dropped
            grid = self.grid = ReferenceGrid(period_seconds, retain_periods=self._max_pending)
            self._pending.clear()
            self._covariates.clear()
        return grid

    def _resolve(self, only: str | None = None) -> list[Pair]:
        grid = self.grid
        if grid is None or grid.closed_through is None:
            return []
        through = grid.closed_through
        pairs: list[Pair] = []
        sensors = [only] if only is not None else list(self._pending)
        for sensor_id in sensors:
            queue = self._pending.get(sensor_id)
            while queue and queue[0][0] <= through:
                period, reading = queue.popleft()
                reference = grid.mean(period)
                covariates = self._take_covariates(sensor_id, period)
                if reference is None:
                    self.unpaired += 1
                    continue
                self.paired += 1
                pairs.append(
                    Pair(
                        row=PairRow(
                            period_start=reading.period_start,
                            sensor_id=sensor_id,
                            raw=reading.raw,
                            reference=reference,
                            calibrated=reading.calibrated,
                            model_version=reading.model_version,
                            rh=covariates[0],
                            temp_c=covariates[1],
                            quality=reading.quality,
                        ),
                        reading=reading,
                    )
                )
        return pairs

    def _take_covariates(self, sensor_id: str, period: int) -> tuple[float | None, float | None]:
        periods = self._covariates.get(sensor_id)
        if not periods:
            return None, None
        sums = periods.pop(period, None)
        for older in [p for p in periods if p < period]:
            del periods[older]
        if sums is None:
            return None, None
        rh = sums[0] / sums[1] if sums[1] else None
        temp_c = sums[2] / sums[3] if sums[3] else None
        return rh, temp_c
