"""The Prometheus endpoint through the real daemon (issue 15).

The daemon runs with ``[metrics]``; the test scrapes ``/metrics`` over loopback, parses the text
with prometheus_client's own parser, sees the counters move as readings (and a bad payload)
arrive, checks that every metric the Grafana dashboard in deploy/ queries is in the scrape, that
the same endpoint answers OpenMetrics and gzip when asked, that ``/`` links to it, and that a
clean stop closes the port.
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families

from devkit.broker import Mosquitto, free_port
from tests.gateway.e2e.harness import (
    MODEL,
    Daemon,
    MqttNodes,
    P,
    grid_base,
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
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return {name for query in queries for name in _METRIC_NAME.findall(query)}


def test_metrics_endpoint_counts_readings_and_serves_the_dashboards_metrics(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path)
    port = free_port()
    config.write_text(
        config.read_text(encoding="utf-8") + f'[metrics]\nlisten = "127.0.0.1:{port}"\n',
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
        assert not any(dict(labels).get("sensor") for _, labels in after)  # per_sensor is off

        _, names = scrape(port)
        missing = dashboard_metrics() - names
        assert not missing, f"the dashboard queries metrics the gateway does not export: {missing}"
        assert_negotiates(port)
        assert daemons[-1].stop() == 0
    finally:
        mqtt.close()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 2):
        pass  # the endpoint closed with the daemon


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
