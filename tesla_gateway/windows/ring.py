"""Per (sensor, model) ring buffers filled in event time, with training's gap policy.

Each model has one :class:`ModelWindows`: a preallocated ``[sensors, channels, N]`` float32 array
in which period ``t`` always lives at column ``t % N`` (a roll-free circular layout: no head index
to move, no copying on push). Readings are averaged into the sensor's *open* period channel by
channel, so a period fills from every reading of the sensor in it (PM in one message, rh and
temperature in another make one full period; :mod:`tesla_gateway.windows.seen`); the period
closes when a reading for a later period arrives (event time) or when the ticker forces it
(wall-clock fallback). Closing writes the mean and fills the gap since the previous observation
with :func:`tesla_gateway.contract.series.gap_fill`, exactly as training's
:func:`interpolate_short_gaps` does, so a window here equals the training window over the same
series (read out by :mod:`tesla_gateway.windows.readout`). float32 is the model's input
type: means and interpolations are computed in float64 and rounded once on the way into the ring,
as the cast at the model's input did before, so windows are unchanged and the ring takes half
the memory (10,000 sensors x N = 360: 14 MB); the published raw mean stays float64.
Beside each window: the sensor's run of equal first-channel means (a frozen sensor,
:mod:`tesla_gateway.contract.stuck`), saved with it, kept over a swap that resets it.
"""

from __future__ import annotations

import math

import numpy as np

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import gap_fill, period_index
from tesla_gateway.contract.stuck import RUN_CAP, ends_frozen_run, next_run
from tesla_gateway.windows import readout
from tesla_gateway.windows.outcome import AddOutcome
from tesla_gateway.windows.seen import ChannelValues, SeenReadings, all_channels, channel_mask
from tesla_gateway.windows.state import (
    NO_PERIOD,
    BoolArray,
    Float32Array,
    FloatArray,
    IntArray,
    ReadyWindows,
    WaitingPeriod,
    WarmUp,
    WindowState,
)

__all__ = ["ModelWindows"]

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
    "_stamped": False,
    "_pending": False,
    "_pending_period": NO_PERIOD,
    "_pending_raw": math.nan,
    "_run_value": math.nan,
    "_run_length": 0,
}


