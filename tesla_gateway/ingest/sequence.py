"""Per-sensor sequence numbers: how many readings never arrived.

A node may number its readings (``seq``: a uint32 it increments per reading and lets wrap; the
serial protocol always carries it, the MQTT payload optionally). Loss anywhere between the
node and the gateway (a broker dropping a full queue, a QoS 0 hop, the gateway's own inbox) then
shows as skipped numbers. :class:`SequenceTracker` counts them per sensor, as
``readings_missing``, under at-least-once delivery:

* a number seen again is a **duplicate** (a redelivery), never a gap and never negative;
* a skipped number that arrives later (reordered, up to ``window`` numbers behind the newest)
  is **late**: it no longer counts as missing;
* a node that **restarts** numbers from 0 again: a number far behind the newest (beyond the
  window) that is small (below ``window``), or a jump ahead of more than ``max_gap``, starts a
  new run (counted as a reset, not a loss). A restart within the first ``window`` readings
  looks like redeliveries (counted as duplicates, nothing missing);
* wrap-around is modular: after 4294967295 comes 0.

A number far behind that is not small is **stale** (delayed beyond the window): it changes
nothing, and the reading it stood for stays counted as missing.

State per sensor is O(1): the newest number and a bit set of the last ``window`` numbers
(``window`` / 8 bytes); at most ``max_sensors`` sensors are tracked (readings of others are
counted as ``untracked``). The gateway's state is not persisted: after a restart of the gateway the
first reading of each sensor starts a new run.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Callable, Iterable

import structlog

__all__ = ["SEQ_MODULUS", "SensorSequence", "SequenceOutcome", "SequenceTracker"]

SEQ_MODULUS = 2**32
_HALF = SEQ_MODULUS // 2
DEFAULT_WINDOW = 2048  # reordering tolerated: above the broker's in-flight window (1000)
DEFAULT_MAX_GAP = 1_000_000  # a longer jump ahead is a restart, not a loss (11 days at 1 Hz)
DEFAULT_MAX_SENSORS = 100_000  # sensors tracked at most (~0.5 KB each); later ones are not
_LOG_INTERVAL_S = 10.0
_TOP = 10


class SequenceOutcome(enum.StrEnum):
    """What one sequence number was, relative to those seen before."""

    FIRST = "first"
    NEXT = "next"  # ahead of the newest (possibly after a gap)
    LATE = "late"  # behind the newest, not seen before
    DUPLICATE = "duplicate"
    RESET = "reset"  # a new run: the node restarted
    STALE = "stale"  # too far behind to tell; ignored


class SensorSequence:
    """One sensor's run of sequence numbers; :meth:`observe` returns the change in missing."""

    __slots__ = ("_last", "_mask", "_max_gap", "_seen", "_span", "_window")

    def __init__(self, *, window: int = DEFAULT_WINDOW, max_gap: int = DEFAULT_MAX_GAP) -> None:
        if not 2 <= window <= _HALF or max_gap < window:
            raise ValueError(f"need 2 <= window ({window}) <= max_gap ({max_gap})")
        self._window = window
        self._max_gap = max_gap
        self._mask = (1 << window) - 1
        self._last: int | None = None  # newest number of the run
        self._seen = 0  # bit i: number last - i arrived
        self._span = 0  # numbers of the run behind the newest that the bit set covers

    def observe(self, seq: int) -> tuple[SequenceOutcome, int]:
        """Fold in one number (0 <= seq < 2**32): its outcome and the change in missing."""
        last = self._last
        if last is None:
            return self._start(seq, SequenceOutcome.FIRST)
        ahead = (seq - last) % SEQ_MODULUS
        if ahead == 0:
            return SequenceOutcome.DUPLICATE, 0
        if ahead < _HALF:
            if ahead - 1 > self._max_gap:
                return self._start(seq, SequenceOutcome.RESET)
            self._last = seq
            self._seen = ((self._seen << ahead) | 1) & self._mask
            self._span = min(self._span + ahead, self._window - 1)
            return SequenceOutcome.NEXT, ahead - 1
        return self._behind(seq, SEQ_MODULUS - ahead)

    def _behind(self, seq: int, behind: int) -> tuple[SequenceOutcome, int]:
        """A number ``behind`` (1 .. 2**31) the newest one."""
        if behind >= self._window:
            if seq < self._window or behind > self._max_gap:
                return self._start(seq, SequenceOutcome.RESET)
            return SequenceOutcome.STALE, 0
        bit = 1 << behind
        if self._seen & bit:
            return SequenceOutcome.DUPLICATE, 0
        self._seen |= bit
        if behind <= self._span:  # skipped earlier, counted missing then
            return SequenceOutcome.LATE, -1
        # Older than the run's first number: the run really began here (its first readings
        # came reordered), and the numbers between were skipped.
        skipped = behind - self._span - 1
        self._span = behind
        return SequenceOutcome.LATE, skipped

    def _start(self, seq: int, outcome: SequenceOutcome) -> tuple[SequenceOutcome, int]:
        self._last = seq
        self._seen = 1
        self._span = 0
        return outcome, 0


