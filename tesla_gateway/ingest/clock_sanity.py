"""One reading with a fast clock must not move a sensor's window into the future.

Windows close a sensor's period in event time: a reading for a later period closes the open
one. A single reading stamped minutes ahead (a node whose clock jumped, within the source's
``max_future_s``) therefore closed the sensor's period early, made every true reading after it
``late`` (dropped) and, when the clock caught up, filled the periods between with an
interpolated ramp that fed the model for N periods.

The rule: a reading for a period the gateway clock has not reached yet, later than any period
the sensor has, is *held* (one per sensor and model), not added. It is added when the sensor's
next reading is for the same period or a later one (the sensor's clock is consistently ahead,
or the gateway's is behind: its readings go in one reading late), or when the gateway clock
reaches its period. It is dropped, counted and logged as ``clock_outlier`` when the next reading
is for an earlier period and the window takes it: that reading contradicts it. A reading the
window refuses (``late``: its period is already closed, a redelivery after a reconnect or a
cluster takeover; a duplicate; none of the model's channels) says nothing of the held one, which
stays held; so does any earlier reading when the held one was at most :data:`EARLY_S` ahead (a
clock that close has not jumped: a redelivery of an earlier reading comes after it, and the
held one goes in when confirmed or when the clock reaches its period). So the window never
runs ahead of the gateway clock on the word of one reading, and after an outlier it holds only
true readings.
Readings that are late all the same (out of order, redelivered after their period closed) are
counted as the ``late`` reject and logged with the sensor. A held reading lives in memory only;
a restart forgets it (it is at most one reading per sensor, and its time is doubtful).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from tesla_gateway.contract.readings import Reading, RejectReason
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.windows.outcome import AddOutcome
from tesla_gateway.windows.ring import ModelWindows

__all__ = ["ClockSanity"]

_Key = tuple[str, str]  # (feature, sensor id)
_LATE = AddOutcome.LATE  # (an enum member looked up once: on 3.11 each lookup costs ~0.1 µs)
EARLY_S = 10.0  # a reading held at most this far ahead of the gateway clock is early, not wrong


class ClockSanity:
    """Holds readings ahead of the gateway clock until confirmed; counts late ones as rejects."""

    def __init__(self, rejects: RejectCounter) -> None:
        self._rejects = rejects
        self._held: dict[_Key, tuple[Reading, float]] = {}
        # readings counted as clock_outlier once and still held by another model's windows
        # (PM in one message, rh in the next refute them one model at a time): ids, pruned
        # as soon as no window holds the reading
        self._counted: set[int] = set()

    @property
    def held(self) -> int:
        return len(self._held)

    def add(
        self, models: Mapping[str, ModelWindows], reading: Reading, arrival: float
    ) -> dict[str, AddOutcome]:
        """Feed one reading (``arrival``: the gateway clock) to every model's windows."""
        outcomes: dict[str, AddOutcome] = {}
        refuted: list[str] = []
        held: tuple[Reading, float] | None = None
        for feature, model in models.items():
            key = (feature, reading.sensor_id)
            earlier = self._confirm(key, model, reading) if self._held else None
            if model.would_run_ahead(reading, arrival):
                self._held[key] = (reading, arrival)
                outcomes[feature] = model.note(AddOutcome.HELD)
            else:
                outcomes[feature] = model.add(reading, arrival)
                if earlier is not None and (
                    outcomes[feature] is not AddOutcome.ACCEPTED
                    or earlier[0].timestamp - earlier[1] <= EARLY_S
                ):
                    self._held[key] = earlier  # it says nothing of the held one
                    earlier = None
            if earlier is not None:
                model.note(AddOutcome.CLOCK_OUTLIER)
                refuted.append(feature)
                held = earlier
        if held is not None:  # one reject per reading, whatever number of windows held it
            if id(held[0]) not in self._counted:
                self._reject_outlier(held, reading, refuted)
            self._counted.add(id(held[0]))
            self._prune(held[0])
        if _LATE in outcomes.values():  # (a test per reading: the usual answer is no)
            late = [feature for feature, outcome in outcomes.items() if outcome is _LATE]
            self._rejects.reject(
                RejectReason.LATE,
                source=reading.source,
                sensor=reading.sensor_id,
                detail=(
                    f"sensor {reading.sensor_id}: reading at {reading.timestamp:.0f} is for a "
                    f"period already closed in its {', '.join(late)} window"
                ),
            )
        return outcomes

    def release_due(self, models: Mapping[str, ModelWindows], now: float) -> int:
        """Add the held readings whose period the gateway clock has reached; how many."""
        if not self._held:
            return 0
        released = 0
        for key, (reading, arrival) in list(self._held.items()):
            model = models.get(key[0])
            if model is None:
                del self._held[key]
                continue
            period_seconds = model.geometry.period_seconds
            if model.period_of(reading) <= math.floor(now / period_seconds):
                del self._held[key]
                model.add(reading, arrival)
                released += 1
                self._prune(reading)
        return released

    def forget_feature(self, feature: str) -> None:
        """The feature's windows were replaced or dropped: its held readings go with them."""
        for key in [key for key in self._held if key[0] == feature]:
            self._prune(self._held.pop(key)[0])

    def forget_sensors(self, sensor_ids: Iterable[str]) -> None:
        gone = set(sensor_ids)
        for key in [key for key in self._held if key[1] in gone]:
            self._prune(self._held.pop(key)[0])

    def clock_stepped(self, step_s: float) -> None:
        """The gateway clock stepped: a held reading's arrival moves with it (it becomes the
        window's arrival once added); the reading's own time stays."""
        for key, (reading, arrival) in self._held.items():
            self._held[key] = (reading, arrival + step_s)

    def _confirm(
        self, key: _Key, model: ModelWindows, reading: Reading
    ) -> tuple[Reading, float] | None:
        """The sensor's next reading confirms a held one when it is for the same period or a
        later one (the held reading is added); otherwise the held reading is returned, taken out,
        for the caller to judge by whether the window takes the new one."""
        entry = self._held.pop(key, None)
        if entry is None:
            return None
        held, held_arrival = entry
        if model.period_of(reading) >= model.period_of(held):
            model.add(held, held_arrival)
            self._prune(held)
            return None
        return entry

    def _prune(self, reading: Reading) -> None:
        """Forget that ``reading`` was counted once no window holds it any more (so the id of
        a later reading can never be taken for it)."""
        if id(reading) in self._counted and not any(
            entry[0] is reading for entry in self._held.values()
        ):
            self._counted.discard(id(reading))

    def _reject_outlier(
        self, entry: tuple[Reading, float], reading: Reading, windows: list[str]
    ) -> None:
        held, held_arrival = entry
        self._rejects.reject(
            RejectReason.CLOCK_OUTLIER,
            source=held.source,
            sensor=held.sensor_id,
            detail=(
                f"sensor {held.sensor_id}: reading at {held.timestamp:.0f} was "
                f"{held.timestamp - held_arrival:.0f} s ahead of the gateway clock and its next "
                f"reading ({reading.timestamp:.0f}) is earlier; dropped from its "
                f"{', '.join(windows)} window{'s' if len(windows) > 1 else ''}"
            ),
        )
