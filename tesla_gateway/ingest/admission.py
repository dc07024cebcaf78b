"""Which sensor ids get windows: at most ``sensors.max_sensors`` at once, across restarts.

Ids come from the wire, so the number of windows must be bounded; and the bound must hold for
the windows the daemon has, not for the ids it saw this run (restored windows count too, or
every restart would admit another ``max_sensors``). A sensor's place is kept while it reports:
a flood of new ids is rejected once the gateway is full and never pushes out a sensor that is
reporting. Only a sensor idle for ``evict_idle_s`` gives its place back: its windows are dropped
from the store (and so from the next snapshot), counted and logged. Idle time runs on the
monotonic clock, so a wall-clock jump cannot make every sensor look idle at once; a restored
window starts idle from the end of its newest period.

A sensor id also belongs to one source: the first source kind to deliver it (``mqtt``,
``serial``, ``tasmota``, ...) claims it while the sensor has windows, and a reading of that id
from another kind is rejected as ``sensor_id_conflict``, so two devices that happen to share a
name never average into one window. The claim ends with the eviction; restored windows have no
claim until their first reading.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import structlog

from tesla_gateway.contract.readings import Reading, RejectReason
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.ingest.sensor_policy import SensorPolicy

__all__ = ["AdmissionStats", "SensorAdmission", "SensorWindows", "source_kind"]

_log = structlog.get_logger(__name__)


class SensorWindows(Protocol):
    """What admission needs of the windows (the Ticker, which owns them, or a bare store)."""

    def last_seen(self) -> dict[str, float]: ...

    def remove_sensors(self, sensor_ids: Iterable[str]) -> int: ...


# The source kinds whose sensor ids can take a sensor_id_prefix (the fleet kinds).
_PREFIXED_KINDS = frozenset({"tasmota", "esphome", "sensor_community", "purpleair"})
_SWEEP_EVERY_S = 60.0  # when full, look for idle sensors at most this often (a flood is cheap)
_LOGGED_IDS = 20  # sensor ids named in one eviction log line


@dataclass(slots=True)
class AdmissionStats:
    """Counters for the stats topic and the status file."""

    restored: int = 0
    admitted: int = 0
    rejected_full: int = 0
    evicted: int = 0
    conflicts: int = 0  # readings refused: their id is claimed by another source

    def as_dict(self) -> dict[str, int]:
        return {
            "restored": self.restored,
            "admitted": self.admitted,
            "rejected_full": self.rejected_full,
            "evicted": self.evicted,
            "conflicts": self.conflicts,
        }


def source_kind(source: str) -> str:
    """The kind of a reading's source: every serial port (``serial:<port>``) is one kind, so a
    node moved to another port keeps its id; two MQTT sources are one kind too."""
    return source.partition(":")[0]


class SensorAdmission:
    """Decides per reading whether its sensor may have windows; evicts idle sensors."""

    def __init__(
        self,
        policy: SensorPolicy,
        store: SensorWindows,
        rejects: RejectCounter,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_evicted: Callable[[list[str]], None] | None = None,
    ) -> None:
        self._policy = policy
        self._known = policy.admitted  # policy.allows() inlined: looked up per reading
        self._on_evicted = on_evicted  # e.g. the publisher removes their discovery configs
        self._store = store
        self._rejects = rejects
        self._clock = clock
        self._monotonic = monotonic
        self._last_seen: dict[str, float] = {}  # sensor id -> monotonic time of its last reading
        self._owner: dict[str, str] = {}  # sensor id -> the source kind that claimed it
        self._last_sweep = -float("inf")
        self.stats = AdmissionStats()

    @property
    def sensors(self) -> int:
        return len(self._last_seen)

    def adopt_windows(self) -> int:
        """Count the store's (restored) windows as admitted, then evict the idle ones.

        Returns how many sensors were new to admission. Call after windows are restored.
        """
        wall, mono = self._clock(), self._monotonic()
        adopted = 0
        for sensor_id, end in self._store.last_seen().items():
            if sensor_id not in self._last_seen:
                self._last_seen[sensor_id] = mono - max(0.0, wall - end)
                adopted += 1
        self.stats.restored += adopted
        self.evict_idle()
        return adopted

    def admit(self, reading: Reading) -> bool:
        """True if the reading's sensor may have windows; a refusal is counted as a reject."""
        sensor_id = reading.sensor_id
        known = self._known
        if known is not None and sensor_id not in known:
            self._rejects.reject(
                RejectReason.UNKNOWN_SENSOR,
                source=reading.source,
                sensor=reading.sensor_id,
                detail=f"sensor {sensor_id} is not in sensors.known",
            )
            return False
        source = reading.source
        owner = self._owner.get(sensor_id)
        # A claim holds a source kind; most sources' names are their kind ("mqtt").
        if owner is not None and owner != source and owner != source_kind(source):
            self._refuse_conflict(reading, owner, source_kind(source))
            return False
        now = self._monotonic()
        last_seen = self._last_seen
        if sensor_id in last_seen:
            last_seen[sensor_id] = now
            if owner is None:  # a restored window: the first reading claims it
                self._owner[sensor_id] = source_kind(source)
            return True
        policy = self._policy
        if len(last_seen) >= policy.max_sensors:
            if now - self._last_sweep >= min(_SWEEP_EVERY_S, policy.evict_idle_s / 4):
                self.evict_idle()
            if len(last_seen) >= policy.max_sensors:
                self.stats.rejected_full += 1
                self._rejects.reject(
                    RejectReason.UNKNOWN_SENSOR,
                    source=reading.source,
                    sensor=reading.sensor_id,
                    detail=(
                        f"new sensor {sensor_id}: sensors.max_sensors={policy.max_sensors} "
                        f"reached, none idle for evict_idle_s={policy.evict_idle_s:g}"
                    ),
                )
                return False
        last_seen[sensor_id] = now
        self._owner[sensor_id] = source_kind(source)
        self.stats.admitted += 1
        return True

    def _refuse_conflict(self, reading: Reading, owner: str, kind: str) -> None:
        self.stats.conflicts += 1
        prefixed = [name for name in (kind, owner) if name in _PREFIXED_KINDS]
        fix = (
            f"set sensor_id_prefix on the {prefixed[0]} source"
            if prefixed
            else "rename one of the two devices"
        )
        self._rejects.reject(
            RejectReason.SENSOR_ID_CONFLICT,
            source=reading.source,
            sensor=reading.sensor_id,
            detail=(
                f"sensor {reading.sensor_id} reports through {owner}; a reading of the same id "
                f"from {kind} is refused (a sensor id belongs to one source): {fix}"
            ),
        )

    def evict_idle(self) -> list[str]:
        """Drop every sensor without a reading for ``evict_idle_s``; the ids dropped."""
        now = self._monotonic()
        self._last_sweep = now
        limit = self._policy.evict_idle_s
        idle = [s for s, seen in self._last_seen.items() if now - seen > limit]
        if not idle:
            return []
        for sensor_id in idle:
            del self._last_seen[sensor_id]
            self._owner.pop(sensor_id, None)
        windows = self._store.remove_sensors(idle)
        self.stats.evicted += len(idle)
        _log.info(
            "sensors_evicted",
            count=len(idle),
            windows=windows,
            idle_for_s=limit,
            sensors=sorted(idle)[:_LOGGED_IDS],
            remaining=len(self._last_seen),
        )
        if self._on_evicted is not None:
            self._on_evicted(idle)
        return idle

    def forget(self, sensor_ids: Iterable[str]) -> None:
        """Another gateway calibrates these sensors now (cluster mode): no longer admitted here,
        and not evicted later either (their windows are already gone)."""
        for sensor_id in sensor_ids:
            self._last_seen.pop(sensor_id, None)
            self._owner.pop(sensor_id, None)

    def idle_seconds(self) -> dict[str, float]:
        """Per admitted sensor, seconds since its last reading (the publisher's availability)."""
        now = self._monotonic()
        return {sensor_id: now - seen for sensor_id, seen in self._last_seen.items()}

    def last_reading_times(self) -> dict[str, float]:
        """Per admitted sensor, the Unix time of its last reading (for staleness alerts).

        The time since the reading is measured on the monotonic clock and taken from the wall
        clock of the call, so ``now - time`` is that reading's true age even when the wall clock
        stepped in between (a time stamped at the reading would carry the step). A restored
        window's is the end of its newest period.
        """
        wall, now = self._clock(), self._monotonic()
        return {sensor_id: wall - (now - seen) for sensor_id, seen in self._last_seen.items()}

    def snapshot(self) -> dict[str, object]:
        """JSON-ready state for the stats topic."""
        return {
            "sensors": len(self._last_seen),
            "max_sensors": self._policy.max_sensors,
            "evict_idle_s": self._policy.evict_idle_s,
            **self.stats.as_dict(),
        }
