"""From closed periods to calibrated readings: one batched invoke per model per tick.

A sensor's period closes in event time, when that sensor's reading for a later period arrives,
or by the wall-clock fallback at most ``grace_s`` after the period's end (or after its last
reading, for replayed data). A tick gathers every closed period of every model, runs each model
once over all its valid windows, and returns one :class:`CalibratedReading` per (sensor, period,
feature). A window that is not valid is published with its raw value and the reason, never with a
made-up calibration; nor is an output no concentration could be (``implausible``, bounded by the
model's manifest: tesla_gateway/models/plausibility.py), nor the model's answer to a frozen
sensor's constant window (``stuck``: tesla_gateway/contract/stuck.py). With a
:class:`ClockSteps` (the daemon's), every wall-clock reading the ticker takes is checked for a
step first, and a step re-anchors the windows before the reading or the tick uses that clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import structlog

from tesla_gateway.contract.calibrated import CalibratedReading, Interval, Quality
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.stuck import STUCK_PERIODS
from tesla_gateway.contract.time_of_day import system_zone, utc_offset_for
from tesla_gateway.models.calibrator import CalibrationError, Calibrator
from tesla_gateway.models.choice import ModelRank, choose_per_sensor, model_rank
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.windows.outcome import AddOutcome
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.state import ReadyWindows, WindowState
from tesla_gateway.windows.store import WindowStore

if TYPE_CHECKING:
    from tesla_gateway.daemon.clock_steps import ClockSteps
    from tesla_gateway.ingest.clock_sanity import ClockSanity

__all__ = ["TickBatch", "Ticker", "TickerStats"]

_log = structlog.get_logger(__name__)


@dataclass(slots=True)
class TickerStats:
    """Counters for the stats topic and the status file."""

    readings_in: int = 0
    ticks: int = 0
    published: int = 0
    calibrated: int = 0
    flagged: dict[str, int] = field(default_factory=dict)
    inference_errors: int = 0
    last_inference_s: float = 0.0
    total_inference_s: float = 0.0
    last_batch: dict[str, int] = field(default_factory=dict)
    sensors_ready: dict[str, int] = field(default_factory=dict)
    last_ingest_monotonic: float = 0.0
    last_tick_monotonic: float = 0.0
    clock_steps: int = 0
    last_clock_step_s: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "readings_in": self.readings_in,
            "ticks": self.ticks,
            "published": self.published,
            "calibrated": self.calibrated,
            "flagged": dict(self.flagged),
            "inference_errors": self.inference_errors,
            "last_inference_ms": round(self.last_inference_s * 1000, 3),
            "total_inference_s": round(self.total_inference_s, 6),
            "last_batch": dict(self.last_batch),
            "sensors_ready": dict(self.sensors_ready),
            "clock_steps": self.clock_steps,
            "last_clock_step_s": round(self.last_clock_step_s, 3),
        }


@dataclass(frozen=True, slots=True)
class TickBatch:
    """One model slot's closed periods, taken off the loop to be calibrated."""

    slot: str
    feature: str
    calibrator: Calibrator | None
    ready: ReadyWindows


