"""The Prometheus endpoint through the real daemon (issues 15 and 27).

The daemon runs with ``[metrics]``; the test scrapes ``/metrics`` over loopback, parses the text
with prometheus_client's own parser, sees the counters move as readings (and a bad payload)
arrive, that the same endpoint answers OpenMetrics and gzip when asked, that ``/`` links to it,
and that a clean stop closes the port. With the series per sensor turned off there are none;
turned on, each sensor sent has its last-reading time (which moves with its next reading) and
its newest raw and calibrated value (those the subscriber received), an evicted sensor loses
them, the hand-off latency histogram counts every calibrated reading, and every metric the
Grafana dashboard in deploy/ queries is in the scrape.
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families

from devkit.broker import Mosquitto, free_port
from tests.gateway.e2e.harness import (
    MODEL,
    Calibrated,
    Daemon,
    MqttNodes,
    P,
    grid_base,
    iso,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana-dashboard.json"
_METRIC_NAME = re.compile(r"\b(?:tesla_gateway|process)_[a-z0-9_]+\b")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(port: int, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body (not decoded) of one GET on loopback, 4xx included."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def scrape(port: int) -> tuple[Samples, set[str]]:
    """Every sample by (name, labels), and every metric name the scrape declares."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode("utf-8")
    samples: Samples = {}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        for sample in family.samples:
            names.add(sample.name)
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, names


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return {name for query in queries for name in _METRIC_NAME.findall(query)}


def test_metrics_endpoint_counts_readings_and_serves_the_dashboards_metrics(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path)
    port = free_port()
    config.write_text(
        config.read_text(encoding="utf-8")
        + f'[metrics]\nlisten = "127.0.0.1:{port}"\nsensor_staleness = false\n',
        encoding="utf-8",
    )
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state"))
        before, names = scrape(port)
        assert before[("tesla_gateway_readings_total", ())] == 0
        assert before[("tesla_gateway_publisher_connected", ())] == 1
        assert before[("tesla_gateway_model_loaded", (("feature", "pm10"), ("slot", "pm10")))] == 1
        info = [k for k in before if k[0] == "tesla_gateway_info"]
        assert dict(info[0][1])["gateway_id"] == "gw-e2e"
        assert "process_resident_memory_bytes" in names

        base = grid_base(5)
        for period in range(3):
            mqtt.send("m-1", base + period * P + 1, 20.0 + period)
        mqtt.send_raw("sensors/m-1/raw", b"{not json")

        def moved() -> Samples | None:
            samples, _ = scrape(port)
            done = (
                samples.get(("tesla_gateway_readings_total", ())) == 3
                and samples.get(("tesla_gateway_rejected_total", (("reason", "bad_json"),))) == 1
                and samples.get(("tesla_gateway_calibrated_readings_total", ()), 0) >= 2
                and samples.get(("tesla_gateway_published_messages_total", ()), 0) >= 2
            )
            return samples if done else None

        after = wait_for(moved, "the counters to move")
        assert after[("tesla_gateway_ticks_total", ())] > before[("tesla_gateway_ticks_total", ())]
        assert after[("tesla_gateway_sensors", ())] == 1
        assert after[("tesla_gateway_windows", (("feature", "pm10"), ("slot", "pm10")))] == 1
        # sensor_staleness = false, sensor_gauges off: no series names a sensor.
        assert not any(dict(labels).get("sensor") for _, labels in after)
        assert_negotiates(port)
        assert daemons[-1].stop() == 0
    finally:
        mqtt.close()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 2):
        pass  # the endpoint closed with the daemon


LAST_READING = "tesla_gateway_sensor_last_reading_timestamp_seconds"
RAW = "tesla_gateway_sensor_raw_micrograms_per_cubic_meter"
CALIBRATED = "tesla_gateway_sensor_calibrated_micrograms_per_cubic_meter"
LATENCY = "tesla_gateway_handoff_latency_seconds"


def per_sensor(samples: Samples, name: str) -> dict[str, float]:
    """One family's values by sensor (pm10 only: the one feature these tests send)."""
    return {
        dict(labels)["sensor"]: value
        for (sample, labels), value in samples.items()
        if sample == name and dict(labels).get("feature", "pm10") == "pm10"
    }


