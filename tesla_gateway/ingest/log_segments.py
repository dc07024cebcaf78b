"""The ingest log's segment files: naming, header, appends, rotation, the size bound, fsync.

The log is a directory of segments named by the sequence number of their first record
(``<20 digits>.seg``), each a header (``magic | format | first sequence number | crc32``)
and records (:mod:`~tesla_gateway.ingest.log_record`). Appends go to the newest (active)
segment, one ``write()`` per commit; it is sealed and a new one opened once it holds
``segment_bytes``, at every snapshot, and after a failed write (a new segment starts clean).
Beyond ``max_bytes`` the oldest segment is dropped, its readings counted and logged. Sealed
segments are fsynced and closed by the fsync loop, in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import structlog

from tesla_gateway.ingest.log_stats import IngestLogStats, report_failure

__all__ = [
    "FORMAT_FRAMED",
    "FORMAT_UNFRAMED",
    "HEADER_SIZE",
    "MAX_SEQ",
    "SUFFIX",
    "Segment",
    "SegmentFiles",
    "read_header",
    "segment_name",
]

_log = structlog.get_logger(__name__)

SUFFIX = ".seg"
# Beyond any count a gateway reaches (a million readings a second for 285 years), exact as a
# float in JSON, and far enough below 2**64 that no sum of a segment's records overflows.
MAX_SEQ = 1 << 53
FORMAT_UNFRAMED = 1  # records before framing: still replayed, never written
FORMAT_FRAMED = 2  # what is written
_SEGMENT_MAGIC = b"TGIL"
_SEGMENT_HEADER = struct.Struct("<4sBQI")  # magic, format, first sequence number, crc32
HEADER_SIZE = _SEGMENT_HEADER.size


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SUFFIX}"


def _segment_header(first_seq: int) -> bytes:
    header = _SEGMENT_HEADER.pack(_SEGMENT_MAGIC, FORMAT_FRAMED, first_seq, 0)
    return header[:-4] + struct.pack("<I", zlib.crc32(header[:-4]))


def read_header(data: bytes) -> tuple[int, int] | None:
    """The format and first sequence number in a segment's header; None if it is damaged."""
    magic, version, first_seq, crc = _SEGMENT_HEADER.unpack_from(data)
    if magic != _SEGMENT_MAGIC or crc != zlib.crc32(data[: HEADER_SIZE - 4]):
        return None
    return int(version), int(first_seq)


@dataclass(slots=True)
class Segment:
    """One segment file kept in the log; ``first_seq + records`` is where its records end."""

    path: Path
    first_seq: int
    records: int  # one past the index of its last record
    size: int


class SegmentFiles:
    """The segments under ``directory``, oldest first, and the sequence numbers they hold.

    ``next_seq`` is the number the next appended record gets; ``covered`` the first one no
    checkpoint covers yet. Failures are counted and logged, never raised.
    """

    def __init__(
        self,
        directory: Path,
        stats: IngestLogStats,
        *,
        max_bytes: int,
        segment_bytes: int,
        fsync_interval_s: float | None,
    ) -> None:
        self.directory = directory
        self.stats = stats
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync_interval_s = fsync_interval_s
        self.segments: list[Segment] = []  # oldest first; the last is the active one once open
        self.next_seq = 0
        self.next_index = 0  # the index of the next record in the active segment
        self.covered = 0
        self._fd: int | None = None
        self._unsynced: list[int] = []  # sealed segments' descriptors waiting for an fsync
        self._dirty = False

    @property
    def is_open(self) -> bool:
        """Whether there is an active segment to append to."""
        return self._fd is not None

    def append(self, data: bytes, records: int) -> None:
        """Append encoded records (one ``write()``); a failed write is counted, never raised."""
        self.next_seq += records
        self.next_index += records
        if self._fd is None:
            self.stats.write_failures += records
            return
        active = self.segments[-1]
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
            self.rotate()

    def _reopen_after_failure(self) -> None:
        """Whatever part of the records reached the file, the next ones start a new segment."""
        self._close_active(sync=False)
        self.open()

    def open(self) -> None:
        """Open a new active segment starting at ``next_seq``."""
        path = self.directory / segment_name(self.next_seq)
        header = _segment_header(self.next_seq)
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
        self.next_index = 0
        self.segments.append(Segment(path, self.next_seq, 0, len(header)))
        self._dirty = True
        self.update_stats()

    def _close_active(self, *, sync: bool) -> None:
        if self._fd is None:
            return
        if sync and self.fsync_interval_s is not None:
            self._unsynced.append(self._fd)  # the fsync loop syncs and closes it
        else:
            os.close(self._fd)
        self._fd = None

    def rotate(self) -> None:
        """Seal the active segment and open the next; drop the oldest beyond ``max_bytes``."""
        self._close_active(sync=True)
        self.open()
        self._enforce_bound()

    def _enforce_bound(self) -> None:
        while len(self.segments) > 1 and self.stats.bytes > self.max_bytes:
            oldest = self.segments.pop(0)
            end = oldest.first_seq + oldest.records
            uncovered = max(0, end - max(oldest.first_seq, self.covered))
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
            self.update_stats()

    def sealed_below(self, covered: int) -> tuple[Path, ...]:
        """The sealed segments whose records all lie below ``covered``."""
        return tuple(
            segment.path
            for segment in self.segments[:-1]
            if segment.first_seq + segment.records <= covered
        )

    def forget(self, deleted: Collection[Path], covered: int) -> None:
        """Bookkeeping after a checkpoint covering ``covered`` deleted ``deleted``."""
        self.covered = max(self.covered, covered)
        self.segments = [s for s in self.segments if s.path not in deleted]
        self.update_stats()

    def update_stats(self) -> None:
        self.stats.bytes = sum(segment.size for segment in self.segments)
        self.stats.segments = len(self.segments)
        self.stats.next_seq = self.next_seq
        self.stats.covered_seq = self.covered

    async def sync(self) -> None:
        """fsync every segment written since the last sync, in a worker thread."""
        if not self._dirty and not self._unsynced:
            return
        active: list[int] = []
        if self._fd is not None:
            try:  # a copy: rotation may close the original while the worker syncs
                active.append(os.dup(self._fd))
            except OSError as exc:  # out of descriptors (EMFILE): try again at the next sync
                self._failed("fsync", exc)
                return
        descriptors, self._unsynced = [*self._unsynced, *active], []
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
        """fsync and close every descriptor (shutdown); an empty active segment is removed."""
        for fd in self._unsynced:
            with contextlib.suppress(OSError):
                os.fsync(fd)
                os.close(fd)
        self._unsynced = []
        if self._fd is None:
            return
        active = self.segments[-1]
        with contextlib.suppress(OSError):
            os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        if active.records == 0:
            with contextlib.suppress(OSError):
                active.path.unlink()
            self.segments.pop()
        self.update_stats()

    def _failed(self, what: str, exc: OSError) -> None:
        report_failure(self.stats, self.directory, what, exc)


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
