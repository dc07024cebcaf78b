"""Per (sensor, model) ring buffers filled in event time, with training's gap policy.

Each model has one :class:`ModelWindows`: a preallocated ``[sensors, channels, N]`` float32 array
in which period ``t`` always lives at column ``t % N`` (a roll-free circular layout: no head index
to move, no copying on push). Readings are averaged into the sensor's *open* period; the period
closes when a reading for a later period arrives (event time) or when the ticker forces it
(wall-clock fallback). Closing writes the mean and fills the gap since the previous observation
with :func:`tesla_gateway.contract.series.gap_fill`, exactly as training's
:func:`interpolate_short_gaps` does,
so a window here equals the training window over the same series. float32 is the model's input
type: means and interpolations are computed in float64 and rounded once on the way into the ring,
as the cast at the model's input did before, so windows are unchanged and the ring takes half
the memory (10,000 sensors x N = 360: 14 MB); the published raw mean stays float64.
"""

from __future__ import annotations

import bisect
import enum
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import gap_fill, period_index, window_is_valid
from tesla_gateway.errors import GatewayError

if TYPE_CHECKING:
    from tesla_gateway.ingest.clock_sanity import ClockSanity

__all__ = [
    "NO_PERIOD",
    "AddOutcome",
    "ModelWindows",
    "ReadyWindows",
    "WindowState",
    "WindowStore",
    "WindowStoreError",
]

_GATHER_CHUNK = 1024
NO_PERIOD = np.iinfo(np.int64).min  # sentinel: "no period yet" in the int64 period arrays
_INITIAL_CAPACITY = 8
# The per-sensor arrays (one row per sensor) and the value a free row holds.
_ROW_ARRAYS: dict[str, float | int | bool] = {
    "_ring": math.nan,
    "_last_closed": NO_PERIOD,
    "_first_period": NO_PERIOD,
    "_last_obs_period": NO_PERIOD,
    "_last_obs_value": math.nan,
    "_open_period": NO_PERIOD,
    "_open_sum": 0.0,
    "_open_count": 0,
    "_last_arrival": 0.0,
    "_pending": False,
    "_pending_period": NO_PERIOD,
    "_pending_raw": math.nan,
}

FloatArray = npt.NDArray[np.float64]
Float32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class WindowStoreError(GatewayError):
    """The window store was asked for something its geometry cannot hold."""


