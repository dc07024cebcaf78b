"""The monitor: health documents on flag changes and by interval, pairs to disk, drift events."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import numpy as np
from structlog.testing import capture_logs

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.contract.manifest import InputRange
from tesla_gateway.contract.readings import Reading
from tesla_gateway.monitor.drift import DriftConfig
from tesla_gateway.monitor.health import HealthConfig
from tesla_gateway.monitor.monitor import ModelInfo, Monitor, SensorDocument
from tesla_gateway.monitor.pairs import HEADER, PairsConfig
from tesla_gateway.monitor.references import ReferenceConfig
from tesla_gateway.sources.mqtt_source import MqttSourceConfig
from tesla_gateway.windows.outcome import AddOutcome

P = 60
INFO = ModelInfo(
    name="m",
    version=1,
    period_seconds=P,
    input_range=InputRange(min=1.0, p01=2.0, p50=40.0, p99=140.0, max=180.0),
    test_rmse=2.0,
)
T0 = 1_578_657_600  # 2020-01-10T12:00:00Z
LATER = T0 + 86_400.0  # a wall clock long after every period


def monitor(tmp_path: Path, **drift: object) -> Monitor:
    reference = ReferenceConfig(
        name="ref",
        feature="pm10",
        colocated_with=["co"],
        mqtt=MqttSourceConfig(topics=["reference/ref"]),
    )
    return Monitor(
        health=HealthConfig(publish_interval_s=30.0, min_periods=5, stuck_periods=5),
        drift=DriftConfig.model_validate({"window_pairs": 10, "min_pairs": 5, **drift}),
        pairs=PairsConfig(reference_grace_s=0.0),
        references=[reference],
        state_dir=tmp_path,
        model_info=lambda feature: INFO if feature == "pm10" else None,
        now=0.0,
    )


def calibrated(
    sensor: str, period: int, raw: float, value: float | None, *quality: Quality
) -> CalibratedReading:
    return CalibratedReading(
        sensor_id=sensor,
        feature="pm10",
        period_start=float(T0 + period * P),
        period_seconds=P,
        raw=raw,
        calibrated=value,
        unit="ug/m3",
        model_name="m",
        model_version=1,
        quality=quality or ((Quality.OK,) if value is not None else (Quality.WARMING_UP,)),
    )


def reference(period: int, value: float) -> Reading:
    return Reading("ref", T0 + period * P + 5.0, MappingProxyType({"pm10": value}), "mqtt")


def of_kind(documents: list[SensorDocument], kind: str) -> list[SensorDocument]:
    return [d for d in documents if d.kind == kind]


def test_health_is_published_on_a_flag_change_and_by_interval(tmp_path: Path) -> None:
    mon = monitor(tmp_path)
    out = mon.observe_tick([calibrated("a", 0, 30.0, None)], now=1.0)
    assert out == []  # healthy: waits for the interval
    out = mon.observe_tick([calibrated("b", 0, 30.0, None, Quality.MISSING_CHANNEL)], now=1.0)
    (document,) = out
    assert document.kind == "health" and document.sensor_id == "b"
    assert document.document["flags"] == ["missing_channel"] and document.document["ok"] is False
    assert mon.poll(now=10.0) == []
    periodic = mon.poll(now=31.0)
    assert sorted(d.sensor_id for d in periodic) == ["a"]  # b has no change since its publish
    assert periodic[0].document["flags"] == [] and periodic[0].document["model"] == "m"
    out = []
    for period in range(1, 8):
        out += mon.observe_tick([calibrated("a", period, 30.0, None)], now=40.0)
    assert [d.document["flags"] for d in out] == [["stuck"]]  # once, at the change
    assert mon.stats()["health"] == {"tracked": 2, "flagged": {"missing_channel": 1, "stuck": 1}}


def test_pairs_are_recorded_and_drift_is_raised_then_cleared(tmp_path: Path) -> None:
    mon = monitor(tmp_path, rmse_abs=5.0, rmse_ratio=0)
    rng = np.random.default_rng(0)
    truth = rng.uniform(10, 60, 40)
    documents: list[SensorDocument] = []
    mon.observe_reading(
        Reading("co", T0 + 1.0, MappingProxyType({"pm10": 1.0, "rh": 60.0}), "mqtt"),
        {"pm10": AddOutcome.ACCEPTED},
    )
    with capture_logs() as logs:
        for period, value in enumerate(truth):
            if period < 10:
                estimate = value + rng.normal(0, 0.5)  # tracks
            elif period < 25:
                estimate = value * 1.5  # drifts
            else:
                estimate = value + rng.normal(0, 0.5)  # fixed again
            documents += mon.observe_reference("ref", reference(period, float(value)), now=0.0)
            documents += mon.observe_tick(
                [calibrated("co", period, float(value) * 2, float(estimate))], now=0.0
            )
        documents += mon.poll(now=LATER)
    mon.close()
    drift = of_kind(documents, "drift")
    assert [d.document["change"] for d in drift] == ["confirmed_clear", "raised", "cleared"]
    raised = drift[1].document
    assert raised["drift"] is True and raised["reference"] == "ref"
    assert isinstance(raised["rmse"], float) and raised["rmse"] > 5.0
    assert isinstance(raised["raw_rmse"], float) and raised["raw_rmse"] > raised["rmse"]
    assert raised["threshold"] == 5.0 and raised["clear_below"] == 4.0
    assert drift[2].document["drift"] is False
    assert [e["event"] for e in logs if e["event"].startswith("drift")] == [
        "drift_detected",
        "drift_cleared",
    ]
    lines = (tmp_path / "pairs" / "pm10" / "pairs-20200110.csv").read_text().splitlines()
    assert lines[0] == HEADER and len(lines) == 1 + len(truth)
    assert lines[1].startswith("2020-01-10T12:00:00Z,co,") and lines[1].endswith(",1,60.0,,ok")
    stats = mon.stats()
    assert stats["references"] == {
        "ref": {
            "readings": 40,
            "ignored_no_model": 0,
            "late": 0,
            "duplicates": 0,
            "paired": 40,
            "unpaired": 0,
            "expired": 0,
        }
    }


def test_relative_threshold_uses_the_manifest_test_rmse(tmp_path: Path) -> None:
    mon = monitor(tmp_path, rmse_abs=0, rmse_ratio=3.0)  # 3 x 2.0 = 6.0
    documents: list[SensorDocument] = []
    for period in range(8):
        documents += mon.observe_reference("ref", reference(period, 20.0), now=0.0)
        documents += mon.observe_tick([calibrated("co", period, 30.0, 27.0)], now=0.0)
    documents += mon.poll(now=LATER)
    mon.close()
    (event,) = of_kind(documents, "drift")
    assert event.document["change"] == "raised" and event.document["threshold"] == 6.0
    co = of_kind(documents, "health")[-1]  # the interval's publication, after the raise
    assert "drift" in co.document["flags"]  # type: ignore[operator]
    assert co.document["reference"] == {
        "name": "ref",
        "pairs": 8,
        "rmse": 7.0,
        "mae": 7.0,
        "raw_rmse": 10.0,
        "raw_mae": 10.0,
        "linear_rmse": None,  # one raw value only: no line through it
        "threshold": 6.0,
        "drift": True,
        "harm": False,
    }


def test_skipped_sequence_numbers_show_on_stats_and_in_health(tmp_path: Path) -> None:
    mon = monitor(tmp_path)
    with capture_logs() as logs:
        for seq in (0, 1, 4, 5, 5, 9):  # 2, 3, 6, 7, 8 never arrive; 5 twice
            reading = Reading("a", T0 + seq, MappingProxyType({"pm10": 1.0}), "mqtt", seq=seq)
            mon.observe_reading(reading, {"pm10": AddOutcome.ACCEPTED})
        mon.observe_reading(Reading("b", T0, MappingProxyType({"pm10": 1.0}), "mqtt"), {})
    stats = mon.stats()
    assert stats["readings_missing"] == 5
    assert stats["readings_missing_top"] == {"a": 5}
    assert [entry["missing"] for entry in logs if entry["event"] == "readings_missing"] == [2]
    mon.observe_tick([calibrated("a", 0, 30.0, None), calibrated("b", 0, 30.0, None)], now=1.0)
    health = {d.sensor_id: d.document for d in of_kind(mon.poll(now=31.0), "health")}
    assert health["a"]["readings_missing"] == 5
    assert health["b"]["readings_missing"] is None  # sends no sequence numbers


def test_health_flags_a_model_its_reference_pairs_show_doing_harm(tmp_path: Path) -> None:
    """The field's guard against harm: while the recorded pairs show the model worse than the
    raw readings, health says 'harm' (and the stats, and the log once); a model that beats both
    raw and a straight line is never flagged; recovery clears it."""
    mon = monitor(tmp_path, rmse_abs=1000.0, rmse_ratio=0)  # no drift in this test
    rng = np.random.default_rng(3)
    truth = rng.uniform(10, 60, 60)
    health: list[SensorDocument] = []
    with capture_logs() as logs:
        for period, value in enumerate(truth):
            raw = float(value) + rng.normal(0, 1.0)  # a good sensor: raw within 1 of the truth
            if period < 20:
                estimate = float(value) + rng.normal(0, 0.3)  # better than raw: no harm
            elif period < 40:
                estimate = float(value) * 1.4 + 3  # the model makes it worse
            else:
                estimate = float(value) + rng.normal(0, 0.3)  # a better model again
            mon.observe_reference("ref", reference(period, float(value)), now=0.0)
            documents = mon.observe_tick([calibrated("co", period, raw, estimate)], now=0.0)
            health += [d for d in of_kind(documents, "health") if d.sensor_id == "co"]
            if period == 19:
                assert mon.stats()["drift"]["co/pm10"]["harm"] is False  # type: ignore[index]
            if period == 39:
                assert mon.stats()["drift"]["co/pm10"]["harm"] is True  # type: ignore[index]
                assert mon.stats()["health"]["flagged"] == {"harm": 1}  # type: ignore[index]
        health += of_kind(mon.poll(now=LATER), "health")
    mon.close()
    flags = [d.document["flags"] for d in health if d.sensor_id == "co"]
    assert ["harm"] in flags and [] in flags[flags.index(["harm"]) :]  # raised, then cleared
    harmed = next(d.document for d in health if d.document["flags"] == ["harm"])
    figures = harmed["reference"]
    assert isinstance(figures, dict) and figures["harm"] is True
    assert figures["rmse"] > 1.05 * figures["raw_rmse"]
    events = [e for e in logs if e["event"].startswith("model_harm")]
    assert [e["event"] for e in events] == ["model_harm_detected", "model_harm_cleared"]
    assert "raw" in events[0]["worse_than"]


def test_too_few_pairs_never_judge_harm(tmp_path: Path) -> None:
    mon = monitor(tmp_path, rmse_abs=1000.0, rmse_ratio=0)  # min_pairs 5
    for period in range(4):
        mon.observe_reference("ref", reference(period, 20.0 + period), now=0.0)
        mon.observe_tick([calibrated("co", period, 20.0 + period, 90.0)], now=0.0)
    assert mon.stats()["drift"]["co/pm10"]["harm"] is False  # type: ignore[index]
    mon.close()


def test_evicted_sensors_leave_the_monitor_and_their_loss_stays_counted(tmp_path: Path) -> None:
    """Sensor ids that come and go over years must not pile up: an evicted sensor's health,
    flags and sequence state go; what it missed stays in readings_missing."""
    mon = monitor(tmp_path)
    for seq in (1, 2, 5):  # two readings of "b" never arrived
        mon.observe_reading(Reading("b", T0 + seq, {"pm10": 1.0}, "mqtt", seq=seq), {})
    mon.observe_tick([calibrated("a", 0, 30.0, 25.0)], now=1.0)
    mon.observe_tick([calibrated("b", 0, 30.0, None, Quality.MISSING_CHANNEL)], now=1.0)
    assert mon.stats()["health"] == {"tracked": 2, "flagged": {"missing_channel": 1}}
    mon.forget_sensors(["b", "never-seen"])
    assert mon.stats()["health"] == {"tracked": 1, "flagged": {}}
    assert mon.sequences.missing_for("b") is None
    assert mon.sequences.readings_missing == 2
    periodic = mon.poll(now=31.0)
    assert [d.sensor_id for d in periodic] == ["a"]
    assert periodic[0].document["model"] == "m"  # the model that calibrated it
