"""install.sh on a Pi whose mosquitto already serves others (Zigbee2MQTT, Home Assistant): the
existing configuration is kept, its clients keep their access, the gateway's users are added.

Each case writes a pre-existing configuration into a fresh throwaway root (Debian's stock
mosquitto.conf plus a conf.d file as the Zigbee2MQTT and Home Assistant guides write it), runs
the installer, then starts a real mosquitto on the result. The venv of the package's shared
install is copied in first, so the installer finds it up to date and skips pip. mosquitto is
given one file: mosquitto.conf followed by conf.d/*.conf in name order (what ``include_dir``
reads), with /etc/mosquitto paths moved into the root, ports 1883 and 8883 moved to free
loopback ports, and the pid file, log file and persistence left out.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit.broker import MOSQUITTO, MOSQUITTO_PASSWD, free_ports
from tests.deploy.conftest import (
    GATEWAY_ID,
    REPO,
    UNINSTALL,
    InstalledRoot,
    adopt_venv,
    install_command,
    make_base_root,
)
from tests.deploy.mqtt_client import WAIT_S, Client

# Debian's /etc/mosquitto/mosquitto.conf (package mosquitto 2.0.11, bookworm).
STOCK_CONF = """\
pid_file /run/mosquitto/mosquitto.pid
persistence true
persistence_location /var/lib/mosquitto/
log_dest file /var/log/mosquitto/mosquitto.log
include_dir /etc/mosquitto/conf.d
"""
# What https://www.zigbee2mqtt.io/guide/getting-started/ and the Home Assistant Mosquitto guides
# have an operator write: one listener on all interfaces, users in a password file.
ANONYMOUS_AND_USERS = """\
listener 1883
allow_anonymous true
password_file /etc/mosquitto/z2m.passwd
"""
USERS_WITH_ACL = """\
listener 1883
allow_anonymous false
password_file /etc/mosquitto/z2m.passwd
acl_file /etc/mosquitto/z2m.acl
"""
Z2M_ACL = "user z2m\ntopic readwrite zigbee2mqtt/#\ntopic readwrite homeassistant/#\n"
Z2M_PASSWORD = "z2m-secret"


@dataclass
class SharedBroker:
    root: Path
    ports: dict[int, int]  # configured listener port -> where it listens in the test
    install_output: str

    def client(self, user: str | None, password: str | None = None, port: int = 1883) -> Client:
        """A plain client on listener ``port`` (as configured); our users' passwords as
        installed."""
        if user is not None and password is None:
            password = (self.root / "etc/tesla-gateway/credentials" / user).read_text().strip()
        return Client(self.ports[port], user, password)

    def conf(self, name: str) -> str:
        return (self.root / "etc/mosquitto" / name).read_text()


def settings(text: str) -> dict[str, str]:
    """A mosquitto configuration's keys (comments left out); the last value of each."""
    pairs = (line.split(maxsplit=1) for line in text.splitlines() if line.strip())
    return {pair[0]: pair[-1] for pair in pairs if not pair[0].startswith("#")}


def install_over(
    base: Path, installed_root: InstalledRoot, files: dict[str, str]
) -> tuple[Path, str]:
    """A fresh root with ``files`` under etc/mosquitto and z2m's password, then install.sh."""
    root = base / "root"
    make_base_root(root)
    adopt_venv(installed_root, root)
    mosq = root / "etc/mosquitto"
    (mosq / "conf.d").mkdir(parents=True)
    (mosq / "mosquitto.conf").write_text(STOCK_CONF)
    for name, text in files.items():
        (mosq / name).write_text(text)
    subprocess.run(
        [str(MOSQUITTO_PASSWD), "-c", "-b", str(mosq / "z2m.passwd"), "z2m", Z2M_PASSWORD],
        check=True,
        capture_output=True,
    )
    args = installed_root.install_args()
    args[args.index("--root") + 1] = str(root)
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return root, result.stdout