def test_sensor_series_and_the_latency_histogram_through_the_daemon(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path)
    port = free_port()
    text = config.read_text(encoding="utf-8").replace(
        "allow_unknown = true", "allow_unknown = true\nmax_sensors = 2\nevict_idle_s = 1"
    )
    config.write_text(
        text + f'[metrics]\nlisten = "127.0.0.1:{port}"\nsensor_gauges = true\n',
        encoding="utf-8",
    )
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state"))
        before, _ = scrape(port)
        assert not any(dict(labels).get("sensor") for _, labels in before)  # none sent yet
        assert before[(f"{LATENCY}_count", ())] == 0

        periods = MODEL["window_length"] + 3  # the newest ones calibrated, not warming up
        base = grid_base(periods + 2)
        for period in range(periods):
            mqtt.send("m-1", base + period * P + 1, 20.0 + period)
        mqtt.send("m-2", base + 1, 7.5)
        newest = iso(base + (periods - 1) * P)
        wait_for(lambda: newest in calibrated.by_period("m-1"), "m-1's newest period")
        wait_for(lambda: calibrated.has("m-2", 1), "m-2's period")
        published = calibrated.by_period("m-1")[newest]
        assert published["calibrated"] is not None

        def values() -> Samples | None:
            samples, _ = scrape(port)
            done = per_sensor(samples, RAW).get("m-1") == published["raw"]
            return samples if done and "m-2" in per_sensor(samples, RAW) else None

        samples = wait_for(values, "the sensors' gauges")
        assert per_sensor(samples, RAW) == {"m-1": published["raw"], "m-2": 7.5}
        assert per_sensor(samples, CALIBRATED) == {"m-1": published["calibrated"]}  # m-2 warms up
        (model_label,) = [dict(k[1])["model"] for k in samples if k[0] == CALIBRATED]
        assert model_label == published["model"]
        sent = per_sensor(samples, LAST_READING)
        assert set(sent) == {"m-1", "m-2"}
        assert all(abs(t - time.time()) < 15 for t in sent.values())  # arrival, not ts (30 s old)
        handed_off = samples[("tesla_gateway_calibrated_readings_total", ())]
        assert samples[(f"{LATENCY}_count", ())] == handed_off
        received = len(calibrated.by_period("m-1")) + len(calibrated.by_period("m-2"))
        assert handed_off == received == periods + 1
        assert samples[(f"{LATENCY}_bucket", (("le", "+Inf"),))] == handed_off
        assert samples[(f"{LATENCY}_sum", ())] > 0  # periods of the recent past: seconds old

        time.sleep(0.1)
        mqtt.send("m-1", base + periods * P + 1, 40.0)  # the last reading's time moves
        moved = wait_for(
            lambda: (t := per_sensor(scrape(port)[0], LAST_READING))["m-1"] > sent["m-1"] and t,
            "m-1's last reading to move",
        )
        assert moved["m-2"] == pytest.approx(sent["m-2"], abs=0.05)

        _, names = scrape(port)
        missing = dashboard_metrics() - names
        assert not missing, f"the dashboard queries metrics the gateway does not export: {missing}"

        time.sleep(1.2)  # both idle beyond evict_idle_s: a third sensor makes room (max 2)
        mqtt.send("m-3", base + periods * P + 1, 12.0)

        def evicted() -> Samples | None:
            samples, _ = scrape(port)
            return samples if set(per_sensor(samples, RAW)) == {"m-3"} else None

        samples = wait_for(evicted, "the evicted sensors' series to go")
        assert set(per_sensor(samples, LAST_READING)) == {"m-3"}
        assert per_sensor(samples, CALIBRATED) == {}
        assert samples[("tesla_gateway_sensors_evicted_total", ())] == 2
        assert daemons[-1].stop() == 0
    finally:
        mqtt.close()
        calibrated.close()


def assert_negotiates(port: int) -> None:
    """OpenMetrics and gzip on request, an index page on ``/``, 404 elsewhere."""
    status, headers, body = get(port, "/metrics", Accept="application/openmetrics-text")
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = body.decode("utf-8")
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_parser.text_string_to_metric_families(text)}
    readings = families["tesla_gateway_readings"]
    assert readings.type == "counter"
    assert [s.value for s in readings.samples if s.name == "tesla_gateway_readings_total"] == [3]
    assert "process_resident_memory_bytes" in families

    status, headers, body = get(port, "/metrics", **{"Accept-Encoding": "gzip"})
    assert (status, headers["Content-Encoding"]) == (200, "gzip")
    assert headers["Content-Type"].startswith("text/plain")
    plain = gzip.decompress(body)
    assert len(body) < len(plain)
    names = {f.name for f in text_string_to_metric_families(plain.decode("utf-8"))}
    assert {"tesla_gateway_readings", "tesla_gateway_info"} <= names

    status, headers, body = get(port, "/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert b'href="/metrics"' in body
    status, _, _ = get(port, "/nothing-here")
    assert status == 404
