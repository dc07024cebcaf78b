"""Disk full and a read-only state directory under the real daemon.

The state directory is a real tmpfs of 4 MiB mounted by the test (it runs as root here; without
the privilege to mount, the test is skipped: ENOSPC cannot be produced faithfully otherwise).
"Full" is a filler file written until ENOSPC. "Read-only": ``mount -o remount,ro`` is refused
(EBUSY) while the daemon holds its outbox open for writing, so a read-only tmpfs is mounted over
the state directory instead: every new open (snapshots, status.json) fails with EROFS while the
already-open outbox keeps working, as on a file system whose new writes are refused. In both the
daemon must keep calibrating, report the problem (stats topic: ``publish_failures``,
``state.save_failures``), and recover when the space or write access returns. A daemon
*started* on the full disk, then on the read-only state dir (a ``remount,ro`` of the tmpfs,
possible while no daemon holds it open), must do the same: its outbox lives in memory and its
pid file is a reported problem until the disk takes writes again.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.broker import Mosquitto
from tests.reliability.harness import (
    PERIOD_S,
    Collector,
    Daemon,
    Sensors,
    copy_default_model,
    grid_base,
    iso,
    report,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.reliability


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "state"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        for _ in range(2):  # the read-only one mounted over it, if still there, then ours
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    # Unbuffered: a buffered file would keep the last chunk and raise ENOSPC again at close.
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with contextlib.suppress(OSError):
        (directory / "filler2").write_bytes(b"\0" * 4096)  # the last partial block
    return filler


def remove_files(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def mount_read_only_over(directory: Path) -> None:
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(directory)], check=True
    )


def unmount_over(directory: Path) -> None:
    subprocess.run(["umount", str(directory)], check=True)


def test_disk_full_and_read_only_state_dir(
    tmp_path: Path, mosquitto: Mosquitto, small_tmpfs: Path
) -> None:
    sensors_n = 3
    names = [f"node-{i}" for i in range(sensors_n)]
    model = copy_default_model(tmp_path / "model")
    config = write_config(
        tmp_path / "gw.toml",
        gateway_id="gw-d",
        model_dir=model,
        broker_port=mosquitto.port,
        state_dir=small_tmpfs,
        save_interval_s=0.2,
    )
    collector = Collector(mosquitto.port)
    sensors = Sensors(mosquitto.port)
    daemon = Daemon(config, small_tmpfs)
    base = grid_base(100)
    period = 0
    phases: dict[str, dict[str, Any]] = {}

    def stream(count: int) -> list[tuple[str, str, str]]:
        nonlocal period
        keys = []
        for _ in range(count):
            for name in names:
                sensors.send(name, base + period * PERIOD_S + 30, 25.0)
                keys.append(("gw-d", name, iso(base + period * PERIOD_S)))
            period += 1
        return keys

    def stats() -> dict[str, Any]:
        return collector.stats.get("gw-d", {})

    def phase(name: str, fault: Any, heal: Any, *, outbox_fails: bool) -> None:
        before = stats()
        fault()
        keys = stream(6)
        # Still calibrating: the ticker's counters move (reported on the stats topic, which
        # needs no disk), and the problem is reported.
        wait_for(
            lambda: (
                stats().get("ticker", {}).get("published", 0)
                >= before["ticker"]["published"] + 5 * sensors_n
                and (not outbox_fails or stats()["publish_failures"] > before["publish_failures"])
                and stats()["state"]["save_failures"] > before["state"]["save_failures"]
            ),
            f"the daemon to keep calibrating and report ({name})",
        )
        during = stats()
        assert daemon.process.poll() is None
        heal()
        after_keys = stream(4)
        wait_for(lambda: all(collector.snapshot()[k] for k in after_keys[:-sensors_n]), "recovery")
        wait_for(
            lambda: stats()["state"]["saves"] > during["state"]["saves"], "state saves to resume"
        )
        received = collector.snapshot()
        phases[name] = {
            "periods_calibrated_during_fault": (
                during["ticker"]["published"] - before["ticker"]["published"]
            ),
            "deliveries_lost_during_fault": sum(1 for k in keys if not received[k]),
            "publish_failures": during["publish_failures"] - before["publish_failures"],
            "state_save_failures": (
                during["state"]["save_failures"] - before["state"]["save_failures"]
            ),
            "delivered_after_recovery": sum(1 for k in after_keys if received[k]),
        }

    try:
        stream(4)
        wait_for(lambda: stats().get("ticker", {}).get("published", 0) >= 3 * sensors_n, "warm")
        filler: list[Path] = []
        phase(
            "disk_full",
            lambda: filler.append(fill(small_tmpfs)),
            lambda: remove_files(*filler, small_tmpfs / "filler2"),
            outbox_fails=True,
        )
        phase(
            "read_only",
            lambda: mount_read_only_over(small_tmpfs),
            lambda: unmount_over(small_tmpfs),
            outbox_fails=False,
        )
        assert daemon.stop() == 0
    finally:
        sensors.close()
        collector.close()
        daemon.kill()
    report("disk_faults", phases)


def remount(directory: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(directory)], check=True)


def test_start_on_a_full_disk_and_on_a_read_only_state_dir(
    tmp_path: Path, mosquitto: Mosquitto, small_tmpfs: Path
) -> None:
    """A daemon started while its state dir is full, then read-only (finding 9 of issue 12:
    both exited 1) starts, calibrates, publishes, reports the problem, and recovers."""
    sensors_n = 2
    names = [f"node-{i}" for i in range(sensors_n)]
    model = copy_default_model(tmp_path / "model")
    config = write_config(
        tmp_path / "gw.toml",
        gateway_id="gw-s",
        model_dir=model,
        broker_port=mosquitto.port,
        state_dir=small_tmpfs,
        save_interval_s=0.2,
    )
    collector = Collector(mosquitto.port)
    sensors = Sensors(mosquitto.port)
    base = grid_base(100)
    period = 0
    phases: dict[str, dict[str, Any]] = {}

    def stream(count: int) -> list[tuple[str, str, str]]:
        nonlocal period
        keys = []
        for _ in range(count):
            for name in names:
                sensors.send(name, base + period * PERIOD_S + 30, 25.0)
                keys.append(("gw-s", name, iso(base + period * PERIOD_S)))
            period += 1
        return keys

    def stats() -> dict[str, Any]:
        return collector.stats.get("gw-s", {})

    def phase(name: str, fault: Any, heal: Any) -> None:
        fault()
        collector.stats.clear()  # only the new daemon's stats from here on
        daemon = Daemon(config, small_tmpfs, wait_status=False)
        try:
            wait_for(  # status() raises, with the daemon's log, if it exited
                lambda: daemon.status() is not None and stats().get("uptime_s") is not None,
                f"stats of a start ({name})",
            )
            keys = stream(6)
            wait_for(
                lambda: all(collector.snapshot()[k] for k in keys[:-sensors_n]),
                f"calibrated readings published ({name})",
            )
            wait_for(
                lambda: stats()["ticker"]["published"] >= 5 * sensors_n,
                f"stats to count them ({name})",
            )
            during = stats()
            assert daemon.process.poll() is None
            assert during["publisher"]["outbox"]["storage"] == "memory", during["publisher"]
            problems = during["state"]["problems"]
            assert any("pid file" in p for p in problems), problems
            heal()
            after_keys = stream(3)
            wait_for(
                lambda: all(collector.snapshot()[k] for k in after_keys[:-sensors_n]), "recovery"
            )
            wait_for(
                lambda: (
                    stats()["state"]["saves"] > 0
                    and stats()["publisher"]["outbox"]["storage"] == "disk"
                ),
                f"state saves and the outbox file to resume ({name})",
            )
            wait_for(lambda: daemon.status().get("pid") == daemon.pid, "status.json written again")
            phases[name] = {
                "periods_calibrated_during_fault": during["ticker"]["published"],
                "delivered_during_fault": sum(1 for k in keys if collector.snapshot()[k]),
                "state_save_failures": during["state"]["save_failures"],
                "outbox_during_fault": during["publisher"]["outbox"]["storage"],
                "outbox_disk_error": during["publisher"]["outbox"]["disk_error"],
                "problems": problems,
                "delivered_after_recovery": sum(1 for k in after_keys if collector.snapshot()[k]),
            }
            assert daemon.stop() == 0
        finally:
            daemon.kill()

    try:
        first = Daemon(config, small_tmpfs)  # a normal run leaves state behind
        stream(3)
        wait_for(lambda: stats().get("state", {}).get("saves", 0) > 0, "a first save")
        assert first.stop() == 0
        filler: list[Path] = []
        phase(
            "start_on_full_disk",
            lambda: filler.append(fill(small_tmpfs)),
            lambda: remove_files(*filler, small_tmpfs / "filler2"),
        )
        phase(
            "start_on_read_only_state_dir",
            lambda: remount(small_tmpfs, "ro"),
            lambda: remount(small_tmpfs, "rw"),
        )
    finally:
        sensors.close()
        collector.close()
    report("disk_faults_at_start", phases)
