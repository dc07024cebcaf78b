"""Floods from the wire against the REAL daemon and a real mosquitto (issue 12, findings 5, 6).

* A QoS 0 flood from one fast client (pre-encoded PUBLISH packets written in large blocks on
  loopback: far faster than the daemon calibrates) must keep the daemon's memory bounded: at
  most ``max_inbox_messages`` wait between paho's thread and the loop, the excess is dropped
  and counted, and every message is either ingested or counted. Short form 200,000 messages;
  long form 2,000,000 with RSS under the 10,000-sensor budget (120 MB).
* QoS 1 readings the broker drops (its queue for the gateway's session is full while the
  gateway is down) must show on the stats: ``readings_missing`` equals the number published
  minus the number the daemon received.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from pathlib import Path

import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.broker import Mosquitto
from tesla_gateway.mqtt.wire import encode_string, publish_packet, remaining_length
from tests.reliability.harness import (
    WAIT_S,
    Daemon,
    copy_default_model,
    report,
    wait_for,
    wait_while_progressing,
    write_config,
)

pytestmark = pytest.mark.reliability
BUDGET_KIB = 120 * 1024  # the 10,000-sensor RSS budget (docs/deployment.md)
SHORT_GROWTH_KIB = 25 * 1024  # short form: growth over the idle daemon (unbounded: 44 MB)
BLOCK = 5_000  # PUBLISH packets per write


def flood_qos0(port: int, count: int, sensors: int, timestamp: float) -> None:
    """One MQTT 3.1.1 client publishing ``count`` QoS 0 readings as fast as the socket takes
    them (what a misbehaving or malicious client does), then disconnecting."""
    body = encode_string("MQTT") + bytes([4, 0x02, 0, 60]) + encode_string("flood")
    connect = b"\x10" + remaining_length(len(body)) + body
    packets = [
        publish_packet(
            f"sensors/f{n % sensors}/raw".encode(),
            json.dumps({"ts": timestamp, "pm10": float(n % 500)}).encode(),
            qos=0,
        )
        for n in range(min(count, BLOCK * 2))
    ]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(connect)
        assert sock.recv(4)[:1] == b"\x20", "no CONNACK"
        sent = 0
        while sent < count:
            size = min(BLOCK, count - sent)
            start = sent % len(packets)
            block = (packets[start:] + packets)[:size]
            sock.sendall(b"".join(block))
            sent += size
        sock.sendall(b"\xe0\x00")  # DISCONNECT


class RssSampler:
    """The daemon's RSS, sampled every 20 ms in a thread; ``peak`` in KiB."""

    def __init__(self, daemon: Daemon) -> None:
        self.peak = daemon.rss_kib()
        self._daemon = daemon
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            with contextlib.suppress(OSError):  # the daemon exited
                self.peak = max(self.peak, self._daemon.rss_kib())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def inbox(daemon: Daemon) -> dict[str, int]:
    return dict(daemon.status().get("mqtt_inbox", {}).get("mqtt-source-0", {}))


class BrokerDrops:
    """mosquitto's own count of messages it dropped (queue limits): ``$SYS`` every second."""

    def __init__(self, broker: Mosquitto) -> None:
        self.dropped = 0
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id="sys-watch")
        self._client.on_message = self._on_message
        self._client.connect(broker.host, broker.port)
        self._client.subscribe("$SYS/broker/publish/messages/dropped")
        self._client.loop_start()

    def _on_message(self, _c: object, _u: object, message: paho.MQTTMessage) -> None:
        self.dropped = int(message.payload)

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


def test_a_qos0_flood_keeps_memory_bounded(tmp_path: Path, long_form: bool) -> None:
    count = 2_000_000 if long_form else 200_000
    broker = Mosquitto(tmp_path / "mosquitto", sys_interval_s=1)
    broker.start()
    model = copy_default_model(tmp_path / "model")
    config = write_config(
        tmp_path / "gw.toml", gateway_id="gw-flood", model_dir=model, broker_port=broker.port
    )
    broker_drops = BrokerDrops(broker)
    daemon = Daemon(config, tmp_path / "state")
    sampler = RssSampler(daemon)
    try:
        idle_kib = daemon.rss_kib()
        flood_qos0(broker.port, count, sensors=100, timestamp=time.time() - 30)

        def accounted() -> int:
            """Ingested, dropped at the gateway's inbox, or dropped by the broker."""
            ingested = int(daemon.status().get("readings_in", 0))
            return ingested + inbox(daemon).get("dropped_qos0", 0) + broker_drops.dropped

        wait_while_progressing(lambda: accounted() >= count, accounted, "the flood to drain")
        peak_kib = sampler.stop()
        status = daemon.status()
        stats = inbox(daemon)
        assert daemon.stop() == 0
    finally:
        sampler.stop()
        daemon.kill()
        broker_drops.close()
        broker.stop()
    figures = {
        "messages": count,
        "readings_in": status["readings_in"],
        "rejected": status["rejected"],
        "inbox": stats,
        "broker_dropped": broker_drops.dropped,
        "rss_idle_kib": idle_kib,
        "rss_peak_kib": peak_kib,
    }
    report(f"qos0_flood_{'long' if long_form else 'short'}", figures)
    assert stats["max"] == 10_000  # the default max_inbox_messages
    assert stats["peak"] <= stats["max"]
    # Every message was ingested or counted as dropped (by the gateway or the broker).
    assert status["readings_in"] + stats["dropped_qos0"] + broker_drops.dropped == count
    if long_form:
        assert peak_kib < BUDGET_KIB
    else:
        assert peak_kib - idle_kib < SHORT_GROWTH_KIB


