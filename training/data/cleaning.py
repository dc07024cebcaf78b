"""Cleaning: the same validity rules the gateway applies, with every removal counted.

A reading the gateway would reject must not be learned from, so the limits come from
``tesla_gateway.contract.readings.FIELD_LIMITS``. An invalid raw value removes its row (there is
nothing to
calibrate); an invalid reference only removes the target (the raw value still feeds windows);
an invalid covariate becomes NaN. A frozen sensor's run of identical readings is removed whole
(``raw:stuck``, the rule of ``tesla_gateway.contract.stuck``, by which the gateway withholds its
calibrated values). As in the paper, sensors that lose more than half of their readings are
dropped entirely.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import numpy.typing as npt
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from tesla_gateway.contract.readings import COVARIATES, FIELD_LIMITS, RejectReason
from tesla_gateway.contract.stuck import STUCK_PERIODS, stuck_positions
from training.data.frame import CoLocationData

__all__ = ["CleaningReport", "CleaningRules", "clean"]

MISSING = "missing"
SENTINEL = "sentinel"
DUPLICATE = "duplicate"
STUCK = "stuck"
SENSOR_DROPPED = "sensor_dropped"
_VALID = ""


class CleaningRules(BaseModel):
    """What counts as invalid beyond the gateway's field limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sentinel_values: tuple[float, ...] = Field(
        default=(-9999.0, -999.0, -99.0, 9999.0, 99999.0),
        description="Codes loggers write for 'no value'; counted apart from ordinary outliers.",
    )
    stuck_periods: int | None = Field(
        default=STUCK_PERIODS,
        ge=2,
        description=(
            "A sensor repeating one raw value exactly for this many readings in a row is frozen "
            "(a dead laser or fan): the whole run is removed. None keeps such runs."
        ),
    )
    max_removed_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "A sensor losing a larger share of its readings (raw rows dropped or references "
            "invalidated) is dropped entirely, as in the paper."
        ),
    )


@dataclass(frozen=True)
class CleaningReport:
    """How many rows and values each rule removed; keys are ``"<column>:<reason>"``.

    ``rows_dropped`` includes rows a loader removed (e.g. ``raw:warmup``), collapsed duplicates
    (``duplicate``) and the remaining rows of dropped sensors (``sensor_dropped``).
    """

    rows_read: int
    rows_kept: int
    rows_dropped: Mapping[str, int]
    values_nulled: Mapping[str, int]
    sensors_dropped: tuple[str, ...]
    removed_fraction: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


def clean(
    data: CoLocationData, rules: CleaningRules | None = None
) -> tuple[CoLocationData, CleaningReport]:
    """Apply the validity rules; return the cleaned data and what was removed and why.

    ``rows_read == rows_kept + sum(rows_dropped.values())``. The more-than-half rule looks only
    at removals made here: a loader's warm-up rows are expected, not a sign of a faulty unit.
    """
    rules = rules or CleaningRules()
    frame = data.frame
    dropped: Counter[str] = Counter()
    nulled: Counter[str] = Counter()
    if data.load_counts is not None:
        dropped.update(data.load_counts.rows_dropped)
        nulled.update(data.load_counts.values_nulled)

    raw_reason = _reasons(frame["raw"].to_numpy(), FIELD_LIMITS[data.feature], rules)
    if rules.stuck_periods is not None:
        frozen = _stuck_rows(frame, raw_reason == _VALID, rules.stuck_periods)
        raw_reason = np.where(frozen, STUCK, raw_reason)  # np.where widens the string dtype
    keep = raw_reason == _VALID
    _count(dropped, "raw", raw_reason[~keep])

    reference = frame["reference"].to_numpy(dtype=np.float64).copy()
    reference_reason = _reasons(reference, FIELD_LIMITS[data.feature], rules)
    # A reference that was never there is not a removal; one the rules reject is.
    invalid_reference = (reference_reason != _VALID) & (reference_reason != MISSING)
    _count(nulled, "reference", reference_reason[invalid_reference & keep])
    reference[invalid_reference] = np.nan

    cleaned = frame.assign(reference=reference)
    for name in COVARIATES:
        if name not in frame.columns:
            continue
        values = frame[name].to_numpy(dtype=np.float64).copy()
        reason = _reasons(values, FIELD_LIMITS[name], rules)
        invalid = (reason != _VALID) & (reason != MISSING)
        _count(nulled, name, reason[invalid & keep])
        values[invalid] = np.nan
        cleaned[name] = values

    removed = pd.Series(~keep | invalid_reference).groupby(frame["sensor_id"].to_numpy()).mean()
    removed_fraction = {str(sensor): float(share) for sensor, share in removed.items()}
    cleaned = cleaned.loc[keep]

    before = len(cleaned)
    cleaned = _collapse_duplicates(cleaned)
    if len(cleaned) < before:
        dropped[DUPLICATE] += before - len(cleaned)

    limit = rules.max_removed_fraction
    too_lossy = sorted(sensor for sensor, share in removed_fraction.items() if share > limit)
    if too_lossy:
        lost = cleaned["sensor_id"].isin(too_lossy).to_numpy()
        dropped[SENSOR_DROPPED] += int(lost.sum())
        cleaned = cleaned.loc[~lost]
    cleaned = cleaned.reset_index(drop=True)

    rows_read = data.load_counts.rows_read if data.load_counts is not None else len(frame)
    report = CleaningReport(
        rows_read=rows_read,
        rows_kept=len(cleaned),
        rows_dropped=MappingProxyType(dict(sorted(dropped.items()))),
        values_nulled=MappingProxyType(dict(sorted(nulled.items()))),
        sensors_dropped=tuple(too_lossy),
        removed_fraction=MappingProxyType(removed_fraction),
    )
    return data.with_frame(cleaned), report


