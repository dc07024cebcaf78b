"""Window snapshots: round trip, incompatible geometry, corrupt files, unwritable directories."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import structlog

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.set_aside import SetAsideLog
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


def _backlog() -> ModelWindows:
    """Two sensors that closed three periods each with no tick between (a replay, a node
    catching up): two of each sensor's periods wait beside its pending one."""
    windows = ModelWindows(GEOMETRY)
    for sensor, scale in (("a", 1.0), ("b", 2.0)):
        for period in range(5):
            windows.add(Reading(sensor, T0 + period * P, {"pm10": scale * (period + 1)}), 0.0)
    windows.ready_windows()  # periods 0-3 closed, ticked; period 4 open
    for sensor, scale in (("a", 1.0), ("b", 2.0)):
        for period in range(5, 9):
            windows.add(Reading(sensor, T0 + period * P, {"pm10": scale * (period + 1)}), 0.0)
    assert windows.pending_count == 8  # periods 4-7 of both: three waiting, one pending each
    return windows


def test_periods_waiting_for_a_tick_survive_a_snapshot(tmp_path: Path) -> None:
    """Every closed period not yet ticked is in the state, not only each sensor's newest: a
    backlog snapshotted (or handed to another gateway) and restored is calibrated whole."""
    original = _backlog()
    store = WindowStore()
    store.install("pm10", original)
    saver = StateStore(tmp_path)
    assert saver.save_all(store)
    restored = saver.restore("pm10", GEOMETRY)
    assert restored is not None
    in_memory = ModelWindows.from_state(original.export_state())
    want = original.export_state()
    for windows in (restored, in_memory):
        assert windows.pending_count == 8
        got = windows.export_state()
        assert [(w.sensor_id, w.period, w.first_period, w.raw) for w in got.waiting] == [
            (w.sensor_id, w.period, w.first_period, w.raw) for w in want.waiting
        ]
    expected = original.ready_windows()
    for windows in (restored, in_memory):
        ready = windows.ready_windows()
        assert ready.sensor_ids == expected.sensor_ids
        np.testing.assert_array_equal(ready.periods, expected.periods)
        np.testing.assert_array_equal(ready.windows, expected.windows)
        np.testing.assert_array_equal(ready.raw, expected.raw)


def _rewrite_backlog_snapshot(
    saver: StateStore, meta_update: dict[str, object], **arrays: object
) -> None:
    """Save the backlog's snapshot, then rewrite it with some meta keys and arrays replaced."""
    store = WindowStore()
    store.install("pm10", _backlog())
    assert saver.save_all(store)
    path = saver.path_for("pm10")
    with np.load(path, allow_pickle=False) as data:
        saved = {name: data[name] for name in data.files}
    meta = json.loads(str(saved.pop("meta")))
    meta.update(meta_update)
    saved.update(arrays)
    np.savez(path, meta=np.array(json.dumps(meta)), **saved)


@pytest.mark.parametrize(
    ("meta_update", "arrays"),
    [
        ({"waiting_sensor_ids": "ababab"}, {}),  # a string as long as the list, not a list
        ({"waiting_sensor_ids": ["a", "a", "a", "b", "b", "bad/id"]}, {}),
        ({}, {"waiting_period": np.zeros(6, dtype=np.float64)}),  # right shape, not integers
        ({}, {"waiting_window": np.zeros((6, 1, 5), dtype=np.float32)}),  # N + 1 long
    ],
    ids=["ids-a-string", "a-bad-id", "periods-as-floats", "windows-too-long"],
)
def test_a_snapshot_whose_waiting_periods_do_not_fit_is_set_aside(
    tmp_path: Path, meta_update: dict[str, object], arrays: dict[str, object]
) -> None:
    saver = StateStore(tmp_path)
    _rewrite_backlog_snapshot(saver, meta_update, **arrays)
    with structlog.testing.capture_logs():
        assert saver.restore("pm10", GEOMETRY) is None
    assert saver.stats.corrupt == 1 and saver.stats.restored == 0


_HUGE = np.int64(2**62)  # a period whose time is past year 9999: no ISO 8601 for it


