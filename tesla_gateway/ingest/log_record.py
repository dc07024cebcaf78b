"""One ingest log record: a reading encoded as bytes, decoded back, and framed in a segment.

A record is ``crc32 (u32) | length (u16) | body``; the body is the reading: sensor id and source
(each a length byte and UTF-8), the field count and codes (:data:`FIELD_CODES`; the count's
high bit flags a node sequence number), then the timestamp (float64), the sequence number
(uint32, if flagged) and the values (float64).
"""

from __future__ import annotations

import struct
import zlib
from types import MappingProxyType
from typing import Any

from tesla_gateway.contract.readings import Reading

__all__ = [
    "FIELD_CODES",
    "IngestLogCorruptError",
    "RecordEncoder",
    "declared_end",
    "decode_record",
    "encode_record",
    "scan_records",
]

# Field codes of the record body: append only, never reorder (records on disk name fields by
# their index here).
FIELD_CODES: tuple[str, ...] = ("pm1", "pm2_5", "pm10", "rh", "temp_c")
_CODE_OF = {name: code for code, name in enumerate(FIELD_CODES)}

_RECORD_HEADER = struct.Struct("<IH")  # crc32 of the body, body length
_TIMESTAMP = struct.Struct("<d")
_SEQ = struct.Struct("<I")  # a node's uint32 sequence number
_HAS_SEQ = 0x80  # flag in the field-count byte
_ENCODE_CACHE_BOUND = 65_536  # sensor ids whose encoded prefix is kept

# Readings carry a node's sequence number where the contract has one (looked up once: getattr
# with a default on a slotted class without the field costs an exception per call).
_READING_HAS_SEQ = "seq" in Reading.__dataclass_fields__
_Head = tuple[bytes, int, struct.Struct, int]  # constant body part, its crc32, tail, length


class IngestLogCorruptError(ValueError):
    """A segment or checkpoint holds bytes that are not a valid record (decoding only)."""


class RecordEncoder:
    """Encodes records, keeping per (sensor, source, fields) the constant part of the body.

    Called once per reading on the event loop, so it does little: one dict lookup, one
    ``struct.pack`` of the timestamp and values, one crc32 continued from the cached part's.
    """

    def __init__(self) -> None:
        self._heads: dict[tuple[str, ...], _Head] = {}  # (sensor, source, *fields)
        self._heads_with_seq: dict[tuple[str, ...], _Head] = {}

    def encode_into(self, buffer: bytearray, reading: Reading) -> None:
        values = reading.values
        seq: int | None = getattr(reading, "seq") if _READING_HAS_SEQ else None  # noqa: B009
        heads = self._heads if seq is None else self._heads_with_seq
        key = (reading.sensor_id, reading.source, *values)
        cached = heads.get(key)
        if cached is None:
            cached = self._head(heads, key, has_seq=seq is not None)
        head, head_crc, tail, length = cached
        if seq is None:
            packed = tail.pack(reading.timestamp, *values.values())
        else:
            packed = tail.pack(reading.timestamp, seq, *values.values())
        buffer += _RECORD_HEADER.pack(zlib.crc32(packed, head_crc), length)
        buffer += head
        buffer += packed

    def _head(
        self, heads: dict[tuple[str, ...], _Head], key: tuple[str, ...], *, has_seq: bool
    ) -> _Head:
        sensor_id, source, *fields = key
        sensor = sensor_id.encode("utf-8")
        source_bytes = source.encode("utf-8")[:255]
        head = b"".join(
            (
                bytes((len(sensor),)),
                sensor,
                bytes((len(source_bytes),)),
                source_bytes,
                bytes(
                    (
                        len(fields) | (_HAS_SEQ if has_seq else 0),
                        *(_CODE_OF[name] for name in fields),
                    )
                ),
            )
        )
        tail = struct.Struct(f"<d{'I' if has_seq else ''}{len(fields)}d")
        cached = (head, zlib.crc32(head), tail, len(head) + tail.size)
        if len(heads) >= _ENCODE_CACHE_BOUND:
            heads.clear()
        heads[key] = cached
        return cached


def encode_record(reading: Reading) -> bytes:
    """One record: header (crc32, length) and body."""
    buffer = bytearray()
    RecordEncoder().encode_into(buffer, reading)
    return bytes(buffer)


def decode_record(body: bytes | memoryview) -> Reading:
    """The reading in a record body; :class:`IngestLogCorruptError` if it is not one."""
    try:
        sensor_length = body[0]
        sensor = bytes(body[1 : 1 + sensor_length]).decode("utf-8")
        position = 1 + sensor_length
        source_length = body[position]
        source = bytes(body[position + 1 : position + 1 + source_length]).decode("utf-8")
        position += 1 + source_length
        has_seq = bool(body[position] & _HAS_SEQ)
        count = body[position] & ~_HAS_SEQ
        names = [FIELD_CODES[code] for code in body[position + 1 : position + 1 + count]]
        position += 1 + count
        (timestamp,) = _TIMESTAMP.unpack_from(body, position)
        position += _TIMESTAMP.size
        seq: int | None = None
        if has_seq:
            (seq,) = _SEQ.unpack_from(body, position)
            position += _SEQ.size
        values = struct.unpack_from(f"<{count}d", body, position)
        position += 8 * count
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise IngestLogCorruptError(f"bad record body: {exc}") from exc
    if position != len(body) or not sensor or len(names) != count:
        raise IngestLogCorruptError("record body length does not match its contents")
    fields: dict[str, Any] = {
        "sensor_id": sensor,
        "timestamp": timestamp,
        "values": MappingProxyType(dict(zip(names, values, strict=True))),
        "source": source,
    }
    if seq is not None:
        fields["seq"] = seq  # readings carry a node's seq where the contract has it
    return Reading(**fields)


def scan_records(data: bytes, start: int) -> tuple[list[memoryview], int]:
    """The bodies of the valid records from ``start`` on, and where the first bad one begins
    (``len(data)`` if none is bad)."""
    view = memoryview(data)
    bodies: list[memoryview] = []
    position = start
    size = len(data)
    while position < size:
        if size - position < _RECORD_HEADER.size:
            break
        crc, length = _RECORD_HEADER.unpack_from(data, position)
        body = view[position + _RECORD_HEADER.size : position + _RECORD_HEADER.size + length]
        if position + _RECORD_HEADER.size + length > size or zlib.crc32(body) != crc:
            break
        bodies.append(body)
        position += _RECORD_HEADER.size + length
    return bodies, position


def declared_end(data: bytes, position: int) -> int:
    """Where the record starting at ``position`` says it ends (its header may be damaged)."""
    end = position + _RECORD_HEADER.size
    if len(data) - position >= _RECORD_HEADER.size:
        end += _RECORD_HEADER.unpack_from(data, position)[1]
    return end