def _reasons(
    values: npt.NDArray[np.float64], limits: tuple[float, float], rules: CleaningRules
) -> npt.NDArray[np.str_]:
    """Per value: why it is invalid, or the empty string; the first matching reason wins."""
    low, high = limits
    reasons = np.full(values.shape, _VALID, dtype=object)
    with np.errstate(invalid="ignore"):
        out_of_range = (values < low) | (values > high)
        negative = (values < 0) & (low >= 0)
    # Applied from the least to the most specific, so the most specific reason wins.
    reasons[out_of_range] = RejectReason.OUT_OF_RANGE.value
    reasons[negative] = RejectReason.NEGATIVE.value
    reasons[np.isin(values, rules.sentinel_values)] = SENTINEL
    reasons[np.isinf(values)] = RejectReason.NOT_FINITE.value
    reasons[np.isnan(values)] = MISSING
    return reasons.astype(str)


def _stuck_rows(
    frame: pd.DataFrame, valid: npt.NDArray[np.bool_], stuck_periods: int
) -> npt.NDArray[np.bool_]:
    """Rows inside a frozen run: per sensor, its valid readings in time order, one value per
    timestamp (duplicates averaged first, as cleaning collapses them), judged in one pass."""
    stuck = np.zeros(len(frame), dtype=np.bool_)
    rows = np.flatnonzero(valid)
    if rows.size < stuck_periods:
        return stuck
    # integer codes and nanoseconds: sorting strings and Timestamp objects took 10x the cleaning
    sensors = pd.factorize(frame["sensor_id"])[0][rows]
    times = pd.DatetimeIndex(frame["timestamp"]).asi8[rows]
    order = np.lexsort((times, sensors))
    sensors, times = sensors[order], times[order]
    raw = frame["raw"].to_numpy(dtype=np.float64)[rows][order]
    first = np.ones(rows.size, dtype=np.bool_)
    first[1:] = (sensors[1:] != sensors[:-1]) | (times[1:] != times[:-1])
    group = np.cumsum(first) - 1  # one group per (sensor, timestamp)
    means = np.bincount(group, weights=raw) / np.bincount(group)
    group_sensors = sensors[first]
    new_sensor = np.ones(means.size, dtype=np.bool_)
    new_sensor[1:] = group_sensors[1:] != group_sensors[:-1]
    frozen = stuck_positions(means, stuck_periods, starts=new_sensor)
    stuck[rows[order]] = frozen[group]
    return stuck


def _count(counter: Counter[str], column: str, reasons: npt.NDArray[np.str_]) -> None:
    names, counts = np.unique(reasons, return_counts=True)
    for name, count in zip(names, counts, strict=True):
        counter[f"{column}:{name}"] += int(count)


def _collapse_duplicates(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (sensor, timestamp): the mean of the duplicates' valid values."""
    if not frame.duplicated(["sensor_id", "timestamp"]).any():
        return frame
    collapsed = frame.groupby(["sensor_id", "timestamp"], sort=True, as_index=False).mean()
    return collapsed[list(frame.columns)]
