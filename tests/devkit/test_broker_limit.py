"""The broker-limit measurement of make bench, run small against a real mosquitto."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from devkit.bench import broker_limit
from devkit.bench.loadgen import SensorLoad
from devkit.bench.mqtt_wire import Inbound, WirePublisher, WireSubscriber
from devkit.broker import Mosquitto
from tesla_gateway.sources.payload_rules import PayloadRules
from tesla_gateway.sources.payloads import decode_payload


def test_the_c_subscriber_takes_every_message_and_reports_its_count(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """limit_sub (built with the system cc) subscribes at QoS 1 under MQTT 5, takes exactly the
    messages published, acknowledges them (the publisher's broker acknowledged every one and
    limit_sub exits cleanly after the last) and writes its count as the daemon's status.json."""
    binary = broker_limit.build_subscriber(tmp_path)
    status = tmp_path / "status.json"
    count = 3_000
    subscriber = subprocess.Popen(
        [str(binary), mosquitto.host, str(mosquitto.port), "t-sub", "sensors/+/raw",
         str(count), str(status)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert subscriber.stdout is not None
        assert subscriber.stdout.readline().strip() == b"subscribed"
        assert json.loads(status.read_text())["readings_in"] == 0
        publisher = WirePublisher(mosquitto.host, mosquitto.port, "t-pub")
        load = SensorLoad(100, 1_700_000_000, stride=1, batch=1)
        try:
            for _ in range(count // 100):
                publisher.send(load.packets(0, 100, publisher.packet_ids(100)), 100)
                load.round += 1
            assert publisher.wait_acked(30.0)
        finally:
            publisher.close()
        out, err = subscriber.communicate(timeout=30)
    finally:
        if subscriber.poll() is None:
            subscriber.kill()
            subscriber.wait()
    assert subscriber.returncode == 0, err
    assert out.decode().split() == ["received", str(count)]


def test_the_closed_loops_reach_the_c_subscriber_and_give_rates() -> None:
    figures = broker_limit.broker_forwarding_rate(sensors=1_000, duration_s=2.0)
    assert figures["broker_messages"] > 1_000
    assert figures["broker_forward_per_s"] > 0
    assert figures["broker_forward_loadgen_per_s"] > 0


def test_the_c_publisher_sends_the_load_generators_readings(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """limit_pub offers the broker what the bench's generator offers the daemon: one reading per
    sensor per round on sensors/node-<i>/raw, payloads the gateway's own decoder accepts, every
    message acknowledged; its samples follow the consumer's status file."""
    binary = broker_limit.build_publisher(tmp_path)
    status = tmp_path / "status.json"
    status.write_text('{"updated_at": 1.0, "readings_in": 0}\n')
    subscriber = WireSubscriber(mosquitto.host, mosquitto.port, "t-sub", "sensors/+/raw")
    subscriber.wait_subscribed()
    out = tmp_path / "out.json"
    try:
        ran = subprocess.run(
            [str(binary), mosquitto.host, str(mosquitto.port), "t-pub", "50", "0.2", "10000000",
             str(status), str(out)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        result = json.loads(out.read_text())
        published = result["readings_published"]
        assert published >= 50 and published % 50 == 0  # whole rounds
        received: list[Inbound] = []
        while len(received) < published:
            batch = subscriber.read(timeout_s=10.0)
            assert batch, f"{len(received)} of {published} arrived"
            received += batch
    finally:
        subscriber.close()
    assert {m.topic for m in received} == {f"sensors/node-{i:05d}/raw" for i in range(50)}
    first = [m for m in received if m.topic == "sensors/node-00007/raw"]
    readings = [
        reading
        for m in first
        for reading in decode_payload(
            m.payload, topic_sensor_id="node-00007", received_at=time.time(), source="mqtt",
            rules=PayloadRules(),
        ).readings
    ]  # fmt: skip
    assert len(readings) == len(first)
    assert all(2 <= r.values["pm10"] <= 60 for r in readings)
    stamps = [r.timestamp for r in readings]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


def test_the_c_publisher_refuses_bad_arguments_and_a_missing_status(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    binary = broker_limit.build_publisher(tmp_path)
    ran = subprocess.run([str(binary), "x"], capture_output=True, text=True, check=False)
    assert ran.returncode == 2 and "usage" in ran.stderr
    ran = subprocess.run(
        [str(binary), mosquitto.host, str(mosquitto.port), "t-pub", "50", "0.2", "100",
         str(tmp_path / "absent.json"), str(tmp_path / "out.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 2 and "status file is not readable" in ran.stderr
    assert not (tmp_path / "out.json").exists()


def test_a_missing_compiler_is_named_with_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)
    with pytest.raises(broker_limit.CompilerMissingError, match="gcc"):
        broker_limit.build_subscriber(tmp_path)
    with pytest.raises(broker_limit.CompilerMissingError, match=r"limit_pub\.c"):
        broker_limit.build_publisher(tmp_path)
