"""Two devices, one name: a sensor id belongs to one source (issue 26 item 7).

The real daemon with an MQTT source and two Tasmota sources on a real mosquitto. A Tasmota device
called ``shared`` (on the source whose ``sensor_id_prefix`` is set to ``""``, the old default)
reports PM10 = 10 first and so owns the id; an MQTT sensor also called ``shared`` then reports 90
for the same period. Before, they averaged into one window with no reject and no warning (the
issue's 10 and 90 were published as 50.0; here 43.3 with the third device below). Now the period
carries the Tasmota device's 10, the MQTT reading is refused as ``sensor_id_conflict`` (counted
under its source, logged naming both sources and the fix), and a device called ``shared`` on the
Tasmota source with the default prefix is ``tasmota-shared``, a sensor of its own.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.broker import Mosquitto
from tests.gateway.e2e.harness import (
    MODEL,
    Calibrated,
    Daemon,
    MqttNodes,
    P,
    iso,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory


def tasmota_sources(broker: Mosquitto) -> str:
    return f"""
[[sources]]
kind = "tasmota"
timezone = "UTC"
sensor_id_prefix = ""
[sources.broker]
port = {broker.port}
reconnect_initial_s = 0.05
[[sources]]
kind = "tasmota"
timezone = "UTC"
topics = ["fleet/+/SENSOR"]
[sources.broker]
port = {broker.port}
reconnect_initial_s = 0.05
"""


def publish_tasmota(broker: Mosquitto, topic: str, epoch: float, pm10: float) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="tasmota-devices")
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        payload = {"Epoch": int(epoch), "PMS5003": {"PM2.5": 5, "PM10": pm10}}
        client.publish(topic, json.dumps(payload).encode(), qos=1).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()


def admitted(daemon: Daemon, count: int) -> bool:
    return int(daemon.status()["admission"]["admitted"]) >= count


def conflicts(daemon: Daemon) -> dict[str, Any] | None:
    by_source: dict[str, Any] = daemon.status()["rejected"]["by_source"]
    return by_source if "mqtt" in by_source else None


def test_a_sensor_id_belongs_to_the_first_source_that_reports_it(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    # The period stays open 3 s after its last reading: every reading below arrives within it.
    config = write_config(tmp_path, mosquitto, model.path, grace_s=3.0)
    with config.open("a", encoding="utf-8") as out:
        out.write(tasmota_sources(mosquitto))
    calibrated = Calibrated(mosquitto)
    nodes = MqttNodes(mosquitto)
    period_start = (int(time.time()) // P - 3) * P  # a period that has ended: it closes at once
    try:
        daemon = Daemon(config, tmp_path / "state")
        daemons.append(daemon)
        wait_for(
            lambda: all(s["connected"] for s in daemon.status()["fleet_sources"].values()),
            "both Tasmota sources connected",
        )
        publish_tasmota(mosquitto, "tele/shared/SENSOR", period_start + 1, 10.0)
        wait_for(partial(admitted, daemon, 1), "the Tasmota device's id claimed")
        nodes.send("shared", period_start + 2, 90.0)  # the MQTT sensor of the same name
        publish_tasmota(mosquitto, "fleet/shared/SENSOR", period_start + 3, 30.0)

        wait_for(partial(calibrated.has, "shared", 1), "the period of shared")
        [shared] = calibrated.arrivals("shared")
        assert shared["period_start"] == iso(period_start)
        assert shared["raw"] == pytest.approx(10.0)  # before: the mean of all three, 43.3
        wait_for(partial(calibrated.has, "tasmota-shared", 1), "the period of tasmota-shared")
        [prefixed] = calibrated.arrivals("tasmota-shared")
        assert prefixed["raw"] == pytest.approx(30.0)
        by_source = wait_for(partial(conflicts, daemon), "the MQTT reading refused")
        assert by_source == {"mqtt": {"sensor_id_conflict": 1}}
        assert daemon.status()["admission"]["conflicts"] == 1
    finally:
        nodes.close()
        calibrated.close()
    events = [
        json.loads(line)
        for line in (tmp_path / "daemon.log").read_text(encoding="utf-8").splitlines()
        if line.startswith("{")
    ]
    [warning] = [e for e in events if e.get("reason") == "sensor_id_conflict"]
    assert (warning["event"], warning["level"]) == ("reading_rejected", "warning")
    assert (warning["sensor"], warning["source"]) == ("shared", "mqtt")
    assert "reports through tasmota" in warning["detail"]
    assert warning["detail"].endswith("set sensor_id_prefix on the tasmota source")
