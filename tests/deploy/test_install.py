"""deploy/install.sh into a throwaway root: files, modes, ownership, idempotence, uninstall.

See conftest.py for what is faked (a minimal /etc, an offline wheel install without dependencies).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tomllib
import zipfile
from pathlib import Path

from tesla_gateway.daemon.config import load_config
from tests.deploy.conftest import (
    GATEWAY_ID,
    NODES,
    UNINSTALL,
    InstalledRoot,
    adopt_venv,
    install_command,
    make_base_root,
)

Snapshot = dict[str, tuple[str, int, int, int, str]]


def test_the_wheel_holds_only_what_runs_on_the_pi(installed_root: InstalledRoot) -> None:
    """The gateway and its metadata: no demo, bench, training or tests, no `tesla-train`."""
    (wheel,) = installed_root.wheelhouse.glob("tesla_gateway-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"tesla_gateway"}
    assert "tesla_gateway/py.typed" in names
    assert not [n for n in names if n.startswith("tesla_gateway/demo/")]
    assert "tesla-gateway = tesla_gateway.daemon.cli:main" in scripts
    assert "tesla-train" not in scripts


def snapshot(root: Path) -> Snapshot:
    """Every path: type, mode, uid, gid, content hash (or link target); mtimes of files too."""
    result: Snapshot = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if path.is_symlink():
            kind, digest = "link", str(path.readlink())
        elif path.is_dir():
            kind, digest = "dir", ""
        else:
            kind = "file"
            digest = hashlib.sha256(path.read_bytes()).hexdigest() + f"@{info.st_mtime_ns}"
        result[str(path.relative_to(root))] = (kind, info.st_mode, info.st_uid, info.st_gid, digest)
    return result


def ids(root: Path) -> tuple[int, int, int]:
    """uid and gid of tesla-gateway and gid of mosquitto, from the target root's /etc."""
    passwd = {
        line.split(":")[0]: line.split(":")
        for line in (root / "etc/passwd").read_text().splitlines()
    }
    group = {
        line.split(":")[0]: line.split(":")
        for line in (root / "etc/group").read_text().splitlines()
    }
    return (
        int(passwd["tesla-gateway"][2]),
        int(group["tesla-gateway"][2]),
        int(group["mosquitto"][2]),
    )


def mode_owner(path: Path) -> tuple[str, int, int]:
    info = path.stat()
    return oct(info.st_mode & 0o7777), info.st_uid, info.st_gid


def test_installed_files_modes_and_owners(installed_root: InstalledRoot) -> None:
    root = installed_root.root
    uid, gid, mosquitto_gid = ids(root)
    passwd_line = next(
        line
        for line in (root / "etc/passwd").read_text().splitlines()
        if line.startswith("tesla-gateway:")
    )
    assert passwd_line.endswith(":/var/lib/tesla-gateway:/usr/sbin/nologin")
    assert "dialout:x:20:tesla-gateway" in (root / "etc/group").read_text()

    assert mode_owner(root / "etc/tesla-gateway") == ("0o750", 0, gid)
    assert mode_owner(root / "var/lib/tesla-gateway") == ("0o750", uid, gid)
    assert mode_owner(root / "etc/tesla-gateway/gateway.toml") == ("0o640", 0, gid)
    # The daemon's MQTT secret: readable by its group only; the others root-only.
    assert mode_owner(root / "etc/tesla-gateway/credentials/tesla-gateway") == ("0o640", 0, gid)
    for user in ("tesla-reader", "tesla-release", *NODES):
        assert mode_owner(root / f"etc/tesla-gateway/credentials/{user}") == ("0o600", 0, 0)
    assert mode_owner(root / "etc/tesla-gateway/credentials/tesla-ca.key") == ("0o600", 0, 0)
    # Models: root-owned, not writable by the daemon's user.
    for feature in ("pm10", "pm2_5"):
        model_dir = root / "opt/tesla-gateway/models" / feature
        assert mode_owner(model_dir) == ("0o755", 0, 0)
        assert mode_owner(model_dir / "model.tflite") == ("0o644", 0, 0)
        assert (model_dir / "manifest.json").exists()
    unit = root / "etc/systemd/system/tesla-gateway.service"
    assert mode_owner(unit) == ("0o644", 0, 0)
    assert (
        unit.read_bytes()
        == (Path(__file__).parents[2] / "systemd/tesla-gateway.service").read_bytes()
    )
    mosq = root / "etc/mosquitto"
    assert mode_owner(mosq / "tesla-gateway.passwd") == ("0o640", 0, mosquitto_gid)
    assert mode_owner(mosq / "tesla-gateway.acl") == ("0o640", 0, mosquitto_gid)
    assert mode_owner(mosq / "certs/tesla-server.key") == ("0o640", 0, mosquitto_gid)
    conf = (mosq / "conf.d/00-tesla-gateway.conf").read_text()
    assert "allow_anonymous false" in conf and "listener 8883" in conf
    users = [
        line.split(":")[0] for line in (mosq / "tesla-gateway.passwd").read_text().splitlines()
    ]
    assert sorted(users) == sorted(["tesla-gateway", "tesla-reader", "tesla-release", *NODES])
    # The venv holds the gateway (dependencies are not installed offline here).
    venv = root / "opt/tesla-gateway/venv"
    assert (venv / "bin/tesla-gateway").exists()
    assert list((venv / "lib").glob("python3*/site-packages/tesla_gateway/daemon/service.py"))

    # The generated configuration validates (models resolved inside the throwaway root).
    config = tomllib.loads((root / "etc/tesla-gateway/gateway.toml").read_text())
    assert config["gateway_id"] == GATEWAY_ID
    assert (
        config["publisher"]["broker"]["password_file"]
        == "/etc/tesla-gateway/credentials/tesla-gateway"
    )
    assert "password" not in config["publisher"]["broker"]
    validated = load_config(root / "etc/tesla-gateway/gateway.toml", environ={})
    assert validated.publisher.broker.username == "tesla-gateway"