class SequenceTracker:
    """``readings_missing`` and friends over every sensor that sends sequence numbers."""

    def __init__(
        self,
        *,
        window: int = DEFAULT_WINDOW,
        max_gap: int = DEFAULT_MAX_GAP,
        log_interval_s: float = _LOG_INTERVAL_S,
        max_sensors: int = DEFAULT_MAX_SENSORS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        SensorSequence(window=window, max_gap=max_gap)  # checks the arguments once
        self._window = window
        self._max_gap = max_gap
        self._log_interval_s = log_interval_s
        self._max_sensors = max_sensors
        self._clock = clock
        self.untracked = 0  # readings of sensors beyond max_sensors
        self._log = structlog.get_logger(__name__)
        self._sensors: dict[str, SensorSequence] = {}
        self.missing: Counter[str] = Counter()  # per sensor
        self._missing_forgotten = 0  # of sensors forgotten (evicted): kept in the total
        self.counts: Counter[SequenceOutcome] = Counter()
        self._unlogged_missing: Counter[str] = Counter()
        self._unlogged_resets: Counter[str] = Counter()
        self._next_log = 0.0

    def observe(self, sensor_id: str, seq: int) -> None:
        """Fold in one reading's sequence number."""
        sequence = self._sensors.get(sensor_id)
        if sequence is None:
            if len(self._sensors) >= self._max_sensors:  # bounded whatever ids arrive
                self.untracked += 1
                return
            sequence = self._sensors[sensor_id] = SensorSequence(
                window=self._window, max_gap=self._max_gap
            )
        outcome, change = sequence.observe(seq)
        self.counts[outcome] += 1
        if change:
            self.missing[sensor_id] += change
            self._unlogged_missing[sensor_id] += change
        if outcome is SequenceOutcome.RESET:
            self._unlogged_resets[sensor_id] += 1
        if (change > 0 or outcome is SequenceOutcome.RESET) and self._clock() >= self._next_log:
            self._log_now()

    def log_pending(self) -> None:
        """Log what was counted since the last log line, if the interval has passed (called
        periodically, so the end of a burst of loss is logged too)."""
        if (self._unlogged_missing or self._unlogged_resets) and self._clock() >= self._next_log:
            self._log_now()

    def missing_for(self, sensor_id: str) -> int | None:
        """Readings of this sensor never received, or None if it sends no sequence numbers."""
        if sensor_id not in self._sensors:
            return None
        return self.missing[sensor_id]

    @property
    def readings_missing(self) -> int:
        return self.missing.total() + self._missing_forgotten

    def forget(self, sensor_ids: Iterable[str]) -> None:
        """Evicted sensors: their state goes (their missing readings stay in the total)."""
        for sensor_id in sensor_ids:
            self._sensors.pop(sensor_id, None)
            self._missing_forgotten += self.missing.pop(sensor_id, 0)
            self._unlogged_missing.pop(sensor_id, None)
            self._unlogged_resets.pop(sensor_id, None)

    def stats(self) -> dict[str, object]:
        """For the stats topic: totals and the sensors missing the most readings."""
        return {
            "readings_missing": self.readings_missing,
            "readings_missing_top": {
                sensor: n for sensor, n in self.missing.most_common(_TOP) if n > 0
            },
            "sequence": {
                "sensors": len(self._sensors),
                "sensors_missing": sum(1 for n in self.missing.values() if n > 0),
                "untracked": self.untracked,
                **{outcome.value: self.counts[outcome] for outcome in SequenceOutcome},
            },
        }

    def _log_now(self) -> None:
        missing = +self._unlogged_missing  # positive counts only
        if missing or self._unlogged_resets:
            self._log.warning(
                "readings_missing",
                missing=missing.total(),
                sensors=dict(missing.most_common(_TOP)),
                resets=dict(self._unlogged_resets.most_common(_TOP)),
                readings_missing_total=self.readings_missing,
            )
        self._unlogged_missing.clear()
        self._unlogged_resets.clear()
        self._next_log = self._clock() + self._log_interval_s
