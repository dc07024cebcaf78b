"""Health, reference pairs and drift for the service: fed by the tick, read by the publisher.

The :class:`Monitor` sits after the ticker in the one-way flow (source -> window -> tick ->
monitor -> publisher) and never reaches back. The service calls it on the event loop:

* :meth:`Monitor.observe_reading` for each ingested reading (its sequence number, if any, for
  ``readings_missing``; only co-located sensors' covariates are kept);
* :meth:`Monitor.observe_reference` for each reading of a reference station;
* :meth:`Monitor.observe_tick` with each tick's calibrated readings (O(1) per reading);
* :meth:`Monitor.poll` on every tick-loop pass (reference periods' wall-clock fallback, the
  periodic health publication).

It returns :class:`SensorDocument` s for the health and drift topics (docs/mqtt.md), appends the
pairs to the dataset (:mod:`tesla_gateway.monitor.pairs`) and logs drift events.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from tesla_gateway.contract.calibrated import CalibratedReading
from tesla_gateway.contract.manifest import InputRange, PredictionIntervals
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.timefmt import iso8601
from tesla_gateway.ingest.sequence import SequenceTracker
from tesla_gateway.monitor.coverage import AdaptiveInterval, observe_interval
from tesla_gateway.monitor.drift import (
    DriftChange,
    DriftConfig,
    DriftDetector,
    ErrorFigures,
    HarmDetector,
    RollingError,
    drift_threshold,
)
from tesla_gateway.monitor.health import HealthConfig, HealthFlag, SensorHealth
from tesla_gateway.monitor.pairs import PAIRS_DIRNAME, PairsConfig, PairsWriter
from tesla_gateway.monitor.references import Pair, ReferenceConfig, ReferencePairing
from tesla_gateway.windows.outcome import AddOutcome

__all__ = ["ModelInfo", "Monitor", "SensorDocument"]

_log = structlog.get_logger(__name__)
_KEPT = (AddOutcome.ACCEPTED, AddOutcome.IRRELEVANT)  # not a duplicate, not late


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the monitor needs from the model in service for a feature (its manifest)."""

    name: str
    version: int
    period_seconds: int
    input_range: InputRange
    test_rmse: float | None
    # the model's intervals by history length (Manifest.intervals_for): their quantile table
    # lets a co-located sensor's adapted interval follow the model's bins (monitor/coverage.py)
    intervals_for: Callable[[int], PredictionIntervals | None] | None = None


@dataclass(frozen=True, slots=True)
class SensorDocument:
    """A retained JSON document for ``<prefix>/<sensor_id>/<feature>/<kind>``."""

    kind: Literal["health", "drift"]
    sensor_id: str
    feature: str
    document: Mapping[str, object]


@dataclass(slots=True)
class _Tracked:
    """Rolling error and drift state of one co-located (sensor, feature)."""

    reference: str
    errors: RollingError
    detector: DriftDetector
    harm: HarmDetector
    model_version: int | None = None
    threshold: float | None = None
    coverage: AdaptiveInterval | None = None  # from its first pair with an interval


