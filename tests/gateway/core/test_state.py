"""Window snapshots: round trip, incompatible geometry, corrupt files, unwritable directories."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import structlog

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.windows.outcome import AddOutcome
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.snapshots import StateStore
from tesla_gateway.windows.store import WindowStore

P = 60
T0 = 1_700_000_040  # a period boundary
GEOMETRY = WindowGeometry(
    window_length=4,
    period_seconds=P,
    channels=("pm10",),
    gap_policy=GapPolicy(max_interpolated_periods=1),
)


def filled_store() -> WindowStore:
    store = WindowStore()
    store.ensure("pm10", GEOMETRY)
    for sensor, scale in (("a", 1.0), ("b", 2.0)):
        for period in (0, 1, 3, 4):
            for offset in (0, 20):
                values = {"pm10": scale * (period + offset / 100)}
                store.add(Reading(sensor, T0 + period * P + offset, values), 0.0)
            if period < 4:
                store["pm10"].ready_windows()  # ticks consume every period but the last closed
    # each sensor has period 3 closed but not yet ticked, and period 4 open with two readings
    return store


def test_round_trip_restores_windows_open_periods_and_dedupe(tmp_path: Path) -> None:
    store = filled_store()
    before = store["pm10"].export_state()
    saver = StateStore(tmp_path)
    assert saver.save_all(store)
    restored = saver.restore("pm10", GEOMETRY)
    assert restored is not None
    after = restored.export_state()
    assert after.sensor_ids == before.sensor_ids
    for name in ("ring", "last_closed", "open_period", "open_sum", "open_count", "pending_period"):
        np.testing.assert_array_equal(getattr(after, name), getattr(before, name))
    assert after.open_seen == before.open_seen
    # a redelivered reading (MQTT QoS 1 after a restart) stays a duplicate
    assert restored.add(Reading("a", T0 + 4 * P + 20, {"pm10": 9.0}), 0.0) is AddOutcome.DUPLICATE
    # and the restored windows continue exactly where the originals would have
    original = store["pm10"]
    for windows in (original, restored):
        windows.add(Reading("a", T0 + 5 * P, {"pm10": 1.0}), 0.0)
    a = original.ready_windows(closed_through_period=T0 // P + 5)
    b = restored.ready_windows(closed_through_period=T0 // P + 5)
    assert a.sensor_ids == b.sensor_ids
    np.testing.assert_array_equal(a.windows, b.windows)
    assert a.quality == b.quality
    assert saver.stats.saves == 1 and saver.stats.restored == 1


def test_geometry_change_is_not_restored(tmp_path: Path) -> None:
    saver = StateStore(tmp_path)
    saver.save_all(filled_store())
    other = WindowGeometry(
        window_length=5, period_seconds=P, channels=("pm10",), gap_policy=GEOMETRY.gap_policy
    )
    with structlog.testing.capture_logs() as logs:
        assert saver.restore("pm10", other) is None
    assert saver.stats.incompatible == 1
    assert logs[0]["event"] == "state_incompatible"
    assert saver.path_for("pm10").exists()  # kept; the next save replaces it


def test_absent_state_is_a_fresh_start(tmp_path: Path) -> None:
    assert StateStore(tmp_path).restore("pm10", GEOMETRY) is None


def test_corrupt_file_is_set_aside_and_counted(tmp_path: Path) -> None:
    saver = StateStore(tmp_path, clock=lambda: 1_700_000_000.0)
    saver.save_all(filled_store())
    path = saver.path_for("pm10")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a torn write from some other tool
    with structlog.testing.capture_logs() as logs:
        assert saver.restore("pm10", GEOMETRY) is None
    assert not path.exists()
    aside = list(path.parent.glob("pm10.npz.corrupt-*"))
    assert [p.name for p in aside] == ["pm10.npz.corrupt-20231114T221320Z"]
    assert saver.stats.corrupt == 1
    assert [log["event"] for log in logs] == ["state_file_set_aside"]
    # and the next save works normally
    assert saver.save("pm10", ModelWindows(GEOMETRY))
    assert saver.restore("pm10", GEOMETRY) is not None


def test_garbage_arrays_are_corrupt_not_fatal(tmp_path: Path) -> None:
    saver = StateStore(tmp_path)
    saver.directory.mkdir(parents=True)
    with saver.path_for("pm10").open("wb") as out:
        np.savez(
            out,
            meta=np.array(
                '{"format_version": 1, "feature": "pm10", "window_length": 4,'
                ' "period_seconds": 60, "channels": ["pm10"],'
                ' "sensor_ids": ["a"], "open_seen": [[]]}'
            ),
            ring=np.zeros((3, 3)),
            last_closed=np.zeros(1),
            first_period=np.zeros(1),
            last_obs_period=np.zeros((1, 1)),
            last_obs_value=np.zeros((1, 1)),
            open_period=np.zeros(1),
            open_sum=np.zeros((1, 1)),
            open_count=np.zeros((1, 1)),
            pending_period=np.zeros(1),
        )
    assert saver.restore("pm10", GEOMETRY) is None
    assert saver.stats.corrupt == 1


def test_unwritable_state_dir_is_reported_and_survived(tmp_path: Path) -> None:
    # A state dir below a regular file: every write fails with a real OSError (ENOTDIR), as on
    # a read-only or full disk; the tests run as root, so permission bits would not stop writes.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    saver = StateStore(blocker / "state")
    with structlog.testing.capture_logs() as logs:
        assert not saver.save_all(filled_store())
        assert not saver.save_all(filled_store())
    assert saver.stats.save_failures == 2
    assert logs[0]["event"] == "state_save_failed"
    assert saver.restore("pm10", GEOMETRY) is None


def test_disk_full_is_reported_and_survived(tmp_path: Path) -> None:
    # A real write error from the kernel: the process's file-size limit makes the snapshot
    # write fail with EFBIG part-way, as a full disk fails with ENOSPC.
    code = f"""
import resource, signal, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
import subprocess
import sys
from pathlib import Path
from tests.gateway.core.test_state import filled_store
from tesla_gateway.windows.snapshots import StateStore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
saver = StateStore(Path({str(tmp_path)!r}))
resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))
ok = saver.save_all(filled_store())
print(ok, saver.stats.save_failures, sorted(p.name for p in saver.directory.iterdir()))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split("\n")[-2] == "False 1 []"  # no half-written file left behind
    assert "state_save_failed" in result.stdout + result.stderr
