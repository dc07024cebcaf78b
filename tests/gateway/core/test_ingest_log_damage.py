"""What damage costs the ingest log (issue 26): a damaged record costs that record only, a
tail of zeros is one torn end, an unexpected file in the directory is set aside and the log
starts, and segments written by the format before framing still replay."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tesla_gateway.contract.readings import Reading
from tesla_gateway.ingest.ingest_log import IngestLog
from tesla_gateway.ingest.log_checkpoint import parse_checkpoint, write_checkpoint_file
from tesla_gateway.ingest.log_record import (
    FRAME_CRC,
    FRAME_HEAD,
    FRAME_INDEX,
    FRAME_MAGIC,
    encode_record,
    length_check,
)
from tesla_gateway.ingest.log_segments import MAX_SEQ
from tesla_gateway.set_aside import SetAsideLog

T0 = 1_700_000_040
SEGMENT_HEADER = 17  # magic (4), version (1), first sequence number (8), crc32 (4)


def reading(index: int) -> Reading:
    return Reading("s1", T0 + index * 7.5, {"pm10": float(index % 97)}, source="mqtt")


def started(directory: Path, **options: object) -> tuple[IngestLog, list[Reading]]:
    settings = {"max_bytes": 1 << 30, "fsync_interval_s": None, **options}
    log = IngestLog(directory, **settings)  # type: ignore[arg-type]
    replayed = list(log.replay())
    log.start()
    return log, replayed


def logged(directory: Path, count: int) -> Path:
    """A segment holding ``count`` readings, committed in batches of 10, as after a kill."""
    log, _ = started(directory)
    for index in range(count):
        log.append(reading(index))
        if index % 10 == 9:
            log.commit()
    log.commit()
    (segment,) = sorted(directory.glob("*.seg"))
    return segment


def set_aside(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("*.corrupt-*"))


# -- 1. a damaged record costs that record only ---------------------------------------------


@pytest.mark.parametrize("where", ["one byte a third in", "one bit in the second record"])
def test_one_damaged_record_costs_that_record_only(tmp_path: Path, where: str) -> None:
    segment = logged(tmp_path, 600)
    data = bytearray(segment.read_bytes())
    record = (len(data) - SEGMENT_HEADER) // 600
    offset = len(data) // 3 if where.startswith("one byte") else SEGMENT_HEADER + record + 9
    data[offset] ^= 0xFF if where.startswith("one byte") else 0x10
    segment.write_bytes(bytes(data))
    lost = (offset - SEGMENT_HEADER) // record
    with capture_logs() as logs:
        again, replayed = started(tmp_path)
    assert replayed == [reading(index) for index in range(600) if index != lost]
    assert again.stats.damaged_records == 1
    assert again.stats.as_dict()["damaged_records"] == 1
    assert again.stats.torn_records == again.stats.corrupt_segments == 0
    assert again.stats.next_seq == 600
    assert set_aside(tmp_path) == []  # the segment stays in the log until a checkpoint covers it
    assert [e["event"] for e in logs].count("ingest_log_damaged_records") == 1
    _, replayed_again = started(tmp_path)
    assert replayed_again == replayed


def test_a_flipped_byte_anywhere_costs_at_most_the_record_it_hit(tmp_path: Path) -> None:
    count = 6
    source = logged(tmp_path / "source", count)
    pristine = source.read_bytes()
    record = (len(pristine) - SEGMENT_HEADER) // count
    for offset in range(len(pristine)):
        data = bytearray(pristine)
        data[offset] ^= 0xFF
        directory = tmp_path / f"at-{offset}"
        directory.mkdir()
        (directory / source.name).write_bytes(bytes(data))
        again, replayed = started(directory)
        if offset < SEGMENT_HEADER:  # the records carry their own checks: none is lost
            assert replayed == [reading(index) for index in range(count)], offset
            continue
        lost = (offset - SEGMENT_HEADER) // record
        assert replayed == [reading(i) for i in range(count) if i != lost], offset
        assert again.stats.damaged_records + again.stats.torn_records == 1, offset
        assert again.stats.next_seq == (count if lost < count - 1 else count - 1), offset
        shutil.rmtree(directory)


def test_damage_in_two_places_costs_the_records_between(tmp_path: Path) -> None:
    segment = logged(tmp_path, 100)
    data = bytearray(segment.read_bytes())
    record = (len(data) - SEGMENT_HEADER) // 100
    data[SEGMENT_HEADER + 10 * record : SEGMENT_HEADER + 13 * record + 5] = bytes(3 * record + 5)
    data[SEGMENT_HEADER + 50 * record + 3] ^= 0x01
    segment.write_bytes(bytes(data))
    again, replayed = started(tmp_path)
    lost = {10, 11, 12, 13, 50}
    assert replayed == [reading(index) for index in range(100) if index not in lost]
    assert again.stats.damaged_records == len(lost)


def test_damage_in_a_later_segment_costs_that_record_only(tmp_path: Path) -> None:
    """Indices count from each segment's first sequence number; a checkpoint still applies."""
    record = len(encode_record(reading(0)))
    log, _ = started(tmp_path, segment_bytes=10 * record)
    for index in range(40):
        log.append(reading(index))
        log.commit()
    checkpoint = log.mark(queued=15)  # the snapshot holds 0..24
    assert log.write_checkpoint(checkpoint)
    log.checkpointed(checkpoint)
    (segment,) = [s for s in tmp_path.glob("*.seg") if int(s.stem) <= 31 < int(s.stem) + 10]
    data = bytearray(segment.read_bytes())
    data[SEGMENT_HEADER + (31 - int(segment.stem)) * record + 20] ^= 0x08
    segment.write_bytes(bytes(data))
    again, replayed = started(tmp_path)
    assert replayed == [reading(index) for index in range(25, 40) if index != 31]
    assert again.stats.damaged_records == 1
    assert again.stats.next_seq == 40


