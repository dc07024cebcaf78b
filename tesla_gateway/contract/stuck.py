"""A frozen sensor: the same period mean, exactly, for many periods in a row.

A PMS5003 whose laser or fan died, or whose firmware froze, repeats one value: Antwerp_4043AE
read exactly 0.0 µg/m³ for 814 hours (2020-08-27 to 09-30) while the reference beside it saw
ordinary air (mean 10.2). A live sensor's period mean, an average over a changing aerosol, does
not repeat exactly for ``STUCK_PERIODS`` periods (no run of even 10 occurs in any other unit of
the shared data). Such a window holds no information, and the model's answer to it is a constant
(the committed Antwerp model said 10.48 µg/m³ to every all-zero window), so:

* the gateway withholds the calibrated value of a window whose newest ``stuck_periods`` values
  of the first channel are identical (quality ``stuck``; :func:`stuck_windows`);
* training drops every reading of such a run (:func:`stuck_positions`, reason ``raw:stuck``):
  in hindsight the whole run is known to be dead, its first periods included.

Both sides count the same thing: consecutive period means of one sensor that are equal. Missing
periods do not break a run (a dead sensor with dropouts is still dead); a missing value (NaN)
does. Air so clean that a sensor reads exactly 0 for ``STUCK_PERIODS`` periods looks the same;
an operator who has it raises ``health.stuck_periods`` or turns ``health.withhold_stuck`` off.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["STUCK_PERIODS", "run_lengths", "stuck_positions", "stuck_windows"]

STUCK_PERIODS = 30

BoolArray = npt.NDArray[np.bool_]


def run_lengths(values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Per position of a 1-D series (oldest first): the length of the run of equal values that
    ends there (1 where the value differs from the previous one, 0 for NaN)."""
    series = np.asarray(values, dtype=np.float64)
    if series.ndim != 1:
        raise ValueError(f"expected a 1-D series, got shape {series.shape}")
    present = ~np.isnan(series)
    same = np.zeros(series.shape, dtype=np.bool_)
    same[1:] = (series[1:] == series[:-1]) & present[1:]
    # A run restarts wherever the value changes: count positions since the last restart.
    index = np.arange(series.size, dtype=np.int64)
    starts = np.where(same, 0, index)
    lengths = index - np.maximum.accumulate(starts) + 1 if series.size else index
    return np.where(present, lengths, 0).astype(np.int64)


def stuck_positions(values: npt.ArrayLike, stuck_periods: int = STUCK_PERIODS) -> BoolArray:
    """Mask of every position of a 1-D series (one sensor, oldest first) inside a run of at least
    ``stuck_periods`` equal values: the whole run, seen in hindsight."""
    if stuck_periods < 2:
        raise ValueError(f"stuck_periods must be at least 2, got {stuck_periods}")
    lengths = run_lengths(values)
    mask = np.zeros(lengths.shape, dtype=np.bool_)
    # A run's last position holds its length; mark back from there.
    ends = np.flatnonzero((lengths >= stuck_periods) & np.append(lengths[1:] <= lengths[:-1], True))
    for end in ends.tolist():
        mask[end - int(lengths[end]) + 1 : end + 1] = True
    return mask


def stuck_windows(
    windows: npt.ArrayLike, history: npt.ArrayLike, stuck_periods: int = STUCK_PERIODS
) -> BoolArray:
    """Per oldest-first window ``[B, N]`` (the first channel) with ``history`` [B] periods of real
    history: are its newest ``stuck_periods`` values all equal? A window with less real history
    than that never is (a young window's older part is padding, equal by construction)."""
    if stuck_periods < 2:
        raise ValueError(f"stuck_periods must be at least 2, got {stuck_periods}")
    array = np.asarray(windows)
    if array.ndim != 2:
        raise ValueError(f"expected windows [B, N], got shape {array.shape}")
    if stuck_periods > array.shape[1]:
        return np.zeros(array.shape[0], dtype=np.bool_)
    recent = array[:, -stuck_periods:]
    equal: BoolArray = np.all(recent == recent[:, -1:], axis=1)
    long_enough: BoolArray = np.asarray(history) >= stuck_periods
    return equal & long_enough
