"""Reading closed windows out of the roll-free ring: oldest-first copies and their quality.

In the ring (:mod:`tesla_gateway.windows.ring`) period ``t`` lives at column ``t % N``, so a
window ending at period ``p`` starts at column ``(p + 1) % N``; these functions turn that layout
into the model's oldest-first input and say, per window, why it is not valid.
"""

from __future__ import annotations

import numpy as np

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.series import window_is_valid
from tesla_gateway.windows.state import Float32Array, FloatArray, IntArray

__all__ = ["gather_windows", "window_quality"]

_GATHER_CHUNK = 1024


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


def window_quality(window: FloatArray, period: int, first_period: int) -> tuple[Quality, ...]:
    """Flags for one [C, N] window, ending at ``period``, whose newest first-channel value was
    observed; ``first_period`` is the sensor's first observed period (for warm-up)."""
    if window_is_valid(window, newest_observed=True):
        return ()
    n = window.shape[1]
    flags: list[Quality] = []
    present = ~np.isnan(window[:, -1])  # channels supplied in the closed period
    if not present.all():
        flags.append(Quality.MISSING_CHANNEL)
    if period - first_period + 1 < n:
        flags.append(Quality.WARMING_UP)
    window_periods = np.arange(period - n + 1, period + 1)
    holes = np.isnan(window[present]).any(axis=0) & (window_periods >= first_period)
    if holes.any():
        flags.append(Quality.GAP)
    return tuple(flags) or (Quality.GAP,)