def test_second_run_changes_nothing(installed_root: InstalledRoot) -> None:
    before = snapshot(installed_root.root)
    result = subprocess.run(
        installed_root.install_args(), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "done: 0 change(s)" in result.stdout, result.stdout
    assert snapshot(installed_root.root) == before


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_base_root(root)
    before = snapshot(root)
    args = install_command(root, "--dry-run")  # as any user: a dry run needs no root
    args[args.index("--arch") + 1] = "armhf"
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert snapshot(root) == before
    assert "would: useradd" in result.stdout
    assert "[legacy-runtime]" in result.stdout  # armhf: no LiteRT wheels


def test_the_default_raspberry_pi_host_name_as_gateway_id_is_warned_about(tmp_path: Path) -> None:
    # Fake: this machine is not a Pi; a `hostname` on PATH answers as a fresh Raspberry Pi OS.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "hostname"
    fake.write_text("#!/bin/sh\necho raspberrypi\n", encoding="utf-8")
    fake.chmod(0o755)
    root = tmp_path / "root"
    make_base_root(root)
    args = install_command(root, "--dry-run")
    at = args.index("--gateway-id")
    without_id = [*args[:at], *args[at + 2 :]]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(without_id, capture_output=True, text=True, check=False, env=env)
    assert result.returncode == 0, result.stderr
    assert 'gateway_id is the host name "raspberrypi"' in result.stderr
    assert "--gateway-id" in result.stderr
    given = subprocess.run(
        [*without_id, "--gateway-id", "raspberrypi"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert given.returncode == 0 and "warning" not in given.stderr  # chosen on purpose


def test_uninstall_then_purge(tmp_path: Path, installed_root: InstalledRoot) -> None:
    # A second, private install: the shared one is used by the other tests.
    root = tmp_path / "root"
    make_base_root(root)
    adopt_venv(installed_root, root)
    args = installed_root.install_args()
    args[args.index("--root") + 1] = str(root)
    subprocess.run(args, capture_output=True, check=True)
    subprocess.run([str(UNINSTALL), "--root", str(root)], capture_output=True, check=True)
    assert not (root / "opt/tesla-gateway").exists()
    assert not (root / "etc/systemd/system/tesla-gateway.service").exists()
    assert not (root / "etc/mosquitto/conf.d/00-tesla-gateway.conf").exists()
    assert (root / "etc/tesla-gateway/gateway.toml").exists()  # kept without --purge
    again = subprocess.run(
        [str(UNINSTALL), "--root", str(root)], capture_output=True, text=True, check=True
    )
    assert "done: 0 change(s)" in again.stdout
    subprocess.run(
        [str(UNINSTALL), "--root", str(root), "--purge"], capture_output=True, check=True
    )
    assert not (root / "etc/tesla-gateway").exists()
    assert not (root / "var/lib/tesla-gateway").exists()
    assert "tesla-gateway" not in (root / "etc/passwd").read_text()
