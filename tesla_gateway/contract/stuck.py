"""A frozen sensor: the same period mean, exactly, for many periods in a row.

A PMS5003 whose laser or fan died, or whose firmware froze, repeats one value: Antwerp_4043AE
read exactly 0.0 µg/m³ for 814 hours (2020-08-27 to 09-30) while the reference beside it saw
ordinary air (mean 10.2). A live sensor's period mean, an average over a changing aerosol, does
not repeat exactly for ``STUCK_PERIODS`` periods (no run of even 10 occurs in any other unit of
the shared data). Such a window holds no information, and the model's answer to it is a constant
(the committed Antwerp model said 10.48 µg/m³ to every all-zero window), so:

* the gateway counts, per sensor, the run of equal first-channel period means it has observed
  (:func:`next_run`, kept beside the window and saved with it) and withholds the calibrated value
  of every period whose run is at least ``stuck_periods`` long (quality ``stuck``), however
  long or young the model's window; when a new value ends such a run (:func:`ends_frozen_run`)
  the sensor starts anew, like a new one, so the frozen values feed no window (training never
  sees them either);
* training drops every reading of such a run (:func:`stuck_positions`, reason ``raw:stuck``):
  in hindsight the whole run is known to be dead, its first periods included.

Both sides count the same thing: consecutive period means of one sensor that are equal to
4 decimals (:func:`run_key`, the pairs files' precision: a mean of 2 and of 3 readings of 12.3
differ in the last bit, and must not end the run). Missing
periods do not break a run (a dead sensor with dropouts is still dead); a missing value (NaN)
does. Air so clean that a sensor reads exactly 0 for ``STUCK_PERIODS`` periods looks the same;
an operator who has it raises ``health.stuck_periods`` or turns ``health.withhold_stuck`` off.
"""

from __future__ import annotations

import math
from typing import overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "RUN_CAP",
    "RUN_DECIMALS",
    "STUCK_PERIODS",
    "ends_frozen_run",
    "next_run",
    "run_ids",
    "run_key",
    "run_lengths",
    "stuck_positions",
]

STUCK_PERIODS = 30
RUN_DECIMALS = 4  # equal means: equal to this many decimals (the pairs files' raw column)
_SCALE = 10.0**RUN_DECIMALS
RUN_CAP = 2**31  # a run counts no further (int64 arithmetic never overflows; 4,000 years of 1 min)

BoolArray = npt.NDArray[np.bool_]


@overload
def run_key(value: float) -> float: ...


@overload
def run_key(value: npt.ArrayLike) -> npt.NDArray[np.float64]: ...


def run_key(value: float | npt.ArrayLike) -> float | npt.NDArray[np.float64]:
    """What two period means must share to continue a run: the mean rounded to
    :data:`RUN_DECIMALS` decimals, half to even (``x * 10^d``, rounded, ``/ 10^d``: NumPy's
    own rounding), in plain Python for a scalar (each closed period of the ring: NumPy took
    10 µs there) and vectorised for an array, the two bit for bit alike; NaN stays NaN, and a
    value too large to scale (over ~1e304: it overflowed to inf, making distinct values one run)
    is kept as it is."""
    if isinstance(value, float | int):
        scaled = float(value) * _SCALE
        return round(scaled) / _SCALE if math.isfinite(scaled) else float(value)
    values = np.asarray(value, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled_values = values * _SCALE
        rounded = np.rint(scaled_values) / _SCALE
    return np.asarray(np.where(np.isfinite(scaled_values), rounded, values), dtype=np.float64)


def run_lengths(values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Per position of a 1-D series (oldest first): the length of the run of equal values
    (:func:`run_key`) that ends there (1 where the value differs from the previous one, 0 for
    NaN)."""
    present, same = _continues(values)
    # A run restarts wherever the value changes: count positions since the last restart.
    index = np.arange(same.size, dtype=np.int64)
    starts = np.where(same, 0, index)
    lengths = index - np.maximum.accumulate(starts) + 1 if same.size else index
    return np.where(present, lengths, 0).astype(np.int64)


def next_run(previous_value: float, previous_run: int, value: float) -> int:
    """The run ending at a newly observed period mean ``value``, after a run of ``previous_run``
    periods of ``previous_value``: one more when equal (:func:`run_key`; never above
    :data:`RUN_CAP`), 1 when it differs, 0 for NaN (the online form of :func:`run_lengths`; a
    period with no mean at all is not observed and changes nothing)."""
    if math.isnan(value):
        return 0
    if run_key(value) != run_key(previous_value):
        return 1
    return min(previous_run + 1, RUN_CAP)


def ends_frozen_run(previous_run: int, run: int, stuck_periods: int | None) -> bool:
    """Did a newly observed period end a frozen run (a new value after ``stuck_periods`` or
    more equal ones; None: no rule)? From it the sensor is young again, like a new one."""
    return stuck_periods is not None and run <= 1 and previous_run >= stuck_periods


def run_ids(values: npt.ArrayLike, *, starts: npt.ArrayLike | None = None) -> npt.NDArray[np.int64]:
    """Per position of a 1-D series (oldest first): the id of its run of equal values
    (:func:`run_key`; ids rise along the series, a NaN is a run of its own). ``starts`` marks
    positions where a new sensor's series begins (a run never continues across one), so many
    sensors' series laid end to end are grouped in one pass."""
    _, same = _continues(values)
    if starts is not None:
        same &= ~np.asarray(starts, dtype=np.bool_)
    ids: npt.NDArray[np.int64] = np.cumsum(~same, dtype=np.int64)
    return ids


def stuck_positions(
    values: npt.ArrayLike,
    stuck_periods: int = STUCK_PERIODS,
    *,
    starts: npt.ArrayLike | None = None,
) -> BoolArray:
    """Mask of every position of a 1-D series (oldest first) inside a run of at least
    ``stuck_periods`` equal values (:func:`run_ids`, ``starts`` as there): the whole run, seen in
    hindsight."""
    if stuck_periods < 2:
        raise ValueError(f"stuck_periods must be at least 2, got {stuck_periods}")
    run = run_ids(values, starts=starts)
    length = np.bincount(run)[run]
    mask: BoolArray = (length >= stuck_periods) & ~np.isnan(run_key(values))
    return mask


def _continues(values: npt.ArrayLike) -> tuple[BoolArray, BoolArray]:
    """Per position of a 1-D series: is its value present, and does it continue the previous
    position's run (equal by :func:`run_key`, both present)?"""
    series = run_key(values)
    if series.ndim != 1:
        raise ValueError(f"expected a 1-D series, got shape {series.shape}")
    present: BoolArray = ~np.isnan(series)
    same = np.zeros(series.shape, dtype=np.bool_)
    same[1:] = (series[1:] == series[:-1]) & present[1:]
    return present, same