@contextlib.contextmanager
def running_broker(root: Path, log: Path, install_output: str) -> Iterator[SharedBroker]:
    """mosquitto on the root's configuration (see the module docstring); every listener is
    moved to a free loopback port (``ports`` maps the configured port to it)."""
    mosq = root / "etc/mosquitto"
    parts = [mosq / "mosquitto.conf", *sorted((mosq / "conf.d").glob("*.conf"))]
    text = "\n".join(part.read_text() for part in parts)
    text = re.sub(
        r"^(pid_file|persistence|persistence_location|log_dest|include_dir)\b.*$",
        "",
        text,
        flags=re.MULTILINE,
    )
    text = text.replace("/etc/mosquitto/", f"{mosq}/")
    configured = sorted({int(p) for p in re.findall(r"^listener (\d+)", text, flags=re.M)})
    ports = dict(zip(configured, free_ports(len(configured)), strict=True))
    text = re.sub(
        r"^listener (\d+)\b.*$",
        lambda match: f"listener {ports[int(match[1])]} 127.0.0.1",
        text,
        flags=re.MULTILINE,
    )
    if os.geteuid() == 0:
        text = "user root\n" + text
    conf = log.with_suffix(".conf")
    conf.write_text(text + "\nlog_dest stderr\n")
    with log.open("wb") as out:
        process = subprocess.Popen([str(MOSQUITTO), "-c", str(conf)], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + WAIT_S
        while not all(_listening(port) for port in ports.values()):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "mosquitto did not start: " + log.read_text()
            time.sleep(0.05)
        yield SharedBroker(root, ports, install_output)
    finally:
        process.terminate()
        process.wait(timeout=WAIT_S)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def anonymous_and_users(
    tmp_path_factory: pytest.TempPathFactory, installed_root: InstalledRoot
) -> Iterator[SharedBroker]:
    base = tmp_path_factory.mktemp("shared-anonymous")
    root, output = install_over(
        base, installed_root, {"conf.d/zigbee2mqtt.conf": ANONYMOUS_AND_USERS}
    )
    with running_broker(root, base / "mosquitto.log", output) as broker:
        yield broker


def gateway_users_work(broker: SharedBroker, port: int = 1883) -> None:
    """The gateway reads its node's raw readings; the reader reads all it publishes."""
    gateway = broker.client("tesla-gateway", port=port)
    node = broker.client("node-01", port=port)
    reader = broker.client("tesla-reader", port=port)
    try:
        for client in (gateway, node, reader):
            assert client.connack is not None and not client.connack.is_failure
        assert gateway.subscribe("sensors/+/raw")
        assert reader.subscribe(f"tesla/{GATEWAY_ID}/#")
        assert node.publish("sensors/node-01/raw", b"own")
        assert not node.publish("sensors/node-02/raw", b"forged")
        published = [
            f"tesla/{GATEWAY_ID}/{leaf}" for leaf in ("stats", "n/pm10/health", "n/pm10/drift")
        ]
        for topic in published:
            assert gateway.publish(topic, b"doc")
        assert gateway.received(1) == [("sensors/node-01/raw", b"own")]
        assert [topic for topic, _ in reader.received(3)] == sorted(published)
    finally:
        for client in (gateway, node, reader):
            client.close()


def test_anonymous_clients_and_existing_users_keep_working(
    anonymous_and_users: SharedBroker,
) -> None:
    broker = anonymous_and_users
    ours = settings(broker.conf("conf.d/tesla-gateway.conf"))
    assert "allow_anonymous" not in ours and "password_file" not in ours  # theirs stand
    assert ours["listener"] == "8883"  # their listener on 1883 serves the gateway too
    assert ours["acl_file"] == "/etc/mosquitto/tesla-gateway.acl"
    users = [line.split(":")[0] for line in broker.conf("z2m.passwd").splitlines()]
    assert users[0] == "z2m" and {"tesla-gateway", "tesla-reader", "node-01"} <= set(users)
    acl = broker.conf("tesla-gateway.acl")
    assert acl.index("topic readwrite #") < acl.index("user z2m") < acl.index("user tesla-gateway")

    anonymous = broker.client(None)
    z2m = broker.client("z2m", Z2M_PASSWORD)
    try:
        for client in (anonymous, z2m):
            assert client.connack is not None and not client.connack.is_failure
        assert anonymous.subscribe("zigbee2mqtt/#")
        assert z2m.publish("zigbee2mqtt/bridge/state", b"online")
        assert anonymous.publish("zigbee2mqtt/lamp/set", b"ON")
        assert z2m.publish("homeassistant/light/lamp/config", b"{}")
        assert anonymous.received(2) == [
            ("zigbee2mqtt/bridge/state", b"online"),
            ("zigbee2mqtt/lamp/set", b"ON"),
        ]
    finally:
        anonymous.close()
        z2m.close()
    gateway_users_work(broker)


def test_an_existing_acl_gets_a_block_and_keeps_its_rules(
    tmp_path: Path, installed_root: InstalledRoot
) -> None:
    files = {"conf.d/zigbee2mqtt.conf": USERS_WITH_ACL, "z2m.acl": Z2M_ACL}
    root, output = install_over(tmp_path, installed_root, files)
    acl = (root / "etc/mosquitto/z2m.acl").read_text()
    assert acl.startswith(Z2M_ACL)  # their rules first, untouched
    assert "# BEGIN tesla-gateway" in acl and acl.rstrip().endswith("# END tesla-gateway")
    ours = settings((root / "etc/mosquitto/conf.d/tesla-gateway.conf").read_text())
    assert not {"acl_file", "password_file", "allow_anonymous"} & set(ours)
    args = installed_root.install_args()
    args[args.index("--root") + 1] = str(root)
    again = subprocess.run(args, capture_output=True, text=True, check=True)
    assert "done: 0 change(s)" in again.stdout, again.stdout  # the block is replaced, not added
    with running_broker(root, tmp_path / "mosquitto.log", output) as broker:
        anonymous = broker.client(None)
        assert anonymous.connack is not None and anonymous.connack.is_failure  # as before
        anonymous.close()
        z2m = broker.client("z2m", Z2M_PASSWORD)
        try:
            assert z2m.connack is not None and not z2m.connack.is_failure
            assert z2m.subscribe("zigbee2mqtt/#")
            assert z2m.publish("zigbee2mqtt/bridge/state", b"online")
            assert z2m.received(1) == [("zigbee2mqtt/bridge/state", b"online")]
        finally:
            z2m.close()
        gateway_users_work(broker)
    subprocess.run([str(UNINSTALL), "--root", str(root)], capture_output=True, check=True)
    assert (root / "etc/mosquitto/z2m.acl").read_text() == Z2M_ACL  # as it was
    users = (root / "etc/mosquitto/z2m.passwd").read_text().splitlines()
    assert [line.split(":")[0] for line in users] == ["z2m"]


def test_dry_run_on_an_empty_root_previews_the_generated_files(tmp_path: Path) -> None:
    args = install_command(tmp_path, "--dry-run")  # nothing at all in it, not even /etc
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []
    out = result.stdout
    assert "etc has no passwd/group" in out
    assert "would: write /etc/mosquitto/conf.d/tesla-gateway.conf:\n" in out
    assert "    allow_anonymous false\n" in out  # the contents, indented
    assert "    user tesla-reader\n" in out
    assert f'    gateway_id = "{GATEWAY_ID}"\n' in out
    # No temporary file names (the checkout itself may live in a mktemp directory).
    assert "/tmp/tmp." not in out.replace(str(REPO), "<checkout>")


def test_a_real_install_into_an_empty_root_says_why_it_cannot(tmp_path: Path) -> None:
    result = subprocess.run(install_command(tmp_path), capture_output=True, text=True, check=False)
    assert result.returncode == 1
    if os.geteuid() == 0:
        assert "etc/passwd or /etc/group is missing" in result.stderr
    else:
        assert "run as root (or --dry-run)" in result.stderr


def test_per_listener_settings_give_the_gateway_its_own_listener(
    tmp_path: Path, installed_root: InstalledRoot
) -> None:
    """With per_listener_settings true, the gateway's auth lives on its own listeners; 1883 is
    taken, so its loopback listener is 1884 and its configuration says so."""
    files = {
        "conf.d/a-ha.conf": "per_listener_settings true\nlistener 1883\nallow_anonymous true\n"
    }
    root, output = install_over(tmp_path, installed_root, files)
    ours = (root / "etc/mosquitto/conf.d/tesla-gateway.conf").read_text()
    assert "listener 1884 127.0.0.1\nallow_anonymous false\npassword_file" in ours
    config = (root / "etc/tesla-gateway/gateway.toml").read_text()
    assert "port = 1884" in config and "port = 1883" not in config
    with running_broker(root, tmp_path / "mosquitto.log", output) as broker:
        anonymous = broker.client(None)  # on their listener, as before
        refused = broker.client(None, port=1884)  # not on ours
        try:
            assert anonymous.connack is not None and not anonymous.connack.is_failure
            assert anonymous.subscribe("zigbee2mqtt/#")
            assert anonymous.publish("zigbee2mqtt/bridge/state", b"online")
            assert anonymous.received(1) == [("zigbee2mqtt/bridge/state", b"online")]
            assert refused.connack is not None and refused.connack.is_failure
        finally:
            anonymous.close()
            refused.close()
        gateway_users_work(broker, port=1884)
