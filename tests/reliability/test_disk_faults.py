"""Disk full and a read-only state directory under the real daemon.

The state directory is a real tmpfs of 4 MiB mounted by the test (it runs as root here; without
the privilege to mount, the test is skipped: ENOSPC cannot be produced faithfully otherwise).
"Full" is a filler file written until ENOSPC. "Read-only": ``mount -o remount,ro`` is refused
(EBUSY) while the daemon holds its outbox open for writing, so a read-only tmpfs is mounted over
the state directory instead: every new open (snapshots, status.json) fails with EROFS while the
already-open outbox keeps working, as on a file system whose new writes are refused. In both the
daemon must keep calibrating, report the problem (stats topic: ``state.save_failures``; on the
full disk the outbox's ``memory_periods``: its queue moved to memory, with the file's messages,
and no reading failed to queue), and recover when the space or write access returns. A daemon
*started* on the full disk, then on the read-only state dir (a ``remount,ro`` of the tmpfs,
possible while no daemon holds it open), must do the same: its outbox lives in memory and its
pid file is a reported problem until the disk takes writes again. So must a daemon *restarted*
on a disk that filled while its outbox held messages: it delivers them from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt import publish

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

    def memory_periods(snapshot: dict[str, Any]) -> int:
        return int(snapshot["publisher"]["outbox"]["memory_periods"])

    def phase(name: str, fault: Any, heal: Any, *, outbox_to_memory: bool) -> None:
        before = stats()
        fault()
        keys = stream(6)
        # Still calibrating: the ticker's counters move (reported on the stats topic, which
        # needs no disk), and the problem is reported.
        wait_for(
            lambda: (
                stats().get("ticker", {}).get("published", 0)
                >= before["ticker"]["published"] + 5 * sensors_n
                and (not outbox_to_memory or memory_periods(stats()) > memory_periods(before))
                # A save fails; or, with the outbox in memory, none is tried: a checkpoint then
                # would claim periods whose messages only memory holds (windows_not_saved).
                and (
                    outbox_to_memory
                    or stats()["state"]["save_failures"] > before["state"]["save_failures"]
                )
            ),
            f"the daemon to keep calibrating and report ({name})",
        )
        during = stats()
        assert daemon.process.poll() is None
        assert during["publish_failures"] == before["publish_failures"], during  # none lost
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
            "outbox_memory_periods": memory_periods(during) - memory_periods(before),
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
            outbox_to_memory=True,
        )
        phase(
            "read_only",
            lambda: mount_read_only_over(small_tmpfs),
            lambda: unmount_over(small_tmpfs),
            outbox_to_memory=False,
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


def probe_stats(port: int, collector: Collector) -> bool:
    """Publish a stats document for a probe gateway; True once the collector has one."""
    publish.single("tesla/probe/stats", b"{}", hostname="127.0.0.1", port=port)
    time.sleep(0.05)
    return "probe" in collector.stats


def test_restart_on_a_full_disk_keeps_the_outbox_and_runs_degraded(
    tmp_path: Path, mosquitto: Mosquitto, small_tmpfs: Path
) -> None:
    """Issue 26 item 4: a daemon whose outbox holds messages (its broker is down) while the
    disk fills, stopped and started again on the still full disk, exited 1 ("cannot write to
    outbox ...: database or disk is full": the file opens, the first write fails). It must run
    as a cold start on a full disk does, and keep what the outbox file holds: its queue in
    memory with the file's messages in it, calibrating, reporting, delivering every message of
    the first run once the broker is back, and back on its file, without the delivered
    messages, once space returns."""
    sensors_n = 2
    names = [f"node-{i}" for i in range(sensors_n)]
    outbound = Mosquitto(tmp_path / "outbound")  # the publisher's broker, down until phase 2
    outbound.start()
    collector = Collector(outbound.port)  # a persistent session: gets what was sent meanwhile
    # Its subscription must be in the session the broker saves when it stops.
    wait_for(lambda: probe_stats(outbound.port, collector), "the collector's subscription")
    outbound.stop()
    config = write_config(
        tmp_path / "gw.toml",
        gateway_id="gw-f",
        model_dir=copy_default_model(tmp_path / "model"),
        broker_port=mosquitto.port,
        publisher_port=outbound.port,
        state_dir=small_tmpfs,
        save_interval_s=0.2,
    )
    sensors = Sensors(mosquitto.port)
    base = grid_base(100)
    period = 0
    figures: dict[str, Any] = {}

    def stream(count: int) -> list[tuple[str, str, str]]:
        nonlocal period
        keys = []
        for _ in range(count):
            for name in names:
                sensors.send(name, base + period * PERIOD_S + 30, 25.0)
                keys.append(("gw-f", name, iso(base + period * PERIOD_S)))
            period += 1
        return keys

    def stats() -> dict[str, Any]:
        return collector.stats.get("gw-f", {})

    def restarted_and_reporting() -> bool:
        second.check_alive()  # raises, with the daemon's log, if it exited
        return stats().get("uptime_s") is not None

    def wait_with_log(daemon: Daemon, condition: Any, what: str) -> None:
        try:
            wait_for(condition, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; end of the daemon's log:\n{daemon.log_tail(60)}") from exc

    daemons: list[Daemon] = []
    try:
        # 1. A normal run whose broker is down: the outbox file fills with its messages.
        first = Daemon(config, small_tmpfs)
        daemons.append(first)
        first_keys = stream(6)
        queued = wait_for(
            lambda: (
                first.status().get("ticker", {}).get("published", 0) >= 6 * sensors_n
                and first.status()["publisher"]["queued"]
            ),
            "the first run's readings in its outbox",
        )
        # The disk fills while it runs; it is stopped, and started again on the full disk.
        filler = fill(small_tmpfs)
        during_fill = stream(2)
        wait_for(
            # a save that failed, or none tried beside an outbox the disk moved to memory
            lambda: any(
                e in first.log.read_text() for e in ("state_save_failed", "windows_not_saved")
            ),
            "the full disk noticed",
        )
        assert first.stop() == 0
        second = Daemon(config, small_tmpfs, wait_status=False)  # no status.json on a full disk
        daemons.append(second)
        restart_keys = stream(4)
        # 2. Broker back: the restarted daemon reports and delivers, the disk still full.
        outbound.start()
        wait_with_log(second, restarted_and_reporting, "stats of the restarted daemon")
        wait_for(
            lambda: all(collector.snapshot()[k] for k in first_keys + restart_keys[:-sensors_n]),
            "the first run's messages and the restarted daemon's readings delivered",
        )
        wait_for(lambda: stats()["ticker"]["published"] >= 3 * sensors_n, "stats to count them")
        during = stats()
        outbox = during["publisher"]["outbox"]
        assert outbox["memory_periods"] >= 1, outbox
        assert outbox["taken_from_file"] >= queued, (outbox, queued)
        # No snapshot beside a memory outbox: a checkpoint would claim what only memory holds.
        assert during["state"]["saves"] == 0, during["state"]
        # 3. Space returns: state saves, status.json and the outbox file resume (the outbox at
        # its next message), and the file no longer holds the messages delivered from memory.
        remove_files(filler, small_tmpfs / "filler2")
        after_keys = stream(3)
        wait_for(lambda: all(collector.snapshot()[k] for k in after_keys[:-sensors_n]), "recovery")
        wait_for(
            lambda: (
                stats()["state"]["saves"] > 0
                and stats()["publisher"]["outbox"]["storage"] == "disk"
                and stats()["publisher"]["queued"] == 0
            ),
            "state saves and the outbox file to resume, empty",
        )
        wait_for(lambda: second.status().get("pid") == second.pid, "status.json written again")
        received = collector.snapshot()
        figures = {
            "queued_in_file_at_restart": queued,
            "taken_from_file": outbox["taken_from_file"],
            "first_run_delivered": sum(1 for k in first_keys if received[k]),
            "first_run_expected": len(first_keys),
            "during_fill_delivered": sum(1 for k in during_fill if received[k]),
            "during_fill_expected": len(during_fill),
            "restart_delivered": sum(1 for k in restart_keys if received[k]),
            "delivered_after_recovery": sum(1 for k in after_keys if received[k]),
            "duplicated": sum(n - 1 for n in received.values() if n > 1),
            "periods_calibrated_on_full_disk": during["ticker"]["published"],
            "state_save_failures": during["state"]["save_failures"],
            "outbox_storage": outbox["storage"],
            "outbox_disk_error": outbox["disk_error"],
            "state_problems": during["state"]["problems"],
        }
        assert second.stop() == 0
    finally:
        for daemon in daemons:
            daemon.kill()
        sensors.close()
        collector.close()
        outbound.stop()
    report("disk_full_restart", figures)


def test_no_snapshot_or_checkpoint_while_the_outbox_is_in_memory(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    """Snapshots no longer hold calibrated periods, so a checkpoint taken while their messages
    exist only in a memory outbox would let a crash lose them: the keeper waits for the file.
    Real service, real windows and ingest log; the publisher's state dir is a full tmpfs."""
    from structlog.testing import capture_logs

    from tesla_gateway.contract.readings import Reading
    from tesla_gateway.daemon.config import load_config
    from tesla_gateway.daemon.service import GatewayService
    from tesla_gateway.publish.publisher import Publisher

    model = Path(__file__).resolve().parents[2] / "models" / "pm10-ispra-1min"
    state = tmp_path / "state-ok"
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        f'gateway_id = "gw-1"\nstate_dir = "{state}"\n'
        f'[[models]]\nfeature = "pm10"\nmodel_dir = "{model}"\n',
        encoding="utf-8",
    )
    service = GatewayService(load_config(config_file))
    service.models.refresh(force=True)
    service.windows.sync_windows()
    service.ingest_log.start()
    now = time.time()
    for minute in range(30):
        service._ingest(Reading("s1", now - 1800 + 60 * minute, {"pm10": 20.0}, source="mqtt"))
    fill(small_tmpfs)
    service.publisher = Publisher(
        service.config.publisher,
        gateway_id="gw-1",
        state_dir=small_tmpfs,
        set_aside=service.set_aside,
    )
    try:
        assert service.publisher.outbox_in_memory
        with capture_logs() as logs:
            service.windows.save_and_checkpoint()
        assert not list(state.glob("windows/*.npz")), (
            "a snapshot was written beside a memory outbox"
        )
        assert [e for e in logs if e["event"] == "windows_not_saved"]
    finally:
        asyncio.run(service.publisher.aclose())
        service._instance.release()
