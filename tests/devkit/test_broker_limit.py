"""The broker-limit measurement of make bench, run small against a real mosquitto."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from devkit.bench import broker_limit
from devkit.bench.loadgen import SensorLoad
from devkit.bench.mqtt_wire import WirePublisher
from devkit.broker import Mosquitto


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


def test_the_closed_loop_reaches_the_c_subscriber_and_gives_a_rate() -> None:
    figures = broker_limit.broker_forwarding_rate(sensors=1_000, duration_s=2.0)
    assert figures["broker_messages"] > 1_000
    assert figures["broker_forward_per_s"] > 0


def test_a_missing_compiler_is_named_with_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)
    with pytest.raises(broker_limit.CompilerMissingError, match="gcc"):
        broker_limit.build_subscriber(tmp_path)
