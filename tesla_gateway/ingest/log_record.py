"""One ingest log record: a reading encoded as bytes, framed so that replay can find it.

The body is the reading: sensor id and source (each a length byte and UTF-8), the field count
and codes (:data:`FIELD_CODES`; the count's high bit flags a node sequence number), then the
timestamp (float64), the sequence number (uint32, if flagged) and the values (float64).

A frame (segment format 2) is ``magic (2) | length (u16) | check (u16) | body | index (u32) |
crc32 (u32)``: ``check`` guards the magic and the length, so a damaged length is never
followed; ``index`` is the record's place in its segment (its sequence number minus the
segment's first), so replay knows how many records a damaged stretch held; the crc32 covers
the body and the index. ``length`` counts the body and the index. Replay finds the next good
frame past a damaged one by its magic (:mod:`~tesla_gateway.ingest.log_scan`).

Segment format 1 framed a record as ``crc32 (u32) | length (u16) | body``: still read, never
written.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Iterable
from types import MappingProxyType
from typing import Any

from tesla_gateway.contract.readings import Reading

__all__ = [
    "FIELD_CODES",
    "FRAME_CRC",
    "FRAME_HEAD",
    "FRAME_INDEX",
    "FRAME_MAGIC",
    "IngestLogCorruptError",
    "RecordEncoder",
    "decode_record",
    "encode_record",
    "length_check",
]

# Field codes of the record body: append only, never reorder (records on disk name fields by
# their index here).
FIELD_CODES: tuple[str, ...] = ("pm1", "pm2_5", "pm10", "rh", "temp_c")
_CODE_OF = {name: code for code, name in enumerate(FIELD_CODES)}

FRAME_MAGIC = b"\xfe\x5a"  # 0xfe is never in UTF-8 text, nor in zeros left by a power cut
FRAME_HEAD = struct.Struct("<2sHH")  # magic, length of body and index, check of the two
FRAME_INDEX = struct.Struct("<I")  # the record's index in its segment
FRAME_CRC = struct.Struct("<I")  # crc32 of body and index
_TIMESTAMP = struct.Struct("<d")
_SEQ = struct.Struct("<I")  # a node's uint32 sequence number
_HAS_SEQ = 0x80  # flag in the field-count byte
_ENCODE_CACHE_BOUND = 65_536  # sensor ids whose encoded prefix is kept

# constant frame part (head, check, body prefix), crc32 of the body prefix, the packer of the rest
_Head = tuple[bytes, int, struct.Struct]


class IngestLogCorruptError(ValueError):
    """A segment or checkpoint holds bytes that are not a valid record (decoding only)."""


@functools.lru_cache(maxsize=4096)  # replay checks every frame; records have few lengths
def length_check(length: int) -> int:
    """The check a frame head carries for its magic and ``length``."""
    return zlib.crc32(FRAME_MAGIC + length.to_bytes(2, "little")) & 0xFFFF


class RecordEncoder:
    """Encodes frames, keeping per (sensor, source, fields) the constant part of the frame.

    Runs on the event loop for every reading, so a record costs little: one dict lookup, one
    ``struct.pack`` of the timestamp, values and index, one crc32 continued from the cached
    part's, one pack of the crc.
    """

    def __init__(self) -> None:
        self._heads: dict[tuple[str, ...], _Head] = {}  # (sensor, source, *fields)
        self._heads_with_seq: dict[tuple[str, ...], _Head] = {}

    def encode(self, readings: Iterable[Reading], first_index: int) -> bytes:
        """The frames of ``readings``, indexed from ``first_index`` on."""
        buffer = bytearray()
        heads, heads_with_seq = self._heads, self._heads_with_seq
        crc32, pack_crc = zlib.crc32, FRAME_CRC.pack
        index = first_index
        for reading in readings:
            values = reading.values
            seq = reading.seq
            key = (reading.sensor_id, reading.source, *values)
            cached = (heads if seq is None else heads_with_seq).get(key)
            if cached is None:
                cached = self._head(key, has_seq=seq is not None)
            head, head_crc, tail = cached
            if seq is None:
                packed = tail.pack(reading.timestamp, *values.values(), index)
            else:
                packed = tail.pack(reading.timestamp, seq, *values.values(), index)
            buffer += head
            buffer += packed
            buffer += pack_crc(crc32(packed, head_crc))
            index += 1
        return bytes(buffer)

    def _head(self, key: tuple[str, ...], *, has_seq: bool) -> _Head:
        sensor_id, source, *fields = key
        sensor = sensor_id.encode("utf-8")
        source_bytes = source.encode("utf-8")[:255]
        prefix = b"".join(
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
        tail = struct.Struct(f"<d{'I' if has_seq else ''}{len(fields)}dI")  # ..., index
        length = len(prefix) + tail.size
        frame_head = FRAME_HEAD.pack(FRAME_MAGIC, length, length_check(length))
        cached = (frame_head + prefix, zlib.crc32(prefix), tail)
        heads = self._heads_with_seq if has_seq else self._heads
        if len(heads) >= _ENCODE_CACHE_BOUND:
            heads.clear()
        heads[key] = cached
        return cached


def encode_record(reading: Reading, index: int = 0) -> bytes:
    """One framed record."""
    return RecordEncoder().encode((reading,), index)


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
        fields["seq"] = seq
    return Reading(**fields)