class Ticker:
    """Owns the window store on the event loop; calibrates off it.

    Everything else reaches the windows through the ticker: ingest, restored windows
    (:meth:`install`), snapshots (:meth:`snapshot`), admission's view and eviction
    (:meth:`last_seen`, :meth:`remove_sensors`) and the stats (:meth:`stats`).
    """

    def __init__(
        self,
        models: ModelSet,
        *,
        grace_s: float,
        clock_sanity: ClockSanity | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        clock_steps: ClockSteps | None = None,
        timezone: str | None = None,
        stuck_periods: int | None = STUCK_PERIODS,
    ) -> None:
        self.store = WindowStore(clock_sanity=clock_sanity)
        # a sensor frozen this long (its run: windows/ring.py) is published without a value
        # ([health]; None: never)
        self._stuck_periods = stuck_periods
        # the sensors' zone, for models that read the hour: named once here, not at every tick
        self._timezone = timezone or system_zone()
        self.models = models
        self.grace_s = grace_s
        self.counters = TickerStats()
        self._clock = clock
        self._monotonic = monotonic
        self._steps = clock_steps
        self.sync_models()

    def sync_models(self) -> list[str]:
        """Give every loaded model windows of its geometry; returns slots whose windows reset."""
        reset: list[str] = []
        loaded = self.models.loaded()
        for slot, calibrator in loaded.items():
            previous = self.store[slot].geometry if slot in self.store else None
            if self.store.ensure(slot, calibrator.geometry):
                reset.append(slot)
                if previous is not None:
                    _log.warning(
                        "windows_reset",
                        feature=calibrator.feature,
                        slot_id=slot,
                        reason="model geometry changed",
                        previous=_describe(previous),
                        current=_describe(calibrator.geometry),
                    )
            self.store[slot].admit_complete_only = _has_simpler_sibling(slot, calibrator, loaded)
            self.store[slot].min_history_periods = calibrator.manifest.calibrates_from
            self.store[slot].stuck_periods = self._stuck_periods
            self.store[slot].utc_offset_s = utc_offset_for(self._timezone, self._clock())
        return reset

    def ingest(self, reading: Reading) -> dict[str, AddOutcome]:
        """Add a reading to every model's windows (``arrival`` = now); the outcome per feature
        (that of the feature's first model, when it has several)."""
        self.counters.readings_in += 1
        self.counters.last_ingest_monotonic = self._monotonic()
        outcomes = self.store.add(reading, self._now())
        if self.models.one_per_feature:
            return outcomes
        by_feature: dict[str, AddOutcome] = {}
        for slot, outcome in outcomes.items():
            by_feature.setdefault(self.models.feature_of(slot), outcome)
        return by_feature

    def _now(self) -> float:
        """The wall clock, checked for a step first (which re-anchors the windows)."""
        now = self._clock()
        if self._steps is not None and (step := self._steps.observe(now)):
            moved = self.store.clock_stepped(step)
            self.counters.clock_steps += 1
            self.counters.last_clock_step_s = step
            _log.warning(
                "clock_step",
                step_s=round(step, 3),
                now=now,
                windows_re_anchored=moved,
                note="windows re-anchored: readings without a time of their own keep flowing",
            )
        return now

    def install(self, slot: str, windows: ModelWindows) -> None:
        """Adopt windows restored from a snapshot (their geometry already checked)."""
        self.store.install(slot, windows)
        self.sync_models()  # the restored windows take the slot's admission rule

    def snapshot(self) -> list[tuple[str, WindowState]]:
        """A copy of every model's restorable state, to be written off the loop."""
        return [(feature, windows.export_state()) for feature, windows in self.store.items()]

    def last_seen(self) -> dict[str, float]:
        """Per sensor, the end of the newest period it had a reading in (for admission)."""
        return self.store.last_seen()

    def remove_sensors(self, sensor_ids: Iterable[str]) -> int:
        """Forget these sensors' windows (admission's eviction); how many windows went."""
        return self.store.remove_sensors(sensor_ids)

    @property
    def sensor_windows(self) -> int:
        """Windows held, over every model."""
        return sum(len(windows.sensor_ids) for _, windows in self.store.items())

    def stats(self) -> dict[str, object]:
        """The ticker's part of the stats topic: readings in, windows per model, tick counters."""
        return {
            "readings_in": self.counters.readings_in,
            "windows": {
                slot: {
                    "feature": self._feature_of(slot),
                    "sensors": len(windows.sensor_ids),
                    "outcomes": {o.value: n for o, n in windows.counts.items()},
                    "warm_up": windows.warm_up().as_dict(),
                }
                for slot, windows in self.store.items()
            },
            "ticker": self.counters.as_dict(),
        }

    def _feature_of(self, slot: str) -> str:
        return self.models.feature_of(slot) if slot in self.models.slot_ids else slot

    @property
    def has_closed_periods(self) -> bool:
        return self.store.pending_count > 0

    def collect(self) -> list[TickBatch]:
        """Apply the wall-clock fallback and pop every closed period (on the event loop)."""
        self.sync_models()  # a model swapped in by a reload must never see old-shaped windows
        self.store.close_idle(self._now(), self.grace_s)
        batches: list[TickBatch] = []
        for slot, windows in self.store.items():
            ready = windows.ready_windows()
            if len(ready):
                batches.append(
                    TickBatch(slot, self._feature_of(slot), self.models.get(slot), ready)
                )
        return batches

    def calibrate(self, batches: list[TickBatch]) -> list[CalibratedReading]:
        """Run each model once over its valid windows (blocking: call from a thread); where a
        feature has several models, keep one reading per sensor period
        (tesla_gateway.models.choice)."""
        by_feature: dict[str, list[tuple[ModelRank, list[CalibratedReading]]]] = {}
        for batch in batches:
            by_feature.setdefault(batch.feature, []).append(
                (model_rank(batch.calibrator), self._calibrate_batch(batch))
            )
        out: list[CalibratedReading] = []
        for results in by_feature.values():
            out.extend(choose_per_sensor(results))
        return out

    async def tick(self) -> list[CalibratedReading]:
        """Collect on the loop, invoke in a worker thread, count, return the readings."""
        batches = self.collect()
        self.counters.ticks += 1
        self.counters.last_tick_monotonic = self._monotonic()
        if not batches:
            return []
        readings = await asyncio.to_thread(self.calibrate, batches)
        self.counters.published += len(readings)
        for batch in batches:
            self.counters.sensors_ready[batch.feature] = len(
                {
                    r.sensor_id
                    for r in readings
                    if r.feature == batch.feature and r.calibrated is not None
                }
            )
        for item in readings:
            if item.calibrated is not None:
                self.counters.calibrated += 1
            for flag in item.quality:
                if flag is not Quality.OK:
                    self.counters.flagged[flag.value] = self.counters.flagged.get(flag.value, 0) + 1
        return readings

    def _calibrate_batch(self, batch: TickBatch) -> list[CalibratedReading]:
        ready = batch.ready
        calibrator = batch.calibrator
        valid = ready.valid
        values = np.full(len(ready), np.nan, dtype=np.float64)
        failed = False
        if calibrator is not None and valid.any():
            started = time.perf_counter()
            try:
                # All valid is the usual case: no [B, N] copy of the windows.
                rows = ready.windows if valid.all() else ready.windows[valid]
                values[valid] = calibrator.calibrate(rows)
            except CalibrationError as exc:
                failed = True
                self.counters.inference_errors += 1
                _log.error(
                    "inference_failed", feature=batch.feature, slot_id=batch.slot, error=str(exc)
                )
            elapsed = time.perf_counter() - started
            self.counters.last_inference_s = elapsed
            self.counters.total_inference_s += elapsed
            self.counters.last_batch[batch.slot] = int(valid.sum())
        domain = _outside_domain(calibrator, ready)
        implausible = (
            np.zeros(len(ready), dtype=np.bool_)
            if calibrator is None or failed
            else calibrator.plausible.implausible(values, ready.raw) & valid
        )
        if implausible.any() and calibrator is not None:
            _log_implausible(batch, calibrator, implausible, values)
        period_seconds = (
            calibrator.geometry.period_seconds
            if calibrator is not None
            else int(self.store[batch.slot].geometry.period_seconds)
        )
        n = int(ready.windows.shape[1])  # N: [B, N] or [B, N, C]
        history = np.full(len(ready), n) if ready.history is None else ready.history
        out: list[CalibratedReading] = []
        for row, sensor_id in enumerate(ready.sensor_ids):
            intervals = (
                None if calibrator is None else calibrator.manifest.intervals_for(int(history[row]))
            )
            quality = ready.quality[row]
            calibrated: float | None = None
            if calibrator is None or failed:
                quality = (*quality, Quality.NO_MODEL)
            elif not quality:
                verdict = Quality.IMPLAUSIBLE if implausible[row] else Quality.OK
                if verdict is Quality.OK:
                    calibrated = float(values[row])
                quality = (verdict, Quality.OUT_OF_DOMAIN) if domain[row] else (verdict,)
            out.append(
                CalibratedReading(
                    sensor_id=sensor_id,
                    feature=batch.feature,
                    period_start=float(int(ready.periods[row]) * period_seconds),
                    period_seconds=period_seconds,
                    raw=float(ready.raw[row]),
                    calibrated=calibrated,
                    unit="ug/m3" if calibrator is None else calibrator.manifest.unit,
                    model_name=None if calibrator is None else calibrator.name,
                    model_version=None if calibrator is None else calibrator.version,
                    quality=quality,
                    interval=None
                    if intervals is None or calibrated is None
                    else Interval(*intervals.interval(calibrated), intervals.level),
                    history_periods=int(history[row]),
                    window_length=n,
                )
            )
        return out


