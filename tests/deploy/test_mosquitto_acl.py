"""The installer's mosquitto configuration, enforced by a real mosquitto over TLS.

The generated conf.d file names its files by their path on the Pi (/etc/mosquitto/...); the test
rewrites those paths into the throwaway root, moves both listeners to free loopback ports and,
as root, keeps mosquitto from switching to the 'mosquitto' user (absent here). The TLS CA and
server certificate are the ones install.sh generated with openssl.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.reasoncodes import ReasonCode

from devkit.broker import MOSQUITTO, free_ports
from tests.deploy.conftest import GATEWAY_ID, InstalledRoot

WAIT_S = 10.0


@dataclass
class Broker:
    tls_port: int
    plain_port: int
    ca: Path
    credentials: Path

    def password(self, user: str) -> str:
        return (self.credentials / user).read_text().strip()


@pytest.fixture
def broker(tmp_path: Path, installed_root: InstalledRoot) -> Iterator[Broker]:
    root = installed_root.root
    conf = (root / "etc/mosquitto/conf.d/tesla-gateway.conf").read_text()
    tls_port, plain_port = free_ports(2)
    conf = conf.replace("/etc/mosquitto/", f"{root}/etc/mosquitto/")
    conf = conf.replace("listener 1883 127.0.0.1", f"listener {plain_port} 127.0.0.1")
    conf = conf.replace("listener 8883", f"listener {tls_port} 127.0.0.1")
    if os.geteuid() == 0:
        conf = "user root\n" + conf
    path = tmp_path / "mosquitto.conf"
    path.write_text(conf + "log_dest stderr\n", encoding="utf-8")
    log = (tmp_path / "mosquitto.log").open("wb")
    process = subprocess.Popen([str(MOSQUITTO), "-c", str(path)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + WAIT_S
        while not _listening(tls_port):
            assert process.poll() is None, (tmp_path / "mosquitto.log").read_text()
            assert time.monotonic() < deadline, "mosquitto did not start"
            time.sleep(0.05)
        yield Broker(
            tls_port=tls_port,
            plain_port=plain_port,
            ca=root / "etc/mosquitto/certs/tesla-ca.pem",
            credentials=root / "etc/tesla-gateway/credentials",
        )
    finally:
        process.terminate()
        process.wait(timeout=WAIT_S)
        log.close()


def _listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Client:
    """A synchronous MQTT 5 client over TLS: connect result, publish and subscribe outcomes."""

    def __init__(self, broker: Broker, user: str | None, password: str | None = None) -> None:
        self.connack: ReasonCode | None = None
        self.messages: list[tuple[str, bytes]] = []
        self._connected = threading.Event()
        self._acks: dict[int, list[ReasonCode]] = {}
        self._acked = threading.Condition()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        self.client.tls_set(ca_certs=str(broker.ca))
        if user is not None:
            self.client.username_pw_set(
                user, password if password is not None else broker.password(user)
            )
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_ack
        self.client.on_subscribe = lambda _c, _u, mid, codes, _p: self._record(mid, list(codes))
        self.client.on_message = lambda _c, _u, m: self.messages.append((m.topic, bytes(m.payload)))
        self.client.connect("127.0.0.1", broker.tls_port)
        self.client.loop_start()
        assert self._connected.wait(WAIT_S), "no CONNACK"

    def _on_connect(self, _c: object, _u: object, _f: object, rc: ReasonCode, _p: object) -> None:
        self.connack = rc
        self._connected.set()

    def _on_ack(self, _c: object, _u: object, mid: int, rc: ReasonCode, _p: object) -> None:
        self._record(mid, [rc])

    def _record(self, mid: int, codes: list[ReasonCode]) -> None:
        with self._acked:
            self._acks[mid] = codes
            self._acked.notify_all()

    def _wait(self, mid: int) -> list[ReasonCode]:
        with self._acked:
            assert self._acked.wait_for(lambda: mid in self._acks, WAIT_S), "no acknowledgement"
            return self._acks.pop(mid)

    def publish(self, topic: str, payload: bytes = b"{}") -> bool:
        """True if the broker accepted the QoS 1 publish (PUBACK without a failure code)."""
        info = self.client.publish(topic, payload, qos=1)
        return not self._wait(info.mid)[0].is_failure

    def subscribe(self, topic: str) -> bool:
        _, mid = self.client.subscribe(topic, qos=1)
        assert mid is not None
        return not self._wait(mid)[0].is_failure

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_acl_and_authentication_over_tls(broker: Broker) -> None:
    anonymous = Client(broker, None)
    assert anonymous.connack is not None and anonymous.connack.is_failure
    anonymous.close()
    wrong = Client(broker, "node-01", "not-the-password")
    assert wrong.connack is not None and wrong.connack.is_failure
    wrong.close()

    gateway = Client(broker, "tesla-gateway")
    reader = Client(broker, "tesla-reader")
    node = Client(broker, "node-01")
    release = Client(broker, "tesla-release")
    try:
        for client in (gateway, reader, node, release):
            assert client.connack is not None and not client.connack.is_failure
        assert gateway.subscribe("sensors/+/raw")
        assert reader.subscribe(f"tesla/{GATEWAY_ID}/+/+")
        # Subscribers may not read raw readings (mosquitto 2 grants the subscription but never
        # delivers a message the ACL forbids: checked below) nor publish anything.
        reader.subscribe("sensors/+/raw")
        assert not reader.publish(f"tesla/{GATEWAY_ID}/node-01/pm10")
        # A node publishes its own raw topic only; not another's, not calibrated, not releases.
        assert node.publish("sensors/node-01/raw", b"own")
        assert not node.publish("sensors/node-02/raw", b"forged")
        assert not node.publish(f"tesla/{GATEWAY_ID}/node-01/pm10", b"forged")
        assert not node.publish("tesla/releases/gateway/pm10", b"forged")
        # Only the release-key holder publishes releases; the gateway publishes calibrated ones.
        assert release.publish("tesla/releases/gateway/pm10", b"release")
        assert not gateway.publish("tesla/releases/gateway/pm10", b"forged")
        assert gateway.publish(f"tesla/{GATEWAY_ID}/node-01/pm10", b"calibrated")
        deadline = time.monotonic() + WAIT_S
        while (not gateway.messages or not reader.messages) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gateway.messages == [("sensors/node-01/raw", b"own")]
        assert reader.messages == [(f"tesla/{GATEWAY_ID}/node-01/pm10", b"calibrated")]
    finally:
        for client in (gateway, reader, node, release):
            client.close()