def _figure(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


class Monitor:
    """Per-sensor health, reference pairs, rolling error and drift (see the module doc)."""

    def __init__(
        self,
        *,
        health: HealthConfig,
        drift: DriftConfig,
        pairs: PairsConfig,
        references: Sequence[ReferenceConfig],
        state_dir: Path,
        model_info: Callable[[str], ModelInfo | None],
        now: float,
    ) -> None:
        self._health_config = health
        self._drift_config = drift
        self._pairs_config = pairs
        self._model_info = model_info
        self._health: dict[tuple[str, str], SensorHealth] = {}
        self._published: dict[tuple[str, str], tuple[HealthFlag, ...]] = {}
        # The model that calibrated each sensor's latest period: with several models for a
        # feature (tesla_gateway.models.choice) it depends on the channels the sensor supplies.
        self._served: dict[tuple[str, str], tuple[str, int | None]] = {}
        self._flag_counts: Counter[str] = Counter()
        self._dirty: set[tuple[str, str]] = set()
        self._next_health = now + health.publish_interval_s
        self._pairings = {
            ref.name: ReferencePairing(ref, max_pending_periods=pairs.max_pending_periods)
            for ref in references
        }
        self._by_sensor: dict[tuple[str, str], ReferencePairing] = {}
        for pairing in self._pairings.values():
            for sensor_id in pairing.sensors:
                self._by_sensor[sensor_id, pairing.config.feature] = pairing
        self._colocated = frozenset(sensor for sensor, _ in self._by_sensor)
        self._tracked: dict[tuple[str, str], _Tracked] = {}
        self._writers: dict[str, PairsWriter] = {}
        self._pairs_dir = state_dir / PAIRS_DIRNAME
        self.reference_readings: Counter[str] = Counter()
        self.reference_ignored: Counter[str] = Counter()
        self.sequences = SequenceTracker()

    # -- inputs -----------------------------------------------------------------------------

    def observe_reading(self, reading: Reading, outcomes: Mapping[str, AddOutcome]) -> None:
        """Count skipped sequence numbers; keep a co-located sensor's covariates (rh, temp_c)."""
        if reading.seq is not None:
            self.sequences.observe(reading.sensor_id, reading.seq)
        if reading.sensor_id not in self._colocated:
            return
        for feature, outcome in outcomes.items():
            pairing = self._by_sensor.get((reading.sensor_id, feature))
            if pairing is None or outcome not in _KEPT:
                continue
            info = self._model_info(feature)
            if info is not None:
                pairing.observe_covariates(reading, info.period_seconds)

    def observe_reference(self, name: str, reading: Reading, now: float) -> list[SensorDocument]:
        """A reading of reference ``name``; returns drift documents of the pairs it completed."""
        pairing = self._pairings[name]
        info = self._model_info(pairing.config.feature)
        if info is None:
            self.reference_ignored[name] += 1  # no model yet: no grid to average onto
            return []
        self.reference_readings[name] += 1
        return self._record(pairing.observe_reference(reading, info.period_seconds, now), now)

    def observe_tick(
        self, readings: Iterable[CalibratedReading], now: float
    ) -> list[SensorDocument]:
        """Fold a tick's readings into health and pairs; documents to publish now."""
        out: list[SensorDocument] = []
        pairs: list[Pair] = []
        infos: dict[str, ModelInfo | None] = {}
        enabled = self._health_config.enabled
        for reading in readings:
            key = (reading.sensor_id, reading.feature)
            if reading.feature not in infos:
                infos[reading.feature] = self._model_info(reading.feature)
            info = infos[reading.feature]
            if reading.calibrated is not None and reading.model_name is not None:
                self._served[key] = (reading.model_name, reading.model_version)
            if enabled:
                tracker = self._health.get(key)
                if tracker is None:
                    tracker = self._health[key] = SensorHealth(self._health_config)
                period = round(reading.period_start / reading.period_seconds)
                input_range = None if info is None else info.input_range
                tracker.update(period, reading.raw, reading.quality, input_range, now)
                self._dirty.add(key)
                document = self._health_if_changed(key, tracker, input_range, now)
                if document is not None:
                    out.append(document)
            pairing = self._by_sensor.get(key)
            if pairing is not None:
                pairs.extend(pairing.observe_sensor(reading))
        out.extend(self._record(pairs, now))
        return out

    def poll(self, now: float) -> list[SensorDocument]:
        """Close idle reference periods; publish health when its interval has come."""
        self.sequences.log_pending()
        pairs: list[Pair] = []
        for pairing in self._pairings.values():
            pairs.extend(pairing.close_idle(now, self._pairs_config.reference_grace_s))
        out = self._record(pairs, now)
        if self._health_config.enabled and now >= self._next_health:
            self._next_health = now + self._health_config.publish_interval_s
            for key, tracker in self._health.items():
                info = self._model_info(key[1])
                input_range = None if info is None else info.input_range
                if key in self._dirty:
                    out.append(self._health_document(key, tracker, input_range, now))
                else:  # no new period: publish only if a flag changed (e.g. offline)
                    document = self._health_if_changed(key, tracker, input_range, now)
                    if document is not None:
                        out.append(document)
            self._dirty.clear()
        return out

    def forget_sensors(self, sensor_ids: Iterable[str]) -> None:
        """Evicted sensors (admission): their health and sequence state go, so a churn of
        sensor ids over the years costs no memory. Co-located sensors keep their reference
        state (configured, so bounded)."""
        gone = set(sensor_ids)
        if not gone:
            return
        self.sequences.forget(gone)
        for key in [key for key in self._health if key[0] in gone]:
            del self._health[key]
            self._dirty.discard(key)
            self._served.pop(key, None)
            self._flag_counts.subtract(flag.value for flag in self._published.pop(key, ()))

    def close(self) -> None:
        """Flush and fsync the pair files (at shutdown)."""
        for writer in self._writers.values():
            writer.close()

    # -- health -----------------------------------------------------------------------------

    def _flags(
        self,
        key: tuple[str, str],
        tracker: SensorHealth,
        input_range: InputRange | None,
        now: float,
    ) -> tuple[HealthFlag, ...]:
        flags = tracker.report(input_range, now).flags
        tracked = self._tracked.get(key)
        if tracked is not None and tracked.detector.active:
            flags = (*flags, HealthFlag.DRIFT)
        if tracked is not None and tracked.harm.active:
            flags = (*flags, HealthFlag.HARM)
        return flags

    def _health_if_changed(
        self,
        key: tuple[str, str],
        tracker: SensorHealth,
        input_range: InputRange | None,
        now: float,
    ) -> SensorDocument | None:
        flags = self._flags(key, tracker, input_range, now)
        if flags == self._published.get(key, ()):
            return None
        return self._health_document(key, tracker, input_range, now)

    def _health_document(
        self,
        key: tuple[str, str],
        tracker: SensorHealth,
        input_range: InputRange | None,
        now: float,
    ) -> SensorDocument:
        sensor_id, feature = key
        report = tracker.report(input_range, now)
        flags = self._flags(key, tracker, input_range, now)
        self._flag_counts.subtract(flag.value for flag in self._published.get(key, ()))
        self._flag_counts.update(flag.value for flag in flags)
        self._published[key] = flags
        self._dirty.discard(key)
        info = self._model_info(feature)
        period_seconds = info.period_seconds if info is not None else None
        last = report.last_period
        document: dict[str, object] = {
            "ts": iso8601(now),
            "sensor": sensor_id,
            "feature": feature,
            "ok": not flags,
            "flags": [flag.value for flag in flags],
            "last_period_start": (
                None if last is None or period_seconds is None else iso8601(last * period_seconds)
            ),
            **report.figures(),
            "readings_missing": self.sequences.missing_for(sensor_id),
            "training_range": None
            if input_range is None
            else {"p01": input_range.p01, "p99": input_range.p99, "max": input_range.max},
        }
        served = self._served.get(key)
        if served is not None:
            document["model"], document["model_version"] = served
        else:
            document["model"] = None if info is None else info.name
            document["model_version"] = None if info is None else info.version
        tracked = self._tracked.get(key)
        if tracked is not None:
            document["reference"] = self._reference_figures(tracked)
        return SensorDocument("health", sensor_id, feature, document)

    # -- pairs and drift --------------------------------------------------------------------

    def _record(self, pairs: Sequence[Pair], now: float) -> list[SensorDocument]:
        if not pairs:
            return []
        by_feature: dict[str, list[Pair]] = {}
        for pair in pairs:
            by_feature.setdefault(pair.reading.feature, []).append(pair)
        out: list[SensorDocument] = []
        for feature, group in by_feature.items():
            self._writer(feature).append([pair.row for pair in group])
            info = self._model_info(feature)
            for pair in group:
                document = self._track(pair, info, now)
                if document is not None:
                    out.append(document)
        return out

    def _writer(self, feature: str) -> PairsWriter:
        writer = self._writers.get(feature)
        if writer is None:
            writer = self._writers[feature] = PairsWriter(
                self._pairs_dir / feature, max_file_bytes=self._pairs_config.max_file_bytes
            )
        return writer

    def _track(self, pair: Pair, info: ModelInfo | None, now: float) -> SensorDocument | None:
        reading = pair.reading
        if reading.calibrated is None:
            return None  # no calibration to judge (warm-up, gap, missing channel, no model)
        key = (reading.sensor_id, reading.feature)
        tracked = self._tracked.get(key)
        if tracked is None:
            pairing = self._by_sensor[key]
            tracked = self._tracked[key] = _Tracked(
                reference=pairing.config.name,
                errors=RollingError(self._drift_config.window_pairs),
                detector=DriftDetector(self._drift_config),
                harm=HarmDetector(self._drift_config),
            )
        if tracked.model_version != reading.model_version:
            if tracked.model_version is not None:
                _log.info(
                    "rolling_error_reset",
                    sensor=reading.sensor_id,
                    feature=reading.feature,
                    reason="model changed",
                    previous_version=tracked.model_version,
                    version=reading.model_version,
                )
            tracked.errors.reset()
            if tracked.coverage is not None:
                tracked.coverage.reset()
            tracked.model_version = reading.model_version
        tracked.errors.add(reading.calibrated, pair.row.raw, pair.row.reference)
        self._track_coverage(tracked, reading, pair.row.reference, info)
        figures = tracked.errors.figures()
        test_rmse = info.test_rmse if info is not None else None
        tracked.threshold = drift_threshold(self._drift_config, test_rmse)
        self._judge_harm(tracked, figures, reading)
        change = tracked.detector.evaluate(figures, tracked.threshold)
        if change is None:
            return None
        context = {
            "sensor": reading.sensor_id,
            "feature": reading.feature,
            "reference": tracked.reference,
            "threshold": _figure(tracked.threshold),
            "model_version": reading.model_version,
            **figures.as_dict(),
        }
        if change is DriftChange.RAISED:
            _log.warning("drift_detected", **context)
        elif change is DriftChange.CLEARED:
            _log.info("drift_cleared", **context)
        return SensorDocument(
            "drift",
            reading.sensor_id,
            reading.feature,
            self._drift_document(tracked, figures, reading, change, now),
        )

    def _track_coverage(
        self,
        tracked: _Tracked,
        reading: CalibratedReading,
        reference: float,
        info: ModelInfo | None,
    ) -> None:
        """Score the published interval and step the sensor's adapted one (ACI)."""
        table = None  # the serving model's quantile table, when it is the feature's primary
        if info is not None and info.intervals_for is not None and reading.model_name == info.name:
            table = info.intervals_for(reading.history_periods or 2**31)
        tracked.coverage = observe_interval(
            tracked.coverage, reading, reference, table, self._drift_config
        )

    def _judge_harm(
        self, tracked: _Tracked, figures: ErrorFigures, reading: CalibratedReading
    ) -> None:
        """Log a change of the harm flag (health carries it: see :meth:`_flags`)."""
        change = tracked.harm.evaluate(figures)
        if change is None:
            return
        context = {
            "sensor": reading.sensor_id,
            "feature": reading.feature,
            "reference": tracked.reference,
            "model": reading.model_name,
            "model_version": reading.model_version,
            **figures.as_dict(),
        }
        if change is DriftChange.RAISED:
            _log.warning(
                "model_harm_detected", worse_than=tracked.harm.worse_than(figures), **context
            )
        else:
            _log.info("model_harm_cleared", **context)

    def _drift_document(
        self,
        tracked: _Tracked,
        figures: ErrorFigures,
        reading: CalibratedReading,
        change: DriftChange,
        now: float,
    ) -> dict[str, object]:
        threshold = tracked.threshold
        return {
            "ts": iso8601(now),
            "sensor": reading.sensor_id,
            "feature": reading.feature,
            "reference": tracked.reference,
            "drift": tracked.detector.active,
            "change": change.value,
            "period_start": iso8601(reading.period_start),
            **figures.as_dict(),
            "threshold": _figure(threshold),
            "clear_below": _figure(
                None if threshold is None else threshold * self._drift_config.clear_fraction
            ),
            "harm": tracked.harm.active,
            "model": reading.model_name,
            "model_version": reading.model_version,
        }

    def _reference_figures(self, tracked: _Tracked) -> dict[str, object]:
        return {
            "name": tracked.reference,
            **tracked.errors.figures().as_dict(),
            "threshold": _figure(tracked.threshold),
            "drift": tracked.detector.active,
            "harm": tracked.harm.active,
            **self._interval_figures(tracked),
        }

    @staticmethod
    def _interval_figures(tracked: _Tracked) -> dict[str, object]:
        coverage = tracked.coverage
        return {} if coverage is None else {"intervals": coverage.figures().as_dict()}

    # -- reporting --------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        """Counters for the stats topic and status.json."""
        return {
            **self.sequences.stats(),
            "health": {
                "tracked": len(self._health),
                "flagged": {flag: n for flag, n in sorted(self._flag_counts.items()) if n > 0},
            },
            "references": {
                name: {
                    "readings": self.reference_readings[name],
                    "ignored_no_model": self.reference_ignored[name],
                    "late": 0 if pairing.grid is None else pairing.grid.late,
                    "duplicates": 0 if pairing.grid is None else pairing.grid.duplicates,
                    "paired": pairing.paired,
                    "unpaired": pairing.unpaired,
                    "expired": pairing.expired,
                }
                for name, pairing in self._pairings.items()
            },
            "drift": {
                f"{sensor}/{feature}": {
                    "drift": tracked.detector.active,
                    "harm": tracked.harm.active,
                    **tracked.errors.figures().as_dict(),
                    **self._interval_figures(tracked),
                }
                for (sensor, feature), tracked in self._tracked.items()
            },
            "pairs": {feature: writer.stats() for feature, writer in self._writers.items()},
        }