class AddOutcome(enum.StrEnum):
    """What happened to one reading in one model's windows."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # same sensor and timestamp already averaged into the open period
    LATE = "late"  # its period was already closed; counted, never re-opened
    IRRELEVANT = "irrelevant"  # carries none of the model's channels (or, for a new sensor of
    # a model that has a sibling with fewer channels, not all of them)
    # for a period the gateway clock has not reached: waits (tesla_gateway.ingest.clock_sanity)
    HELD = "held"
    CLOCK_OUTLIER = "clock_outlier"  # a held reading the sensor's next reading contradicted


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

    @property
    def valid(self) -> BoolArray:
        return np.array([not flags for flags in self.quality], dtype=np.bool_)

    def __len__(self) -> int:
        return len(self.sensor_ids)


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


@dataclass(slots=True)
class _Snapshot:
    """A closed period copied out because the sensor closed another one before the tick."""

    sensor_id: str
    period: int
    window: Float32Array  # [C, N] oldest-first
    first_period: int
    raw: float


class ModelWindows:
    """The ring buffers of every sensor for one model."""

    def __init__(self, geometry: WindowGeometry, capacity: int = _INITIAL_CAPACITY) -> None:
        self.geometry = geometry
        self._n = geometry.window_length
        self._channels = len(geometry.channels)
        self._max_gap = geometry.gap_policy.max_interpolated_periods
        self._ids: list[str] = []
        self._index: dict[str, int] = {}
        # Per sensor, the open period's timestamps, sorted: duplicates are found by bisection.
        # array('d') holds 60 timestamps in 600 bytes where a set of floats took 3.7 KB (37 MB
        # for 10,000 sensors at one reading per second and 60 s periods).
        self._seen: list[array[float]] = []
        self._overflow: list[_Snapshot] = []
        self._pending_rows = 0  # count of True in _pending: asked for after every reading
        self.counts: dict[AddOutcome, int] = dict.fromkeys(AddOutcome, 0)
        # Set by the ticker when the feature has a model with fewer channels: a sensor gets a
        # window here only once a reading brings every channel, so PM-only sensors cost no
        # covariate windows (10,000 sensors x 3 channels x N = 360 would be 43 MB).
        self.admit_complete_only = False
        self._allocate(max(capacity, 1))

    # -- allocation -------------------------------------------------------------------------

    def _allocate(self, capacity: int) -> None:
        c, n = self._channels, self._n
        self._ring: Float32Array = np.full((capacity, c, n), np.nan, dtype=np.float32)
        self._pending_raw: FloatArray = np.full(capacity, np.nan)  # exact mean, for "raw"
        self._last_closed: IntArray = np.full(capacity, NO_PERIOD, dtype=np.int64)
        self._first_period: IntArray = np.full(capacity, NO_PERIOD, dtype=np.int64)
        self._last_obs_period: IntArray = np.full((capacity, c), NO_PERIOD, dtype=np.int64)
        self._last_obs_value: FloatArray = np.full((capacity, c), np.nan)
        self._open_period: IntArray = np.full(capacity, NO_PERIOD, dtype=np.int64)
        self._open_sum: FloatArray = np.zeros((capacity, c))
        self._open_count: IntArray = np.zeros((capacity, c), dtype=np.int64)
        self._last_arrival: FloatArray = np.zeros(capacity)
        self._pending: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self._pending_period: IntArray = np.full(capacity, NO_PERIOD, dtype=np.int64)

    def _grow(self) -> None:
        old = len(self._last_closed)
        arrays = {name: getattr(self, name) for name in _ROW_ARRAYS}
        self._allocate(old * 2)
        for name, values in arrays.items():
            getattr(self, name)[:old] = values

    def _row(self, sensor_id: str) -> int:
        row = self._index.get(sensor_id)
        if row is not None:
            return row
        row = len(self._ids)
        if row == len(self._last_closed):
            self._grow()
        self._ids.append(sensor_id)
        self._index[sensor_id] = row
        self._seen.append(array("d"))
        return row

    def remove(self, sensor_id: str) -> bool:
        """Forget a sensor's window (evicted); the last row moves into its place."""
        row = self._index.pop(sensor_id, None)
        if row is None:
            return False
        if self._pending[row]:
            self._pending_rows -= 1
        last = len(self._ids) - 1
        if row != last:
            moved = self._ids[last]
            for name in _ROW_ARRAYS:
                values = getattr(self, name)
                values[row] = values[last]
            self._ids[row] = moved
            self._index[moved] = row
            self._seen[row] = self._seen[last]
        for name, empty in _ROW_ARRAYS.items():
            getattr(self, name)[last] = empty
        self._ids.pop()
        self._seen.pop()
        return True

    def last_seen(self) -> dict[str, float]:
        """Per sensor, the end (Unix seconds) of the newest period it had a reading in."""
        live = len(self._ids)
        newest = np.maximum(self._open_period[:live], self._last_obs_period[:live].max(axis=1))
        ends = (newest.astype(np.float64) + 1.0) * self.geometry.period_seconds
        rows = zip(self._ids, newest.tolist(), ends.tolist(), strict=True)
        return {sensor_id: float(end) for sensor_id, period, end in rows if period != NO_PERIOD}

    # -- ingest -----------------------------------------------------------------------------

    @property
    def sensor_ids(self) -> tuple[str, ...]:
        return tuple(self._ids)

    @property
    def pending_count(self) -> int:
        """Closed periods waiting for the ticker."""
        return self._pending_rows + len(self._overflow)

    def add(self, reading: Reading, arrival: float) -> AddOutcome:
        """Average one reading into its sensor's open period (``arrival``: wall-clock seconds).

        Called for every reading: scalar reads use ``ndarray.item`` (cheaper than indexing).
        """
        values = reading.values
        present = [
            (channel, value)
            for channel, name in enumerate(self.geometry.channels)
            if (value := values.get(name)) is not None
        ]
        if not present:
            return self._count(AddOutcome.IRRELEVANT)
        timestamp = reading.timestamp
        period = period_index(timestamp, self.geometry.period_seconds)
        row = self._index.get(reading.sensor_id)
        if row is None:
            if self.admit_complete_only and len(present) < self._channels:
                return self._count(AddOutcome.IRRELEVANT)
            row = self._row(reading.sensor_id)
        open_period = self._open_period.item(row)
        if open_period == NO_PERIOD:
            if period <= self._last_closed.item(row):
                return self._count(AddOutcome.LATE)
            self._open_period[row] = period
        elif period < open_period:
            return self._count(AddOutcome.LATE)
        elif period > open_period:
            self._close(row)
            self._open_period[row] = period
        seen = self._seen[row]
        if not seen or timestamp > seen[-1]:
            seen.append(timestamp)  # the usual case: readings arrive in order
        else:
            position = bisect.bisect_left(seen, timestamp)
            if position < len(seen) and seen[position] == timestamp:
                return self._count(AddOutcome.DUPLICATE)
            seen.insert(position, timestamp)
        for channel, value in present:
            self._open_sum[row, channel] += value
            self._open_count[row, channel] += 1
        self._last_arrival[row] = arrival
        self.counts[AddOutcome.ACCEPTED] += 1
        return AddOutcome.ACCEPTED

    def _count(self, outcome: AddOutcome) -> AddOutcome:
        self.counts[outcome] += 1
        return outcome

    def note(self, outcome: AddOutcome) -> AddOutcome:
        """Count an outcome decided outside :meth:`add` (held, clock outlier)."""
        return self._count(outcome)

    def period_of(self, reading: Reading) -> int:
        return period_index(reading.timestamp, self.geometry.period_seconds)

    def would_run_ahead(self, reading: Reading, now: float) -> bool:
        """True if the reading would move its sensor's window past the clock's current period.

        Such a reading (a period the clock at ``now`` has not reached, later than any the
        sensor has) would close the sensor's open period and make every true reading after it
        late; see :mod:`tesla_gateway.ingest.clock_sanity`.
        """
        period_seconds = self.geometry.period_seconds
        period = math.floor(reading.timestamp / period_seconds)
        if period <= math.floor(now / period_seconds):
            return False
        if not any(name in reading.values for name in self.geometry.channels):
            return False
        row = self._index.get(reading.sensor_id)
        if row is None:
            return True
        return period > max(self._open_period.item(row), self._last_closed.item(row))

    # -- closing ----------------------------------------------------------------------------

    def close_through(self, period: int) -> int:
        """Close every open period at or before ``period``; return how many closed."""
        live = len(self._ids)
        rows = np.flatnonzero(
            (self._open_period[:live] != NO_PERIOD) & (self._open_period[:live] <= period)
        )
        for row in rows:
            self._close(int(row))
        return int(rows.size)

    def close_idle(self, now: float, grace_s: float) -> int:
        """Wall-clock fallback: close periods that ended, and saw no reading, ``grace_s`` ago.

        A period's end is taken in wall-clock time; for replayed old data (whose periods ended
        long ago) the rule reduces to "no reading for ``grace_s``".
        """
        live = len(self._ids)
        open_periods = self._open_period[:live]
        is_open = open_periods != NO_PERIOD
        ends = (open_periods.astype(np.float64) + 1.0) * self.geometry.period_seconds
        deadline = np.maximum(ends, self._last_arrival[:live]) + grace_s
        rows = np.flatnonzero(is_open & (now >= deadline))
        for row in rows:
            self._close(int(row))
        return int(rows.size)

    def _close(self, row: int) -> None:
        period = int(self._open_period[row])
        if self._pending[row]:
            self._overflow.append(self._snapshot(row))
        counts = self._open_count[row]
        first_mean = math.nan
        for channel in range(self._channels):
            count = int(counts[channel])
            mean = float(self._open_sum[row, channel]) / count if count else math.nan
            self._write(row, channel, period, mean)
            if channel == 0:
                first_mean = mean
        self._last_closed[row] = period
        if counts[0] > 0:
            if not self._pending[row]:
                self._pending_rows += 1
            self._pending[row] = True
            self._pending_period[row] = period
            self._pending_raw[row] = first_mean
            if self._first_period[row] == NO_PERIOD:
                self._first_period[row] = period
        self._open_period[row] = NO_PERIOD
        self._open_sum[row] = 0.0
        self._open_count[row] = 0
        del self._seen[row][:]

    def _write(self, row: int, channel: int, period: int, value: float) -> None:
        """Push one closed period's mean, first settling the periods since the last close."""
        n = self._n
        ring = self._ring[row, channel]
        oldest_kept = period - n + 1
        previous = int(self._last_closed[row])
        start = oldest_kept if previous == NO_PERIOD else max(previous + 1, oldest_kept)
        if start < period:
            ring[np.arange(start, period) % n] = np.nan
        if math.isnan(value):
            ring[period % n] = np.nan
            return
        last_period = int(self._last_obs_period[row, channel])
        if last_period != NO_PERIOD:
            missing = period - last_period - 1
            if 0 < missing <= self._max_gap:
                filled = gap_fill(float(self._last_obs_value[row, channel]), value, missing)
                low = max(last_period + 1, oldest_kept)
                ring[np.arange(low, period) % n] = filled[low - last_period - 1 :]
        ring[period % n] = value
        self._last_obs_period[row, channel] = period
        self._last_obs_value[row, channel] = value

    def _ordered(self, row: int, period: int) -> Float32Array:
        """Copy of the row's window ending at ``period``, oldest first: [C, N]."""
        positions = np.arange(period + 1, period + 1 + self._n) % self._n
        window: Float32Array = self._ring[row][:, positions]
        return window

    def _snapshot(self, row: int) -> _Snapshot:
        period = int(self._pending_period[row])
        return _Snapshot(
            sensor_id=self._ids[row],
            period=period,
            window=self._ordered(row, period),
            first_period=int(self._first_period[row]),
            raw=float(self._pending_raw[row]),
        )

    # -- gathering --------------------------------------------------------------------------

    def ready_windows(self, closed_through_period: int | None = None) -> ReadyWindows:
        """Pop every closed, observed period (optionally closing open ones up to a period first)."""
        if closed_through_period is not None:
            self.close_through(closed_through_period)
        live = len(self._ids)
        rows = np.flatnonzero(self._pending[:live])
        n, c = self._n, self._channels
        periods = np.concatenate(
            [
                np.array([snap.period for snap in self._overflow], dtype=np.int64),
                self._pending_period[rows],
            ]
        )
        overflow = len(self._overflow)
        windows = np.empty((periods.size, c, n), dtype=np.float32)
        for index, snap in enumerate(self._overflow):
            windows[index] = snap.window
        self._gather(rows, windows[overflow:])
        raw = np.concatenate(
            [
                np.array([snap.raw for snap in self._overflow], dtype=np.float64),
                self._pending_raw[rows],
            ]
        )
        first = np.concatenate(
            [
                np.array([snap.first_period for snap in self._overflow], dtype=np.int64),
                self._first_period[rows],
            ]
        )
        sensor_ids = tuple(snap.sensor_id for snap in self._overflow) + tuple(
            self._ids[int(row)] for row in rows
        )
        # Flags only for windows holding a hole: a full window is plain OK, no Python per row.
        # A window's sum is NaN exactly when it holds a NaN (values are finite otherwise), and
        # summing needs no [B, C, N] boolean temporary.
        incomplete = np.flatnonzero(np.isnan(windows.sum(axis=(1, 2))))
        flags: list[tuple[Quality, ...]] = [()] * periods.size
        for hole in incomplete.tolist():
            flags[hole] = self._quality(windows[hole], int(periods[hole]), int(first[hole]))
        self._overflow.clear()
        self._pending[rows] = False
        self._pending_rows -= int(rows.size)
        shaped = windows[:, 0, :] if c == 1 else np.ascontiguousarray(windows.transpose(0, 2, 1))
        return ReadyWindows(
            sensor_ids=sensor_ids,
            periods=periods,
            windows=shaped,
            raw=raw,
            quality=tuple(flags),
        )

    def _gather(self, rows: IntArray, out: npt.NDArray[np.float32]) -> None:
        """Copy the rows' windows, oldest first, into ``out`` [len(rows), C, N] (float32).

        Rows whose newest period sits at the same ring position share one shift (the usual case:
        sensors close the same period together), so each group is two slice copies. Work goes in
        chunks to keep temporaries small: gathering 10,000 windows at once took 80 MB.
        """
        n = self._n
        shifts = (self._pending_period[rows] + 1) % n
        for shift in np.unique(shifts):
            members = np.flatnonzero(shifts == shift)
            for start in range(0, members.size, _GATHER_CHUNK):
                chunk = members[start : start + _GATHER_CHUNK]
                source = self._ring[rows[chunk]]  # [k, C, N] float32, small
                out[chunk, :, : n - shift] = source[:, :, shift:]
                out[chunk, :, n - shift :] = source[:, :, :shift]

    def _quality(self, window: FloatArray, period: int, first_period: int) -> tuple[Quality, ...]:
        """Flags for one [C, N] window whose newest first-channel value was observed."""
        if window_is_valid(window, newest_observed=True):
            return ()
        flags: list[Quality] = []
        present = ~np.isnan(window[:, -1])  # channels supplied in the closed period
        if not present.all():
            flags.append(Quality.MISSING_CHANNEL)
        if period - first_period + 1 < self._n:
            flags.append(Quality.WARMING_UP)
        window_periods = np.arange(period - self._n + 1, period + 1)
        holes = np.isnan(window[present]).any(axis=0) & (window_periods >= first_period)
        if holes.any():
            flags.append(Quality.GAP)
        return tuple(flags) or (Quality.GAP,)

    # -- persistence ------------------------------------------------------------------------

    def export_state(self) -> WindowState:
        """Copy of the restorable state (pending periods are kept, snapshots are not)."""
        live = len(self._ids)
        return WindowState(
            geometry=self.geometry,
            sensor_ids=list(self._ids),
            ring=self._ring[:live].copy(),
            last_closed=self._last_closed[:live].copy(),
            first_period=self._first_period[:live].copy(),
            last_obs_period=self._last_obs_period[:live].copy(),
            last_obs_value=self._last_obs_value[:live].copy(),
            open_period=self._open_period[:live].copy(),
            open_sum=self._open_sum[:live].copy(),
            open_count=self._open_count[:live].copy(),
            open_seen=[seen.tolist() for seen in self._seen],
            pending_period=np.where(
                self._pending[:live], self._pending_period[:live], NO_PERIOD
            ).astype(np.int64),
        )

    @classmethod
    def from_state(cls, state: WindowState) -> ModelWindows:
        """Rebuild from :meth:`export_state`; raises :class:`WindowStoreError` on bad shapes."""
        windows = cls(state.geometry, capacity=max(len(state.sensor_ids), _INITIAL_CAPACITY))
        s, c, n = len(state.sensor_ids), windows._channels, windows._n
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
        }
        for name, shape in expected.items():
            actual = np.shape(getattr(state, name))
            if actual != shape:
                raise WindowStoreError(f"state field {name} has shape {actual}, expected {shape}")
        if len(state.open_seen) != s or len(set(state.sensor_ids)) != s:
            raise WindowStoreError("state sensor list is inconsistent")
        for sensor_id in state.sensor_ids:
            windows._row(sensor_id)
        windows._ring[:s] = state.ring
        windows._last_closed[:s] = state.last_closed
        windows._first_period[:s] = state.first_period
        windows._last_obs_period[:s] = state.last_obs_period
        windows._last_obs_value[:s] = state.last_obs_value
        windows._open_period[:s] = state.open_period
        windows._open_sum[:s] = state.open_sum
        windows._open_count[:s] = state.open_count
        windows._pending_period[:s] = state.pending_period
        windows._pending[:s] = state.pending_period != NO_PERIOD
        windows._pending_rows = int(np.count_nonzero(windows._pending[:s]))
        for row in np.flatnonzero(windows._pending[:s]).tolist():
            # The exact mean is not saved: the ring's float32 value, read back as the shortest
            # decimal that rounds to it (what the sensor sent, for a mean of few digits).
            value = windows._ring[row, 0, int(state.pending_period[row]) % n]
            windows._pending_raw[row] = float(str(value))
        for row, seen in enumerate(state.open_seen):
            windows._seen[row].extend(sorted(set(seen)))
        return windows


