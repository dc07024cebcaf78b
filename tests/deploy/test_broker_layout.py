"""install.sh's broker choices without a broker running: the who-can-connect table of
``--dry-run`` (derived from the parsed configuration), ``--broker remote``, a configuration it
cannot keep (left alone), and an earlier install's edits taken back out.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from devkit.broker import MOSQUITTO_PASSWD
from tesla_gateway.daemon.config import load_config
from tests.deploy.before_after import STOCK_CONF, install_args, make_root, texts
from tests.deploy.conftest import (
    GATEWAY_ID,
    REPO,
    InstalledRoot,
    install_command,
    make_base_root,
)

WITH_ACL = {
    "conf.d/zigbee2mqtt.conf": (
        "listener 1883\nallow_anonymous false\npassword_file /etc/mosquitto/z2m.passwd\n"
        "acl_file /etc/mosquitto/z2m.acl\n"
    ),
    "z2m.acl": "user z2m\ntopic readwrite #\n\nuser monitor\ntopic read $SYS/#\n",
}


def dry_run_root(base: Path, files: dict[str, str], users: tuple[str, ...] = ()) -> Path:
    """A root with Debian's mosquitto.conf, ``files`` and z2m.passwd holding ``users``."""
    root = base / "root"
    make_base_root(root)
    mosq = root / "etc/mosquitto"
    (mosq / "conf.d").mkdir(parents=True)
    for name, text in {"mosquitto.conf": STOCK_CONF, **files}.items():
        (mosq / name).write_text(text, encoding="utf-8")
    for user in users:
        create = [] if (mosq / "z2m.passwd").exists() else ["-c"]
        subprocess.run(
            [str(MOSQUITTO_PASSWD), *create, "-b", str(mosq / "z2m.passwd"), user, "pw"],
            check=True,
            capture_output=True,
        )
    return root


