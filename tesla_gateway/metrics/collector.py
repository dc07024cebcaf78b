"""The stats snapshot as Prometheus metric families, named by Prometheus' conventions.

Every series comes from the same snapshot the stats topic publishes (the service's
``_stats()`` plus the publisher's counters), read when Prometheus scrapes, on the event loop.
Labels are bounded: reject reasons, features, window outcomes, health flags, MQTT sources and
co-located sensors (a handful each). Series per sensor id come from the daemon's own records,
not the snapshot (10,000 sensors would make it 10,000 entries long), and only when asked:
``last_readings`` (one series per sensor, ``sensor_staleness``) and ``sensor_values`` (up to two
per sensor and feature, ``sensor_gauges``); admission bounds both by ``max_sensors``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tesla_gateway.metrics.coverage import interval_families
from tesla_gateway.metrics.sensor_values import SensorValue

__all__ = ["PREFIX", "StatsCollector"]

PREFIX = "tesla_gateway"

Snapshot = Mapping[str, object]


def _map(document: object, *path: str) -> Mapping[str, object]:
    for key in path:
        if not isinstance(document, Mapping):
            return {}
        document = document.get(key)
    return document if isinstance(document, Mapping) else {}


def _num(document: object, *path: str) -> float | None:
    *parents, last = path
    value = _map(document, *parents).get(last)
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, int | float) else None


class StatsCollector(Collector):
    """Builds the metric families from a fresh snapshot at every scrape."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        *,
        last_readings: Callable[[], Mapping[str, float]] | None = None,
        sensor_values: Callable[[], Mapping[tuple[str, str], SensorValue]] | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._last_readings = last_readings
        self._sensor_values = sensor_values

    def collect(self) -> Iterator[Metric]:
        stats = self._snapshot()
        yield from self._gateway(stats)
        yield from self._ingest(stats)
        yield from self._models(stats)
        yield from self._latency(stats)
        yield from self._publisher(stats)
        yield from self._sources(stats)
        yield from self._sessions(stats)
        yield from self._monitor(stats)
        if self._last_readings is not None:
            yield _last_readings(self._last_readings())
        if self._sensor_values is not None:
            yield from _sensor_values(self._sensor_values())

    # -- families --------------------------------------------------------------------------

    @staticmethod
    def _gateway(stats: Snapshot) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            f"{PREFIX}_info",
            "The gateway's id and version (always 1).",
            labels=["gateway_id", "version"],
        )
        info.add_metric([str(stats.get("gateway_id", "")), str(stats.get("version", ""))], 1)
        yield info
        yield _gauge("uptime_seconds", "Seconds since the daemon started.", _num(stats, "uptime_s"))

    @staticmethod
    def _ingest(stats: Snapshot) -> Iterator[Metric]:
        yield _counter(
            "readings", "Readings admitted into the windows.", _num(stats, "readings_in")
        )
        rejected = CounterMetricFamily(
            f"{PREFIX}_rejected", "Readings rejected, by reason.", labels=["reason"]
        )
        for reason, count in sorted(_map(stats, "rejected", "by_reason").items()):
            if isinstance(count, int):
                rejected.add_metric([reason], count)
        yield rejected
        yield _counter(
            "readings_missing",
            "Sequence numbers sensors skipped (readings that never arrived).",
            _num(stats, "readings_missing"),
        )
        admission = _map(stats, "admission")
        yield _gauge("sensors", "Sensors with windows now.", _num(admission, "sensors"))
        yield _gauge("sensors_max", "sensors.max_sensors.", _num(admission, "max_sensors"))
        for key, help_text in (
            ("admitted", "New sensor ids admitted."),
            ("evicted", "Sensors evicted after evict_idle_s without a reading."),
            ("rejected_full", "Readings of new sensor ids refused at max_sensors."),
        ):
            yield _counter(f"sensors_{key}", help_text, _num(admission, key))
        windows = GaugeMetricFamily(
            f"{PREFIX}_windows",
            "Sensor windows held, per feature and model slot.",
            labels=["feature", "slot"],
        )
        outcomes = CounterMetricFamily(
            f"{PREFIX}_window_outcomes",
            "What happened to readings at the windows, per feature, model slot and outcome.",
            labels=["feature", "slot", "outcome"],
        )
        for slot, document in sorted(_map(stats, "windows").items()):
            feature = str(_map(document).get("feature", slot))
            sensors = _num(document, "sensors")
            if sensors is not None:
                windows.add_metric([feature, slot], sensors)
            for outcome, count in sorted(_map(document, "outcomes").items()):
                if isinstance(count, int):
                    outcomes.add_metric([feature, slot, outcome], count)
        yield windows
        yield outcomes

    @staticmethod
    def _models(stats: Snapshot) -> Iterator[Metric]:
        ticker = _map(stats, "ticker")
        yield _counter("ticks", "Ticks run (batched invokes).", _num(ticker, "ticks"))
        yield _counter(
            "calibrated_readings",
            "Readings out of the ticks (one per sensor and closed period).",
            _num(ticker, "published"),
        )
        yield _counter(
            "calibrated_values",
            "Of those, readings with a calibrated value.",
            _num(ticker, "calibrated"),
        )
        yield _counter(
            "inference_seconds",
            "Time spent in model invokes.",
            _num(ticker, "total_inference_s"),
        )
        last_ms = _num(ticker, "last_inference_ms")
        yield _gauge(
            "last_inference_seconds",
            "Duration of the last tick's invokes.",
            None if last_ms is None else last_ms / 1000,
        )
        yield _counter("inference_errors", "Invokes that failed.", _num(ticker, "inference_errors"))
        flagged = CounterMetricFamily(
            f"{PREFIX}_readings_flagged",
            "Readings out of the ticks carrying each quality flag other than ok "
            "(e.g. implausible: a model output withheld).",
            labels=["quality"],
        )
        for quality, count in sorted(_map(ticker, "flagged").items()):
            if isinstance(count, int):
                flagged.add_metric([quality], count)
        yield flagged
        ready = GaugeMetricFamily(
            f"{PREFIX}_sensors_ready",
            "Sensors whose window is full enough to calibrate, per feature.",
            labels=["feature"],
        )
        for feature, count in sorted(_map(ticker, "sensors_ready").items()):
            if isinstance(count, int):
                ready.add_metric([feature], count)
        yield ready
        loaded = GaugeMetricFamily(
            f"{PREFIX}_model_loaded",
            "1 if a model serves the slot, 0 if it runs degraded.",
            labels=["feature", "slot"],
        )
        info = GaugeMetricFamily(
            f"{PREFIX}_model_info",
            "The model serving each slot (always 1).",
            labels=["feature", "slot", "model", "version", "runtime"],
        )
        reloads = CounterMetricFamily(
            f"{PREFIX}_model_reloads", "Models loaded, per slot.", labels=["feature", "slot"]
        )
        for slot, document in sorted(_map(stats, "models").items()):
            feature = str(_map(document).get("feature", slot))
            model = _map(document).get("model")
            loaded.add_metric([feature, slot], 0 if model is None else 1)
            if model is not None:
                version, runtime = _map(document).get("version"), _map(document).get("runtime")
                info.add_metric([feature, slot, str(model), str(version), str(runtime)], 1)
            count = _num(document, "reloads")
            if count is not None:
                reloads.add_metric([feature, slot], count)
        yield loaded
        yield info
        yield reloads

    @staticmethod
    def _latency(stats: Snapshot) -> Iterator[Metric]:
        """The hand-off latency histogram (tesla_gateway/metrics/latency.py) from its counts."""
        latency = _map(stats, "handoff_latency")
        bounds, cumulative = latency.get("buckets_s"), latency.get("cumulative")
        count, total = _num(latency, "count"), _num(latency, "sum_s")
        family = HistogramMetricFamily(
            f"{PREFIX}_handoff_latency_seconds",
            "Seconds from the end of a reading's period to its calibrated reading queued in the "
            "outbox (handed to the publisher), per calibrated reading.",
            labels=[],
        )
        if (
            isinstance(bounds, list)
            and isinstance(cumulative, list)
            and len(bounds) == len(cumulative)
            and count is not None
        ):
            buckets = [
                (repr(float(bound)), float(n))  # le as Python writes it: 0.05, 60.0
                for bound, n in zip(bounds, cumulative, strict=True)
                if isinstance(bound, int | float) and isinstance(n, int)
            ]
            family.add_metric([], [*buckets, ("+Inf", count)], total)
        yield family

    @staticmethod
    def _publisher(stats: Snapshot) -> Iterator[Metric]:
        publisher = _map(stats, "publisher")
        yield _gauge(
            "publisher_connected",
            "1 while the publisher is connected to its broker.",
            _num(publisher, "connected"),
        )
        yield _gauge("outbox_messages", "Messages queued for delivery.", _num(publisher, "queued"))
        yield _counter(
            "published_messages",
            "Messages the broker acknowledged (this run).",
            _num(publisher, "published"),
        )
        yield _counter(
            "outbox_dropped",
            "Oldest messages dropped at outbox_max_messages (persisted total).",
            _num(publisher, "dropped_total"),
        )
        yield _counter(
            "publish_refused",
            "Messages the broker refused for good (e.g. an ACL).",
            _num(publisher, "refused"),
        )
        yield _gauge(
            "sensors_online",
            "Sensors online on their availability topic.",
            _num(publisher, "sensors_online"),
        )
        yield _counter(
            "publish_failures",
            "Readings and documents that could not be queued.",
            _num(stats, "publish_failures"),
        )

    @staticmethod
    def _sources(stats: Snapshot) -> Iterator[Metric]:
        connected = GaugeMetricFamily(
            f"{PREFIX}_mqtt_source_connected",
            "1 while the MQTT source is subscribed.",
            labels=["source"],
        )
        for source, value in sorted(_map(stats, "mqtt_sources_connected").items()):
            connected.add_metric([source], float(bool(value)))
        yield connected
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "buffered": GaugeMetricFamily(
                f"{PREFIX}_mqtt_inbox_messages",
                "Received messages waiting to be decoded.",
                labels=["source"],
            ),
            "dropped_qos0": CounterMetricFamily(
                f"{PREFIX}_mqtt_inbox_dropped",
                "QoS 0 messages dropped at a full inbox.",
                labels=["source"],
            ),
            "held_back": CounterMetricFamily(
                f"{PREFIX}_mqtt_inbox_held_back",
                "QoS 1/2 messages left at the broker at a full inbox.",
                labels=["source"],
            ),
        }
        for source, inbox in sorted(_map(stats, "mqtt_inbox").items()):
            for key, family in families.items():
                value = _num(inbox, key)
                if value is not None:
                    family.add_metric([source], value)
        yield from families.values()

    @staticmethod
    def _sessions(stats: Snapshot) -> Iterator[Metric]:
        """Per MQTT connection: losses, and takeovers by a client with the same client id."""
        sessions = {
            **_map(stats, "mqtt_sessions"),
            "publisher": _map(stats, "publisher", "session"),
        }
        families = {
            "lost": CounterMetricFamily(
                f"{PREFIX}_mqtt_connections_lost",
                "Connections to the broker lost after it accepted them.",
                labels=["connection"],
            ),
            "taken_over": CounterMetricFamily(
                f"{PREFIX}_mqtt_sessions_taken_over",
                "Connections the broker closed because another client used the same client id.",
                labels=["connection"],
            ),
        }
        for name, session in sorted(sessions.items()):
            for key, family in families.items():
                value = _num(session, key)
                if value is not None:
                    family.add_metric([name], value)
        yield from families.values()

    @staticmethod
    def _monitor(stats: Snapshot) -> Iterator[Metric]:
        yield _gauge(
            "health_tracked",
            "(sensor, feature) pairs with health tracking.",
            _num(stats, "health", "tracked"),
        )
        flagged = GaugeMetricFamily(
            f"{PREFIX}_health_flagged",
            "(sensor, feature) pairs raising each health flag.",
            labels=["flag"],
        )
        for flag, count in sorted(_map(stats, "health", "flagged").items()):
            if isinstance(count, int):
                flagged.add_metric([flag], count)
        yield flagged
        drift = GaugeMetricFamily(
            f"{PREFIX}_drift",
            "1 while a co-located sensor's drift is raised (only sensors beside a reference).",
            labels=["sensor", "feature"],
        )
        harm = GaugeMetricFamily(
            f"{PREFIX}_harm",
            "1 while a co-located sensor's reference pairs show the model worse than its raw "
            "readings or a straight line (health flag 'harm').",
            labels=["sensor", "feature"],
        )
        for key, document in sorted(_map(stats, "drift").items()):
            sensor, _, feature = key.rpartition("/")
            value = _num(document, "drift")
            if value is not None:
                drift.add_metric([sensor, feature], value)
            value = _num(document, "harm")
            if value is not None:
                harm.add_metric([sensor, feature], value)
        yield drift
        yield harm
        yield from interval_families(_map(stats, "drift"), PREFIX)


