"""The windows of every model, keyed by model slot, and the gate a reading may wait at.

One :class:`tesla_gateway.windows.ring.ModelWindows` per model slot; a reading goes to each.
The daemon puts its clock sanity (:mod:`tesla_gateway.ingest.clock_sanity`) in front as a
:class:`ReadingGate`: the store knows only that protocol, so ingest depends on the windows and
never the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.windows.outcome import AddOutcome
from tesla_gateway.windows.ring import ModelWindows

__all__ = ["ReadingGate", "WindowStore"]


class ReadingGate(Protocol):
    """What may hold a reading back from the windows (the daemon's clock sanity)."""

    def add(
        self, models: Mapping[str, ModelWindows], reading: Reading, arrival: float
    ) -> dict[str, AddOutcome]:
        """Feed one reading to every model's windows, or hold it; the outcome per feature."""
        ...

    def release_due(self, models: Mapping[str, ModelWindows], now: float) -> int:
        """Add the held readings that may now go in; how many."""
        ...

    def forget_feature(self, feature: str) -> None:
        """The feature's windows were replaced or dropped."""
        ...

    def forget_sensors(self, sensor_ids: Iterable[str]) -> None:
        """These sensors' windows were evicted."""
        ...

    def clock_stepped(self, step_s: float) -> None:
        """The gateway clock stepped by ``step_s`` seconds (the held readings' arrivals)."""
        ...


class WindowStore:
    """The windows of every model, keyed by model slot (the feature, when it has one model).

    With a ``clock_sanity`` (the daemon's), readings ahead of the gateway clock wait for the
    sensor's next reading before they may move a window (:mod:`tesla_gateway.ingest.clock_sanity`);
    without one (replays, tests of the ring itself) every reading goes straight in.
    """

    def __init__(self, clock_sanity: ReadingGate | None = None) -> None:
        self._models: dict[str, ModelWindows] = {}
        self._sanity = clock_sanity

    def ensure(self, feature: str, geometry: WindowGeometry) -> bool:
        """Create or keep the feature's windows; reset them if the geometry changed.

        Returns True when the windows were (re)created, so the caller can log a reset. The
        new windows keep the old ones' frozen-sensor runs: a sensor frozen before a model swap
        is frozen after it.
        """
        current = self._models.get(feature)
        if current is not None and current.geometry.same_ring(geometry):
            current.geometry = geometry  # a model adding or dropping the hour: same ring
            return False
        self._models[feature] = ModelWindows(geometry)
        if current is not None:
            self._models[feature].carry_runs(current)
        if self._sanity is not None:
            self._sanity.forget_feature(feature)
        return True

    def install(self, feature: str, windows: ModelWindows) -> None:
        """Adopt restored windows."""
        self._models[feature] = windows
        if self._sanity is not None:
            self._sanity.forget_feature(feature)

    def drop(self, feature: str) -> None:
        self._models.pop(feature, None)
        if self._sanity is not None:
            self._sanity.forget_feature(feature)

    def remove_sensors(self, sensor_ids: Iterable[str]) -> int:
        """Forget these sensors' windows in every model; how many windows went."""
        sensor_ids = list(sensor_ids)
        if self._sanity is not None:
            self._sanity.forget_sensors(sensor_ids)
        return sum(
            model.remove(sensor_id) for sensor_id in sensor_ids for model in self._models.values()
        )

    def last_seen(self) -> dict[str, float]:
        """Per sensor, the end of the newest period it had a reading in, over every model."""
        merged: dict[str, float] = {}
        for model in self._models.values():
            for sensor_id, end in model.last_seen().items():
                if end > merged.get(sensor_id, -math.inf):
                    merged[sensor_id] = end
        return merged

    def add(self, reading: Reading, arrival: float) -> dict[str, AddOutcome]:
        """Feed one reading to every model; the outcome per feature."""
        if self._sanity is not None:
            return self._sanity.add(self._models, reading, arrival)
        return {feature: model.add(reading, arrival) for feature, model in self._models.items()}

    def clock_stepped(self, step_s: float) -> int:
        """The gateway clock stepped: every model re-anchors what that clock set
        (:meth:`ModelWindows.clock_stepped`); how many sensor windows moved, over models."""
        if self._sanity is not None:
            self._sanity.clock_stepped(step_s)
        return sum(model.clock_stepped(step_s) for model in self._models.values())

    def close_idle(self, now: float, grace_s: float) -> int:
        if self._sanity is not None:
            self._sanity.release_due(self._models, now)
        return sum(model.close_idle(now, grace_s) for model in self._models.values())

    @property
    def pending_count(self) -> int:
        return sum(model.pending_count for model in self._models.values())

    def __getitem__(self, feature: str) -> ModelWindows:
        return self._models[feature]

    def __contains__(self, feature: object) -> bool:
        return feature in self._models

    def items(self) -> Iterable[tuple[str, ModelWindows]]:
        return list(self._models.items())

    def features(self) -> Sequence[str]:
        return list(self._models)

    def counts(self) -> Mapping[str, Mapping[str, int]]:
        """Outcome counters per feature, for the stats topic and the status file."""
        return {
            feature: {outcome.value: count for outcome, count in model.counts.items()}
            for feature, model in self._models.items()
        }