def who_can_connect(output: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The dry run's two tables: listener (address:port) -> its rows, before and after."""
    lines = [line.removeprefix("install.sh: ") for line in output.splitlines()]
    start = lines.index("who can connect to mosquitto, before:")
    middle = next(i for i, line in enumerate(lines) if line.startswith("and after"))
    end = next(i for i, line in enumerate(lines) if i > middle and not line.startswith("  "))

    def blocks(part: list[str]) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        key = ""
        for line in part:
            listener = re.match(r"  listener (.+?:\d+)", line)
            if listener:
                key = listener[1]
                result[key] = [line]
            elif key:
                result[key].append(re.sub(r"\s+", " ", line.strip()))
        return result

    return blocks(lines[start + 1 : middle]), blocks(lines[middle + 1 : end])


def test_dry_run_shows_who_can_connect_before_and_after(tmp_path: Path) -> None:
    root = dry_run_root(tmp_path, WITH_ACL, users=("z2m", "monitor"))
    before_files = texts(root)
    result = subprocess.run(
        install_command(root, "--dry-run"), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert texts(root) == before_files
    before, after = who_can_connect(result.stdout)
    assert list(before) == ["every address:1883"]
    rows = before["every address:1883"]
    assert rows[0] == "  listener every address:1883 (in /etc/mosquitto/conf.d/zigbee2mqtt.conf)"
    assert rows[1:] == [
        "anonymous clients refused",
        "user monitor, password checked read $SYS/# ($SYS readable)",
        "user z2m, password checked readwrite # ($SYS not readable)",
        "any other user name refused",
    ]
    assert after["every address:1883"] == rows  # the same listener, the same rows
    gateway = [key for key, block in after.items() if block[0].endswith("[tesla-gateway]")]
    assert sorted(gateway) == ["127.0.0.1:1884", "every address:8883"]
    for key in gateway:
        block = after[key]
        assert "anonymous clients refused" in block
        assert (
            "user node-01, password checked write sensors/node-01/raw ($SYS not readable)" in block
        )


def test_dry_run_of_the_stock_config_keeps_local_only_mode_spelled_out(tmp_path: Path) -> None:
    root = dry_run_root(tmp_path, {})
    result = subprocess.run(
        install_command(root, "--dry-run"), capture_output=True, text=True, check=True
    )
    before, after = who_can_connect(result.stdout)
    assert "local only mode: no listener configured" in before["127.0.0.1:1883"][0]
    assert (
        before["127.0.0.1:1883"][1:]
        == after["127.0.0.1:1883"][1:]
        == [
            "anonymous clients all topics, $SYS included",
            "any user name, password not checked all topics, $SYS included",
        ]
    )
    assert "would: change /etc/mosquitto/mosquitto.conf" not in result.stdout
    assert "    listener 1883 127.0.0.1\n    allow_anonymous true\n" in result.stdout
    assert "the gateway connects to 127.0.0.1:1884" in result.stdout


def test_dry_run_on_an_empty_root_previews_the_generated_files(tmp_path: Path) -> None:
    args = install_command(tmp_path, "--dry-run")  # nothing at all in it, not even /etc
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []
    out = result.stdout
    assert "etc has no passwd/group" in out
    assert "would: write /etc/mosquitto/conf.d/00-tesla-gateway.conf:\n" in out
    assert "    allow_anonymous false\n" in out  # the contents, indented
    assert "    user tesla-reader\n" in out
    assert f'    gateway_id = "{GATEWAY_ID}"\n' in out
    assert "  nobody: there is no mosquitto configuration" in out
    # No temporary file names (the checkout itself may live in a mktemp directory).
    assert "/tmp/tmp." not in out.replace(str(REPO), "<checkout>")


def test_a_real_install_into_an_empty_root_says_why_it_cannot(tmp_path: Path) -> None:
    result = subprocess.run(install_command(tmp_path), capture_output=True, text=True, check=False)
    assert result.returncode == 1
    if os.geteuid() == 0:
        assert "etc/passwd or /etc/group is missing" in result.stderr
    else:
        assert "run as root (or --dry-run)" in result.stderr


def test_a_configuration_it_cannot_keep_is_left_as_it_was(tmp_path: Path) -> None:
    """A broker-wide auth plugin would have to run once per listener: the installer stops
    before changing anything, and says what to do instead."""
    plugin = "listener 1883\nplugin /usr/lib/mosquitto_dynamic_security.so\n"
    root = dry_run_root(tmp_path, {"conf.d/dynsec.conf": plugin})
    before = texts(root)
    for extra in (("--dry-run",), ()):
        result = subprocess.run(
            install_command(root, *extra), capture_output=True, text=True, check=False
        )
        assert result.returncode == 1, result.stdout
        assert "plugin" in result.stderr and "--broker remote" in result.stderr
        assert "the broker's configuration is left as it was" in result.stderr
        assert texts(root) == before
    assert not (root / "opt").exists()  # stopped before anything was installed


def test_remote_broker_installs_the_gateway_only(
    tmp_path: Path, installed_root: InstalledRoot
) -> None:
    """--broker remote --broker-host: no mosquitto file written or changed, no users of a
    broker's; gateway.toml points at that broker (TLS with --broker-ca)."""
    root = make_root(tmp_path, installed_root, WITH_ACL, {"z2m.passwd": {"z2m": "pw"}})
    before = texts(root)
    ca = root.parent / "ha-ca.pem"  # Home Assistant's CA (its content is not checked here)
    ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    args = install_args(
        installed_root, root, "--broker", "remote", "--broker-host", "homeassistant.local",
        "--broker-user", "gw-kitchen", "--broker-ca", str(ca),
    )  # fmt: skip
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--node is ignored with --broker remote" in result.stderr
    assert texts(root) == before  # not one mosquitto file written or changed
    config = load_config(root / "etc/tesla-gateway/gateway.toml", environ={})
    for broker in (config.sources[0].broker, config.publisher.broker):  # type: ignore[union-attr]
        assert (broker.host, broker.port, broker.username) == (
            "homeassistant.local",
            8883,
            "gw-kitchen",
        )
        assert broker.tls is not None and str(broker.tls.ca_file).endswith("broker-ca.pem")
    assert (root / "etc/tesla-gateway/broker-ca.pem").read_bytes() == ca.read_bytes()
    credentials = sorted(p.name for p in (root / "etc/tesla-gateway/credentials").iterdir())
    assert credentials == ["tesla-gateway"]
    assert not (root / "etc/tesla-gateway/mqtt-nodes").exists()
    again = subprocess.run(args, capture_output=True, text=True, check=True)
    assert "done: 0 change(s)" in again.stdout


def test_remote_broker_without_a_host_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        install_command(tmp_path, "--dry-run", "--broker", "remote"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "--broker remote needs --broker-host" in result.stderr


def test_an_earlier_installs_edits_are_taken_out(
    tmp_path: Path, installed_root: InstalledRoot
) -> None:
    """Earlier installers added the gateway's users to the operator's password file, a block to
    their ACL and wrote conf.d/tesla-gateway.conf: the new installer puts theirs back as it was
    (the gateway now has its own files, on its own listeners)."""
    z2m_acl = WITH_ACL["z2m.acl"]
    old_block = "# BEGIN tesla-gateway (deploy/install.sh: rerun it)\nuser tesla-gateway\n"
    files = {
        **WITH_ACL,
        "z2m.acl": z2m_acl + old_block + "topic read sensors/+/raw\n# END tesla-gateway\n",
        "conf.d/tesla-gateway.conf": "# Generated by deploy/install.sh (tesla-gateway)\n",
    }
    root = make_root(
        tmp_path, installed_root, files, {"z2m.passwd": {"z2m": "pw", "tesla-gateway": "old"}}
    )
    shared = root / "etc/tesla-gateway/mqtt-shared"
    shared.parent.mkdir(parents=True)
    mosq = "/etc/mosquitto"
    shared.write_text(f"password_file {mosq}/z2m.passwd\nacl_file {mosq}/z2m.acl\n")
    result = subprocess.run(
        install_args(installed_root, root), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (root / "etc/mosquitto/z2m.acl").read_text() == z2m_acl
    users = (root / "etc/mosquitto/z2m.passwd").read_text().splitlines()
    assert [line.split(":")[0] for line in users] == ["z2m"]
    assert not (root / "etc/mosquitto/conf.d/tesla-gateway.conf").exists()
    assert (root / "etc/mosquitto/conf.d/00-tesla-gateway.conf").exists()
    assert shared.read_text() == ""


def test_remote_only_options_need_broker_remote(tmp_path: Path) -> None:
    args = install_command(tmp_path, "--dry-run", "--broker-port", "8883")
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "are for --broker remote" in result.stderr