def _last_readings(times: Mapping[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_sensor_last_reading_timestamp_seconds",
        "Unix time of the sensor's last admitted reading (alert on time() minus this).",
        labels=["sensor"],
    )
    for sensor, timestamp in sorted(times.items()):
        family.add_metric([sensor], timestamp)
    return family


def _sensor_values(values: Mapping[tuple[str, str], SensorValue]) -> Iterator[Metric]:
    """Newest raw and calibrated value per (sensor, feature); no calibrated series while the
    newest period has none (warming up, a gap, no model, implausible, stuck)."""
    raw = GaugeMetricFamily(
        f"{PREFIX}_sensor_raw_micrograms_per_cubic_meter",
        "The sensor's newest published period: its mean raw reading.",
        labels=["sensor", "feature"],
    )
    calibrated = GaugeMetricFamily(
        f"{PREFIX}_sensor_calibrated_micrograms_per_cubic_meter",
        "The sensor's newest published period: its calibrated value, by the model named.",
        labels=["sensor", "feature", "model"],
    )
    for (sensor, feature), value in sorted(values.items()):
        raw.add_metric([sensor, feature], value.raw)
        if value.calibrated is not None:
            calibrated.add_metric([sensor, feature, value.model or ""], value.calibrated)
    yield raw
    yield calibrated


def _gauge(name: str, help_text: str, value: float | None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{PREFIX}_{name}", help_text, labels=[])
    if value is not None:
        family.add_metric([], value)
    return family


def _counter(name: str, help_text: str, value: float | None) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{PREFIX}_{name}", help_text, labels=[])
    if value is not None:
        family.add_metric([], value)
    return family
