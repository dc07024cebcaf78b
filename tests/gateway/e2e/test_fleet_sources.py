"""Existing sensor fleets through the real daemon, each in its own native output.

One daemon (one per module: every send happens in the module fixture, so the periods of all
four kinds close together) with the four fleet source kinds configured: a Tasmota device and
an ESPHome node publish to a real mosquitto, an airrohr station POSTs to the daemon's listener
on loopback over real HTTP, and two PurpleAir units are a real HTTP server on loopback serving
the fixture (one of them with its A and B lasers disagreeing). The payloads are those of
tests/fixtures/fleet with times moved to now; each sensor's PM10 comes back calibrated on the
gateway's topic with the raw value the device sent, and each bad payload is counted under its
source and reason while the daemon keeps running.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.broker import Mosquitto, free_port
from tests.gateway.e2e.harness import GATEWAY_ID, Calibrated, Daemon, wait_for
from tests.support.models import ModelFactory

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "fleet"
P = 2  # seconds per period: short, so each sensor's one period closes within seconds
MODEL = {"window_length": 8, "period_seconds": P, "max_interpolated_periods": 2}
AUTH = ("station", "s3cret")


def fixture(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return document


class PurpleAirUnits:
    """Two units on one loopback HTTP server: /good/json (the fixture) and /bad/json."""

    def __init__(self, documents: dict[str, dict[str, Any]]) -> None:
        bodies = {path: json.dumps(doc).encode() for path, doc in documents.items()}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = bodies.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def post(port: int, body: bytes, *, auth: tuple[str, str] | None = AUTH) -> int:
    """A real HTTP POST, as the airrohr firmware sends it; returns the status."""
    headers = {"Content-Type": "application/json", "X-Sensor": "esp8266-12331981"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/data.php", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def write_config(
    tmp: Path, broker: Mosquitto, model_dir: Path, http_port: int, pa_port: int
) -> Path:
    channels = fixture("esphome_states.json")["channels"]
    path = tmp / "gateway.toml"
    path.write_text(
        f"""
