"""Finding the records in a segment's bytes, and telling a torn end from damage.

Format 2 (framed, :mod:`~tesla_gateway.ingest.log_record`): a frame is taken only if its magic,
its length check and its crc32 agree. Past a bad one, the scan looks for the next good frame
by its magic; the index gap says how many records the damaged stretch held: a damaged record
costs that record only. Format 1 (before framing) has no way to find the next record: the
scan stops at the first bad one.

Where no good record follows, the rest is the segment's end: a torn end if it holds no more
than one record cut short (a kill mid-write) followed by nothing but zeros (what a file system
can leave after a power cut: the size was written, the data was not); otherwise damage.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from tesla_gateway.ingest.log_record import (
    FRAME_CRC,
    FRAME_HEAD,
    FRAME_INDEX,
    FRAME_MAGIC,
    length_check,
)

__all__ = ["SegmentScan", "scan_framed", "scan_unframed"]

_UNFRAMED_HEADER = struct.Struct("<IH")  # format 1: crc32 of the body, body length
_FRAME_OVERHEAD = FRAME_HEAD.size + FRAME_CRC.size
_Frame = tuple[int, memoryview, int]  # index, body, end


@dataclass(slots=True)
class SegmentScan:
    """What a segment holds: its good records and what was lost on the way."""

    records: list[tuple[int, memoryview]] = field(default_factory=list)  # (index, body)
    end: int = 0  # one past the index of the last good record
    torn_at: int | None = None  # offset of a torn end
    damaged_records: int = 0  # records lost to damage before the end (at least one a stretch)
    damaged_bytes: int = 0
    damaged_at: int | None = None  # offset of the first damaged stretch
    corrupt: str | None = None  # format 1: why the rest of the segment cannot be read


def scan_framed(data: bytes, start: int) -> SegmentScan:
    """The good frames of ``data`` from ``start`` on, skipping damaged ones."""
    scan = SegmentScan()
    view = memoryview(data)
    size = len(data)
    position = start
    expected = 0  # the index the next record should have
    while position < size:
        frame = _frame_at(data, view, position)
        if frame is not None and frame[0] >= expected:
            index, body, end = frame
            scan.damaged_records += index - expected  # > 0 just after a damaged stretch
            scan.records.append((index, body))
            expected = index + 1
            position = end
            continue
        resume = _next_frame(data, view, position + 1, expected)
        if resume is None:
            if _is_torn_end(data, position):
                scan.torn_at = position
            else:
                _damaged(scan, position, size, records=1)
            break
        _damaged(scan, position, resume, records=0)  # counted by the index gap at resume
        position = resume
    scan.end = expected
    return scan


def _damaged(scan: SegmentScan, start: int, end: int, *, records: int) -> None:
    scan.damaged_records += records
    scan.damaged_bytes += end - start
    if scan.damaged_at is None:
        scan.damaged_at = start


def _frame_at(data: bytes, view: memoryview, position: int) -> _Frame | None:
    """The frame at ``position`` if it is a good one."""
    if len(data) - position < _FRAME_OVERHEAD:
        return None
    magic, length, check = FRAME_HEAD.unpack_from(data, position)
    if magic != FRAME_MAGIC or check != length_check(length) or length < FRAME_INDEX.size:
        return None
    body_at = position + FRAME_HEAD.size
    end = body_at + length + FRAME_CRC.size
    if end > len(data):
        return None
    body = view[body_at : body_at + length]
    if zlib.crc32(body) != FRAME_CRC.unpack_from(data, body_at + length)[0]:
        return None
    (index,) = FRAME_INDEX.unpack_from(body, length - FRAME_INDEX.size)
    return index, body[: length - FRAME_INDEX.size], end


def _next_frame(data: bytes, view: memoryview, position: int, expected: int) -> int | None:
    """Where the next good frame at or after ``position`` starts."""
    candidate = data.find(FRAME_MAGIC, position)
    while candidate != -1:
        frame = _frame_at(data, view, candidate)
        if frame is not None and frame[0] >= expected:
            return candidate
        candidate = data.find(FRAME_MAGIC, candidate + 1)
    return None


def _is_torn_end(data: bytes, position: int) -> bool:
    """Whether the bytes from ``position`` on are one record cut short, then only zeros."""
    size = len(data)
    if size - position < FRAME_HEAD.size:
        return True
    magic, length, check = FRAME_HEAD.unpack_from(data, position)
    record_end = position + FRAME_HEAD.size  # a damaged head: only the head may be left
    if magic == FRAME_MAGIC and check == length_check(length):
        record_end = position + _FRAME_OVERHEAD + length
    return len(data.rstrip(b"\0")) <= record_end


def scan_unframed(data: bytes, start: int) -> SegmentScan:
    """The records of a format 1 segment up to the first bad one."""
    scan = SegmentScan()
    view = memoryview(data)
    size = len(data)
    position = start
    while size - position >= _UNFRAMED_HEADER.size:
        crc, length = _UNFRAMED_HEADER.unpack_from(data, position)
        body_at = position + _UNFRAMED_HEADER.size
        body = view[body_at : body_at + length]
        # No body is empty: six zero bytes (crc32 of nothing is 0) are a power cut's zeros.
        if length == 0 or body_at + length > size or zlib.crc32(body) != crc:
            break
        scan.records.append((len(scan.records), body))
        position = body_at + length
    scan.end = len(scan.records)
    if position < size:
        declared_end = position + _UNFRAMED_HEADER.size
        if size - position >= _UNFRAMED_HEADER.size:
            declared_end += _UNFRAMED_HEADER.unpack_from(data, position)[1]
        if declared_end >= size or not data[position:].strip(b"\0"):
            scan.torn_at = position
        else:
            scan.corrupt = f"bad record at offset {position} with data after it"
    return scan
