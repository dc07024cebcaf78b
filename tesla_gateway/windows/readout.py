"""Reading closed windows out of the roll-free ring: oldest-first copies and their quality.

In the ring (:mod:`tesla_gateway.windows.ring`) period ``t`` lives at column ``t % N``, so a
window ending at period ``p`` starts at column ``(p + 1) % N``; these functions turn that layout
into the model's oldest-first input, pad a young sensor's window (fewer than ``N`` periods since
its first) by the contract's rule, and say, per window, why it is not valid.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.series import pad_history, window_is_valid
from tesla_gateway.contract.time_of_day import window_hours
from tesla_gateway.windows.state import (
    NO_PERIOD,
    BoolArray,
    Float32Array,
    FloatArray,
    IntArray,
    WaitingPeriod,
    WarmUp,
)

__all__ = [
    "batch",
    "gather_windows",
    "history_periods",
    "pad_young",
    "qualities",
    "saved_raw",
    "stacked",
    "warm_up",
    "window_quality",
    "with_hours",
]

_GATHER_CHUNK = 1024
_T = TypeVar("_T", bound=np.generic)


def gather_windows(ring: Float32Array, rows: IntArray, newest: IntArray, out: Float32Array) -> None:
    """Copy the rows' windows ending at ``newest`` [len(rows)] periods, oldest first, into
    ``out`` [len(rows), C, N] (float32); ``ring`` is [S, C, N].

    Rows whose newest period sits at the same ring position share one shift (the usual case:
    sensors close the same period together), so each group is two slice copies. Work goes in
    chunks to keep temporaries small: gathering 10,000 windows at once took 80 MB.
    """
    n = ring.shape[2]
    shifts = (newest + 1) % n
    for shift in np.unique(shifts):
        members = np.flatnonzero(shifts == shift)
        for start in range(0, members.size, _GATHER_CHUNK):
            chunk = members[start : start + _GATHER_CHUNK]
            source = ring[rows[chunk]]  # [k, C, N] float32, small
            out[chunk, :, : n - shift] = source[:, :, shift:]
            out[chunk, :, n - shift :] = source[:, :, :shift]


def batch(
    ring: Float32Array, waiting: list[WaitingPeriod], rows: IntArray, newest: IntArray
) -> Float32Array:
    """The [B, C, N] windows of the periods set aside (``waiting``, copied out already) followed
    by those of the ring's ``rows`` ending at their ``newest`` periods."""
    windows = np.empty((len(waiting) + rows.size, *ring.shape[1:]), dtype=np.float32)
    for index, item in enumerate(waiting):
        windows[index] = item.window
    gather_windows(ring, rows, newest, windows[len(waiting) :])
    return windows


def stacked(waiting: list[WaitingPeriod], name: str, pending: npt.NDArray[_T]) -> npt.NDArray[_T]:
    """One field of the periods set aside (``waiting``, oldest first) followed by the same
    field of the rows' pending periods (``pending``, of its dtype): the batch's column."""
    first = np.array([getattr(item, name) for item in waiting], dtype=pending.dtype)
    column: npt.NDArray[_T] = np.concatenate([first, pending])
    return column


def with_hours(
    windows: Float32Array, periods: IntArray, geometry: WindowGeometry, utc_offset_s: int | None
) -> Float32Array:
    """The model's [B, C, N] input from the ring's [B, C_read, N] windows ending at ``periods``:
    the read channels in their places, the hour channels derived by the contract's rule
    (:func:`window_hours`), before a young window is padded."""
    positions = geometry.hour_positions
    if positions is None:
        return windows
    full = np.empty((windows.shape[0], len(geometry.channels), windows.shape[2]), np.float32)
    full[:, list(geometry.read_positions), :] = windows
    sin, cos = window_hours(windows[:, 0, :], periods, geometry.period_seconds, utc_offset_s)
    full[:, positions[0], :] = sin
    full[:, positions[1], :] = cos
    return full


def history_periods(periods: IntArray, first: IntArray, n: int) -> IntArray:
    """Periods of real history of each window ending at ``periods``: those since the sensor's
    first observed period ``first``, at most ``N`` (``N`` when the first is unknown)."""
    known = first != NO_PERIOD
    since = np.where(known, periods - np.where(known, first, 0) + 1, n)
    return np.clip(since, 1, n).astype(np.int64)


