"""Acknowledged readings survive a SIGKILL: an append-only log written before the broker's ack.

Every reading a source hands to the ingest loop goes through :class:`JournaledQueue`, which
appends it to the log as it enters the queue, so the log's order is the queue's order. A source
calls :func:`commit_queued` before it acknowledges what it put (MQTT: once per batch of messages
the connection hands over, just before their PUBACKs; serial: once per chunk read), which is one
``write()`` of the encoded records: from then on they are in the kernel's page cache and a
SIGKILL cannot lose them. ``fsync`` runs
every ``fsync_interval_s`` in a worker thread, for power cuts.

The log is a directory of segments named by the sequence number of their first record. A window
snapshot covers every reading ingested when it was taken: ``next_seq - queue depth``. Once the
snapshots are durable, :meth:`IngestLog.write_checkpoint` records that number (``covered``) and
deletes the segments it covers. At start, :meth:`IngestLog.replay` yields the records from
``covered`` on, which the service feeds through its normal ingest path. A replayed reading that
a snapshot already holds is a duplicate (its open period remembers its timestamp) or late (its
period is closed) in the windows: never counted twice in a mean.

A record is ``crc32 (u32) | length (u16) | body``; the body is the reading: sensor id and source
(each a length byte and UTF-8), the field count and codes (:data:`FIELD_CODES`; the count's
high bit flags a node sequence number), then the timestamp (float64), the sequence number
(uint32, if flagged) and the values (float64). A bad record at the end of a segment is a torn
write (kill or power cut mid-write): skipped and counted. A bad record with data after it
means a corrupt segment: its valid records are replayed, the file is set aside
(``*.corrupt-<time>``) and counted. Nothing read from the log can stop the daemon from starting.
The log is bounded (``max_bytes``): beyond it the oldest segment is dropped, its readings
counted and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog

from tesla_gateway.contract.readings import Reading
from tesla_gateway.set_aside import SetAsideLog

__all__ = [
    "FIELD_CODES",
    "IngestLog",
    "IngestLogCheckpoint",
    "IngestLogStats",
    "JournaledQueue",
    "commit_queued",
    "decode_record",
    "encode_record",
]

_log = structlog.get_logger(__name__)

# Field codes of the record body: append only, never reorder (records on disk name fields by
# their index here).
FIELD_CODES: tuple[str, ...] = ("pm1", "pm2_5", "pm10", "rh", "temp_c")
_CODE_OF = {name: code for code, name in enumerate(FIELD_CODES)}

_SEGMENT_MAGIC = b"TGIL"
_CHECKPOINT_MAGIC = b"TGIC"
_VERSION = 1
_SEGMENT_HEADER = struct.Struct("<4sBQI")  # magic, version, first sequence number, crc32
_CHECKPOINT = struct.Struct("<4sBQI")  # magic, version, covered sequence number, crc32
_RECORD_HEADER = struct.Struct("<IH")  # crc32 of the body, body length
_TIMESTAMP = struct.Struct("<d")
_SEQ = struct.Struct("<I")  # a node's uint32 sequence number
_HAS_SEQ = 0x80  # flag in the field-count byte
_SUFFIX = ".seg"
_CHECKPOINT_NAME = "covered"
_FLUSH_AT = 4096  # readings waiting that force a write even before a commit
_ENCODE_CACHE_BOUND = 65_536  # sensor ids whose encoded prefix is kept


class IngestLogCorruptError(ValueError):
    """A segment or checkpoint holds bytes that are not a valid record (decoding only)."""


@dataclass(slots=True)
class IngestLogStats:
    """Counters for the status file and the stats topic (``ingest_log``)."""

    bytes: int = 0
    segments: int = 0
    replayed: int = 0
    torn_records: int = 0
    corrupt_segments: int = 0
    corrupt_records: int = 0
    dropped_segments: int = 0
    dropped_records: int = 0
    write_failures: int = 0
    fsyncs: int = 0
    covered_seq: int = 0
    next_seq: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "bytes": self.bytes,
            "segments": self.segments,
            "replayed": self.replayed,
            "torn_records": self.torn_records,
            "corrupt_segments": self.corrupt_segments,
            "corrupt_records": self.corrupt_records,
            "dropped_segments": self.dropped_segments,
            "dropped_records": self.dropped_records,
            "write_failures": self.write_failures,
            "fsyncs": self.fsyncs,
            "covered_seq": self.covered_seq,
            "next_seq": self.next_seq,
            "last_error": self.last_error,
        }


@dataclass(slots=True)
class _Segment:
    path: Path
    first_seq: int
    records: int
    size: int


@dataclass(frozen=True, slots=True)
class IngestLogCheckpoint:
    """What a snapshot covers, taken with it on the loop; written once the snapshot is saved."""

    covered_seq: int
    sealed: tuple[Path, ...] = field(default=())  # segments wholly below covered_seq


# -- records ------------------------------------------------------------------------------------


# Readings carry a node's sequence number where the contract has one (looked up once: getattr
# with a default on a slotted class without the field costs an exception per call).
_READING_HAS_SEQ = "seq" in Reading.__dataclass_fields__
_Head = tuple[bytes, int, struct.Struct, int]  # constant body part, its crc32, tail, length


class _RecordEncoder:
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
    _RecordEncoder().encode_into(buffer, reading)
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


# -- the queue ----------------------------------------------------------------------------------


class JournaledQueue(asyncio.Queue[Reading]):
    """The sources' hand-off to the ingest loop: a reading is logged as it enters the queue."""

    def __init__(self, log: IngestLog, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self.log = log

    def put_nowait(self, item: Reading) -> None:
        if self.full():
            raise asyncio.QueueFull  # before logging: the caller will put it again
        self.log.append(item)
        super().put_nowait(item)

    def commit(self) -> None:
        """Write what was put so far (one ``write()``): from here a SIGKILL cannot lose it."""
        self.log.commit()


def commit_queued(queue: asyncio.Queue[Reading]) -> None:
    """Make the readings a source put so far durable before it acknowledges them."""
    if isinstance(queue, JournaledQueue):
        queue.commit()


# -- the log ------------------------------------------------------------------------------------


class IngestLog:
    """The append-only log of readings under ``directory``: replay, append, checkpoint."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        fsync_interval_s: float | None,
        segment_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        set_aside: SetAsideLog | None = None,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(4096, min(8 * 1024 * 1024, max_bytes // 4))
        self.fsync_interval_s = fsync_interval_s
        self.stats = IngestLogStats()
        self._aside = set_aside if set_aside is not None else SetAsideLog(clock=clock)
        self._segments: list[_Segment] = []  # oldest first; the last is the active one once open
        self._fd: int | None = None
        self._pending: list[Reading] = []  # put, not yet encoded and written
        self._next_seq = 0
        self._covered = 0
        self._unsynced: list[int] = []  # sealed segments' descriptors waiting for an fsync
        self._dirty = False
        self._replay_done = False
        self._encoder = _RecordEncoder()

    # -- start: replay, then open a new segment ------------------------------------------------

    def replay(self) -> Iterator[Reading]:
        """Yield the logged readings no snapshot covers, oldest first; then :meth:`start`."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            names = sorted(self.directory.iterdir())
        except OSError as exc:
            self._failed("open", exc)
            self._replay_done = True  # nothing to replay; appends retry the directory
            return
        self._covered = self._read_checkpoint()
        segments: list[tuple[int, Path]] = []
        for path in names:
            if path.suffix == _SUFFIX and path.stem.isdigit():
                segments.append((int(path.stem), path))
        segments.sort()
        end = self._covered
        for first_seq, path in segments:
            try:
                data = path.read_bytes()
            except OSError as exc:
                self._failed(f"read {path.name}", exc)
                end = max(end, first_seq + 1)  # never reuse its name for the new segment
                continue
            records, corrupt = self._scan(path, first_seq, data)
            end = max(end, first_seq + len(records))
            if corrupt:
                self._set_aside(path, corrupt)
            elif first_seq + len(records) <= self._covered or not records:
                with contextlib.suppress(OSError):
                    path.unlink()  # covered, or nothing in it: the checkpoint makes it redundant
            else:
                self._segments.append(_Segment(path, first_seq, len(records), len(data)))
            for seq, body in records:
                if seq < self._covered:
                    continue
                try:
                    reading = decode_record(body)
                except IngestLogCorruptError as exc:
                    self.stats.corrupt_records += 1
                    _log.error("ingest_log_bad_record", segment=path.name, seq=seq, error=str(exc))
                    continue
                self.stats.replayed += 1
                yield reading
        self._next_seq = end
        self._replay_done = True
        if self.stats.replayed or self.stats.torn_records or self.stats.corrupt_segments:
            _log.info(
                "ingest_log_replayed",
                replayed=self.stats.replayed,
                covered_seq=self._covered,
                torn_records=self.stats.torn_records,
                corrupt_segments=self.stats.corrupt_segments,
            )

    def start(self) -> None:
        """Open a fresh segment for appends (after :meth:`replay`; never append to old ones)."""
        if not self._replay_done:
            for _ in self.replay():
                pass
        self._open_segment()
        self._update_sizes()

    def _scan(
        self, path: Path, first_seq: int, data: bytes
    ) -> tuple[list[tuple[int, memoryview]], str | None]:
        """The segment's valid records and, if it is corrupt (not just torn), why."""
        if len(data) < _SEGMENT_HEADER.size:
            if data:
                self.stats.torn_records += 1  # killed while creating it
            return [], None
        magic, version, header_seq, crc = _SEGMENT_HEADER.unpack_from(data)
        if (
            magic != _SEGMENT_MAGIC
            or version != _VERSION
            or crc != zlib.crc32(data[: _SEGMENT_HEADER.size - 4])
            or header_seq != first_seq
        ):
            return [], "bad segment header"
        view = memoryview(data)
        records: list[tuple[int, memoryview]] = []
        position = _SEGMENT_HEADER.size
        size = len(data)
        while position < size:
            start = position
            if size - position < _RECORD_HEADER.size:
                break
            crc, length = _RECORD_HEADER.unpack_from(data, position)
            position += _RECORD_HEADER.size
            body = view[position : position + length]
            if position + length > size or zlib.crc32(body) != crc:
                position = start
                break
            records.append((first_seq + len(records), body))
            position += length
        if position < size:
            rest = data[position:]
            declared_end = position + _RECORD_HEADER.size
            if len(rest) >= _RECORD_HEADER.size:
                declared_end += _RECORD_HEADER.unpack_from(rest)[1]
            if declared_end >= size or not rest.strip(b"\0"):
                self.stats.torn_records += 1
                _log.warning(
                    "ingest_log_torn_record", segment=path.name, offset=position, bytes=len(rest)
                )
            else:
                return records, f"bad record at offset {position} with data after it"
        return records, None

    def _read_checkpoint(self) -> int:
        path = self.directory / _CHECKPOINT_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            self._failed(f"read {path.name}", exc)
            return 0
        if len(data) == _CHECKPOINT.size:
            magic, version, covered, crc = _CHECKPOINT.unpack(data)
            if (
                magic == _CHECKPOINT_MAGIC
                and version == _VERSION
                and crc == zlib.crc32(data[: _CHECKPOINT.size - 4])
            ):
                return int(covered)
        # Replaying everything retained is safe: the windows ignore what they already hold.
        self._set_aside(path, "bad checkpoint")
        return 0

    def _set_aside(self, path: Path, reason: str) -> None:
        self.stats.corrupt_segments += 1
        self.stats.last_error = f"corrupt {path.name}: {reason}"
        self._aside.set_aside(path, kind="ingest log", reason=reason)

    # -- appending (on the event loop) ----------------------------------------------------------

    def append(self, reading: Reading) -> None:
        """Take one reading; :meth:`commit` encodes and writes it."""
        pending = self._pending
        pending.append(reading)  # encoded at commit, in one tight loop: cheaper per reading
        if len(pending) >= _FLUSH_AT:
            self.commit()

    def commit(self) -> None:
        """One ``write()`` of everything buffered; a failed write is counted, never raised."""
        pending = self._pending
        if not pending:
            return
        records = len(pending)
        buffer = bytearray()
        encode_into = self._encoder.encode_into
        for reading in pending:
            encode_into(buffer, reading)
        pending.clear()
        data = bytes(buffer)
        self._next_seq += records
        if self._fd is None:
            self.stats.write_failures += records
            return
        active = self._segments[-1]
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a regular file writes all unless the disk is full
                more = os.write(self._fd, data[written:])
                if more == 0:
                    raise OSError("short write")
                written += more
        except OSError as exc:
            self.stats.write_failures += records
            self._failed("write", exc)
            self._reopen_after_failure()
            return
        active.records += records
        active.size += len(data)
        self.stats.bytes += len(data)
        self._dirty = True
        if active.size >= self.segment_bytes:
            self._rotate()

    def _reopen_after_failure(self) -> None:
        """A partly written record would hide everything after it: start a new segment."""
        self._close_active(sync=False)
        self._open_segment()

    def _open_segment(self) -> None:
        path = self.directory / f"{self._next_seq:020d}{_SUFFIX}"
        header = _SEGMENT_HEADER.pack(_SEGMENT_MAGIC, _VERSION, self._next_seq, 0)
        header = header[:-4] + struct.pack("<I", zlib.crc32(header[:-4]))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        except OSError as exc:
            self._failed(f"open {path.name}", exc)
            self._fd = None
            return
        try:
            os.write(fd, header)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            self._failed(f"write {path.name}", exc)
            self._fd = None
            return
        self._fd = fd
        self._segments.append(_Segment(path, self._next_seq, 0, len(header)))
        self._dirty = True
        self._update_sizes()

    def _close_active(self, *, sync: bool) -> None:
        if self._fd is None:
            return
        if sync and self.fsync_interval_s is not None:
            self._unsynced.append(self._fd)  # the fsync loop syncs and closes it
        else:
            os.close(self._fd)
        self._fd = None

    def _rotate(self) -> None:
        """Seal the active segment and open the next; drop the oldest beyond ``max_bytes``."""
        self.commit()
        self._close_active(sync=True)
        self._open_segment()
        self._enforce_bound()

    def _enforce_bound(self) -> None:
        while len(self._segments) > 1 and self.stats.bytes > self.max_bytes:
            oldest = self._segments.pop(0)
            end = oldest.first_seq + oldest.records
            uncovered = max(0, end - max(oldest.first_seq, self._covered))
            self.stats.dropped_segments += 1
            self.stats.dropped_records += uncovered
            _log.error(
                "ingest_log_segment_dropped",
                segment=oldest.path.name,
                readings=uncovered,
                max_bytes=self.max_bytes,
            )
            with contextlib.suppress(OSError):
                oldest.path.unlink()
            self._update_sizes()

    def _update_sizes(self) -> None:
        self.stats.bytes = sum(segment.size for segment in self._segments)
        self.stats.segments = len(self._segments)
        self.stats.next_seq = self._next_seq
        self.stats.covered_seq = self._covered

    # -- checkpoints ----------------------------------------------------------------------------

    def mark(self, queued: int) -> IngestLogCheckpoint:
        """What a snapshot taken now covers (``queued``: readings still waiting for ingest).

        Call on the loop together with the snapshot; seals the active segment so that it can be
        deleted at a later checkpoint.
        """
        self.commit()
        covered = self._next_seq - queued
        if self._fd is None and self._replay_done:
            self._open_segment()  # retry after a failure (disk full, read-only)
        elif self._segments[-1].records:
            self._rotate()
        sealed = tuple(
            segment.path
            for segment in self._segments[:-1]
            if segment.first_seq + segment.records <= covered
        )
        return IngestLogCheckpoint(covered_seq=covered, sealed=sealed)

    def write_checkpoint(self, checkpoint: IngestLogCheckpoint) -> bool:
        """Record ``covered`` durably and delete the segments it covers (call in a thread)."""
        path = self.directory / _CHECKPOINT_NAME
        data = _CHECKPOINT.pack(_CHECKPOINT_MAGIC, _VERSION, checkpoint.covered_seq, 0)
        data = data[:-4] + struct.pack("<I", zlib.crc32(data[:-4]))
        temp = path.with_name(f".{path.name}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            temp.replace(path)
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            self._failed("checkpoint", exc)
            return False
        for sealed in checkpoint.sealed:
            with contextlib.suppress(OSError):
                sealed.unlink()
        return True

    def checkpointed(self, checkpoint: IngestLogCheckpoint) -> None:
        """Bookkeeping on the loop after :meth:`write_checkpoint` succeeded."""
        self._covered = max(self._covered, checkpoint.covered_seq)
        gone = set(checkpoint.sealed)
        self._segments = [s for s in self._segments if s.path not in gone]
        self._update_sizes()

    def checkpoint_now(self, queued: int) -> None:
        """Mark, write and account in one go (shutdown, with the windows just saved)."""
        if not self._replay_done:
            return  # never started (e.g. no model loaded): the log is left as it was
        checkpoint = self.mark(queued)
        if self.write_checkpoint(checkpoint):
            self.checkpointed(checkpoint)

    # -- durability against power cuts ------------------------------------------------------------

    async def run(self) -> None:
        """Every ``fsync_interval_s``: write what is buffered and fsync what was written."""
        if self.fsync_interval_s is None:
            return
        while True:
            await asyncio.sleep(self.fsync_interval_s)
            await self.sync()

    async def sync(self) -> None:
        """Write what is buffered, then fsync every segment written since the last sync."""
        if self._fd is None and self._replay_done:
            self._open_segment()  # retry after a failure (disk full, read-only)
        self.commit()
        if not self._dirty and not self._unsynced:
            return
        closing, self._unsynced = self._unsynced, []
        descriptors = list(closing)
        if self._fd is not None:
            descriptors.append(os.dup(self._fd))  # rotation may close the original meanwhile
        self._dirty = False
        try:
            # The worker closes them too: a cancelled wait must not close what it still syncs.
            await asyncio.to_thread(_fsync_and_close, descriptors)
        except OSError as exc:
            self._dirty = True
            self._failed("fsync", exc)
        else:
            self.stats.fsyncs += 1

    def close(self) -> None:
        """Write, fsync and close (shutdown); an empty active segment is removed."""
        self.commit()
        for fd in self._unsynced:
            with contextlib.suppress(OSError):
                os.fsync(fd)
                os.close(fd)
        self._unsynced = []
        if self._fd is None:
            return
        active = self._segments[-1]
        with contextlib.suppress(OSError):
            os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        if active.records == 0:
            with contextlib.suppress(OSError):
                active.path.unlink()
            self._segments.pop()
        self._update_sizes()

    def _failed(self, what: str, exc: OSError) -> None:
        self.stats.last_error = f"{what}: {exc.strerror or exc}"
        _log.error(
            "ingest_log_failed",
            directory=str(self.directory),
            operation=what,
            error=exc.strerror or str(exc),
            errno=exc.errno,
        )


def _fsync_and_close(descriptors: list[int]) -> None:
    """fsync each descriptor, close them all; the first fsync error is raised after."""
    error: OSError | None = None
    for fd in descriptors:
        try:
            os.fsync(fd)
        except OSError as exc:
            error = error or exc
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
    if error is not None:
        raise error
