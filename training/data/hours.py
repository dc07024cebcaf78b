"""The hour-of-day channels of training windows, by the contract's rule
(:func:`tesla_gateway.contract.time_of_day.window_hours`, which the gateway and the node apply
too), and windows with the hour withheld as for a node without a clock.

Training calls the contract's rule on each gathered window with its sensor's standard offset at
the window's newest period (the gateway's offset at the tick that closes it), so a window holds
exactly the hour the gateway would put beside its readings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.time_of_day import neutral_hours, standard_offset_seconds

__all__ = ["standard_offsets", "withhold_hour"]


def standard_offsets(zone: str, period_starts: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The zone's standard UTC offset (s) at each period start (Unix seconds): the contract's
    rule is one offset per UTC year, so each year present is asked once."""
    starts = np.asarray(period_starts, dtype=np.float64)
    years = starts.astype("datetime64[s]").astype("datetime64[Y]")
    distinct, inverse = np.unique(years, return_inverse=True)
    offsets = np.fromiter(
        (
            standard_offset_seconds(zone, float(year.astype("datetime64[s]").astype(np.int64)))
            for year in distinct
        ),
        dtype=np.int64,
        count=distinct.size,
    )
    return offsets[inverse.reshape(-1)]


def withhold_hour(
    x: npt.NDArray[np.float32],
    channels: Sequence[str],
    which: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.float32]:
    """Windows ``x`` ``[B, N, C]`` with the hour channels of the ``which`` windows (default: all)
    set to UNKNOWN_HOUR over the whole window (the contract's ``neutral_hours``); a copy."""
    out = np.array(x, dtype=np.float32, copy=True)
    rows = np.ones(len(out), dtype=np.bool_) if which is None else np.asarray(which, np.bool_)
    chosen = out[rows]
    neutral_hours(chosen, tuple(channels))
    out[rows] = chosen
    return out
