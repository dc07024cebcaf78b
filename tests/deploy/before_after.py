"""Before and after install.sh on a broker that already serves others: the same real clients
against a real mosquitto on the configuration as it was, and as the installer left it.

A scenario writes a pre-existing configuration into a fresh throwaway root (Debian's stock
mosquitto.conf unless it brings its own, plus conf.d files, password files and ACLs as the
Zigbee2MQTT and Home Assistant guides have an operator write them), probes every client with
``reach`` on mosquitto (tests/deploy/mosquitto_tree.py), runs the installer (the venv of the
package's shared install copied in first, so it skips pip), restarts mosquitto on the result and
probes again. Then: a second run changes nothing, and uninstall.sh puts every file of the
operator's back byte for byte.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from devkit.broker import MOSQUITTO_PASSWD
from tests.deploy.conftest import (
    GATEWAY_ID,
    UNINSTALL,
    InstalledRoot,
    adopt_venv,
    make_base_root,
)
from tests.deploy.mosquitto_tree import Ports, running
from tests.deploy.mqtt_client import Client, reach

# Debian's /etc/mosquitto/mosquitto.conf (package mosquitto 2.0.11, bookworm).
STOCK_CONF = """\
pid_file /run/mosquitto/mosquitto.pid
persistence true
persistence_location /var/lib/mosquitto/
log_dest file /var/log/mosquitto/mosquitto.log
include_dir /etc/mosquitto/conf.d
"""
# What each client tries: two ordinary topics (publish, then receive its own message) and a
# broker statistic (receive the retained one).
TOPICS = ("zigbee2mqtt/bridge/state", "homeassistant/status", "$SYS/broker/uptime")
EVERYTHING = ("write+read", "write+read", "read")
OWN_CONF = "etc/mosquitto/conf.d/00-tesla-gateway.conf"


@dataclass(frozen=True)
class Probe:
    """One client: its user name (None: anonymous) and password, on a configured port."""

    user: str | None
    password: str | None = None
    port: int = 1883


@dataclass(frozen=True)
class Outcome:
    root: Path
    before: dict[str, tuple[str, ...]]
    after: dict[str, tuple[str, ...]]
    output: str
    edited: dict[str, str]  # the operator's files the installer changed: path -> new text


def install_args(installed_root: InstalledRoot, root: Path, *extra: str) -> list[str]:
    args = installed_root.install_args(*extra)
    args[args.index("--root") + 1] = str(root)
    return args


def make_root(
    base: Path,
    installed_root: InstalledRoot,
    files: Mapping[str, str],
    passwords: Mapping[str, Mapping[str, str]] = {},  # read only
) -> Path:
    """A root with ``files`` under etc/mosquitto (mosquitto.conf: Debian's unless given) and
    the password files ``passwords`` (file name -> user -> password)."""
    root = base / "root"
    make_base_root(root)
    adopt_venv(installed_root, root)
    mosq = root / "etc/mosquitto"
    (mosq / "conf.d").mkdir(parents=True)
    for name, text in {"mosquitto.conf": STOCK_CONF, **files}.items():
        (mosq / name).write_text(text, encoding="utf-8")
    for name, users in passwords.items():
        for user, password in users.items():
            create = ["-c"] if not (mosq / name).exists() else []
            subprocess.run(
                [str(MOSQUITTO_PASSWD), *create, "-b", str(mosq / name), user, password],
                check=True,
                capture_output=True,
            )
    return root


def texts(root: Path) -> dict[str, bytes]:
    mosq = root / "etc/mosquitto"
    return {str(p.relative_to(root)): p.read_bytes() for p in mosq.rglob("*") if p.is_file()}


def gateway_ports(root: Path) -> tuple[int, int]:
    """The gateway's loopback port (its gateway.toml) and TLS port (its conf.d file)."""
    toml = (root / "etc/tesla-gateway/gateway.toml").read_text()
    (plain,) = set(re.findall(r"^port = (\d+)$", toml, re.M))
    (tls,) = re.findall(r"^listener (\d+)$", (root / OWN_CONF).read_text(), re.M)
    return int(plain), int(tls)


def gateway_users_work(root: Path, ports: Ports) -> None:
    """The gateway (loopback listener) reads its node's raw readings and publishes; the node and
    the reader use TLS; anonymous clients are refused on both; the ACL holds."""
    plain, tls = gateway_ports(root)
    ca = root / "etc/mosquitto/certs/tesla-ca.pem"

    def password(user: str) -> str:
        return (root / "etc/tesla-gateway/credentials" / user).read_text().strip()

    assert reach(ports[plain], None, None, ()) == ("refused",)
    assert reach(ports[tls], None, None, (), ca=ca) == ("refused",)
    gateway = Client(ports[plain], "tesla-gateway", password("tesla-gateway"))
    node = Client(ports[tls], "node-01", password("node-01"), ca=ca)
    reader = Client(ports[tls], "tesla-reader", password("tesla-reader"), ca=ca)
    try:
        for client in (gateway, node, reader):
            assert client.connack is not None and not client.connack.is_failure
        assert gateway.subscribe("sensors/+/raw")
        assert reader.subscribe(f"tesla/{GATEWAY_ID}/#")
        assert node.publish("sensors/node-01/raw", b"own")
        assert not node.publish("sensors/node-02/raw", b"forged")
        assert not node.publish(f"tesla/{GATEWAY_ID}/stats", b"forged")
        assert gateway.publish(f"tesla/{GATEWAY_ID}/stats", b"doc")
        assert gateway.received(1) == [("sensors/node-01/raw", b"own")]
        assert reader.received(1) == [(f"tesla/{GATEWAY_ID}/stats", b"doc")]
    finally:
        for client in (gateway, node, reader):
            client.close()


def before_and_after(
    work: Path, installed_root: InstalledRoot, root: Path, probes: Mapping[str, Probe]
) -> Outcome:
    """Probe, install, probe again; then check the rerun and the uninstall (see above)."""

    def probe_all(ports: Ports) -> dict[str, tuple[str, ...]]:
        return {
            name: reach(ports[p.port], p.user, p.password, TOPICS) for name, p in probes.items()
        }

    original = texts(root)
    with running(root, work / "before") as ports:
        before = probe_all(ports)
    first = subprocess.run(
        install_args(installed_root, root), capture_output=True, text=True, check=False
    )
    assert first.returncode == 0, first.stdout + first.stderr
    installed = texts(root)
    with running(root, work / "after") as ports:
        after = probe_all(ports)
        gateway_users_work(root, ports)
    again = subprocess.run(
        install_args(installed_root, root), capture_output=True, text=True, check=True
    )
    assert "done: 0 change(s)" in again.stdout, again.stdout
    subprocess.run([str(UNINSTALL), "--root", str(root)], capture_output=True, check=True)
    assert texts(root) == original  # the operator's files as they were, the gateway's gone
    edited = {
        path: text.decode()
        for path, text in installed.items()
        if path in original and original[path] != text
    }
    return Outcome(root, before, after, first.stdout, edited)
