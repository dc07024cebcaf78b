"""The installer's mosquitto configuration, enforced by a real mosquitto over TLS.

The generated conf.d file names its files by their path on the Pi (/etc/mosquitto/...); the test
rewrites those paths into the throwaway root, moves both listeners to free loopback ports and,
as root, keeps mosquitto from switching to the 'mosquitto' user (absent here). The TLS CA and
server certificate are the ones install.sh generated with openssl.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit.broker import MOSQUITTO, free_ports
from tests.deploy.conftest import GATEWAY_ID, InstalledRoot
from tests.deploy.mqtt_client import WAIT_S, Client


@dataclass
class Broker:
    tls_port: int
    plain_port: int
    ca: Path
    credentials: Path

    def password(self, user: str) -> str:
        return (self.credentials / user).read_text().strip()

    def client(self, user: str | None, password: str | None = None) -> Client:
        """A TLS client; without a password, the one install.sh created for ``user``."""
        if user is not None and password is None:
            password = self.password(user)
        return Client(self.tls_port, user, password, ca=self.ca)


@pytest.fixture
def broker(tmp_path: Path, installed_root: InstalledRoot) -> Iterator[Broker]:
    root = installed_root.root
    conf = (root / "etc/mosquitto/conf.d/00-tesla-gateway.conf").read_text()
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


def test_acl_and_authentication_over_tls(broker: Broker) -> None:
    anonymous = broker.client(None)
    assert anonymous.connack is not None and anonymous.connack.is_failure
    anonymous.close()
    wrong = broker.client("node-01", "not-the-password")
    assert wrong.connack is not None and wrong.connack.is_failure
    wrong.close()

    gateway = broker.client("tesla-gateway")
    reader = broker.client("tesla-reader")
    node = broker.client("node-01")
    release = broker.client("tesla-release")
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
        # The reader account reads everything the gateway publishes: stats, health, drift.
        published = [
            f"tesla/{GATEWAY_ID}/stats",
            f"tesla/{GATEWAY_ID}/node-01/pm10/health",
            f"tesla/{GATEWAY_ID}/node-01/pm10/drift",
        ]
        assert reader.subscribe(f"tesla/{GATEWAY_ID}/#")
        reader.messages.clear()
        for topic in published:
            assert gateway.publish(topic, b"doc")
        assert [topic for topic, _ in reader.received(len(published))] == sorted(published)
    finally:
        for client in (gateway, reader, node, release):
            client.close()