class WindowStore:
    """The windows of every model, keyed by model slot (the feature, when it has one model).

    With a ``clock_sanity`` (the daemon's), readings ahead of the gateway clock wait for the
    sensor's next reading before they may move a window (:mod:`tesla_gateway.ingest.clock_sanity`);
    without one (replays, tests of the ring itself) every reading goes straight in.
    """

    def __init__(self, clock_sanity: ClockSanity | None = None) -> None:
        self._models: dict[str, ModelWindows] = {}
        self._sanity = clock_sanity

    def ensure(self, feature: str, geometry: WindowGeometry) -> bool:
        """Create or keep the feature's windows; reset them if the geometry changed.

        Returns True when the windows were (re)created, so the caller can log a reset.
        """
        current = self._models.get(feature)
        if current is not None and current.geometry == geometry:
            return False
        self._models[feature] = ModelWindows(geometry)
        if self._sanity is not None:
            self._sanity.forget_feature(feature)
        return True

    def install(self, feature: str, windows: ModelWindows) -> None:
        """Adopt restored windows."""
        self._models[feature] = windows
        if self._sanity is not None:
            self._sanity.forget_feature(feature)

    def drop(self, feature: str) -> None:
        self._models.pop(feature, None)
        if self._sanity is not None:
            self._sanity.forget_feature(feature)

    def remove_sensors(self, sensor_ids: Iterable[str]) -> int:
        """Forget these sensors' windows in every model; how many windows went."""
        sensor_ids = list(sensor_ids)
        if self._sanity is not None:
            self._sanity.forget_sensors(sensor_ids)
        return sum(
            model.remove(sensor_id) for sensor_id in sensor_ids for model in self._models.values()
        )

    def last_seen(self) -> dict[str, float]:
        """Per sensor, the end of the newest period it had a reading in, over every model."""
        merged: dict[str, float] = {}
        for model in self._models.values():
            for sensor_id, end in model.last_seen().items():
                if end > merged.get(sensor_id, -math.inf):
                    merged[sensor_id] = end
        return merged

    def add(self, reading: Reading, arrival: float) -> dict[str, AddOutcome]:
        """Feed one reading to every model; the outcome per feature."""
        if self._sanity is not None:
            return self._sanity.add(self._models, reading, arrival)
        return {feature: model.add(reading, arrival) for feature, model in self._models.items()}

    def close_idle(self, now: float, grace_s: float) -> int:
        if self._sanity is not None:
            self._sanity.release_due(self._models, now)
        return sum(model.close_idle(now, grace_s) for model in self._models.values())

    @property
    def pending_count(self) -> int:
        return sum(model.pending_count for model in self._models.values())

    def __getitem__(self, feature: str) -> ModelWindows:
        return self._models[feature]

    def __contains__(self, feature: object) -> bool:
        return feature in self._models

    def items(self) -> Iterable[tuple[str, ModelWindows]]:
        return list(self._models.items())

    def features(self) -> Sequence[str]:
        return list(self._models)

    def counts(self) -> Mapping[str, Mapping[str, int]]:
        """Outcome counters per feature, for the stats topic and the status file."""
        return {
            feature: {outcome.value: count for outcome, count in model.counts.items()}
            for feature, model in self._models.items()
        }
