"""The time grid and the gap policy: the one rule shared by training and the gateway.

Readings are placed on a regular grid of ``period_seconds`` aligned to the Unix epoch: a reading
at time ``t`` belongs to period ``floor(t / period_seconds)``, and all readings of a period are
averaged. Missing periods are handled by one explicit policy:

* a gap of at most ``max_interpolated_periods`` missing periods *between two observed values* is
  filled by linear interpolation (this is causal: the gap is filled when the value after it
  arrives, so the gateway can do exactly what training does);
* a longer gap stays missing;
* a window of ``N`` periods ending at period ``t`` is valid only if period ``t`` was observed and
  none of its ``N`` values is still missing after filling;
* a sensor that has only its newest ``K < N`` periods (it started ``K`` periods ago) fills the
  ``N - K`` older positions of its window with its oldest reading (:func:`pad_history`: edge
  padding), so a model of input length ``N`` calibrates it from its first period on.

Training applies these functions to whole series; the gateway's ring buffers call
:func:`gap_fill` and :func:`window_is_valid` on each arrival, so both sides share this code.
Training pads windows truncated to ``K`` periods with :func:`pad_history` (to learn short
histories and to score them), and the gateway pads a young sensor's window with the same function.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from tesla_gateway.errors import SeriesError

__all__ = [
    "GapPolicy",
    "gap_fill",
    "interpolate_short_gaps",
    "pad_history",
    "period_index",
    "sliding_windows",
    "valid_window_ends",
    "window_is_valid",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
FloatingArray = npt.NDArray[np.floating[Any]]


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


Windows = TypeVar("Windows", bound=FloatingArray)


def pad_history(windows: Windows, history: npt.ArrayLike, *, axis: int = -1) -> Windows:
    """Copy of oldest-first windows in which only the newest ``history`` periods are real.

    ``windows`` is ``[B, ..., N, ...]`` with time on ``axis``; ``history`` gives each row's
    number of real periods (one int for all rows), clipped to ``1 .. N``. Every older position
    takes the value of the oldest real period, channel by channel (edge padding): a sensor with
    one period of history sees a constant window at its first reading. Training and the gateway
    both pad with this function, so a model learns exactly the windows it is served.
    """
    array = np.asarray(windows)
    if array.ndim < 2:
        raise SeriesError(f"expected a batch of windows [B, ..., N], got shape {array.shape}")
    timeline = np.moveaxis(array, axis, -1)  # [B, ..., N]
    batch, n = timeline.shape[0], timeline.shape[-1]
    periods = np.broadcast_to(np.asarray(history, dtype=np.int64), (batch,))
    start = n - np.clip(periods, 1, n)  # [B] position of the oldest real period
    positions = np.maximum(np.arange(n)[None, :], start[:, None])  # [B, N]
    shape = (batch,) + (1,) * (timeline.ndim - 2) + (n,)
    index = np.broadcast_to(positions.reshape(shape), timeline.shape)
    padded = np.take_along_axis(timeline, index, axis=-1)
    return np.moveaxis(padded, -1, axis)  # type: ignore[return-value]