gateway_id = "{GATEWAY_ID}"
state_dir = "{tmp / "state"}"
[[models]]
feature = "pm10"
model_dir = "{model_dir}"
[runtime]
model_poll_s = 600
[tick]
grace_s = 0.3
settle_s = 0.05
[state]
status_interval_s = 0.1
save_interval_s = 600
[logging]
format = "json"
[[sources]]
kind = "tasmota"
timezone = "UTC"
[sources.broker]
port = {broker.port}
reconnect_initial_s = 0.05
[[sources]]
kind = "esphome"
channels = {json.dumps(channels).replace(":", " =")}
group_s = {P}
grace_s = 0.2
[sources.broker]
port = {broker.port}
reconnect_initial_s = 0.05
[[sources]]
kind = "sensor_community"
host = "127.0.0.1"
port = {http_port}
username = "{AUTH[0]}"
password = "{AUTH[1]}"
[[sources]]
kind = "purpleair"
poll_interval_s = 0.3
timeout_s = 5
[[sources.units]]
url = "http://127.0.0.1:{pa_port}/good/json"
[[sources.units]]
url = "http://127.0.0.1:{pa_port}/bad/json"
sensor_id = "pa-bad"
[publisher]
stats_interval_s = 0.2
[publisher.broker]
port = {broker.port}
reconnect_initial_s = 0.05
""",
        encoding="utf-8",
    )
    return path


@dataclass
class Fleet:
    daemon: Daemon
    calibrated: Calibrated
    http_statuses: dict[str, int]


def publish(broker: Mosquitto, messages: list[tuple[str, bytes]]) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="fleet-devices")
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        for topic, payload in messages:
            client.publish(topic, payload, qos=1).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()


def past(seconds: float) -> float:
    """A whole second in a period that has already ended (it closes as soon as it arrives)."""
    return float(int(time.time() - seconds))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, model_factory: ModelFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    model = model_factory.get(**MODEL)
    good = fixture("purpleair_json.json")["payload"]
    good = {**good, "DateTime": time.strftime("%Y/%m/%dT%H:%M:%Sz", time.gmtime(past(6)))}
    bad = {**good, "pm10_0_cf_1": 10, "pm10_0_cf_1_b": 60}
    units = PurpleAirUnits({"/good/json": good, "/bad/json": bad})
    http_port = free_port()
    with Mosquitto(tmp / "mosquitto") as broker:
        calibrated = Calibrated(broker)
        daemon = Daemon(write_config(tmp, broker, model.path, http_port, units.port), tmp / "state")
        try:
            wait_for(
                lambda: all(s["connected"] for s in daemon.status()["fleet_sources"].values()),
                "every fleet source connected, listening or polled",
            )
            tasmota = fixture("tasmota_sensor.json")
            payload = dict(tasmota["payload"])
            payload["Time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(past(6)))
            esphome = fixture("esphome_states.json")["messages"]
            publish(
                broker,
                [
                    ("tele/tasmota_bad/SENSOR", b"{not json"),
                    (tasmota["topic"], json.dumps(payload).encode()),
                    ("airquality-balcony/sensor/pm2_5/state", b"nan"),
                    *[(topic, value.encode()) for topic, value in esphome],
                ],
            )
            body = json.dumps(fixture("sensor_community_post.json")["payload"]).encode()
            statuses = {
                "bad_json": post(http_port, b"{not json"),
                "no_auth": post(http_port, body, auth=None),
                "wrong_auth": post(http_port, body, auth=("station", "guess")),
                "good": post(http_port, body),
            }
            yield Fleet(daemon=daemon, calibrated=calibrated, http_statuses=statuses)
        finally:
            daemon.kill()
            calibrated.close()
            units.close()


def raw_pm10(fleet: Fleet, sensor: str) -> float | None:
    arrivals = fleet.calibrated.arrivals(sensor)
    return float(arrivals[0]["raw"]) if arrivals else None


@pytest.mark.parametrize(
    ("sensor", "pm10"),
    [
        ("tasmota-tasmota_9229FE", 12.0),  # PMS5003.PM10 (atmospheric); the default prefix
        ("esphome-airquality-balcony", 12.0),  # the pm10 state topic; the default prefix
        ("airrohr-12331981", 12.4),  # PMS_P1
        ("purpleair-5ccf7f5ca424", 11.0),  # mean of pm10_0_cf_1 and pm10_0_cf_1_b
    ],
)
def test_each_fleet_kind_is_calibrated_from_its_native_output(
    fleet: Fleet, sensor: str, pm10: float
) -> None:
    got = wait_for(partial(raw_pm10, fleet, sensor), f"a calibrated period of {sensor}")
    assert got == pytest.approx(pm10)


def test_bad_payloads_are_counted_by_source_and_reason_and_nothing_stops(fleet: Fleet) -> None:
    assert fleet.http_statuses == {"bad_json": 400, "no_auth": 401, "wrong_auth": 401, "good": 200}

    def rejected() -> dict[str, Any] | None:
        by_source: dict[str, Any] = fleet.daemon.status()["rejected"]["by_source"]
        return by_source if "purpleair" in by_source and "esphome" in by_source else None

    by_source = wait_for(rejected, "rejects of every fleet kind")
    assert by_source["tasmota"] == {"bad_json": 1}
    assert by_source["esphome"] == {"not_finite": 1}
    assert by_source["sensor_community"] == {"bad_json": 1}
    assert set(by_source["purpleair"]) == {"channel_disagreement"}  # the bad unit, each poll
    status = fleet.daemon.status()  # raises if the daemon exited
    sources = status["fleet_sources"]
    assert sources["esphome-source-1"]["ignored_states"] == 1  # wifi_signal is not mapped
    assert sources["sensor_community-source-2"]["http_refused"] == {"400": 1, "401": 2}
    assert sources["purpleair-source-3"]["poll_failures"] == 0
    # The MQTT-based fleet sources report their sessions beside the sensor sources'.
    sessions = status["mqtt_sessions"]
    for name in ("tasmota-source-0", "esphome-source-1"):
        assert sessions[name]["connections"] >= 1 and sessions[name]["taken_over"] == 0, name
    assert "sensor_community-source-2" not in sessions  # HTTP: no MQTT session
