"""The time grid and the gap policy: the one rule shared by training and the gateway.

Readings are placed on a regular grid of ``period_seconds`` aligned to the Unix epoch: a reading
at time ``t`` belongs to period ``floor(t / period_seconds)``, and all readings of a period are
averaged. Missing periods are handled by one explicit policy:

* a gap of at most ``max_interpolated_periods`` missing periods *between two observed values* is
  filled by linear interpolation (this is causal: the gap is filled when the value after it
  arrives, so the gateway can do exactly what training does);
* a longer gap stays missing;
* a window of ``N`` periods ending at period ``t`` is valid only if period ``t`` was observed and
  none of its ``N`` values is still missing after filling.

Training applies these functions to whole series; the gateway's ring buffers call
:func:`gap_fill` and :func:`window_is_valid` on each arrival, so both sides share this code.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from tesla_gateway.errors import SeriesError

__all__ = [
    "GapPolicy",
    "gap_fill",
    "interpolate_short_gaps",
    "period_index",
    "sliding_windows",
    "valid_window_ends",
    "window_is_valid",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class GapPolicy(BaseModel):
    """How long a gap may be interpolated; travels in the manifest with the model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_interpolated_periods: int = Field(
        ge=0,
        description=(
            "Gaps of at most this many missing periods between two observed values are filled by "
            "linear interpolation; longer gaps leave the window invalid until they scroll out."
        ),
    )


def period_index(timestamp_s: float, period_seconds: int) -> int:
    """Index of the grid period holding a Unix timestamp (periods are aligned to the epoch)."""
    if period_seconds <= 0:
        raise SeriesError(f"period_seconds must be positive, got {period_seconds}")
    if not math.isfinite(timestamp_s):
        raise SeriesError(f"timestamp must be finite, got {timestamp_s}")
    return math.floor(timestamp_s / period_seconds)


def gap_fill(previous: float, following: float, missing: int) -> FloatArray:
    """Values for ``missing`` periods between two observed values: a straight line between them."""
    if missing < 0:
        raise SeriesError(f"a gap cannot have {missing} missing periods")
    steps = np.arange(1, missing + 1, dtype=np.float64) / (missing + 1)
    return previous + (following - previous) * steps


def interpolate_short_gaps(values: FloatArray, policy: GapPolicy) -> FloatArray:
    """Copy of a gridded series (NaN = missing) with the gaps the policy allows filled.

    Leading and trailing missing values have only one neighbour and stay missing.
    """
    series = np.asarray(values, dtype=np.float64)
    if series.ndim != 1:
        raise SeriesError(f"expected a 1-D series, got shape {series.shape}")
    filled = series.copy()
    observed = np.flatnonzero(~np.isnan(series))
    if observed.size < 2 or policy.max_interpolated_periods == 0:
        return filled
    missing = np.diff(observed) - 1
    for gap_index in np.flatnonzero((missing > 0) & (missing <= policy.max_interpolated_periods)):
        start = int(observed[gap_index])
        end = int(observed[gap_index + 1])
        filled[start + 1 : end] = gap_fill(series[start], series[end], end - start - 1)
    return filled


def valid_window_ends(filled: FloatArray, observed: BoolArray, window_length: int) -> BoolArray:
    """Mask over periods: True where the window of ``window_length`` ending there is valid.

    ``filled`` is the output of :func:`interpolate_short_gaps`; ``observed`` marks periods that
    had a real reading (an interpolated value is never the one being calibrated).
    """
    if window_length < 1:
        raise SeriesError(f"window_length must be at least 1, got {window_length}")
    if filled.shape != observed.shape or filled.ndim != 1:
        raise SeriesError("filled and observed must be 1-D arrays of the same length")
    missing = np.isnan(filled).astype(np.int64)
    result = np.zeros(filled.shape, dtype=np.bool_)
    if filled.size < window_length:
        return result
    missing_before = np.concatenate(([0], np.cumsum(missing)))
    missing_in_window = missing_before[window_length:] - missing_before[:-window_length]
    result[window_length - 1 :] = missing_in_window == 0
    return result & observed


def window_is_valid(window: FloatArray, newest_observed: bool) -> bool:
    """The single-window form of :func:`valid_window_ends`, used by the gateway per tick."""
    return bool(newest_observed) and not bool(np.isnan(window).any())


def sliding_windows(filled: FloatArray, window_length: int) -> FloatArray:
    """Read-only strided view of every window (no copy): row ``k`` ends at period ``k + N - 1``."""
    if filled.size < window_length:
        return np.empty((0, window_length), dtype=filled.dtype)
    return np.lib.stride_tricks.sliding_window_view(filled, window_length)
