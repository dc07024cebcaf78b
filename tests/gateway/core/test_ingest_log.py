"""The ingest log: records round trip, replay after a kill, checkpoints, torn and corrupt
segments, the size bound, and that a replayed reading is never counted twice in a window.
What damage costs: test_ingest_log_damage.py."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import resource
import shutil
import signal
import stat
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import FIELD_LIMITS, SENSOR_ID_PATTERN, Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.ingest.ingest_log import IngestLog, JournaledQueue, commit_queued
from tesla_gateway.ingest.log_record import (
    FIELD_CODES,
    IngestLogCorruptError,
    RecordEncoder,
    decode_record,
    encode_record,
)
from tesla_gateway.ingest.log_scan import scan_framed
from tesla_gateway.ingest.log_segments import HEADER_SIZE, _fsync_and_close
from tesla_gateway.windows.snapshots import StateStore
from tesla_gateway.windows.store import WindowStore

P = 60
T0 = 1_700_000_040
GEOMETRY = WindowGeometry(
    window_length=4,
    period_seconds=P,
    channels=("pm10",),
    gap_policy=GapPolicy(max_interpolated_periods=1),
)


def reading(index: int, sensor: str = "s1") -> Reading:
    return Reading(sensor, T0 + index * 7.5, {"pm10": float(index % 97)}, source="mqtt")


def open_log(directory: Path, **options: object) -> IngestLog:
    settings = {"max_bytes": 1 << 30, "fsync_interval_s": None, **options}
    return IngestLog(directory, **settings)  # type: ignore[arg-type]


def started(directory: Path, **options: object) -> tuple[IngestLog, list[Reading]]:
    log = open_log(directory, **options)
    replayed = list(log.replay())
    log.start()
    return log, replayed


def replayed_by_a_restart(directory: Path) -> list[Reading]:
    """What a new process would replay now, from a copy (this one keeps appending)."""
    copy = directory.with_name(f"{directory.name}-restart-{len(list(directory.parent.iterdir()))}")
    shutil.copytree(directory, copy)
    return list(open_log(copy).replay())


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def test_every_reading_field_has_a_code() -> None:
    assert set(FIELD_LIMITS) <= set(FIELD_CODES)


@settings(max_examples=200, deadline=None)
@given(
    sensor=st.from_regex(SENSOR_ID_PATTERN, fullmatch=True),
    timestamp=st.floats(allow_nan=False, allow_infinity=False),
    values=st.dictionaries(
        st.sampled_from(sorted(FIELD_LIMITS)), st.floats(0, 1000), min_size=1, max_size=5
    ),
    source=st.sampled_from(["mqtt", "serial", "pms5003", "node:/dev/ttyUSB0"]),
)
def test_records_round_trip(
    sensor: str, timestamp: float, values: dict[str, float], source: str
) -> None:
    original = Reading(sensor, timestamp, values, source=source)
    ((index, body),) = scan_framed(encode_record(original, index=3), 0).records
    decoded = decode_record(body)
    assert index == 3
    assert decoded == original
    assert dict(decoded.values) == values


def test_a_node_sequence_number_round_trips() -> None:
    original = Reading("node-7", T0, {"pm2_5": 3.5, "pm10": 7.0}, "serial", seq=2**32 - 1)
    ((_, body),) = scan_framed(encode_record(original), 0).records
    assert decode_record(body) == original


def test_a_killed_log_replays_what_was_committed(tmp_path: Path) -> None:
    log, replayed = started(tmp_path)
    assert replayed == []
    for index in range(50):
        log.append(reading(index))
        log.commit()
    log.append(reading(50))  # buffered, never committed: not yet acknowledged either
    # SIGKILL: no close(); a second process opens the same directory
    again, replayed = started(tmp_path)
    assert replayed == [reading(index) for index in range(50)]
    assert again.stats.replayed == 50
    assert again.stats.torn_records == 0
    assert again.stats.next_seq == 50


def test_checkpoint_covers_snapshotted_readings_and_deletes_their_segments(
    tmp_path: Path,
) -> None:
    log, _ = started(tmp_path)
    for index in range(30):
        log.append(reading(index))
    log.commit()
    checkpoint = log.mark(queued=5)  # the snapshot holds 25; 5 still wait in the queue
    assert checkpoint.covered_seq == 25
    for index in range(30, 40):
        log.append(reading(index))
    log.commit()
    assert log.write_checkpoint(checkpoint)
    log.checkpointed(checkpoint)
    assert len(segment_files(tmp_path)) == 2  # the sealed one still holds 5 uncovered
    assert replayed_by_a_restart(tmp_path) == [reading(index) for index in range(25, 40)]
    # a later checkpoint covering everything deletes every sealed segment
    log.append(reading(40))
    log.commit()
    final = log.mark(queued=0)
    assert log.write_checkpoint(final)
    log.checkpointed(final)
    log.close()
    assert log.stats.segments == 0
    assert segment_files(tmp_path) == []
    _, replayed = started(tmp_path)
    assert replayed == []


@pytest.mark.parametrize("cut", [1, 5, 6, 10])
def test_a_torn_last_record_is_skipped_and_counted(tmp_path: Path, cut: int) -> None:
    log, _ = started(tmp_path)
    for index in range(10):
        log.append(reading(index))
        log.commit()
    (segment,) = segment_files(tmp_path)
    os.truncate(segment, segment.stat().st_size - cut)  # killed in the middle of a write()
    again, replayed = started(tmp_path)
    assert replayed == [reading(index) for index in range(9)]
    assert again.stats.torn_records == 1
    assert again.stats.corrupt_segments == 0


def test_zeros_after_the_last_record_are_a_torn_tail(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    for index in range(3):
        log.append(reading(index))
    log.commit()
    (segment,) = segment_files(tmp_path)
    with segment.open("ab") as out:
        out.write(b"\0" * 4096)  # a power cut: the file grew, its data never reached the disk
    again, replayed = started(tmp_path)
    assert replayed == [reading(index) for index in range(3)]
    assert again.stats.torn_records == 1


def test_a_segment_whose_header_does_not_match_its_name_is_set_aside(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    for index in range(20):
        log.append(reading(index))
    log.commit()
    (segment,) = segment_files(tmp_path)
    segment.rename(tmp_path / f"{7:020d}.seg")  # its records' sequence numbers are unknown
    again, replayed = started(tmp_path)
    assert replayed == []
    assert again.stats.corrupt_segments == 1
    assert len(list(tmp_path.glob("*.seg.corrupt-*"))) == 1
    # the next start does not see the set-aside segment again
    _, replayed = started(tmp_path)
    assert replayed == []


def test_a_corrupt_checkpoint_replays_everything_retained(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    for index in range(10):
        log.append(reading(index))
    log.commit()
    checkpoint = log.mark(queued=0)
    assert log.write_checkpoint(checkpoint)
    log.append(reading(10))
    log.commit()
    (tmp_path / "covered").write_bytes(b"garbage")
    again, replayed = started(tmp_path)
    assert replayed == [reading(10)]  # the covered segment was deleted with the checkpoint
    assert again.stats.corrupt_segments == 1
    assert list(tmp_path.glob("covered.corrupt-*"))


def test_the_size_bound_drops_the_oldest_segment_and_counts_it(tmp_path: Path) -> None:
    record = len(encode_record(reading(0)))
    log, _ = started(tmp_path, max_bytes=20 * record, segment_bytes=5 * record)
    for index in range(100):
        log.append(reading(index))
        log.commit()
    assert log.stats.dropped_segments > 0
    assert log.stats.bytes <= 20 * record + 5 * record
    assert sum(f.stat().st_size for f in segment_files(tmp_path)) == log.stats.bytes
    assert log.stats.dropped_records == 100 - len(replayed_by_a_restart(tmp_path))


def test_mutated_segments_never_stop_a_start(tmp_path: Path) -> None:
    """Bit flips, zeroed blocks and truncations anywhere: replay yields or skips, never raises."""
    rng = random.Random(12)
    source = tmp_path / "source"
    log, _ = started(source)
    for index in range(200):
        log.append(reading(index, sensor=f"s{index % 7}"))
        if index % 3 == 0:
            log.commit()
    log.commit()
    log.close()
    (segment,) = segment_files(source)
    pristine = segment.read_bytes()
    logged = {reading(index, sensor=f"s{index % 7}") for index in range(200)}
    for trial in range(300):
        data = bytearray(pristine)
        kind = trial % 3
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            start = rng.randrange(len(data))
            data[start : start + 512] = bytes(len(data[start : start + 512]))
        else:
            del data[rng.randrange(len(data)) :]
        directory = tmp_path / f"t{trial}"
        directory.mkdir()
        (directory / segment.name).write_bytes(bytes(data))
        again = open_log(directory)
        replayed = list(again.replay())
        again.start()
        assert set(replayed) <= logged


def test_a_replayed_reading_the_snapshot_holds_is_not_counted_twice(tmp_path: Path) -> None:
    """A checkpoint older than the snapshot (kill between the two writes) replays readings the
    windows already hold: the open period ignores them by timestamp, a closed one as late."""
    store = WindowStore()
    store.ensure("pm10", GEOMETRY)
    log, _ = started(tmp_path / "log")
    readings = [
        Reading("a", T0 + period * P + offset, {"pm10": 10.0 * period + offset})
        for period in range(3)
        for offset in (0, 20, 40)
    ]
    for item in readings:
        log.append(item)
        log.commit()
        store.add(item, 0.0)
    assert StateStore(tmp_path).save_all(store)  # the snapshot: no checkpoint written after it
    before = store["pm10"].export_state()
    restored = StateStore(tmp_path).restore("pm10", GEOMETRY)
    assert restored is not None
    again = WindowStore()
    again.install("pm10", restored)
    _, replayed = started(tmp_path / "log")
    assert replayed == readings
    for item in replayed:
        again.add(item, 0.0)
    after = again["pm10"].export_state()
    np.testing.assert_array_equal(after.open_sum, before.open_sum)
    np.testing.assert_array_equal(after.open_count, before.open_count)
    np.testing.assert_array_equal(after.ring, before.ring)


def test_the_queue_logs_each_reading_once_in_queue_order(tmp_path: Path) -> None:
    asyncio.run(queue_logs_each_reading_once_in_queue_order(tmp_path))


async def queue_logs_each_reading_once_in_queue_order(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    queue = JournaledQueue(log, maxsize=2)
    queue.put_nowait(reading(0))
    queue.put_nowait(reading(1))
    with pytest.raises(asyncio.QueueFull):
        queue.put_nowait(reading(2))  # refused before it is logged
    waiting = asyncio.ensure_future(queue.put(reading(2)))
    await asyncio.sleep(0)
    assert queue.get_nowait() == reading(0)
    await waiting
    commit_queued(queue)
    assert replayed_by_a_restart(tmp_path) == [reading(0), reading(1), reading(2)]
    assert log.mark(queued=queue.qsize()).covered_seq == 1


def test_sync_fsyncs_written_segments(tmp_path: Path) -> None:
    asyncio.run(sync_fsyncs_written_segments(tmp_path))


async def sync_fsyncs_written_segments(tmp_path: Path) -> None:
    log, _ = started(tmp_path, fsync_interval_s=0.01)
    log.append(reading(0))
    await log.sync()  # also writes what is buffered
    assert log.stats.fsyncs == 1
    await log.sync()
    assert log.stats.fsyncs == 1  # nothing new written
    log.close()


def test_an_unwritable_directory_is_reported_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    log, replayed = started(blocker / "ingest-log")
    assert replayed == []
    log.append(reading(0))
    log.commit()
    assert log.stats.write_failures == 1
    assert log.stats.last_error is not None
    log.close()


def test_a_log_never_started_is_left_as_it_was(tmp_path: Path) -> None:
    """A daemon that stops before its replay (no model loaded) must not checkpoint or reuse
    the log: its readings are still to be replayed."""
    log, _ = started(tmp_path)
    for index in range(5):
        log.append(reading(index))
    log.commit()
    unstarted = open_log(tmp_path)
    unstarted.checkpoint_now(queued=0)
    unstarted.close()
    _, replayed = started(tmp_path)
    assert replayed == [reading(index) for index in range(5)]


def test_a_sync_out_of_file_descriptors_is_retried_not_fatal(tmp_path: Path) -> None:
    """EMFILE (idle connections used up the process's descriptors) once reached the unguarded
    ``os.dup`` in sync and the daemon exited; now that sync is reported and the next one syncs.
    The shortage is real: the soft limit is lowered and every free descriptor is taken."""
    import resource

    log, _ = started(tmp_path)
    for index in range(5):
        log.append(reading(index))
        log.commit()
    loop = asyncio.new_event_loop()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hog: list[int] = []
    try:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (len(list(Path("/proc/self/fd").iterdir())) + 8, hard)
        )
        with pytest.raises(OSError):  # fill until the kernel refuses
            while True:
                hog.append(os.open(os.devnull, os.O_RDONLY))
        loop.run_until_complete(log.sync())  # must not raise
        assert log.stats.last_error == "fsync: Too many open files"
        assert log.stats.fsyncs == 0
    finally:
        for fd in hog:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    loop.run_until_complete(log.sync())
    loop.close()
    assert log.stats.fsyncs == 1
    assert replayed_by_a_restart(tmp_path) == [reading(index) for index in range(5)]


def test_a_failure_that_repeats_is_logged_at_most_once_a_minute(tmp_path: Path) -> None:
    """A full disk fails every write: one line when it starts, then one a minute with a count."""
    from structlog.testing import capture_logs

    from tesla_gateway.ingest.log_stats import IngestLogStats, report_failure

    stats = IngestLogStats()
    now = [1000.0]
    full = OSError(28, "No space left on device")
    with capture_logs() as logs:
        for step in range(5):
            now[0] = 1000.0 + 10 * step
            report_failure(stats, tmp_path, "write", full, clock=lambda: now[0])
        now[0] = 1061.0
        report_failure(stats, tmp_path, "write", full, clock=lambda: now[0])
    lines = [e for e in logs if e["event"] == "ingest_log_failed"]
    assert [line["not_logged_since"] for line in lines] == [0, 4]
    assert stats.last_error == "write: No space left on device"


# -- what the log reports, its bounds and its descriptors (survivors of make mutation) ----------


def fds_open_on(directory: Path) -> list[str]:
    """The names of files under ``directory`` this process holds open."""
    names = []
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = fd.readlink()
            if target.parent == directory:
                names.append(target.name)
    return sorted(names)


def test_segment_size_defaults_to_a_quarter_of_the_bound_within_4_kib_and_8_mib(
    tmp_path: Path,
) -> None:
    assert open_log(tmp_path, max_bytes=1 << 30).segment_bytes == 8 * 1024 * 1024
    assert open_log(tmp_path, max_bytes=40_003).segment_bytes == 10_000
    assert open_log(tmp_path, max_bytes=1000).segment_bytes == 4096
    assert open_log(tmp_path, max_bytes=1000, segment_bytes=512).segment_bytes == 512
    assert open_log(tmp_path, max_bytes=1000).max_bytes == 1000


def test_a_segment_is_sealed_when_it_reaches_its_size(tmp_path: Path) -> None:
    record = len(encode_record(reading(0)))
    log, _ = started(tmp_path, segment_bytes=HEADER_SIZE + 3 * record)
    for index in range(3):
        log.append(reading(index))
        log.commit()
        assert log.stats.bytes == sum(f.stat().st_size for f in segment_files(tmp_path))
    assert [f.stat().st_size for f in segment_files(tmp_path)] == [
        HEADER_SIZE + 3 * record,
        HEADER_SIZE,
    ]
    assert log.stats.segments == 2
    assert stat.S_IMODE(segment_files(tmp_path)[0].stat().st_mode) == 0o600


def test_the_size_bound_drops_exactly_the_oldest_segments_and_logs_each(tmp_path: Path) -> None:
    record = len(encode_record(reading(0)))
    segment = HEADER_SIZE + 5 * record
    log, _ = started(tmp_path, max_bytes=2 * segment, segment_bytes=segment)
    with capture_logs() as logs:
        for index in range(20):
            log.append(reading(index))
            log.commit()
            if index == 6:  # a snapshot holding 0..5; reading 6 still waits in the queue
                log.checkpoint_now(queued=1)
    # Segments: 0-4 (deleted by the checkpoint), 5-6 (sealed by it), 7-11, 12-16, 17-19
    # (active). Two full segments fit: 5-6 (one reading uncovered) and 7-11 went, oldest first.
    assert [e for e in logs if e["event"] == "ingest_log_segment_dropped"] == [
        {
            "event": "ingest_log_segment_dropped",
            "log_level": "error",
            "segment": f"{first:020d}.seg",
            "readings": readings,
            "max_bytes": 2 * segment,
        }
        for first, readings in ((5, 1), (7, 5))
    ]
    assert (log.stats.dropped_segments, log.stats.dropped_records) == (2, 6)
    assert [int(f.stem) for f in segment_files(tmp_path)] == [12, 17]
    assert log.stats.bytes == 2 * HEADER_SIZE + 8 * record
    assert replayed_by_a_restart(tmp_path) == [reading(index) for index in range(12, 20)]


def test_the_active_segment_is_never_dropped_even_beyond_the_bound(tmp_path: Path) -> None:
    record = len(encode_record(reading(0)))
    log, _ = started(tmp_path, max_bytes=10, segment_bytes=HEADER_SIZE + 2 * record)
    for index in range(5):
        log.append(reading(index))
    log.commit()  # sealed; the new active segment alone is beyond the bound, and kept
    assert [int(f.stem) for f in segment_files(tmp_path)] == [5]
    log.append(reading(5))
    log.commit()
    assert replayed_by_a_restart(tmp_path) == [reading(5)]
    segment_files(tmp_path)[0].unlink()  # removed by hand: dropping it later must not raise
    log.append(reading(6))
    log.commit()  # sealed (and its reading 6 lost with the file removed by hand)
    log.append(reading(7))
    log.commit()
    assert (log.stats.dropped_segments, log.stats.dropped_records) == (2, 7)
    assert replayed_by_a_restart(tmp_path) == [reading(7)]


def test_stats_after_a_checkpoint_name_every_counter(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    for index in range(10):
        log.append(reading(index))
    log.commit()
    log.checkpoint_now(queued=4)  # the snapshot holds 0..5
    record = len(encode_record(reading(0)))
    assert log.stats.as_dict() == {
        "bytes": 2 * HEADER_SIZE + 10 * record,
        "segments": 2,
        "replayed": 0,
        "torn_records": 0,
        "damaged_records": 0,
        "corrupt_segments": 0,
        "corrupt_records": 0,
        "dropped_segments": 0,
        "dropped_records": 0,
        "unexpected_files": 0,
        "write_failures": 0,
        "fsyncs": 0,
        "covered_seq": 6,
        "next_seq": 10,
        "last_error": None,
    }
    assert replayed_by_a_restart(tmp_path) == [reading(index) for index in range(6, 10)]


def test_marking_twice_without_readings_keeps_one_active_segment(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    log.append(reading(0))
    log.commit()
    log.mark(queued=0)
    log.mark(queued=0)
    assert log.stats.segments == 2 and len(segment_files(tmp_path)) == 2
    log.close()
    assert fds_open_on(tmp_path) == []


def test_sealed_segments_stay_open_until_the_fsync_loop_syncs_them(tmp_path: Path) -> None:
    asyncio.run(sealed_segments_stay_open_until_synced(tmp_path))


async def sealed_segments_stay_open_until_synced(tmp_path: Path) -> None:
    log, _ = started(tmp_path, fsync_interval_s=60.0)
    first = segment_files(tmp_path)[0].name
    await log.sync()  # a new segment's header is written: synced
    assert log.stats.fsyncs == 1
    log.append(reading(0))
    log.mark(queued=0)  # sealed: waits for the fsync loop
    second = segment_files(tmp_path)[1].name
    assert fds_open_on(tmp_path) == [first, second]
    await log.sync()
    assert fds_open_on(tmp_path) == [second]
    assert log.stats.fsyncs == 2
    log.append(reading(1))
    log.mark(queued=0)
    log.close()  # fsyncs and closes the sealed one too
    assert fds_open_on(tmp_path) == []


def test_without_an_fsync_interval_a_sealed_segment_is_closed_at_once(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    log.append(reading(0))
    log.mark(queued=0)
    assert fds_open_on(tmp_path) == [segment_files(tmp_path)[1].name]
    asyncio.run(log.run())  # no interval: returns at once
    log.close()


def test_the_fsync_loop_syncs_every_interval(tmp_path: Path) -> None:
    async def scenario() -> int:
        log, _ = started(tmp_path, fsync_interval_s=0.01)
        log.append(reading(0))
        task = asyncio.create_task(log.run())
        for _ in range(500):
            await asyncio.sleep(0.01)
            if log.stats.fsyncs:
                break
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        log.close()
        return log.stats.fsyncs

    assert asyncio.run(scenario()) >= 1
    assert replayed_by_a_restart(tmp_path) == [reading(0)]


def test_a_failed_fsync_is_reported_and_retried_at_the_next_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error from fsync (no real one can be had here: os.fsync fails once)."""
    real_fsync = os.fsync
    failures = [OSError(errno.EIO, "Input/output error")]

    def fsync(fd: int) -> None:
        if failures:
            raise failures.pop()
        real_fsync(fd)

    async def scenario() -> IngestLog:
        log, _ = started(tmp_path, fsync_interval_s=60.0)
        log.append(reading(0))
        monkeypatch.setattr(os, "fsync", fsync)
        with capture_logs() as logs:
            await log.sync()
        assert logs == [
            {
                "event": "ingest_log_failed",
                "log_level": "error",
                "directory": str(tmp_path),
                "operation": "fsync",
                "error": "Input/output error",
                "errno": errno.EIO,
                "not_logged_since": 0,
            }
        ]
        assert log.stats.fsyncs == 0
        assert log.stats.last_error == "fsync: Input/output error"
        await log.sync()  # nothing new written, but the failed sync is retried
        assert log.stats.fsyncs == 1
        log.append(reading(1))
        await log.sync()
        assert log.stats.fsyncs == 2
        return log

    asyncio.run(scenario()).close()


def test_fsync_and_close_closes_every_descriptor_and_raises_the_first_error(
    tmp_path: Path,
) -> None:
    """A pipe cannot be fsynced (EINVAL, a real error); a closed descriptor fails with EBADF."""
    read_end, write_end = os.pipe()
    segment = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    closed = os.open(tmp_path / "g", os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(closed)
    with pytest.raises(OSError) as raised:
        _fsync_and_close([segment, read_end, closed, write_end])
    assert raised.value.errno == errno.EINVAL
    for fd in (segment, read_end, write_end):
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_write_cut_short_by_the_file_size_limit_is_reported_and_a_new_segment_follows(
    tmp_path: Path,
) -> None:
    """A real EFBIG (the process's file-size limit) part-way through a commit, as a full disk:
    the records already in the file replay, the failed ones are counted, the next go on."""
    log, _ = started(tmp_path)
    record = len(encode_record(reading(0)))
    for index in range(3):
        log.append(reading(index))
    log.commit()
    for index in range(3, 13):
        log.append(reading(index))
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (HEADER_SIZE + 5 * record + 7, hard))
    try:
        with capture_logs() as logs:
            log.commit()  # 2 records fit, a third is cut short, then EFBIG
            for index in range(13, 23):
                log.append(reading(index))
            log.commit()  # the new segment has room for 5 records: EFBIG again
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert log.stats.write_failures == 20
    assert [(e["event"], e["operation"], e["errno"]) for e in logs] == [
        ("ingest_log_failed", "write", errno.EFBIG)
    ]
    assert log.stats.last_error == "write: File too large"
    log.append(reading(23))
    log.commit()
    assert log.stats.write_failures == 20
    # What reached the files before each EFBIG replays (the failed commits are counted whole).
    replayed = replayed_by_a_restart(tmp_path)
    expected = [*range(5), *range(13, 18), 23]
    assert replayed == [reading(i) for i in expected]


def test_a_log_that_cannot_create_its_directory_reports_and_counts(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    directory = blocker / "ingest-log"
    with capture_logs() as logs:
        log, replayed = started(directory)
    assert replayed == []
    assert (log.stats.next_seq, log.stats.covered_seq) == (0, 0)
    assert logs[0] == {
        "event": "ingest_log_failed",
        "log_level": "error",
        "directory": str(directory),
        "operation": "open",
        "error": "Not a directory",
        "errno": errno.ENOTDIR,
        "not_logged_since": 0,
    }
    for index in range(3):
        log.append(reading(index))
        log.commit()
    asyncio.run(log.sync())
    assert log.stats.write_failures == 3
    assert log.stats.fsyncs == 0
    assert log.stats.last_error == f"open {3:020d}.seg: Not a directory"  # sync retried it


def test_a_log_under_missing_parents_creates_them(tmp_path: Path) -> None:
    log, _ = started(tmp_path / "a" / "b" / "log")
    log.append(reading(0))
    log.commit()
    assert log.stats.write_failures == 0
    assert replayed_by_a_restart(tmp_path / "a" / "b" / "log") == [reading(0)]


def test_a_new_segment_whose_header_cannot_be_written_is_removed(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    log.append(reading(0))
    log.commit()
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        with capture_logs() as logs:
            log.mark(queued=0)  # seals, and the next segment's header fails with EFBIG
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert [(e["event"], e["operation"]) for e in logs] == [
        ("ingest_log_failed", f"write {1:020d}.seg")
    ]
    assert [f.name for f in segment_files(tmp_path)] == [f"{0:020d}.seg"]
    log.append(reading(1))
    log.commit()  # no active segment: counted, not raised
    assert log.stats.write_failures == 1
    log.mark(queued=0)  # retries the segment
    log.append(reading(2))
    log.commit()
    assert replayed_by_a_restart(tmp_path) == [reading(0), reading(2)]


def test_a_segment_that_cannot_be_created_is_reported(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log, _ = started(directory)
    log.append(reading(0))
    log.commit()
    shutil.rmtree(directory)  # gone under the running log
    with capture_logs() as logs:
        log.mark(queued=0)
    assert [(e["event"], e["operation"], e["errno"]) for e in logs] == [
        ("ingest_log_failed", f"open {1:020d}.seg", errno.ENOENT)
    ]


def test_a_checkpoint_that_cannot_be_written_keeps_the_segments(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log, _ = started(directory)
    for index in range(3):
        log.append(reading(index))
    checkpoint = log.mark(queued=0)
    assert checkpoint.sealed
    shutil.rmtree(directory)
    with capture_logs() as logs:
        assert not log.write_checkpoint(checkpoint)
    assert [(e["event"], e["operation"], e["directory"]) for e in logs] == [
        ("ingest_log_failed", "checkpoint", str(directory))
    ]
    assert log.stats.last_error == "checkpoint: No such file or directory"


def test_a_checkpoint_whose_segment_is_already_gone_still_succeeds(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    log.append(reading(0))
    checkpoint = log.mark(queued=0)
    for sealed in checkpoint.sealed:
        sealed.unlink()
    assert log.write_checkpoint(checkpoint)
    log.checkpointed(checkpoint)
    assert log.stats.covered_seq == 1
    checkpoint_file = tmp_path / "covered"
    assert stat.S_IMODE(checkpoint_file.stat().st_mode) == 0o600


def test_an_unbounded_journaled_queue_takes_any_number(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    queue = JournaledQueue(log)
    for index in range(3):
        queue.put_nowait(reading(index))
    assert queue.qsize() == 3


def test_4096_buffered_readings_are_written_without_a_commit(tmp_path: Path) -> None:
    log, _ = started(tmp_path)
    for index in range(4096):
        log.append(reading(index))
    assert len(replayed_by_a_restart(tmp_path)) == 4096


def test_one_sensor_with_and_without_sequence_numbers_round_trips() -> None:
    """The encoder caches a frame prefix per (sensor, source, fields), apart for readings with
    a node sequence number: the two never borrow each other's."""
    plain = Reading("node-7", T0, {"pm10": 1.0}, "serial")
    numbered = Reading("node-7", T0 + 1, {"pm10": 2.0}, "serial", seq=5)
    for order in ((plain, numbered, plain), (numbered, plain, numbered)):
        data = RecordEncoder().encode(order, 0)
        bodies = [body for _, body in scan_framed(data, 0).records]
        assert [decode_record(body) for body in bodies] == list(order)


def test_a_long_source_is_cut_to_255_bytes() -> None:
    original = Reading("s1", T0, {"pm10": 1.0}, source="x" * 300)
    ((index, body),) = scan_framed(encode_record(original), 0).records
    assert index == 0
    assert decode_record(body).source == "x" * 255


@pytest.mark.parametrize(
    "body",
    [
        bytes(scan_framed(encode_record(Reading("", T0, {"pm10": 1.0})), 0).records[0][1]),
        bytes(scan_framed(encode_record(reading(0)), 0).records[0][1]) + b"\0",
    ],
    ids=["no sensor id", "a byte too many"],
)
def test_a_record_body_that_does_not_add_up_is_corrupt(body: bytes) -> None:
    with pytest.raises(IngestLogCorruptError):
        decode_record(body)


def test_a_failure_logged_exactly_a_minute_later_is_logged_again(tmp_path: Path) -> None:
    from tesla_gateway.ingest.log_stats import IngestLogStats, report_failure

    stats = IngestLogStats()
    now = [1000.0]
    with capture_logs() as logs:
        report_failure(stats, tmp_path, "write", OSError("short write"), clock=lambda: now[0])
        now[0] = 1060.0
        report_failure(stats, tmp_path, "write", OSError("short write"), clock=lambda: now[0])
    assert [e["error"] for e in logs] == ["short write", "short write"]  # no strerror: the text
    assert stats.last_error == "write: short write"


def test_the_size_bound_is_a_maximum_the_log_may_reach(tmp_path: Path) -> None:
    record = len(encode_record(reading(0)))
    segment = HEADER_SIZE + 2 * record
    log, _ = started(tmp_path, max_bytes=segment + HEADER_SIZE, segment_bytes=segment)
    log.append(reading(0))
    log.append(reading(1))
    log.commit()  # sealed: the sealed segment and the new header are exactly the bound
    assert log.stats.bytes == segment + HEADER_SIZE
    assert log.stats.dropped_segments == 0


def test_a_segment_a_full_disk_left_empty_drops_no_reading_when_dropped(tmp_path: Path) -> None:
    """A write refused whole (a real EFBIG at the file-size limit) leaves a segment with no
    record; when the bound drops it, no reading is counted as dropped for it."""
    record = len(encode_record(reading(0)))
    segment = HEADER_SIZE + 2 * record
    log, _ = started(tmp_path, max_bytes=2 * segment, segment_bytes=segment)
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (HEADER_SIZE, hard))
    try:
        with capture_logs():  # (the test's captured stdout is a file under the limit too)
            log.append(reading(0))
            log.commit()  # nothing fits: counted, and a new segment started
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert log.stats.write_failures == 1
    for index in range(1, 5):
        log.append(reading(index))
        log.commit()
    assert log.stats.dropped_segments == 2  # the empty one, then readings 1 and 2
    assert log.stats.dropped_records == 2


def test_close_survives_fsync_errors_and_an_active_segment_removed_by_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """I/O errors from fsync at close (injected: no real one can be had here) and an empty
    active segment already gone are not raised: the daemon is stopping."""
    log, _ = started(tmp_path, fsync_interval_s=60.0)
    log.append(reading(0))
    log.mark(queued=0)  # a sealed segment waits for the fsync loop

    def fsync(_fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    log.close()  # (the sealed segment's descriptor stays open: close skips it after the error)
    monkeypatch.undo()
    for fd in Path("/proc/self/fd").iterdir():  # close what close() left open
        with contextlib.suppress(OSError):
            if fd.readlink().parent == tmp_path:
                os.close(int(fd.name))
    again, _ = started(tmp_path)
    segment_files(tmp_path)[-1].unlink()  # the empty active segment, removed by hand
    again.close()
    assert again.stats.segments == 1