# -- 2. zeros after a power cut ---------------------------------------------------------------


@pytest.mark.parametrize("zeros", [4096, 1 << 20])
def test_a_tail_of_zeros_is_one_torn_end(tmp_path: Path, zeros: int) -> None:
    segment = logged(tmp_path, 100)
    with segment.open("ab") as out:
        out.write(bytes(zeros))  # what ext4 can leave after a power cut
    with capture_logs() as logs:
        again, replayed = started(tmp_path)
    assert replayed == [reading(index) for index in range(100)]
    assert again.stats.torn_records == 1
    assert again.stats.corrupt_records == 0
    assert again.stats.next_seq == 100
    assert again.stats.damaged_records == 0
    events = [entry["event"] for entry in logs]
    assert events.count("ingest_log_torn_record") == 1
    assert "ingest_log_bad_record" not in events
    assert len(logs) <= 3  # the torn end, the replay summary


# -- 3. a file name never kills a start ---------------------------------------------------------


def a_life(directory: Path) -> list[Reading]:
    """Start, log, take a snapshot (checkpoint), log more, restart: what the restart replays."""
    log, _ = started(directory)
    for index in range(5):
        log.append(reading(index))
    log.commit()
    assert log.stats.write_failures == 0
    checkpoint = log.mark(queued=0)
    assert log.write_checkpoint(checkpoint)
    log.checkpointed(checkpoint)
    for index in range(5, 8):
        log.append(reading(index))
    log.commit()
    assert log.stats.write_failures == 0
    _, replayed = started(directory)
    return replayed