@pytest.mark.parametrize(
    ("meta_update", "arrays"),
    [
        ({"waiting_sensor_ids": ["a", "a", "a", "b", "b", "ghost"]}, {}),  # no window of its own
        ({}, {"waiting_period": np.array([4, 5, 6, 4, 5, -1], dtype=np.int64)}),
        ({}, {"waiting_period": np.full(6, _HUGE, dtype=np.int64)}),
        ({}, {"waiting_first_period": np.full(6, _HUGE, dtype=np.int64)}),  # after its period
        ({}, {"waiting_raw": np.full(6, np.nan)}),
        ({}, {"pending_period": np.full(2, _HUGE, dtype=np.int64)}),  # the format before, too
    ],
    ids=[
        "a-ghost-sensor",
        "a-negative-period",
        "a-period-past-9999",
        "first-after-period",
        "raw-nan",
        "pending-past-9999",
    ],
)
def test_a_snapshot_whose_periods_are_no_times_is_set_aside(
    tmp_path: Path, meta_update: dict[str, object], arrays: dict[str, object]
) -> None:
    """Restored, such a period was handed to the next tick, where formatting its time as
    ISO 8601 raises OverflowError (a ghost's window was calibrated though no sensor of that id
    has one). Checked by WindowState._check_periods, so partition snapshots get it too."""
    saver = StateStore(tmp_path)
    _rewrite_backlog_snapshot(saver, meta_update, **arrays)
    with structlog.testing.capture_logs():
        assert saver.restore("pm10", GEOMETRY) is None
    assert saver.stats.corrupt == 1 and saver.stats.restored == 0


def test_a_snapshot_written_before_waiting_periods_were_kept_still_loads(tmp_path: Path) -> None:
    saver = StateStore(tmp_path)
    store = filled_store()
    assert saver.save_all(store)
    path = saver.path_for("pm10")
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files if not name.startswith("waiting_")}
    meta = json.loads(str(arrays.pop("meta")))
    del meta["waiting_sensor_ids"]
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    restored = saver.restore("pm10", GEOMETRY)
    assert restored is not None
    assert restored.pending_count == store["pm10"].pending_count == 1


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


# -- what restore and save report, and which meta they refuse (survivors of make mutation) -----

CLOCK = 1_700_000_123.0