def _log_implausible(
    batch: TickBatch, calibrator: Calibrator, implausible: np.ndarray, values: np.ndarray
) -> None:
    """One warning per model and tick (not per sensor): how many, and the first one's numbers
    (the published message carries no value, so this is where an operator sees it)."""
    row = int(np.flatnonzero(implausible)[0])
    raw = float(batch.ready.raw[row])
    _log.warning(
        "implausible_outputs",
        feature=batch.feature,
        slot_id=batch.slot,
        model=calibrator.name,
        version=calibrator.version,
        count=int(implausible.sum()),
        sensor=batch.ready.sensor_ids[row],
        raw=raw,
        output=float(values[row]),
        reason=calibrator.plausible.reason(float(values[row]), raw),
    )


def _outside_domain(calibrator: Calibrator | None, ready: ReadyWindows) -> np.ndarray:
    """Rows whose window leaves the training inputs' [min, max] (advisory flag)."""
    if calibrator is None or not len(ready):
        return np.zeros(len(ready), dtype=np.bool_)
    span = calibrator.manifest.input_range
    with np.errstate(invalid="ignore"):
        windows = ready.windows
        flat = windows if windows.ndim == 2 else windows[:, :, 0]  # the feature's own channel
        # fmin/fmax skip NaN (an all-NaN row gives NaN, which compares False) without the
        # [B, N] temporaries that np.where would allocate.
        low = np.fmin.reduce(flat, axis=1)
        high = np.fmax.reduce(flat, axis=1)
    return np.asarray((low < span.min) | (high > span.max), dtype=np.bool_)


def _has_simpler_sibling(slot: str, calibrator: Calibrator, loaded: dict[str, Calibrator]) -> bool:
    """Does another serving model of the same feature need only a subset of the channels
    readings bring to this one (the hour of the day is no reading: every sensor has it)?"""
    channels = set(calibrator.geometry.read_channels)
    return any(
        other != slot
        and sibling.feature == calibrator.feature
        and set(sibling.geometry.read_channels) < channels
        for other, sibling in loaded.items()
    )


def _describe(geometry: WindowGeometry) -> str:
    return (
        f"N={geometry.window_length} period={geometry.period_seconds}s "
        f"channels={','.join(geometry.channels)}"
    )
