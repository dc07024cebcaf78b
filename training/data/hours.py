"""The hour-of-day input channels of a sensor's series, by the contract's rule
(tesla_gateway/contract/time_of_day.py), and windows with the hour withheld.

The hour is derived only for periods that hold a raw reading and is NaN elsewhere, so the gap
policy fills it exactly as it fills the readings: the gateway derives the hour for each period a
reading lands in, then gap-fills it like any channel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.time_of_day import (
    HOUR_CHANNELS,
    UNKNOWN_HOUR,
    hour_channels,
    is_hour_channel,
    standard_offset_seconds,
)

__all__ = ["hour_series", "standard_offsets", "withhold_hour"]

FloatArray = npt.NDArray[np.float64]
# Zones change their standard offset at whole quarter hours (offsets are multiples of 15 min):
# evaluating the zone once per quarter hour gives every period's offset at a fraction of the cost.
_OFFSET_STEP_S = 900


def standard_offsets(zone: str, period_starts: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The zone's standard UTC offset (s) at each period start (Unix seconds)."""
    starts = np.asarray(period_starts, dtype=np.float64)
    steps, inverse = np.unique(np.floor_divide(starts, _OFFSET_STEP_S), return_inverse=True)
    offsets = np.fromiter(
        (standard_offset_seconds(zone, float(step) * _OFFSET_STEP_S) for step in steps),
        dtype=np.int64,
        count=steps.size,
    )
    return offsets[inverse.reshape(-1)]


def hour_series(
    name: str, period_starts: npt.ArrayLike, observed: npt.ArrayLike, zone: str
) -> FloatArray:
    """Channel ``name`` (``hour_sin`` or ``hour_cos``) at each period start; NaN where the raw
    reading is missing (``observed`` False)."""
    if not is_hour_channel(name):
        raise ValueError(f"{name!r} is not an hour channel; they are {HOUR_CHANNELS}")
    starts = np.asarray(period_starts, dtype=np.float64)
    present = np.asarray(observed, dtype=np.bool_)
    offsets = standard_offsets(zone, starts)
    values = np.full(starts.size, np.nan)
    column = HOUR_CHANNELS.index(name)
    for offset in np.unique(offsets):
        rows = present & (offsets == offset)
        values[rows] = hour_channels(starts[rows], int(offset))[column]
    return values


def withhold_hour(
    x: npt.NDArray[np.float32],
    channels: Sequence[str],
    which: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.float32]:
    """Windows ``x`` ``[B, N, C]`` with the hour channels of the ``which`` windows (default: all)
    set to :data:`UNKNOWN_HOUR` over the whole window, as for a node without a clock (a copy)."""
    out = np.array(x, dtype=np.float32, copy=True)
    rows = np.ones(len(out), dtype=np.bool_) if which is None else np.asarray(which, np.bool_)
    for name, value in zip(HOUR_CHANNELS, UNKNOWN_HOUR, strict=True):
        if name in channels:
            out[rows, :, list(channels).index(name)] = value
    return out
