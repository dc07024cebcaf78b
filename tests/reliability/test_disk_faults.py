"""Disk full and a read-only state directory under the real daemon.

The state directory is a real tmpfs of 4 MiB mounted by the test (it runs as root here; without
the privilege to mount, the test is skipped: ENOSPC cannot be produced faithfully otherwise).
"Full" is a filler file written until ENOSPC. "Read-only": ``mount -o remount,ro`` is refused
(EBUSY) while the daemon holds its outbox open for writing, so a read-only tmpfs is mounted over
the state directory instead: every new open (snapshots, status.json) fails with EROFS while the
already-open outbox keeps working, as on a file system whose new writes are refused. In both the
daemon must keep calibrating, report the problem (stats topic: ``publish_failures``,
``state.save_failures``), and recover when the space or write access returns.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
from tests.support.mosquitto import Mosquitto

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
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
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
