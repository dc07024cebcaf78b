"""The stats snapshot as Prometheus metrics: names, bounded labels, per-sensor series opt-in,
the hand-off latency histogram."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.metrics.collector import StatsCollector
from tesla_gateway.metrics.latency import BUCKETS_S, HandoffLatency
from tesla_gateway.metrics.sensor_values import LatestValues

SNAPSHOT: dict[str, object] = {  # the shape of the stats topic (docs/mqtt.md, "Stats")
    "gateway_id": "gw1",
    "version": "0.1.0",
    "uptime_s": 12.5,
    "readings_in": 40,
    "rejected": {"total": 3, "by_reason": {"bad_json": 2, "negative": 1}, "by_source": {}},
    "admission": {"sensors": 2, "max_sensors": 10, "admitted": 2, "evicted": 0, "rejected_full": 0},
    "windows": {"pm10": {"feature": "pm10", "sensors": 2, "outcomes": {"accepted": 38, "late": 2}},
                "pm10-rh": {"feature": "pm10", "sensors": 1, "outcomes": {"accepted": 19}}},
    "ticker": {"ticks": 5, "published": 9, "calibrated": 4, "total_inference_s": 0.002,
               "last_inference_ms": 0.4, "inference_errors": 0, "sensors_ready": {"pm10": 1}},
    "models": {
        "pm10": {"model": "tesla-pm10", "version": 3, "runtime": "ai_edge_litert", "reloads": 1},
        "pm2_5": {"model": None, "version": None, "runtime": None, "reloads": 0},
        "pm10-rh": {"feature": "pm10", "model": "tesla-pm10-rh", "version": 2,
                    "runtime": "ai_edge_litert", "reloads": 1},
    },
    "publisher": {"connected": True, "queued": 1, "published": 8, "dropped_total": 0, "refused": 0,
                  "sensors_online": 2,
                  "session": {"connections": 9, "lost": 8, "taken_over": 8,
                              "last_taken_over": 1.8e9, "unstable_in_a_row": 8}},
    "mqtt_sessions": {"mqtt-source-0": {"connections": 2, "lost": 1, "taken_over": 0,
                                        "last_taken_over": None, "unstable_in_a_row": 0}},
    "mqtt_sources_connected": {"mqtt-source-0": True},
    "mqtt_inbox": {"mqtt-source-0": {"buffered": 0, "dropped_qos0": 5, "held_back": 0}},
    "health": {"tracked": 2, "flagged": {"stuck": 1}},
    "drift": {"s1/pm10": {"drift": True, "harm": False}},
    "readings_missing": 7,
    "publish_failures": 0,
}  # fmt: skip


def scrape(collector: StatsCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_snapshot_becomes_prometheus_series() -> None:
    samples = scrape(StatsCollector(lambda: SNAPSHOT))
    assert samples[("tesla_gateway_readings_total", ())] == 40
    assert samples[("tesla_gateway_rejected_total", (("reason", "bad_json"),))] == 2
    late = (("feature", "pm10"), ("outcome", "late"), ("slot", "pm10"))
    assert samples[("tesla_gateway_window_outcomes_total", late)] == 2
    # A feature's second model is its own slot, labelled with the feature it calibrates.
    assert samples[("tesla_gateway_windows", (("feature", "pm10"), ("slot", "pm10-rh")))] == 1
    rh_info = (
        ("feature", "pm10"),
        ("model", "tesla-pm10-rh"),
        ("runtime", "ai_edge_litert"),
        ("slot", "pm10-rh"),
        ("version", "2"),
    )
    assert samples[("tesla_gateway_model_info", rh_info)] == 1
    assert samples[("tesla_gateway_inference_seconds_total", ())] == 0.002
    assert samples[("tesla_gateway_last_inference_seconds", ())] == 0.0004
    assert samples[("tesla_gateway_model_loaded", (("feature", "pm2_5"), ("slot", "pm2_5")))] == 0
    assert samples[("tesla_gateway_mqtt_inbox_dropped_total", (("source", "mqtt-source-0"),))] == 5
    assert samples[("tesla_gateway_drift", (("feature", "pm10"), ("sensor", "s1")))] == 1
    assert samples[("tesla_gateway_harm", (("feature", "pm10"), ("sensor", "s1")))] == 0
    assert samples[("tesla_gateway_sensors_online", ())] == 2
    assert not any(
        dict(labels).get("sensor")
        for name, labels in samples
        if name not in {"tesla_gateway_drift", "tesla_gateway_harm"}
    )


def reading(
    sensor: str,
    *,
    feature: str = "pm10",
    period_start: float = 1_800_000_000.0,
    raw: float = 20.0,
    calibrated: float | None = 14.5,
) -> CalibratedReading:
    return CalibratedReading(
        sensor_id=sensor,
        feature=feature,
        period_start=period_start,
        period_seconds=60,
        raw=raw,
        calibrated=calibrated,
        unit="ug/m3",
        model_name=None if calibrated is None else "tesla-pm10",
        model_version=None if calibrated is None else 3,
        quality=(Quality.OK,) if calibrated is not None else (Quality.WARMING_UP,),
    )


def test_last_reading_timestamps_per_sensor_only_when_asked() -> None:
    times = {"s1": 1_800_000_000.5, "s2": 1_799_999_000.0}
    samples = scrape(StatsCollector(lambda: SNAPSHOT, last_readings=lambda: times))
    name = "tesla_gateway_sensor_last_reading_timestamp_seconds"
    assert samples[(name, (("sensor", "s1"),))] == 1_800_000_000.5
    assert samples[(name, (("sensor", "s2"),))] == 1_799_999_000.0
    assert not any(n == name for n, _ in scrape(StatsCollector(lambda: SNAPSHOT)))


def test_sensor_gauges_hold_the_newest_raw_and_calibrated_value() -> None:
    latest = LatestValues()
    latest.record([reading("s1", raw=30.0, calibrated=21.0), reading("s2", calibrated=None)])
    latest.record([reading("s1", period_start=1_800_000_060.0, raw=31.0, calibrated=22.5)])
    latest.record([reading("s1", period_start=1_799_999_940.0, raw=1.0)])  # older: ignored
    latest.record([reading("s1", feature="pm2_5", raw=9.0, calibrated=6.0)])
    samples = scrape(StatsCollector(lambda: SNAPSHOT, sensor_values=latest.values))
    raw = "tesla_gateway_sensor_raw_micrograms_per_cubic_meter"
    calibrated = "tesla_gateway_sensor_calibrated_micrograms_per_cubic_meter"
    assert samples[(raw, (("feature", "pm10"), ("sensor", "s1")))] == 31.0
    assert samples[(raw, (("feature", "pm2_5"), ("sensor", "s1")))] == 9.0
    assert samples[(raw, (("feature", "pm10"), ("sensor", "s2")))] == 20.0
    pm10 = (("feature", "pm10"), ("model", "tesla-pm10"), ("sensor", "s1"))
    assert samples[(calibrated, pm10)] == 22.5
    # s2's newest period has no calibration (warming up): no calibrated series, not a 0.
    assert not [k for k in samples if k[0] == calibrated and ("sensor", "s2") in k[1]]
    assert len([k for k in samples if k[0] in {raw, calibrated}]) == 5

    latest.forget(["s1"])  # evicted by admission: its series go
    after = scrape(StatsCollector(lambda: SNAPSHOT, sensor_values=latest.values))
    assert {dict(k[1])["sensor"] for k in after if k[0] in {raw, calibrated}} == {"s2"}
    assert not any(n in {raw, calibrated} for n, _ in scrape(StatsCollector(lambda: SNAPSHOT)))


def test_handoff_latency_is_a_histogram_from_the_snapshot() -> None:
    latency = HandoffLatency()
    end = 1_800_000_060.0  # reading("x")'s period ends here
    latency.observe([reading("a"), reading("b")], end + 0.02)  # both within 50 ms
    latency.observe([reading("c")], end + 5.0)  # exactly on a bound: in that bucket (le)
    latency.observe([reading("d")], end + 7.0)
    latency.observe([reading("e")], end + 3600.0)  # a replayed backlog: only +Inf
    latency.observe([reading("f")], end - 2.0)  # a sensor clock ahead: 0, not negative
    latency.observe([], end)  # nothing handed off: nothing counted
    samples = scrape(StatsCollector(lambda: {**SNAPSHOT, "handoff_latency": latency.as_dict()}))
    name = "tesla_gateway_handoff_latency_seconds"
    bucket = {le: samples[(f"{name}_bucket", (("le", le),))] for le in ("0.05", "5.0", "10.0")}
    assert bucket == {"0.05": 3, "5.0": 4, "10.0": 5}
    assert samples[(f"{name}_bucket", (("le", "60.0"),))] == 5
    assert samples[(f"{name}_bucket", (("le", "+Inf"),))] == 6
    assert samples[(f"{name}_count", ())] == 6
    assert samples[(f"{name}_sum", ())] == pytest.approx(0.02 * 2 + 5.0 + 7.0 + 3600.0)
    assert len([k for k in samples if k[0] == f"{name}_bucket"]) == len(BUCKETS_S) + 1


def test_the_latency_counts_are_json_for_the_stats_topic() -> None:
    latency = HandoffLatency(buckets_s=(1.0, 10.0))
    latency.observe([reading("a")], 1_800_000_060.0 + 2.5)
    assert latency.as_dict() == {
        "buckets_s": [1.0, 10.0],
        "cumulative": [0, 1],
        "count": 1,
        "sum_s": 2.5,
    }
    assert latency.count == 1
    with pytest.raises(ValueError, match="increasing"):
        HandoffLatency(buckets_s=(1.0, 1.0))
    with pytest.raises(ValueError, match="increasing"):
        HandoffLatency(buckets_s=())
    empty = scrape(StatsCollector(dict))  # no counts in the snapshot: no made-up zeros
    assert not [k for k in empty if k[0].startswith("tesla_gateway_handoff_latency")]


def test_an_empty_snapshot_still_renders() -> None:
    samples = scrape(StatsCollector(dict))
    assert ("tesla_gateway_readings_total", ()) not in samples  # unknown, not a made-up 0
    assert samples[("tesla_gateway_info", (("gateway_id", ""), ("version", "")))] == 1


def test_lost_and_taken_over_sessions_are_counted_per_connection() -> None:
    samples = scrape(StatsCollector(lambda: SNAPSHOT))
    lost = "tesla_gateway_mqtt_connections_lost_total"
    taken = "tesla_gateway_mqtt_sessions_taken_over_total"
    assert samples[(lost, (("connection", "mqtt-source-0"),))] == 1
    assert samples[(lost, (("connection", "publisher"),))] == 8
    assert samples[(taken, (("connection", "publisher"),))] == 8
    assert samples[(taken, (("connection", "mqtt-source-0"),))] == 0


def test_quality_flags_are_counted_per_flag() -> None:
    ticker = {**SNAPSHOT["ticker"], "flagged": {"warming_up": 7, "implausible": 2}}  # type: ignore[dict-item]
    samples = scrape(StatsCollector(lambda: {**SNAPSHOT, "ticker": ticker}))
    flagged = "tesla_gateway_readings_flagged_total"
    assert samples[(flagged, (("quality", "implausible"),))] == 2
    assert samples[(flagged, (("quality", "warming_up"),))] == 7
