"""The values that leave the windows: closed periods for the ticker, state for a snapshot.

Plain data over NumPy arrays; the ring that makes them is :mod:`tesla_gateway.windows.ring`,
the file format that keeps the state is :mod:`tesla_gateway.windows.snapshots`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.errors import GatewayError

__all__ = [
    "NEWER_ARRAYS",
    "NO_PERIOD",
    "STATE_ARRAYS",
    "WAITING_ARRAYS",
    "BoolArray",
    "Float32Array",
    "FloatArray",
    "IntArray",
    "ReadyWindows",
    "WaitingPeriod",
    "WarmUp",
    "WindowState",
    "WindowStoreError",
    "waiting_as_arrays",
    "waiting_from_arrays",
]

NO_PERIOD = np.iinfo(np.int64).min  # sentinel: "no period yet" in the int64 period arrays
_LAST_UNIX_S = 253_402_300_799  # 9999-12-31T23:59:59Z: the last time ISO 8601 formats

FloatArray = npt.NDArray[np.float64]
Float32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class WindowStoreError(GatewayError):
    """The window store was asked for something its geometry cannot hold."""


@dataclass(frozen=True, slots=True)
class ReadyWindows:
    """Closed periods ready for the ticker: one row per (sensor, closed period).

    ``windows`` is ``[B, N]`` float32 oldest-first for a one-channel model and ``[B, N, C]`` for
    several channels, matching the model's input. ``quality`` is empty for a valid window.
    """

    sensor_ids: tuple[str, ...]
    periods: IntArray  # [B] grid period index of the closed period
    windows: Float32Array  # [B, N] or [B, N, C]
    raw: FloatArray  # [B] mean of the first channel's readings in the closed period (float64)
    quality: tuple[tuple[Quality, ...], ...]  # [B]
    # [B] periods of real history per window (N: whole); a shorter window of a model that
    # calibrates from it was edge-padded (tesla_gateway/contract/series.py, pad_history)
    history: IntArray | None = None

    @property
    def valid(self) -> BoolArray:
        return np.array([not flags for flags in self.quality], dtype=np.bool_)

    def __len__(self) -> int:
        return len(self.sensor_ids)


@dataclass(frozen=True, slots=True)
class WarmUp:
    """A model's sensors whose windows are not whole yet (``tesla-gateway status``)."""

    need: int  # N: periods of a whole window
    calibrates_from: int  # periods from which the model calibrates (the manifest's minimum)
    sensors_short: int  # sensors with fewer than N periods since their first
    fewest_periods: int | None  # the fewest periods any sensor has (None: no sensor)
    all_ready_at: float | None  # Unix s when the last of them has N periods, if none stops

    def as_dict(self) -> dict[str, object]:
        return {
            "need": self.need,
            "calibrates_from": self.calibrates_from,
            "sensors_short": self.sensors_short,
            "fewest_periods": self.fewest_periods,
            "all_ready_at": self.all_ready_at,
        }


@dataclass(frozen=True, slots=True)
class WaitingPeriod:
    """A closed period waiting for a tick while its sensor has closed a newer one: its window is
    copied out, as the ring has moved on. A backlog (a replay, a node catching up) makes them."""

    sensor_id: str
    period: int
    window: Float32Array  # [C, N] oldest-first
    first_period: int
    raw: float
    run: int = 0  # equal first-channel means observed in a row, this one included (stuck.py)


# A WindowState's per-sensor arrays, each with the kind of its dtype ('f' float, 'i' integer):
# the arrays every snapshot of the windows carries (windows/snapshots.py, cluster/window_parts.py).
STATE_ARRAYS: Mapping[str, str] = MappingProxyType(
    {
        "ring": "f",
        "last_closed": "i",
        "first_period": "i",
        "last_obs_period": "i",
        "last_obs_value": "f",
        "open_period": "i",
        "open_sum": "f",
        "open_count": "i",
        "pending_period": "i",
        "run_value": "f",
        "run_length": "i",
    }
)
# Arrays a snapshot written before the frozen-sensor runs were kept lacks: they start anew.
NEWER_ARRAYS = frozenset({"run_value", "run_length", "waiting_run"})

# How waiting periods are kept in a snapshot's arrays (their sensor ids go with the meta).
WAITING_ARRAYS = (
    "waiting_period",
    "waiting_window",
    "waiting_first_period",
    "waiting_raw",
    "waiting_run",
)


def waiting_as_arrays(
    waiting: list[WaitingPeriod], geometry: WindowGeometry
) -> tuple[list[str], dict[str, npt.NDArray[Any]]]:
    """Waiting periods as (sensor ids, arrays named by :data:`WAITING_ARRAYS`)."""
    c, n = len(geometry.read_channels), geometry.window_length
    windows = np.empty((len(waiting), c, n), dtype=np.float32)
    for index, item in enumerate(waiting):
        windows[index] = item.window
    return [item.sensor_id for item in waiting], {
        "waiting_period": np.array([item.period for item in waiting], dtype=np.int64),
        "waiting_window": windows,
        "waiting_first_period": np.array([item.first_period for item in waiting], dtype=np.int64),
        "waiting_raw": np.array([item.raw for item in waiting], dtype=np.float64),
        "waiting_run": np.array([item.run for item in waiting], dtype=np.int64),
    }