def rewrite(path: Path, meta_changes: dict[str, object], **arrays: np.ndarray) -> None:
    """Replace fields of a saved snapshot's meta (and arrays), as damage or an old tool would."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        kept = {name: data[name] for name in data.files if name != "meta"}
    meta.update(meta_changes)
    kept.update(arrays)
    with path.open("wb") as out:
        np.savez(out, meta=np.array(json.dumps(meta)), **kept)


def test_save_and_restore_report_what_they_did(tmp_path: Path) -> None:
    set_aside = SetAsideLog(clock=lambda: CLOCK)
    saver = StateStore(tmp_path / "deeper" / "state", clock=lambda: CLOCK, set_aside=set_aside)
    assert saver.directory == tmp_path / "deeper" / "state" / "windows"
    assert saver.save_all(filled_store()) and saver.save_all(filled_store())
    assert saver.path_for("pm10").is_file()
    with structlog.testing.capture_logs() as logs:
        assert saver.restore("pm10", GEOMETRY) is not None
        assert saver.restore("pm10", GEOMETRY) is not None
    assert logs[0] == {
        "event": "state_restored",
        "log_level": "info",
        "feature": "pm10",
        "sensors": 2,
        "saved_at": CLOCK,
    }
    other_channels = WindowGeometry(
        window_length=4, period_seconds=P, channels=("pm10", "rh"), gap_policy=GEOMETRY.gap_policy
    )
    with structlog.testing.capture_logs() as logs:
        assert saver.restore("pm10", other_channels) is None
        assert saver.restore("pm10", other_channels) is None
    assert logs[0] == {
        "event": "state_incompatible",
        "log_level": "warning",
        "feature": "pm10",
        "path": str(saver.path_for("pm10")),
        "reason": "saved channels ['pm10'] differ from ['pm10', 'rh']",
    }
    saver.path_for("pm10").write_bytes(b"PK\x03\x04 and then nothing")
    saver.restore("pm10", GEOMETRY)
    saver.save("pm10", ModelWindows(GEOMETRY))
    saver.path_for("pm10").write_bytes(b"not a zip")
    saver.restore("pm10", GEOMETRY)
    assert set_aside.count == 2
    assert saver.stats.as_dict() == {
        "saves": 3,
        "save_failures": 0,
        "restored": 2,
        "incompatible": 2,
        "corrupt": 2,
        "last_error": (f"corrupt {saver.path_for('pm10')}: not a snapshot: no .npz (zip) header"),
        "last_save_unix": CLOCK,
    }
    record = set_aside.as_dict()["files"][-1]  # type: ignore[index]
    assert record["kind"] == "window snapshot pm10"
    assert record["reason"] == "not a snapshot: no .npz (zip) header"


def test_a_snapshot_that_cannot_be_opened_is_reported_and_kept(tmp_path: Path) -> None:
    saver = StateStore(tmp_path)
    saver.path_for("pm10").mkdir(parents=True)  # a directory where the file should be
    with structlog.testing.capture_logs() as logs:
        assert saver.restore("pm10", GEOMETRY) is None
    path = str(saver.path_for("pm10"))
    assert logs == [
        {
            "event": "state_read_failed",
            "log_level": "error",
            "feature": "pm10",
            "path": path,
            "error": f"[Errno 21] Is a directory: {path!r}",
        }
    ]
    assert saver.stats.last_error == f"read {path}: Is a directory"
    assert saver.stats.corrupt == 0 and saver.path_for("pm10").is_dir()


def test_a_failed_save_is_reported_with_its_errno(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    saver = StateStore(blocker / "state")
    with structlog.testing.capture_logs() as logs:
        assert not saver.save("pm10", ModelWindows(GEOMETRY))
    path = str(saver.path_for("pm10"))
    assert logs == [
        {
            "event": "state_save_failed",
            "log_level": "error",
            "feature": "pm10",
            "path": path,
            "error": "Not a directory",
            "errno": errno.ENOTDIR,
        }
    ]
    assert saver.stats.last_error == f"save {path}: Not a directory"
    assert saver.stats.saves == 0 and saver.stats.last_save_unix is None


def test_the_temporary_file_is_written_beside_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename that replaces a snapshot is atomic only within one directory (one file
    system): the system's temporary directory is never used."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-temp-dir"))
    saver = StateStore(tmp_path)
    assert saver.save_all(filled_store())
    assert [p.name for p in saver.directory.iterdir()] == ["pm10.npz"]


def test_a_write_failing_midway_leaves_no_temporary_file(tmp_path: Path) -> None:
    """A real EFBIG from the kernel (the process's file-size limit) part-way through the
    snapshot, in this process: reported, and the half-written temporary file is removed."""
    saver = StateStore(tmp_path)
    store = filled_store()
    saver.directory.mkdir(parents=True)
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (512, hard))
    try:
        ok = saver.save_all(store)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert not ok and saver.stats.save_failures == 1
    assert list(saver.directory.iterdir()) == []


@pytest.mark.parametrize(
    "meta_changes",
    [
        {"open_seen": [[True], []]},  # JSON true is not a timestamp
        {"open_seen": [["1.0"], []]},
        {"open_seen": [[1e300], []]},  # no float timestamp is that large
        {"open_seen": [[1.0], 5]},
        {"sensor_ids": "ab"},  # a string is not a list of sensor ids
        {"sensor_ids": ["a", 5]},
    ],
    ids=["bool", "string", "huge", "not-a-list", "ids-string", "id-number"],
)
def test_snapshot_meta_of_the_wrong_type_is_corrupt(
    tmp_path: Path, meta_changes: dict[str, object]
) -> None:
    saver = StateStore(tmp_path)
    saver.save_all(filled_store())
    rewrite(saver.path_for("pm10"), meta_changes)
    assert saver.restore("pm10", GEOMETRY) is None
    assert saver.stats.corrupt == 1


def test_snapshot_meta_that_is_not_an_object_is_corrupt(tmp_path: Path) -> None:
    saver = StateStore(tmp_path)
    saver.save("pm10", ModelWindows(GEOMETRY))
    path = saver.path_for("pm10")
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files if name != "meta"}
    for meta in ("[1]", '"text"'):
        with path.open("wb") as out:
            np.savez(out, meta=np.array(meta), **arrays)
        assert saver.restore("pm10", GEOMETRY) is None
    assert saver.stats.corrupt == 2


def test_open_seen_must_be_a_list_even_for_no_sensors(tmp_path: Path) -> None:
    saver = StateStore(tmp_path)
    saver.save("pm10", ModelWindows(GEOMETRY))
    rewrite(saver.path_for("pm10"), {"open_seen": {}})
    assert saver.restore("pm10", GEOMETRY) is None
    assert saver.stats.corrupt == 1


class _Planted:
    """An object whose unpickling leaves a mark: a snapshot must never unpickle anything."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.mark),))


def test_a_pickled_array_in_a_snapshot_is_never_unpickled(tmp_path: Path) -> None:
    saver = StateStore(tmp_path)
    saver.save_all(filled_store())
    mark = tmp_path / "unpickled"
    planted = np.empty(1, dtype=object)
    planted[0] = _Planted(mark)
    with np.load(saver.path_for("pm10"), allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["ring"] = planted
    with saver.path_for("pm10").open("wb") as out:
        np.savez(out, **arrays)
    assert saver.restore("pm10", GEOMETRY) is None
    assert not mark.exists()
    assert saver.stats.corrupt == 1