def pad_young(
    windows: Float32Array, periods: IntArray, first: IntArray, min_history: int
) -> IntArray:
    """Each [B, C, N] window's periods of history (:func:`history_periods`); pads, in place,
    those shorter than ``N`` but at least the model's ``min_history``: their periods before the
    sensor's first take its oldest reading (the contract's rule, :func:`pad_history`), so the
    model calibrates them. Those shorter than ``min_history`` hold nothing before the first
    (NaN: warming up), whatever the ring kept there (a frozen run the sensor recovered from)."""
    n = windows.shape[2]
    history = history_periods(periods, first, n)
    short = history < n
    young = np.flatnonzero(short & (history >= min_history))
    if young.size:
        windows[young] = pad_history(windows[young], history[young])
    for row in np.flatnonzero(short & (history < min_history)).tolist():
        windows[row, :, : n - int(history[row])] = np.nan
    return history


def warm_up(
    first: IntArray, last_closed: IntArray, geometry: WindowGeometry, min_history: int
) -> WarmUp:
    """How far the sensors' windows are from whole: those with fewer than ``N`` periods, the
    fewest any has, and when the last of them will be whole (Unix s)."""
    n, period_seconds = geometry.window_length, geometry.period_seconds
    known = (first != NO_PERIOD) & (last_closed != NO_PERIOD)
    have = history_periods(last_closed[known], first[known], n)
    short = have < n
    ready = (last_closed[known][short] + (n - have[short]) + 1) * period_seconds
    return WarmUp(
        need=n,
        calibrates_from=min_history,
        sensors_short=int(short.sum()),
        fewest_periods=int(have.min()) if have.size else None,
        all_ready_at=float(ready.max()) if ready.size else None,
    )


def qualities(
    windows: Float32Array,
    periods: IntArray,
    first: IntArray,
    runs: IntArray,
    *,
    min_history: int,
    stuck_periods: int | None,
) -> tuple[tuple[Quality, ...], ...]:
    """The flags of each [B, C, N] window (empty: valid). Python runs only for the rows flagged:
    a window holding a hole gets :func:`window_quality`; an otherwise valid one whose sensor
    has observed its newest first-channel mean ``runs`` >= ``stuck_periods`` periods in a row
    is ``stuck`` (tesla_gateway/contract/stuck.py; None: never), whatever the window holds."""
    # A window's sum is NaN exactly when it holds a NaN (values are finite otherwise), and
    # summing needs no [B, C, N] boolean temporary.
    holes = np.isnan(windows.sum(axis=(1, 2)))
    flags: list[tuple[Quality, ...]] = [()] * len(periods)
    for row in np.flatnonzero(holes).tolist():
        flags[row] = window_quality(windows[row], int(periods[row]), int(first[row]), min_history)
    if stuck_periods is not None:
        for row in np.flatnonzero((runs >= stuck_periods) & ~holes).tolist():
            flags[row] = (Quality.STUCK,)
    return tuple(flags)


def window_quality(
    window: FloatArray, period: int, first_period: int, min_history: int
) -> tuple[Quality, ...]:
    """Flags for one [C, N] window, ending at ``period``, whose newest first-channel value was
    observed; ``first_period`` is the sensor's first observed period: a window with fewer
    periods since than the model's ``min_history`` is warming up."""
    if window_is_valid(window, newest_observed=True):
        return ()
    flags: list[Quality] = []
    present = ~np.isnan(window[:, -1])  # channels supplied in the closed period
    if not present.all():
        flags.append(Quality.MISSING_CHANNEL)
    n = window.shape[1]
    if period - first_period + 1 < min_history:
        flags.append(Quality.WARMING_UP)
    window_periods = np.arange(period - n + 1, period + 1)
    holes = np.isnan(window[present]).any(axis=0) & (window_periods >= first_period)
    if holes.any():
        flags.append(Quality.GAP)
    return tuple(flags) or (Quality.GAP,)


def saved_raw(ring: Float32Array, pending_period: IntArray, pending: BoolArray) -> FloatArray:
    """The pending periods' raw means after a restore (NaN where none pends): the exact mean is
    not saved, so the ring's float32 value, read back as the shortest decimal that rounds to it
    (what the sensor sent, for a mean of few digits)."""
    raw = np.full(pending.shape, np.nan)
    n = ring.shape[2]
    for row in np.flatnonzero(pending).tolist():
        raw[row] = float(str(ring[row, 0, int(pending_period[row]) % n]))
    return raw
