"""install.sh on a Pi whose mosquitto already serves others (Zigbee2MQTT, Home Assistant,
Node-RED, MQTT Explorer): every client that could connect before connects after, to the same
topics, $SYS included; the gateway's users work on its own listeners.

Each case runs real clients against a real mosquitto before and after the install
(tests/deploy/before_after.py says how), then checks the rerun and the uninstall.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.deploy.before_after import (
    EVERYTHING,
    OWN_CONF,
    Probe,
    before_and_after,
    gateway_ports,
    install_args,
    make_root,
)
from tests.deploy.conftest import InstalledRoot

Z2M_PASSWORD = "z2m-secret"


def test_debian_stock_config_keeps_its_anonymous_local_clients(
    tmp_path: Path, installed_root: InstalledRoot
) -> None:
    """No listener configured: mosquitto 2's local only mode. It ended the moment the old
    installer added a listener, locking out Zigbee2MQTT, Home Assistant and Node-RED."""
    root = make_root(tmp_path, installed_root, {})
    probes = {"anonymous": Probe(None), "ha": Probe("homeassistant", "never-checked")}
    outcome = before_and_after(tmp_path, installed_root, root, probes)
    assert outcome.before == {"anonymous": EVERYTHING, "ha": EVERYTHING}
    assert outcome.after == outcome.before
    assert outcome.edited == {}  # mosquitto.conf untouched: conf.d/00-tesla-gateway.conf says it


def test_an_open_listener_stays_open_and_never_checks_a_password(
    tmp_path: Path, installed_root: InstalledRoot
) -> None:
    """allow_anonymous true: a client that sends a user and password the broker never checked
    (the old installer's broker-wide password file refused it: "not authorised")."""
    files = {"conf.d/zigbee2mqtt.conf": "listener 1883\nallow_anonymous true\n"}
    root = make_root(tmp_path, installed_root, files)
    probes = {"anonymous": Probe(None), "z2m": Probe("z2m", "anything")}
    outcome = before_and_after(tmp_path, installed_root, root, probes)
    assert outcome.before == {"anonymous": EVERYTHING, "z2m": EVERYTHING}
    assert outcome.after == outcome.before
    assert outcome.edited == {}  # its settings already follow its listener line


def test_an_existing_password_file_and_acl_stay_as_they_were(
    tmp_path: Path, installed_root: InstalledRoot
) -> None:
    """A user with `topic readwrite #` (which never matched $SYS) and a monitoring user reading
    $SYS/# (the old installer's `topic readwrite #` for kept clients took $SYS from it)."""
    files = {
        "conf.d/zigbee2mqtt.conf": (
            "listener 1883\nallow_anonymous false\npassword_file /etc/mosquitto/z2m.passwd\n"
            "acl_file /etc/mosquitto/z2m.acl\n"
        ),
        "z2m.acl": "user z2m\ntopic readwrite #\n\nuser monitor\ntopic read $SYS/#\n",
    }
    passwords = {"z2m.passwd": {"z2m": Z2M_PASSWORD, "monitor": "mon-secret"}}
    root = make_root(tmp_path, installed_root, files, passwords)
    probes = {
        "z2m": Probe("z2m", Z2M_PASSWORD),
        "monitor": Probe("monitor", "mon-secret"),
        "anonymous": Probe(None),
        "wrong password": Probe("z2m", "not-it"),
    }
    outcome = before_and_after(tmp_path, installed_root, root, probes)
    assert outcome.before == {
        "z2m": ("write+read", "write+read", "none"),
        "monitor": ("none", "none", "read"),
        "anonymous": ("refused",),
        "wrong password": ("refused",),
    }
    assert outcome.after == outcome.before
    assert outcome.edited == {}  # their password file and ACL are not the gateway's any more


def test_broker_wide_settings_before_include_dir_become_each_listeners_own(
    tmp_path: Path, installed_root: InstalledRoot
) -> None:
    """Settings written into mosquitto.conf above its listeners and include_dir: with
    per_listener_settings true they would land on a default listener (a second listener on 1883:
    mosquitto would not start). Each listener gets them in a marked block, the originals are
    commented out, and per_listener_settings true goes above all (a block in mosquitto.conf)."""
    stock = "".join(f"{line}\n" for line in (
        "pid_file /run/mosquitto/mosquitto.pid",
        "allow_anonymous false",
        "password_file /etc/mosquitto/z2m.passwd",
        "listener 1883",
        "listener 1885",
        "include_dir /etc/mosquitto/conf.d",
    ))  # fmt: skip
    root = make_root(
        tmp_path, installed_root, {"mosquitto.conf": stock}, {"z2m.passwd": {"z2m": "pw"}}
    )
    probes = {
        "z2m": Probe("z2m", "pw"),
        "z2m on 1885": Probe("z2m", "pw", port=1885),
        "anonymous on 1885": Probe(None, port=1885),
    }
    outcome = before_and_after(tmp_path, installed_root, root, probes)
    assert outcome.before == {
        "z2m": EVERYTHING,
        "z2m on 1885": EVERYTHING,
        "anonymous on 1885": ("refused",),
    }
    assert outcome.after == outcome.before
    conf = outcome.edited["etc/mosquitto/mosquitto.conf"]
    assert conf.startswith("# BEGIN tesla-gateway")
    assert conf.splitlines()[1] == "per_listener_settings true"
    assert "#tesla-gateway# password_file /etc/mosquitto/z2m.passwd\n" in conf
    assert conf.count("\npassword_file /etc/mosquitto/z2m.passwd\n") == 2  # one per listener


def test_per_listener_settings_already_on(tmp_path: Path, installed_root: InstalledRoot) -> None:
    """Each listener already has its own settings: the gateway's listeners are added beside
    them (1883 is taken: its loopback listener is 1884, and gateway.toml says so). Their
    per_listener_settings line is commented out: the installer's, read first, says the same."""
    files = {
        "conf.d/a-ha.conf": "per_listener_settings true\nlistener 1883\nallow_anonymous true\n"
    }
    root = make_root(tmp_path, installed_root, files)
    probes = {"anonymous": Probe(None), "user": Probe("ha", "never-checked")}
    outcome = before_and_after(tmp_path, installed_root, root, probes)
    assert outcome.before == {"anonymous": EVERYTHING, "user": EVERYTHING}
    assert outcome.after == outcome.before
    assert outcome.edited == {
        "etc/mosquitto/conf.d/a-ha.conf": (
            "#tesla-gateway# per_listener_settings true\nlistener 1883\nallow_anonymous true\n"
        )
    }
    assert "the gateway connects to 127.0.0.1:1884" in outcome.output


def test_the_gateway_uses_port_1883_when_the_installer_installed_mosquitto(
    tmp_path: Path, installed_root: InstalledRoot
) -> None:
    """mosquitto installed by install.sh itself (recorded in mqtt-broker-owned): its local only
    mode served nobody, so it is not kept and anonymous clients are refused everywhere."""
    root = make_root(tmp_path, installed_root, {})
    owned = root / "etc/tesla-gateway/mqtt-broker-owned"
    owned.parent.mkdir(parents=True)
    owned.write_text("mosquitto was installed by deploy/install.sh\n", encoding="utf-8")
    args = install_args(installed_root, root)
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nobody: mosquitto was installed by deploy/install.sh" in result.stdout
    assert gateway_ports(root) == (1883, 8883)
    assert "allow_anonymous true" not in (root / OWN_CONF).read_text()
