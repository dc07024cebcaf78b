"""Gridding: each sensor's readings on the epoch-aligned period grid the gateway uses.

Placement follows ``tesla_gateway.contract.series.period_index`` and readings of one period are
averaged, so a
window built here holds the same values the gateway's ring buffer would hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.series import period_index
from training.data.frame import CoLocationData, unix_seconds

__all__ = ["GriddedSensor", "to_grid"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class GriddedSensor:
    """One sensor's series on the grid; NaN marks a period without a (valid) value."""

    sensor_id: str
    first_period: int
    period_seconds: int
    raw: FloatArray
    reference: FloatArray
    observed: BoolArray  # True where at least one raw reading fell in the period
    covariates: Mapping[str, FloatArray] = field(default_factory=lambda: MappingProxyType({}))
    zone: str = "UTC"  # the site's IANA zone: its standard offset places the hour channels

    def __len__(self) -> int:
        return int(self.raw.size)

    @property
    def timestamps(self) -> npt.NDArray[np.int64]:
        """Start of each period, Unix seconds."""
        periods = self.first_period + np.arange(self.raw.size, dtype=np.int64)
        return periods * self.period_seconds

    def channel(self, name: str) -> FloatArray:
        """A series by channel name: ``raw``, ``reference`` or a covariate (the hour channels
        are derived per window, training/data/windows.py)."""
        if name == "raw":
            return self.raw
        if name == "reference":
            return self.reference
        if name in self.covariates:
            return self.covariates[name]
        known = ["raw", "reference", *self.covariates]
        raise KeyError(f"sensor {self.sensor_id} has no channel {name!r}; it has {known}")


def to_grid(data: CoLocationData) -> dict[str, GriddedSensor]:
    """Grid every sensor of the (cleaned) data, keyed and ordered by sensor id."""
    frame = data.frame
    period = data.period_seconds
    seconds = unix_seconds(frame["timestamp"])
    unique_seconds, inverse = np.unique(seconds, return_inverse=True)
    unique_periods = np.fromiter(
        (period_index(float(t), period) for t in unique_seconds),
        dtype=np.int64,
        count=unique_seconds.size,
    )
    periods = unique_periods[inverse]
    sensor_ids = frame["sensor_id"].to_numpy(dtype=str)
    raw_all = frame["raw"].to_numpy(dtype=np.float64)
    reference_all = frame["reference"].to_numpy(dtype=np.float64)
    covariates_all = {name: frame[name].to_numpy(dtype=np.float64) for name in data.covariates}
    grids: dict[str, GriddedSensor] = {}
    for sensor in sorted({str(value) for value in sensor_ids}):
        rows = np.flatnonzero(sensor_ids == sensor)
        first = int(periods[rows].min())
        slot = periods[rows] - first
        length = int(slot.max()) + 1
        raw = raw_all[rows]
        grids[sensor] = GriddedSensor(
            sensor_id=sensor,
            first_period=first,
            period_seconds=period,
            raw=_period_means(slot, raw, length),
            reference=_period_means(slot, reference_all[rows], length),
            observed=np.bincount(slot, weights=~np.isnan(raw), minlength=length) > 0,
            covariates=MappingProxyType(
                {
                    name: _period_means(slot, values[rows], length)
                    for name, values in covariates_all.items()
                }
            ),
            zone=data.zone,
        )
    return grids


def _period_means(slot: npt.NDArray[np.int64], values: FloatArray, length: int) -> FloatArray:
    """Mean of the non-NaN values falling in each slot; NaN where there are none."""
    present = ~np.isnan(values)
    totals = np.bincount(slot, weights=np.where(present, values, 0.0), minlength=length)
    counts = np.bincount(slot, weights=present, minlength=length)
    means = np.full(length, np.nan)
    np.divide(totals, counts, out=means, where=counts > 0)
    return means
