"""Cluster mode at its edges, with one real nats-server: a node publishing MQTT to the server's
MQTT listener (paho, MQTT 3.1.1, QoS 1) and a serial node on the gateway itself (a pty: no board
exists here) both land in the partitioned readings stream, and both are calibrated into the
calibrated stream and onto MQTT topics under the cluster-wide prefix, not the gateway's id."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.cluster_demo.streams import sensor_partitions
from devkit.nats_servers import NatsServer
from devkit.pty import PtySerial
from tests.cluster.harness import (
    PERIOD_S,
    WINDOW,
    ClusterGateway,
    balanced,
    expected_periods,
    stream_messages,
    value_of,
    wait_calibrated,
    wait_for,
    write_config,
)
from tests.gateway.e2e.harness import SerialNode
from tests.support.models import ModelFactory

pytest.importorskip("nats")


def test_mqtt_and_serial_readings_are_partitioned_and_calibrated_under_the_cluster_prefix(
    nats_server: NatsServer, pty_serial: PtySerial, model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.get(window_length=WINDOW, period_seconds=PERIOD_S).path
    serial = f'[[sources]]\nkind = "node"\nport = "{pty_serial.path}"\nreconnect_initial_s = 0.05'
    config = write_config(
        tmp_path / "g",
        "g",
        model,
        [nats_server.url],
        nats_server.mqtt_port,
        replicas=1,
        sources=serial,
    )
    seen: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def on_message(_client: paho.Client, _userdata: object, message: paho.MQTTMessage) -> None:
        with lock:
            seen.append((message.topic, bytes(message.payload)))

    listener = paho.Client(CallbackAPIVersion.VERSION2, client_id="consumer")
    listener.on_message = on_message
    listener.connect("127.0.0.1", nats_server.mqtt_port)
    listener.subscribe("tesla/#", qos=1)
    listener.loop_start()
    node = paho.Client(CallbackAPIVersion.VERSION2, client_id="mqtt-node")
    node.connect("127.0.0.1", nats_server.mqtt_port)
    node.loop_start()
    board = SerialNode(pty_serial, "serial-1")
    sent: list[tuple[str, float, float]] = []
    with ClusterGateway(tmp_path / "g", "g", config) as gateway:
        board.wait_opened()
        gateway.wait_ready(wait_sources=False)
        wait_for(lambda: balanced([gateway]), "the gateway owning every partition")
        start = time.time()
        while time.time() < start + (WINDOW + 1) * PERIOD_S:
            now = round(time.time(), 3)
            for sensor in ("mqtt-1", "serial-1"):
                value = value_of(sensor, now)
                if sensor == "serial-1":
                    board.send(now, value)
                else:
                    payload = json.dumps({"ts": now, "pm10": value}).encode()
                    node.publish("sensors/mqtt-1/raw", payload, qos=1).wait_for_publish(10)
                sent.append((sensor, now, value))
            time.sleep(0.5)
        closing = round(time.time() + PERIOD_S, 3)
        board.send(closing, 10.0)
        node.publish(
            "sensors/mqtt-1/raw", json.dumps({"ts": closing, "pm10": 10.0}).encode(), qos=1
        )
        sent += [("serial-1", closing, 10.0), ("mqtt-1", closing, 10.0)]
        expected = expected_periods(sent)
        wait_calibrated([nats_server.url], expected, "both sensors calibrated")
        stats = gateway.cluster()
    node.loop_stop()
    listener.loop_stop()

    assert set(sensor_partitions([nats_server.url])) == {"mqtt-1", "serial-1"}
    assert stats["local_forwarded"] >= (WINDOW + 1) * 2  # the serial node's readings
    ids = [msg_id for msg_id, _, _ in stream_messages([nats_server.url], "TESLA_CALIBRATED")]
    assert sorted(ids) == sorted(expected)
    with lock:
        topics = {topic for topic, _ in seen}
    assert {"tesla/cluster/mqtt-1/pm10", "tesla/cluster/serial-1/pm10"} <= topics
    # only the gateway's own status and stats carry its id; no sensor's topic does
    assert {t for t in topics if t.startswith("tesla/g/")} <= {"tesla/g/status", "tesla/g/stats"}