def waiting_from_arrays(
    sensor_ids: list[str], arrays: Mapping[str, npt.NDArray[Any]], geometry: WindowGeometry
) -> list[WaitingPeriod]:
    """The inverse of :func:`waiting_as_arrays`; :class:`WindowStoreError` on shapes or types
    that do not fit."""
    k, c, n = len(sensor_ids), len(geometry.read_channels), geometry.window_length
    expected = {
        "waiting_period": ((k,), "i"),
        "waiting_window": ((k, c, n), "f"),
        "waiting_first_period": ((k,), "i"),
        "waiting_raw": ((k,), "f"),
        "waiting_run": ((k,), "i"),
    }
    runs = arrays.get("waiting_run", np.zeros(k, dtype=np.int64))  # older snapshots: none
    for name, (shape, kind) in expected.items():
        array = runs if name == "waiting_run" else arrays[name]
        if array.shape != shape or array.dtype.kind != kind:
            raise WindowStoreError(
                f"state field {name} has shape {array.shape} and dtype {array.dtype}, "
                f"expected {shape} of kind {kind!r}"
            )
    return [
        WaitingPeriod(
            sensor_id=sensor_id,
            period=int(arrays["waiting_period"][index]),
            window=np.asarray(arrays["waiting_window"][index], dtype=np.float32),
            first_period=int(arrays["waiting_first_period"][index]),
            raw=float(arrays["waiting_raw"][index]),
            run=int(runs[index]),
        )
        for index, sensor_id in enumerate(sensor_ids)
    ]


@dataclass(slots=True)
class WindowState:
    """Everything needed to rebuild a model's windows after a restart.

    See ``tesla_gateway.windows.snapshots``.
    """

    geometry: WindowGeometry
    sensor_ids: list[str]
    ring: npt.NDArray[np.floating[Any]]  # [S, C, N] float32 (float64 in older snapshots)
    last_closed: IntArray  # [S]
    first_period: IntArray  # [S]
    last_obs_period: IntArray  # [S, C]
    last_obs_value: FloatArray  # [S, C]
    open_period: IntArray  # [S]
    open_sum: FloatArray  # [S, C]
    open_count: IntArray  # [S, C]
    open_seen: list[list[float]] = field(default_factory=list)  # [S] timestamps in open period
    pending_period: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # [S]
    # Closed periods older than a sensor's pending one, still waiting for a tick, oldest first
    waiting: list[WaitingPeriod] = field(default_factory=list)
    # [S] the newest observed first-channel mean and how many observed periods in a row held
    # it (tesla_gateway/contract/stuck.py); empty (a state written before they were kept): no
    # run yet, filled in below
    run_value: FloatArray = field(default_factory=lambda: np.empty(0))
    run_length: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    # Runs of sensors with no row yet, taken over a model swap (ModelWindows.carry_runs):
    # sensor -> (newest first-channel mean, run length)
    carried: dict[str, tuple[float, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        s = len(self.sensor_ids)
        if s and np.size(self.run_value) == 0 and np.size(self.run_length) == 0:
            self.run_value = np.full(s, np.nan)
            self.run_length = np.zeros(s, dtype=np.int64)

    def check_shapes(self) -> None:
        """Raise :class:`WindowStoreError` unless every array fits the sensors and geometry."""
        s, c, n = (
            len(self.sensor_ids),
            len(self.geometry.read_channels),
            self.geometry.window_length,
        )
        expected = {
            "ring": (s, c, n),
            "last_closed": (s,),
            "first_period": (s,),
            "last_obs_period": (s, c),
            "last_obs_value": (s, c),
            "open_period": (s,),
            "open_sum": (s, c),
            "open_count": (s, c),
            "pending_period": (s,),
            "run_value": (s,),
            "run_length": (s,),
        }
        for name, shape in expected.items():
            actual = np.shape(getattr(self, name))
            if actual != shape:
                raise WindowStoreError(f"state field {name} has shape {actual}, expected {shape}")
        if len(self.open_seen) != s or len(set(self.sensor_ids)) != s:
            raise WindowStoreError("state sensor list is inconsistent")
        if any(np.shape(item.window) != (c, n) for item in self.waiting):
            raise WindowStoreError(f"a waiting period's window is not of shape {(c, n)}")
        self._check_periods()
        self._check_runs()

    def _check_runs(self) -> None:
        """No run is negative: what no gateway wrote (a too long one is clipped at load)."""
        runs = (
            np.asarray(self.run_length),
            np.array([item.run for item in self.waiting], dtype=np.int64),
            np.array([run for _, run in self.carried.values()], dtype=np.int64),
        )
        if any((values < 0).any() for values in runs):
            raise WindowStoreError("state holds a negative frozen-sensor run")

    def _check_periods(self) -> None:
        """Every period a time (or :data:`NO_PERIOD`), every waiting period one of a sensor with
        a window: a period no timestamp can name fails each tick's ISO-8601 formatting."""
        last = _LAST_UNIX_S // self.geometry.period_seconds
        periods = {
            name: np.asarray(getattr(self, name))
            for name in (
                "last_closed",
                "first_period",
                "last_obs_period",
                "open_period",
                "pending_period",
            )
        }
        periods["waiting period"] = np.array([w.period for w in self.waiting], dtype=np.int64)
        periods["waiting first_period"] = np.array(
            [w.first_period for w in self.waiting], dtype=np.int64
        )
        for name, values in periods.items():
            if ((values != NO_PERIOD) & ((values < 0) | (values > last))).any():
                raise WindowStoreError(f"state field {name} holds a period of no time in 1970-9999")
        known = set(self.sensor_ids)
        for item in self.waiting:
            if item.sensor_id not in known:
                raise WindowStoreError(f"a waiting period's sensor {item.sensor_id} has no window")
            if not item.first_period <= item.period or not math.isfinite(item.raw):
                raise WindowStoreError(
                    f"waiting period {item.period} of {item.sensor_id} has first period "
                    f"{item.first_period} and raw mean {item.raw}"
                )