class ModelWindows:
    """The ring buffers of every sensor for one model."""

    def __init__(self, geometry: WindowGeometry, capacity: int = _INITIAL_CAPACITY) -> None:
        self.geometry = geometry
        self._n = geometry.window_length
        self._read = geometry.read_channels  # the ring's; hour channels come at read-out
        self._channels = len(self._read)
        self._max_gap = geometry.gap_policy.max_interpolated_periods
        self._ids: list[str] = []
        self._index: dict[str, int] = {}
        self._seen = SeenReadings(self._channels)  # per row: what the open period holds
        self._overflow: list[WaitingPeriod] = []
        self._pending_rows = 0  # count of True in _pending: asked for after every reading
        self.counts: dict[AddOutcome, int] = dict.fromkeys(AddOutcome, 0)
        # Set by the ticker when the feature has a model with fewer channels: a sensor gets a
        # window here only once its readings have brought every channel, so PM-only sensors
        # cost no covariate windows (10,000 sensors x 3 channels x N = 360 would be 43 MB).
        # The channels a sensor without a window has sent so far (a mask), kept only once it
        # sent one beyond the first: PM and rh/temp in separate messages add up here.
        self.admit_complete_only = False
        self.min_history_periods = self._n  # the model's (the ticker sets it from its manifest)
        # A valid window of a sensor whose newest first-channel mean was observed this many
        # periods in a row is flagged stuck; a new value after such a run makes the sensor
        # young again (the ticker sets it from [health]); None: never.
        self.stuck_periods: int | None = None
        self._carried: dict[str, tuple[float, int]] = {}  # runs of a swapped-out model's rows
        self.utc_offset_s: int | None = 0  # the hour channels' zone (the ticker sets it)
        self._partial: dict[str, int] = {}
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
        self._stamped: BoolArray = np.zeros(capacity, dtype=np.bool_)  # last reading's time: ours
        self._pending: BoolArray = np.zeros(capacity, dtype=np.bool_)
        self._pending_period: IntArray = np.full(capacity, NO_PERIOD, dtype=np.int64)
        self._run_value: FloatArray = np.full(capacity, np.nan)  # newest observed raw mean
        self._run_length: IntArray = np.zeros(capacity, dtype=np.int64)  # periods in a row

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
        self._seen.add_row()
        if sensor_id in self._carried:
            self._run_value[row], self._run_length[row] = self._carried.pop(sensor_id)
        return row

    def carry_runs(self, previous: ModelWindows) -> None:
        """Take the frozen-sensor runs of the windows this replaces (a model swap that changed
        the geometry): a sensor frozen before the swap is frozen after it."""
        rows = np.flatnonzero(previous._run_length[: len(previous._ids)] > 0).tolist()
        values, lengths = previous._run_value.tolist(), previous._run_length.tolist()
        self._carried = dict(previous._carried)  # its own, from a swap before (there and back)
        self._carried |= {previous._ids[row]: (values[row], lengths[row]) for row in rows}

    def remove(self, sensor_id: str) -> bool:
        """Forget a sensor's window (evicted, or handed to another gateway) and its periods
        waiting for a tick; the last row moves into its place."""
        self._partial.pop(sensor_id, None)
        self._carried.pop(sensor_id, None)
        row = self._index.pop(sensor_id, None)
        if row is None:
            return False
        if self._overflow:
            self._overflow = [item for item in self._overflow if item.sensor_id != sensor_id]
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
        self._seen.move_last_to(row)
        for name, empty in _ROW_ARRAYS.items():
            getattr(self, name)[last] = empty
        self._ids.pop()
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
        """Average one reading into its sensor's open period (``arrival``: wall-clock seconds);
        called for every reading: scalar reads use ``ndarray.item`` (cheaper than indexing)."""
        values = reading.values
        present = [
            (channel, value)
            for channel, name in enumerate(self._read)
            if (value := values.get(name)) is not None
        ]
        if not present:
            return self._count(AddOutcome.IRRELEVANT)
        timestamp = reading.timestamp
        period = period_index(timestamp, self.geometry.period_seconds)
        row = self._index.get(reading.sensor_id)
        if row is None:
            if self.admit_complete_only and not self._completes(reading.sensor_id, present):
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
        present = self._seen.unseen(row, timestamp, present)
        if not present:
            return self._count(AddOutcome.DUPLICATE)
        for channel, value in present:
            self._open_sum[row, channel] += value
            self._open_count[row, channel] += 1
        self._last_arrival[row] = arrival
        self._stamped[row] = reading.stamped_at_gateway
        self.counts[AddOutcome.ACCEPTED] += 1
        return AddOutcome.ACCEPTED

    def _completes(self, sensor_id: str, present: ChannelValues) -> bool:
        """For a sensor without a window here: have its readings now brought every channel?"""
        known = self._partial.get(sensor_id)
        if known is None and all(channel == 0 for channel, _ in present):
            return len(present) == self._channels  # PM alone: remembered nowhere
        have = (known or 0) | channel_mask(present)
        if have == all_channels(self._channels):
            self._partial.pop(sensor_id, None)
            return True
        self._partial[sensor_id] = have
        return False

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
        if not any(name in reading.values for name in self._read):
            return False
        row = self._index.get(reading.sensor_id)
        if row is None:
            return True
        return period > max(self._open_period.item(row), self._last_closed.item(row))

    def clock_stepped(self, step_s: float) -> int:
        """The gateway clock stepped by ``step_s`` seconds: re-anchor what it set.

        Every arrival moves with it (the grace deadlines stay the same instants). A sensor whose
        readings the gateway stamps (:attr:`Reading.stamped_at_gateway`) has its whole timeline
        moved by the step in whole periods, so its next reading continues its open period
        instead of being ``late`` (a step back) or leaving a gap (a step forward); a closed
        period waiting for the ticker keeps the time it closed with. Returns how many sensors
        moved.
        """
        live = len(self._ids)
        self._last_arrival[:live] += step_s
        shift = round(step_s / self.geometry.period_seconds)
        rows = np.flatnonzero(self._stamped[:live]) if shift else np.empty(0, dtype=np.int64)
        for row in rows.tolist():
            self._shift(row, shift)
        return int(rows.size)

    def _shift(self, row: int, shift: int) -> None:
        """Move one sensor's periods ``shift`` periods on (ring columns included)."""
        self._set_pending_aside(row)
        self._ring[row] = np.roll(self._ring[row], shift % self._n, axis=1)  # t % N -> (t + k)
        for periods in (self._open_period, self._last_closed, self._first_period):
            if periods.item(row) != NO_PERIOD:
                periods[row] += shift
        observed = self._last_obs_period[row]
        observed[observed != NO_PERIOD] += shift
        self._seen.shift(row, shift * self.geometry.period_seconds)

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
        self._set_pending_aside(row)
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
            self._pending_rows += 1
            self._pending[row] = True
            self._pending_period[row] = period
            self._pending_raw[row] = first_mean
            previous = self._run_length.item(row)
            run = next_run(self._run_value.item(row), previous, first_mean)
            if self._first_period[row] == NO_PERIOD or ends_frozen_run(
                previous, run, self.stuck_periods
            ):
                self._first_period[row] = period  # new, or recovered: young from here
            self._run_value[row], self._run_length[row] = first_mean, run
        self._open_period[row] = NO_PERIOD
        self._open_sum[row] = 0.0
        self._open_count[row] = 0
        self._seen.clear(row)

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

    def _set_pending_aside(self, row: int) -> None:
        """Copy the row's pending period out (a :class:`WaitingPeriod`) before its ring moves
        on; the row no longer pends (a newer period that observed no PM does not pend)."""
        if self._pending[row]:
            self._overflow.append(self._snapshot(row))
            self._pending[row] = False
            self._pending_rows -= 1

    def _snapshot(self, row: int) -> WaitingPeriod:
        period = int(self._pending_period[row])
        return WaitingPeriod(
            sensor_id=self._ids[row],
            period=period,
            window=self._ordered(row, period),
            first_period=int(self._first_period[row]),
            raw=float(self._pending_raw[row]),
            run=self._run_length.item(row),  # a row pends only its newest observed period
        )

    # -- gathering --------------------------------------------------------------------------

    def ready_windows(self, closed_through_period: int | None = None) -> ReadyWindows:
        """Pop every closed, observed period (optionally closing open ones up to a period first)."""
        if closed_through_period is not None:
            self.close_through(closed_through_period)
        live = len(self._ids)
        rows = np.flatnonzero(self._pending[:live])
        waiting = self._overflow
        periods = readout.stacked(waiting, "period", self._pending_period[rows])
        windows = readout.batch(self._ring, waiting, rows, self._pending_period[rows])
        raw = readout.stacked(waiting, "raw", self._pending_raw[rows])
        first = readout.stacked(waiting, "first_period", self._first_period[rows])
        runs = readout.stacked(waiting, "run", self._run_length[rows])
        sensor_ids = (*(item.sensor_id for item in waiting), *map(self._ids.__getitem__, rows))
        windows = readout.with_hours(windows, periods, self.geometry, self.utc_offset_s)
        c = windows.shape[1]
        minimum, stuck = self.min_history_periods, self.stuck_periods
        history = readout.pad_young(windows, periods, first, minimum)
        flags = readout.qualities(
            windows, periods, first, runs, min_history=minimum, stuck_periods=stuck
        )
        self._overflow.clear()
        self._pending[rows] = False
        self._pending_rows -= int(rows.size)
        shaped = windows[:, 0, :] if c == 1 else np.ascontiguousarray(windows.transpose(0, 2, 1))
        return ReadyWindows(
            sensor_ids=sensor_ids,
            periods=periods,
            windows=shaped,
            raw=raw,
            quality=flags,
            history=history,
        )

    def warm_up(self) -> WarmUp:
        """Sensors whose windows are not whole yet (:func:`readout.warm_up`)."""
        first, closed = self._first_period[: len(self._ids)], self._last_closed[: len(self._ids)]
        return readout.warm_up(first, closed, self.geometry, self.min_history_periods)

    # -- persistence ------------------------------------------------------------------------

    def export_state(self) -> WindowState:
        """Copy of the restorable state, every period waiting for a tick included."""
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
            open_seen=self._seen.export(),
            pending_period=np.where(
                self._pending[:live], self._pending_period[:live], NO_PERIOD
            ).astype(np.int64),
            waiting=list(self._overflow),  # frozen items: the list is the copy
            run_value=self._run_value[:live].copy(),
            run_length=self._run_length[:live].copy(),
            carried=dict(self._carried),
        )

    @classmethod
    def from_state(cls, state: WindowState) -> ModelWindows:
        """Rebuild from :meth:`export_state`; raises :class:`WindowStoreError` on bad shapes."""
        state.check_shapes()
        windows = cls(state.geometry, capacity=max(len(state.sensor_ids), _INITIAL_CAPACITY))
        s = len(state.sensor_ids)
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
        windows._run_value[:s] = state.run_value
        windows._run_length[:s] = np.minimum(state.run_length, RUN_CAP)  # a run counts no further
        windows._carried = {k: (v, min(r, RUN_CAP)) for k, (v, r) in state.carried.items()}
        windows._pending[:s] = state.pending_period != NO_PERIOD
        windows._pending_rows = int(np.count_nonzero(windows._pending[:s]))
        windows._overflow = list(state.waiting)
        ring, pending = windows._ring[:s], windows._pending[:s]
        windows._pending_raw[:s] = readout.saved_raw(ring, state.pending_period, pending)
        for row, seen in enumerate(state.open_seen):
            windows._seen.restore(row, seen)
        return windows