def test_readings_the_broker_drops_show_as_missing(tmp_path: Path) -> None:
    """mosquitto keeps at most max_queued_messages for the gateway's session while it is down
    and drops the rest; the readings' sequence numbers make the loss visible on the stats."""
    broker = Mosquitto(tmp_path / "mosquitto", max_queued_messages=50)
    broker.start()
    model = copy_default_model(tmp_path / "model")
    config = write_config(
        tmp_path / "gw.toml", gateway_id="gw-seq", model_dir=model, broker_port=broker.port
    )
    offline, online = 500, 10
    base = time.time() - 3600
    publisher = paho.Client(CallbackAPIVersion.VERSION2, client_id="node-1")
    try:
        daemon = Daemon(config, tmp_path / "state")  # creates the persistent session
        assert daemon.stop() == 0
        publisher.connect(broker.host, broker.port)
        publisher.loop_start()

        def publish(seq: int) -> None:
            payload = json.dumps({"ts": base + seq, "seq": seq, "pm10": 10.0 + seq % 7})
            publisher.publish("sensors/node-1/raw", payload, qos=1).wait_for_publish(10)

        for seq in range(offline):  # the broker acknowledges each, then drops most
            publish(seq)
        daemon = Daemon(config, tmp_path / "state")
        try:
            wait_for(lambda: daemon.status().get("readings_in", 0) > 0, "the queued readings")
            for seq in range(offline, offline + online):
                publish(seq)

            def accounted() -> int:  # received, and counted as never received
                status = daemon.status()
                return int(status.get("readings_in", 0)) + int(status.get("readings_missing", 0))

            try:
                wait_while_progressing(
                    lambda: accounted() == offline + online,
                    lambda: daemon.status().get("readings_in"),
                    "every reading received or counted missing",
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {daemon.status().get('sequence')}") from exc
            status = daemon.status()
            assert daemon.stop() == 0
        finally:
            daemon.kill()
    finally:
        publisher.loop_stop()
        publisher.disconnect()
        broker.stop()
    published = offline + online
    received = status["readings_in"]
    report(
        "qos1_loss_visible",
        {
            "published": published,
            "received": received,
            "readings_missing": status["readings_missing"],
            "sequence": status["sequence"],
        },
    )
    assert received < published  # the broker did drop some
    assert status["readings_missing"] == published - received
    assert status["readings_missing_top"] == {"node-1": published - received}


def test_an_online_qos1_flood_the_broker_cannot_queue_shows_as_missing(
    tmp_path: Path, long_form: bool
) -> None:
    """Finding 6 as reported: a QoS 1 flood faster than the gateway takes it, to a broker whose
    queue for the gateway overflows ("outgoing messages are being dropped"). What mosquitto
    drops is exactly what the daemon reports as readings_missing."""
    count = 200_000 if long_form else 20_000
    broker = Mosquitto(tmp_path / "mosquitto", max_queued_messages=100, sys_interval_s=1)
    broker.start()
    model = copy_default_model(tmp_path / "model")
    config = write_config(
        tmp_path / "gw.toml", gateway_id="gw-q1", model_dir=model, broker_port=broker.port
    )
    base = time.time() - 86_400
    broker_drops = BrokerDrops(broker)
    publisher = paho.Client(CallbackAPIVersion.VERSION2, client_id="node-1")
    publisher.max_inflight_messages_set(1000)
    publisher.max_queued_messages_set(0)
    daemon = Daemon(config, tmp_path / "state")
    try:
        publisher.connect(broker.host, broker.port)
        publisher.loop_start()

        def publish(seq: int) -> paho.MQTTMessageInfo:
            # 4 readings a second from a day ago: never in the future, even in the long form
            payload = json.dumps({"ts": base + seq / 4, "seq": seq, "pm10": 10.0 + seq % 7})
            return publisher.publish("sensors/node-1/raw", payload, qos=1)

        for start in range(0, count, 20_000):  # paho's packet ids (65,535) must not wrap
            for info in [publish(seq) for seq in range(start, min(start + 20_000, count))]:
                info.wait_for_publish(WAIT_S)

        def received() -> int:
            return int(daemon.status().get("readings_in", 0))

        wait_while_progressing(
            lambda: received() + broker_drops.dropped >= count,
            lambda: received() + broker_drops.dropped,
            "the broker to deliver or drop every reading",
        )
        publish(count).wait_for_publish(WAIT_S)  # one more, so a lost tail is a gap too
        wait_for(lambda: received() + broker_drops.dropped >= count + 1, "the last reading")
        status = daemon.status()
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        publisher.loop_stop()
        publisher.disconnect()
        broker_drops.close()
        broker.stop()
    figures = {
        "published": count + 1,
        "received": status["readings_in"],
        "broker_dropped": broker_drops.dropped,
        "readings_missing": status["readings_missing"],
        "sequence": status["sequence"],
        "inbox": status["mqtt_inbox"],
    }
    report(f"qos1_online_flood_{'long' if long_form else 'short'}", figures)
    assert broker_drops.dropped > 0  # the broker did drop
    assert status["readings_missing"] == count + 1 - status["readings_in"]
    assert status["readings_missing"] == broker_drops.dropped