@pytest.mark.parametrize("name", ["99999999999999999999.seg", "18446744073709551615.seg"])
def test_a_segment_named_beyond_any_sequence_number_is_set_aside(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    with capture_logs() as logs:
        replayed = a_life(tmp_path)
    assert replayed == [reading(index) for index in range(5, 8)]
    (aside,) = set_aside(tmp_path)
    assert aside.startswith(f"{name}.corrupt-")
    assert [e["event"] for e in logs].count("state_file_set_aside") == 1


def test_a_file_where_the_directory_should_be_is_set_aside(tmp_path: Path) -> None:
    directory = tmp_path / "ingest-log"
    directory.write_bytes(b"not a directory")
    log, replayed = started(directory)
    assert replayed == []
    log.append(reading(0))
    log.commit()
    assert log.stats.write_failures == 0
    assert log.stats.unexpected_files == 1
    assert directory.is_dir()
    assert [path.name.split(".corrupt-")[0] for path in tmp_path.glob("*.corrupt-*")] == [
        "ingest-log"
    ]
    _, replayed = started(directory)
    assert replayed == [reading(0)]


def test_unexpected_entries_in_the_directory_are_set_aside(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000000.seg").mkdir()  # a directory named like a segment
    (tmp_path / "covered").mkdir()  # where the checkpoint goes
    (tmp_path / "\u00b2.seg").write_bytes(b"")  # a digit to str.isdigit, not to int()
    (tmp_path / "7.seg").write_bytes(b"")  # not a name the log writes
    (tmp_path / "notes.txt").write_text("kept by hand")
    (tmp_path / "00000000000000000003.seg.corrupt-20240101T000000Z").write_bytes(b"old")
    log = IngestLog(tmp_path, max_bytes=1 << 30, fsync_interval_s=None)
    list(log.replay())
    assert log.stats.unexpected_files == 5
    assert a_life(tmp_path) == [reading(index) for index in range(5, 8)]
    names = {name.split(".corrupt-")[0] for name in set_aside(tmp_path)}
    assert names == {
        "00000000000000000000.seg",
        "00000000000000000003.seg",  # set aside before: left as it was
        "covered",
        "\u00b2.seg",
        "7.seg",
        "notes.txt",
    }


# -- segments written before framing (format version 1) ------------------------------------------

OLD_FIELD_CODES = ("pm1", "pm2_5", "pm10", "rh", "temp_c")


def old_body(item: Reading) -> bytes:
    """A record body as version 1 wrote it: sensor id and source (a length byte and UTF-8
    each), the field count (high bit: a node sequence number follows) and codes, the timestamp
    (float64), the sequence number (uint32, if flagged), the values (float64)."""
    sensor, source = item.sensor_id.encode(), item.source.encode()
    codes = [OLD_FIELD_CODES.index(name) for name in item.values]
    flag = 0x80 if item.seq is not None else 0
    body = bytes((len(sensor), *sensor, len(source), *source, len(codes) | flag, *codes))
    body += struct.pack("<d", item.timestamp)
    if item.seq is not None:
        body += struct.pack("<I", item.seq)
    return body + struct.pack(f"<{len(codes)}d", *item.values.values())


def old_segment(first_seq: int, items: list[Reading]) -> bytes:
    """Version 1: header ``TGIL | 1 | first seq (u64) | crc32``, records ``crc32 | length (u16)
    | body``."""
    header = struct.pack("<4sBQ", b"TGIL", 1, first_seq)
    out = bytearray(header + struct.pack("<I", zlib.crc32(header)))
    for item in items:
        body = old_body(item)
        out += struct.pack("<IH", zlib.crc32(body), len(body)) + body
    return bytes(out)


OLD_READINGS = [
    *(reading(index) for index in range(20)),
    Reading("node-7", T0, {"pm2_5": 3.5, "pm10": 7.0, "rh": 41.0}, "serial", seq=2**32 - 1),
    Reading("ünïcode", T0 + 1, {"temp_c": -3.25}, "node:/dev/ttyUSB0"),
]


def test_a_segment_of_the_old_format_replays_after_an_upgrade(tmp_path: Path) -> None:
    (tmp_path / f"{1000:020d}.seg").write_bytes(old_segment(1000, OLD_READINGS))
    log, replayed = started(tmp_path)
    assert replayed == OLD_READINGS
    assert log.stats.next_seq == 1000 + len(OLD_READINGS)
    log.append(reading(99))
    log.commit()
    _, replayed = started(tmp_path)  # killed: the old segment and the new one replay
    assert replayed == [*OLD_READINGS, reading(99)]


def test_an_old_segment_with_a_tail_of_zeros_is_one_torn_end(tmp_path: Path) -> None:
    data = old_segment(0, OLD_READINGS) + bytes(4096)
    (tmp_path / f"{0:020d}.seg").write_bytes(data)
    with capture_logs() as logs:
        log, replayed = started(tmp_path)
    assert replayed == OLD_READINGS
    assert log.stats.torn_records == 1
    assert log.stats.corrupt_records == 0
    assert log.stats.next_seq == len(OLD_READINGS)
    assert "ingest_log_bad_record" not in [entry["event"] for entry in logs]


def test_an_old_segment_damaged_in_the_middle_replays_what_precedes_it(tmp_path: Path) -> None:
    """Version 1 records cannot be found past a damaged one: the segment is set aside."""
    data = bytearray(old_segment(0, OLD_READINGS))
    record = len(old_body(reading(0))) + 6
    data[SEGMENT_HEADER + 5 * record + 8] ^= 0x40
    (tmp_path / f"{0:020d}.seg").write_bytes(bytes(data))
    log, replayed = started(tmp_path)
    assert replayed == OLD_READINGS[:5]
    assert log.stats.corrupt_segments == 1
    assert len(set_aside(tmp_path)) == 1


# -- what replay reports, exactly (survivors of make mutation) ----------------------------------

RECORD = len(encode_record(reading(0)))


def frame(body: bytes, index: int) -> bytes:
    """A good frame around any body (what the log would write for that body)."""
    payload = body + FRAME_INDEX.pack(index)
    head = FRAME_HEAD.pack(FRAME_MAGIC, len(payload), length_check(len(payload)))
    return head + payload + FRAME_CRC.pack(zlib.crc32(payload))


def segment_of(first_seq: int, frames: bytes) -> bytes:
    header = struct.pack("<4sBQ", b"TGIL", 2, first_seq)
    return header + struct.pack("<I", zlib.crc32(header)) + frames


def records(first: int, count: int, index: int = 0) -> bytes:
    return b"".join(encode_record(reading(first + i), index + i) for i in range(count))


def replay_logged(directory: Path, **options: object) -> tuple[IngestLog, list[Reading], list]:  # type: ignore[type-arg]
    with capture_logs() as logs:
        log, replayed = started(directory, **options)
    return log, replayed, logs


def test_a_damaged_record_and_a_torn_end_are_logged_with_where_and_how_much(
    tmp_path: Path,
) -> None:
    data = bytearray(segment_of(0, records(0, 10)))
    data[SEGMENT_HEADER + 3 * RECORD + 20] ^= 0x04  # record 3's body
    data[SEGMENT_HEADER + 6 * RECORD + 20] ^= 0x04  # record 6's body
    data = data[: len(data) - 7]  # record 9 cut short
    name = f"{0:020d}.seg"
    (tmp_path / name).write_bytes(bytes(data))
    log, replayed, logs = replay_logged(tmp_path)
    assert replayed == [reading(i) for i in range(9) if i not in (3, 6)]
    assert logs[:3] == [
        {
            "event": "ingest_log_torn_record",
            "log_level": "warning",
            "segment": name,
            "offset": SEGMENT_HEADER + 9 * RECORD,
            "bytes": RECORD - 7,
        },
        {
            "event": "ingest_log_damaged_records",
            "log_level": "error",
            "segment": name,
            "records": 2,
            "bytes": 2 * RECORD,
            "offset": SEGMENT_HEADER + 3 * RECORD,
        },
        {
            "event": "ingest_log_replayed",
            "log_level": "info",
            "replayed": 7,
            "covered_seq": 0,
            "torn_records": 1,
            "damaged_records": 2,
            "corrupt_segments": 0,
        },
    ]
    assert log.stats.last_error == f"damaged records in {name}"
    assert log.stats.as_dict()["torn_records"] == 1


def test_a_damaged_segment_header_with_good_frames_after_it_replays_them(tmp_path: Path) -> None:
    data = bytearray(segment_of(0, records(0, 4)))
    data[2] ^= 0x01  # the magic
    name = f"{0:020d}.seg"
    (tmp_path / name).write_bytes(bytes(data))
    log, replayed, logs = replay_logged(tmp_path)
    assert replayed == [reading(i) for i in range(4)]
    assert logs[0] == {
        "event": "ingest_log_damaged_header",
        "log_level": "error",
        "segment": name,
        "records": 4,
    }
    assert log.stats.last_error == f"damaged header in {name}"
    assert log.stats.corrupt_segments == 0 and set_aside(tmp_path) == []


def test_a_damaged_header_with_nothing_readable_after_it_is_set_aside(tmp_path: Path) -> None:
    aside = SetAsideLog()
    name = f"{0:020d}.seg"
    (tmp_path / name).write_bytes(b"\x01" * 64)
    log, replayed, logs = replay_logged(tmp_path, set_aside=aside)
    assert replayed == []
    assert [e["event"] for e in logs][:1] == ["ingest_log_damaged_header"]
    assert log.stats.corrupt_segments == 1
    assert log.stats.last_error == f"corrupt {name}: bad segment header"
    files = aside.as_dict()["files"]
    assert [(f["kind"], f["reason"]) for f in files] == [  # type: ignore[attr-defined]
        ("ingest log", "bad segment header")
    ]
    assert [e for e in logs if e["event"] == "ingest_log_replayed"] == [
        {
            "event": "ingest_log_replayed",
            "log_level": "info",
            "replayed": 0,
            "covered_seq": 0,
            "torn_records": 0,
            "damaged_records": 1,  # the bytes after the header, in which no frame was found
            "corrupt_segments": 1,
        }
    ]


def test_segments_shorter_than_a_header_are_torn_and_removed(tmp_path: Path) -> None:
    (tmp_path / f"{0:020d}.seg").write_bytes(b"")  # killed before the header
    (tmp_path / f"{1:020d}.seg").write_bytes(b"TGI")  # killed within it
    (tmp_path / f"{2:020d}.seg").write_bytes(b"TGIL\x02")
    (tmp_path / f"{3:020d}.seg").write_bytes(segment_of(3, b""))  # a header, no record
    log, replayed, logs = replay_logged(tmp_path)
    assert replayed == []
    assert log.stats.torn_records == 2
    assert [e["event"] for e in logs] == ["ingest_log_replayed"]
    assert sorted(p.name for p in tmp_path.glob("*.seg")) == [f"{3:020d}.seg"]  # the new one
    assert log.stats.next_seq == 3


def test_an_intact_frame_that_is_not_a_reading_is_a_corrupt_record(tmp_path: Path) -> None:
    name = f"{0:020d}.seg"
    frames = records(0, 2) + frame(b"\x05abc", 2) + frame(b"", 3) + records(4, 2, index=4)
    (tmp_path / name).write_bytes(segment_of(0, frames))
    log, replayed, logs = replay_logged(tmp_path)
    assert replayed == [reading(i) for i in (0, 1, 4, 5)]
    assert log.stats.corrupt_records == 2
    assert log.stats.damaged_records == 0
    bad = [e for e in logs if e["event"] == "ingest_log_bad_record"]
    assert [(e["segment"], e["seq"], e["log_level"]) for e in bad] == [
        (name, 2, "error"),
        (name, 3, "error"),
    ]
    assert bad[0]["error"].startswith("bad record body: ")


def test_junk_between_two_records_costs_nothing(tmp_path: Path) -> None:
    for junk in (b"\x07", b"\x07\x07\x07"):
        directory = tmp_path / f"junk-{len(junk)}"
        directory.mkdir()
        frames = records(0, 3) + junk + records(3, 3, index=3)
        (directory / f"{0:020d}.seg").write_bytes(segment_of(0, frames))
        log, replayed, logs = replay_logged(directory)
        assert replayed == [reading(i) for i in range(6)]
        assert log.stats.damaged_records == 0
        damaged = [e for e in logs if e["event"] == "ingest_log_damaged_records"]
        assert [(e["records"], e["bytes"]) for e in damaged] == [(0, len(junk))]


def test_two_damaged_records_in_a_row_cost_those_two(tmp_path: Path) -> None:
    data = bytearray(segment_of(0, records(0, 8)))
    data[SEGMENT_HEADER + 3 * RECORD + 20] ^= 0x04  # record 3's body
    data[SEGMENT_HEADER + 4 * RECORD + 4] ^= 0x04  # record 4's length check: its magic stays
    (tmp_path / f"{0:020d}.seg").write_bytes(bytes(data))
    log, replayed, _ = replay_logged(tmp_path)
    assert replayed == [reading(i) for i in range(8) if i not in (3, 4)]
    assert log.stats.damaged_records == 2


def test_the_last_record_damaged_but_whole_is_a_torn_end(tmp_path: Path) -> None:
    """A power cut can leave a record's length on disk and not all its bytes."""
    data = bytearray(segment_of(0, records(0, 5)))
    data[-1] ^= 0xFF  # its crc32
    (tmp_path / f"{0:020d}.seg").write_bytes(bytes(data))
    log, replayed, _ = replay_logged(tmp_path)
    assert replayed == [reading(i) for i in range(4)]
    assert (log.stats.torn_records, log.stats.damaged_records) == (1, 0)


def test_a_last_record_whose_length_is_damaged_is_damage(tmp_path: Path) -> None:
    """A length that fails its check is not followed: the bytes after the head are damage."""
    data = bytearray(segment_of(0, records(0, 5)))
    data[SEGMENT_HEADER + 4 * RECORD + 3] = 0xFF  # record 4's length, now far past the end
    (tmp_path / f"{0:020d}.seg").write_bytes(bytes(data))
    log, replayed, _ = replay_logged(tmp_path)
    assert replayed == [reading(i) for i in range(4)]
    assert (log.stats.torn_records, log.stats.damaged_records) == (0, 1)


def test_a_few_bytes_of_a_last_record_are_a_torn_end(tmp_path: Path) -> None:
    data = segment_of(0, records(0, 5))[: SEGMENT_HEADER + 4 * RECORD + 3]
    (tmp_path / f"{0:020d}.seg").write_bytes(data)
    log, replayed, _ = replay_logged(tmp_path)
    assert replayed == [reading(i) for i in range(4)]
    assert (log.stats.torn_records, log.stats.damaged_records) == (1, 0)


def test_an_unreadable_segment_is_reported_and_its_name_never_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error reading a segment (injected: no real one can be had here)."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    unreadable = first / f"{10:020d}.seg"
    second.mkdir()
    (second / f"{0:020d}.seg").write_bytes(segment_of(0, records(0, 10)))
    (second / unreadable.name).write_bytes(segment_of(10, records(10, 3)))
    (first / f"{0:020d}.seg").write_bytes(segment_of(0, records(0, 10)))
    unreadable.write_bytes(segment_of(10, records(10, 3)))
    (first / f"{13:020d}.seg").write_bytes(segment_of(13, records(13, 2)))
    kept = unreadable.read_bytes()
    real_read_bytes = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path.name == unreadable.name:
            raise OSError(errno.EIO, "Input/output error")
        return real_read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    log, replayed, logs = replay_logged(first)
    assert replayed == [reading(i) for i in (*range(10), 13, 14)]
    assert logs[0] == {
        "event": "ingest_log_failed",
        "log_level": "error",
        "directory": str(first),
        "operation": f"read {unreadable.name}",
        "error": "Input/output error",
        "errno": errno.EIO,
        "not_logged_since": 0,
    }
    assert log.stats.next_seq == 15
    # The last segment unreadable: the new segment is named past it, never over it.
    again = IngestLog(second, max_bytes=1 << 30, fsync_interval_s=None)
    assert list(again.replay()) == [reading(i) for i in range(10)]
    again.start()
    assert again.stats.next_seq == 11
    assert real_read_bytes(second / unreadable.name) == kept


def test_an_unreadable_checkpoint_replays_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, _ = started(tmp_path)
    for index in range(4):
        log.append(reading(index))
    log.checkpoint_now(queued=2)
    log.append(reading(4))
    log.commit()
    checkpoint = tmp_path / "covered"
    real_read_bytes = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path == checkpoint:
            raise OSError(errno.EIO, "Input/output error")
        return real_read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    again, replayed, logs = replay_logged(tmp_path)
    assert replayed == [reading(i) for i in range(5)]  # from 0: the segment held 0..3
    assert again.stats.covered_seq == 0
    assert [(e["event"], e.get("operation"), e.get("directory")) for e in logs][:1] == [
        ("ingest_log_failed", "read covered", str(tmp_path))
    ]


def test_a_bad_checkpoint_is_set_aside_with_its_reason(tmp_path: Path) -> None:
    aside = SetAsideLog()
    (tmp_path / f"{0:020d}.seg").write_bytes(segment_of(0, records(0, 3)))
    (tmp_path / "covered").write_bytes(b"garbage")
    log, replayed, _ = replay_logged(tmp_path, set_aside=aside)
    assert replayed == [reading(i) for i in range(3)]
    assert log.stats.last_error == "corrupt covered: bad checkpoint"
    files = aside.as_dict()["files"]
    assert [(f["kind"], f["reason"]) for f in files] == [  # type: ignore[attr-defined]
        ("ingest log", "bad checkpoint")
    ]


def checkpoint_bytes(covered: int, *, magic: bytes = b"TGIC", version: int = 1) -> bytes:
    data = struct.pack("<4sBQ", magic, version, covered)
    return data + struct.pack("<I", zlib.crc32(data))


def test_a_checkpoint_is_read_only_if_every_field_agrees() -> None:
    assert parse_checkpoint(checkpoint_bytes(5)) == 5
    assert parse_checkpoint(checkpoint_bytes(MAX_SEQ)) == MAX_SEQ
    assert parse_checkpoint(checkpoint_bytes(MAX_SEQ + 1)) is None
    assert parse_checkpoint(checkpoint_bytes(5, magic=b"TGIX")) is None
    assert parse_checkpoint(checkpoint_bytes(5, version=2)) is None
    bad_crc = bytearray(checkpoint_bytes(5))
    bad_crc[-1] ^= 0x01
    assert parse_checkpoint(bytes(bad_crc)) is None
    assert parse_checkpoint(checkpoint_bytes(5)[:-1]) is None


def test_a_log_can_reach_the_last_sequence_number(tmp_path: Path) -> None:
    write_checkpoint_file(tmp_path, MAX_SEQ)
    log, replayed = started(tmp_path)
    assert replayed == [] and log.stats.next_seq == MAX_SEQ
    log.append(reading(0))
    log.commit()
    assert log.stats.unexpected_files == 0
    _, replayed = started(tmp_path)
    assert replayed == [reading(0)]


def test_what_is_set_aside_from_the_directory_says_why(tmp_path: Path) -> None:
    aside = SetAsideLog()
    directory = tmp_path / "log"
    directory.write_bytes(b"a file")
    IngestLog(directory, max_bytes=1 << 30, fsync_interval_s=None, set_aside=aside).start()
    (directory / "notes.txt").write_text("kept by hand")
    (directory / f"{0:020d}.seg.d").mkdir()
    (directory / f"{1:020d}.seg").mkdir()
    (directory / "99999999999999999999.seg").write_bytes(b"")
    log = IngestLog(directory, max_bytes=1 << 30, fsync_interval_s=None, set_aside=aside)
    log.start()
    files = aside.as_dict()["files"]
    assert sorted((f["kind"], Path(f["path"]).name, f["reason"]) for f in files) == [  # type: ignore[attr-defined]
        ("ingest log", f"{0:020d}.seg.d", "not a file the ingest log writes"),
        ("ingest log", f"{1:020d}.seg", "not a regular file"),
        (
            "ingest log",
            "99999999999999999999.seg",
            "a segment name beyond any sequence number the log writes",
        ),
        ("ingest log", "log", "not a directory"),
        ("ingest log", "notes.txt", "not a file the ingest log writes"),
    ]
    assert log.stats.unexpected_files == 4
    assert log.stats.last_error is not None
    assert log.stats.last_error.startswith("unexpected ")


def test_an_entry_gone_between_listing_and_looking_at_it_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A race no test can time: lstat of the first entry fails as if it had just gone."""
    gone = tmp_path / f"{0:020d}.seg"
    gone.write_bytes(segment_of(0, records(0, 2)))
    (tmp_path / f"{2:020d}.seg").write_bytes(segment_of(2, records(2, 2)))
    real_lstat = Path.lstat

    def lstat(path: Path) -> os.stat_result:
        if path == gone:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        return real_lstat(path)

    monkeypatch.setattr(Path, "lstat", lstat)
    _, replayed, _ = replay_logged(tmp_path)
    assert replayed == [reading(2), reading(3)]


# -- format 1 ends ----------------------------------------------------------------------------


def test_a_clean_old_segment_has_no_torn_end(tmp_path: Path) -> None:
    (tmp_path / f"{0:020d}.seg").write_bytes(old_segment(0, OLD_READINGS))
    log, replayed = started(tmp_path)
    assert replayed == OLD_READINGS
    assert log.stats.torn_records == log.stats.corrupt_segments == 0


@pytest.mark.parametrize(
    "end",
    ["cut 3 bytes short", "whole with a bad crc", "a header and nothing", "3 more bytes"],
)
def test_an_old_segment_ending_in_one_bad_record_is_a_torn_end(tmp_path: Path, end: str) -> None:
    data = bytearray(old_segment(0, OLD_READINGS))
    if end == "cut 3 bytes short":
        data = data[:-3]
    elif end == "whole with a bad crc":
        data[-len(old_body(OLD_READINGS[-1])) - 6] ^= 0x01
    elif end == "a header and nothing":
        data += struct.pack("<IH", 0, 5)  # crc32 0 is the crc32 of the empty body it has
    else:
        data += b"\x07\x07\x07"
    (tmp_path / f"{0:020d}.seg").write_bytes(bytes(data))
    log, replayed = started(tmp_path)
    whole = OLD_READINGS if end in ("a header and nothing", "3 more bytes") else OLD_READINGS[:-1]
    assert replayed == whole
    assert (log.stats.torn_records, log.stats.corrupt_segments) == (1, 0)
    assert log.stats.corrupt_records == 0


def test_an_old_segment_with_data_after_a_bad_record_is_set_aside(tmp_path: Path) -> None:
    data = old_segment(0, OLD_READINGS[:3]) + struct.pack("<IH", 1, 5) + b"X" * 100
    (tmp_path / f"{0:020d}.seg").write_bytes(data)
    log, replayed = started(tmp_path)
    assert replayed == OLD_READINGS[:3]
    assert log.stats.corrupt_segments == 1


def test_each_segment_adds_to_the_counts_of_what_replay_lost(tmp_path: Path) -> None:
    torn = segment_of(0, records(0, 3))[:-5]  # the last record cut short
    damaged = bytearray(segment_of(3, records(3, 3)))
    damaged[SEGMENT_HEADER + RECORD + 20] ^= 0x04
    torn_and_damaged = bytearray(segment_of(6, records(6, 3)))[:-5]
    torn_and_damaged[SEGMENT_HEADER + 20] ^= 0x04
    (tmp_path / f"{0:020d}.seg").write_bytes(torn)
    (tmp_path / f"{3:020d}.seg").write_bytes(bytes(damaged))
    (tmp_path / f"{6:020d}.seg").write_bytes(bytes(torn_and_damaged))
    for first in (9, 10):  # headers that do not match their names: set aside
        (tmp_path / f"{first:020d}.seg").write_bytes(segment_of(first + 100, records(0, 1)))
    log, replayed, _ = replay_logged(tmp_path)
    assert replayed == [reading(i) for i in (0, 1, 3, 5, 7)]
    stats = log.stats.as_dict()
    assert (stats["torn_records"], stats["damaged_records"], stats["corrupt_segments"]) == (2, 2, 2)


def test_a_segment_holding_only_damage_is_reported_in_the_replay_summary(tmp_path: Path) -> None:
    (tmp_path / f"{0:020d}.seg").write_bytes(segment_of(0, b"\x07" * 64))
    log, replayed, logs = replay_logged(tmp_path)
    assert replayed == [] and log.stats.damaged_records == 1
    assert [e["damaged_records"] for e in logs if e["event"] == "ingest_log_replayed"] == [1]


def test_a_segment_the_checkpoint_covers_exactly_is_deleted_at_start(tmp_path: Path) -> None:
    (tmp_path / f"{0:020d}.seg").write_bytes(segment_of(0, records(0, 3)))
    (tmp_path / f"{3:020d}.seg").write_bytes(segment_of(3, records(3, 3)))
    write_checkpoint_file(tmp_path, 3)  # killed before the covered segment was deleted
    log, replayed = started(tmp_path)
    assert replayed == [reading(i) for i in range(3, 6)]
    assert sorted(p.name for p in tmp_path.glob("*.seg")) == [f"{3:020d}.seg", f"{6:020d}.seg"]
    assert log.stats.segments == 2


def test_segments_kept_at_start_are_deleted_by_the_next_checkpoint(tmp_path: Path) -> None:
    (tmp_path / f"{0:020d}.seg").write_bytes(segment_of(0, records(0, 3)))
    write_checkpoint_file(tmp_path, 1)
    log, replayed = started(tmp_path)
    assert replayed == [reading(1), reading(2)]
    log.append(reading(3))
    log.checkpoint_now(queued=0)
    assert [p.name for p in tmp_path.glob("*.seg")] == [f"{4:020d}.seg"]
    log.close()


def test_an_old_segment_ending_in_anything_but_zeros_after_a_bad_record_is_set_aside(
    tmp_path: Path,
) -> None:
    data = old_segment(0, OLD_READINGS[:3]) + b"X" * 30_000  # a declared length within it
    (tmp_path / f"{0:020d}.seg").write_bytes(data)
    log, replayed = started(tmp_path)
    assert replayed == OLD_READINGS[:3]
    assert log.stats.corrupt_segments == 1 and log.stats.torn_records == 0
