"""What damage costs the ingest log (issue 26): a damaged record costs that record only, a
tail of zeros is one torn end, an unexpected file in the directory is set aside and the log
starts, and segments written by the format before framing still replay."""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tesla_gateway.contract.readings import Reading
from tesla_gateway.ingest.ingest_log import IngestLog
from tesla_gateway.ingest.log_record import encode_record

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
