"""Training windows without materialising them: filled series plus an index of valid window ends.

Each sensor's channels are gap-filled once with the gateway's policy; a window is then just a
``(sensor, end)`` pair, and only the windows of a requested batch are copied out of strided views.
Memory therefore grows with the length of the series, not with N times the number of windows
(the authors' code needs 2.5 GB for 56 k windows; this needs a few MB). The hour channels
(``hour_sin``, ``hour_cos``) are not stored: each gathered window gets them from the contract's
rule (``window_hours``) with its sensor's standard offset at its newest period.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from tesla_gateway.contract.series import (
    GapPolicy,
    interpolate_short_gaps,
    sliding_windows,
    valid_window_ends,
)
from tesla_gateway.contract.time_of_day import HOUR_CHANNELS, is_hour_channel, window_hours
from training.data.grid import GriddedSensor
from training.data.hours import standard_offsets
from training.errors import DataError

__all__ = ["WindowSet"]

IndexArray = npt.NDArray[np.int64]
Float32Array = npt.NDArray[np.float32]


class WindowSet:
    """Every valid window of some sensors, addressable by a flat index ``0 … len - 1``.

    Windows are ordered by sensor (in the order given) and then by end period. ``x`` is oldest
    first, shape ``[B, N]`` for one channel or ``[B, N, C]`` for several; ``y`` is the reference
    at the window's newest period.
    """

    __slots__ = (
        "_current_raw",
        "_end",
        "_filled",
        "_first_periods",
        "_offsets",
        "_period_seconds",
        "_sensor",
        "_sensor_ids",
        "_targets",
        "channels",
        "window_length",
    )

    def __init__(
        self,
        *,
        window_length: int,
        channels: tuple[str, ...],
        sensor_ids: tuple[str, ...],
        period_seconds: tuple[int, ...],
        first_periods: tuple[int, ...],
        filled: tuple[npt.NDArray[np.float64], ...],
        sensor: npt.NDArray[np.int32],
        end: IndexArray,
        targets: Float32Array,
        current_raw: Float32Array,
        offsets: IndexArray | None = None,
    ) -> None:
        self.window_length = window_length
        self.channels = channels
        self._sensor_ids = sensor_ids
        self._period_seconds = period_seconds
        self._first_periods = first_periods
        self._filled = filled  # per sensor: [R, T] gap-filled read (non-hour) channels
        self._sensor = sensor  # per window: position of its sensor in _sensor_ids
        self._end = end  # per window: grid position of its newest period
        self._targets = targets
        self._current_raw = current_raw
        # per window: its sensor's standard UTC offset (s) at its newest period (hour channels)
        self._offsets = np.zeros(end.size, np.int64) if offsets is None else offsets

    @classmethod
    def build(
        cls,
        sensors: Sequence[GriddedSensor],
        window_length: int,
        policy: GapPolicy,
        channels: Sequence[str] = ("raw",),
        require_target: bool = True,
    ) -> WindowSet:
        """Fill short gaps per channel and index every window the gap rule accepts.

        A window is valid only if it is valid for every channel; with ``require_target`` the
        reference at its newest period must also exist (windows without one cannot be scored).
        """
        if window_length < 1:
            raise DataError(f"window_length must be at least 1, got {window_length}")
        channel_names = tuple(channels)
        if not channel_names or len(set(channel_names)) != len(channel_names):
            raise DataError(f"channels must be distinct and non-empty, got {channel_names}")
        if "reference" in channel_names:
            raise DataError("the reference is the target; it cannot be an input channel")
        hours = tuple(name for name in channel_names if is_hour_channel(name))
        if hours and (len(hours) != len(HOUR_CHANNELS) or "raw" not in channel_names):
            raise DataError(
                f"the hour channels {HOUR_CHANNELS} go together and beside 'raw' (they are "
                f"derived where the reading is), got {channel_names}"
            )
        read = tuple(name for name in channel_names if not is_hour_channel(name))
        ids = [sensor.sensor_id for sensor in sensors]
        if len(set(ids)) != len(ids):
            raise DataError(f"each sensor may appear once, got {ids}")

        filled: list[npt.NDArray[np.float64]] = []
        sensor_parts: list[npt.NDArray[np.int32]] = []
        end_parts: list[IndexArray] = []
        target_parts: list[Float32Array] = []
        raw_parts: list[Float32Array] = []
        offset_parts: list[IndexArray] = []
        for position, sensor in enumerate(sensors):
            series = np.empty((len(read), len(sensor)), dtype=np.float64)
            valid = np.ones(len(sensor), dtype=np.bool_)
            for row, name in enumerate(read):
                values = _channel(sensor, name)
                observed = sensor.observed if name == "raw" else ~np.isnan(values)
                series[row] = interpolate_short_gaps(values, policy)
                valid &= valid_window_ends(series[row], observed, window_length)
            if require_target:
                valid &= ~np.isnan(sensor.reference)
            ends = np.flatnonzero(valid).astype(np.int64)
            filled.append(series)
            sensor_parts.append(np.full(ends.size, position, dtype=np.int32))
            end_parts.append(ends)
            target_parts.append(sensor.reference[ends].astype(np.float32))
            raw_parts.append(sensor.raw[ends].astype(np.float32))
            newest_starts = (sensor.first_period + ends) * sensor.period_seconds
            offset_parts.append(
                standard_offsets(sensor.zone, newest_starts) if hours else np.zeros_like(ends)
            )
        return cls(
            window_length=window_length,
            channels=channel_names,
            sensor_ids=tuple(ids),
            period_seconds=tuple(sensor.period_seconds for sensor in sensors),
            first_periods=tuple(sensor.first_period for sensor in sensors),
            filled=tuple(filled),
            sensor=_concat(sensor_parts, np.int32),
            end=_concat(end_parts, np.int64),
            targets=_concat(target_parts, np.float32),
            current_raw=_concat(raw_parts, np.float32),
            offsets=_concat(offset_parts, np.int64),
        )

    def __len__(self) -> int:
        return int(self._end.size)

    @property
    def sensor_ids(self) -> tuple[str, ...]:
        """The sensors the windows come from, in build order."""
        return self._sensor_ids

    @property
    def nbytes(self) -> int:
        """Bytes held: the filled series plus the per-window index (no window copies)."""
        series = sum(array.nbytes for array in self._filled)
        index = self._sensor.nbytes + self._end.nbytes + self._offsets.nbytes
        return series + index + self._targets.nbytes + self._current_raw.nbytes

    def gather(self, indices: npt.ArrayLike) -> tuple[Float32Array, Float32Array]:
        """Copy out windows ``indices``: ``x`` [B, N] (or [B, N, C]) and ``y`` [B], float32."""
        picked = np.asarray(indices, dtype=np.int64).reshape(-1)
        if picked.size and (picked.min() < 0 or picked.max() >= len(self)):
            raise IndexError(f"window indices must lie in [0, {len(self)}), got {picked}")
        count = picked.size
        N = self.window_length
        C = len(self.channels)
        x = np.empty((count, N, C), dtype=np.float32)  # [B, N, C]
        sensors = self._sensor[picked]
        starts = self._end[picked] - (N - 1)
        read = [c for c, name in enumerate(self.channels) if not is_hour_channel(name)]
        for position in np.unique(sensors):
            rows = sensors == position
            for row, channel in enumerate(read):
                views = sliding_windows(self._filled[position][row], N)  # [T - N + 1, N]
                x[rows, :, channel] = views[starts[rows]]
        if len(read) < C:
            pm = x[:, :, self.channels.index("raw")]
            sin, cos = self._hours(picked, pm)
            x[:, :, self.channels.index(HOUR_CHANNELS[0])] = sin
            x[:, :, self.channels.index(HOUR_CHANNELS[1])] = cos
        y = self._targets[picked].copy()  # [B]
        if C == 1:
            return np.ascontiguousarray(x[:, :, 0]), y  # [B, N]
        return x, y

    def iter_batches(
        self, batch_size: int, *, shuffle: bool, seed: int
    ) -> Iterator[tuple[Float32Array, Float32Array]]:
        """Batches covering every window once; the order is reproducible from ``seed``."""
        if batch_size < 1:
            raise DataError(f"batch_size must be at least 1, got {batch_size}")
        order = (
            np.random.default_rng(seed).permutation(len(self))
            if shuffle
            else np.arange(len(self), dtype=np.int64)
        )
        for start in range(0, len(self), batch_size):
            yield self.gather(order[start : start + batch_size])

    def targets(self) -> Float32Array:
        """The reference at each window's newest period, float32 [len]."""
        return self._targets.copy()

    def current_raw(self) -> Float32Array:
        """The newest raw reading of each window (the linear baseline's only input) [len]."""
        return self._current_raw.copy()

    def current(self, channel: str) -> Float32Array:
        """The newest value of one input channel in each window [len] (e.g. ``'rh'``)."""
        if is_hour_channel(channel) and channel in self.channels:
            everything = np.arange(len(self), dtype=np.int64)
            hours = self._hours(everything, self._current_raw[:, None])
            return hours[HOUR_CHANNELS.index(channel)][:, 0]
        read = [name for name in self.channels if not is_hour_channel(name)]
        index = read.index(channel)
        out = np.empty(len(self), dtype=np.float32)
        for position in np.unique(self._sensor):
            rows = self._sensor == position
            out[rows] = self._filled[position][index][self._end[rows]]
        return out

    def _hours(
        self, picked: IndexArray, pm: npt.NDArray[np.float32]
    ) -> tuple[Float32Array, Float32Array]:
        """The contract's hour channels of windows ``picked`` whose newest ``pm.shape[1]``
        periods hold ``pm`` [B, n], each with its sensor's offset at its newest period."""
        sin = np.empty(pm.shape, dtype=np.float32)
        cos = np.empty(pm.shape, dtype=np.float32)
        sensors = self._sensor[picked]
        offsets = self._offsets[picked]
        newest = np.asarray(self._first_periods, dtype=np.int64)[sensors] + self._end[picked]
        for position in np.unique(sensors):
            for offset in np.unique(offsets[sensors == position]):
                rows = (sensors == position) & (offsets == offset)
                sin[rows], cos[rows] = window_hours(
                    pm[rows], newest[rows], self._period_seconds[position], int(offset)
                )
        return sin, cos

    def meta(self) -> pd.DataFrame:
        """Per window: ``sensor_id``, ``period_start_s`` (Unix s) and ``timestamp`` (UTC)."""
        first = np.asarray(self._first_periods, dtype=np.int64)[self._sensor]
        period = np.asarray(self._period_seconds, dtype=np.int64)[self._sensor]
        start_s = (first + self._end) * period
        ids = np.asarray(self._sensor_ids, dtype=object)[self._sensor]
        return pd.DataFrame(
            {
                "sensor_id": pd.Series(ids, dtype="str"),
                "period_start_s": start_s,
                "timestamp": pd.to_datetime(start_s, unit="s", utc=True).as_unit("ns"),
            }
        )


def _channel(sensor: GriddedSensor, name: str) -> npt.NDArray[np.float64]:
    try:
        return sensor.channel(name)
    except KeyError as error:
        raise DataError(str(error.args[0])) from error


def _concat(parts: Sequence[npt.NDArray[Any]], dtype: type[np.generic]) -> npt.NDArray[Any]:
    if not parts:
        return np.empty(0, dtype=dtype)
    return np.concatenate(parts).astype(dtype, copy=False)
