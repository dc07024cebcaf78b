"""Replay at start: the logged readings no checkpoint covers, oldest first.

Damage costs what it hit (:mod:`~tesla_gateway.ingest.log_scan`): a torn end (kill or power
cut mid-write, zeros left by a power cut) is skipped and counted once per segment; a damaged
record is skipped and counted, the records after it are replayed, and the segment stays in
the log until a checkpoint covers it. A segment that cannot be read as a whole (a header that
does not match its name, no frame found past a damaged header, a format 1 segment damaged
before its end, whose valid records before the damage are replayed) is set aside
(``*.corrupt-<time>``) and counted; so is a checkpoint that cannot be read, and anything in
the directory the log did not write (:mod:`~tesla_gateway.ingest.log_directory`). Nothing
read from the log can stop the daemon from starting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import structlog

from tesla_gateway.contract.readings import Reading
from tesla_gateway.ingest.log_checkpoint import CHECKPOINT_NAME, parse_checkpoint
from tesla_gateway.ingest.log_directory import open_directory
from tesla_gateway.ingest.log_record import IngestLogCorruptError, decode_record
from tesla_gateway.ingest.log_scan import SegmentScan, scan_framed, scan_unframed
from tesla_gateway.ingest.log_segments import (
    FORMAT_FRAMED,
    FORMAT_UNFRAMED,
    HEADER_SIZE,
    Segment,
    SegmentFiles,
    read_header,
)
from tesla_gateway.ingest.log_stats import IngestLogStats, report_failure
from tesla_gateway.set_aside import SetAsideLog

__all__ = ["replay_segments"]

_log = structlog.get_logger(__name__)


def replay_segments(files: SegmentFiles, aside: SetAsideLog) -> Iterator[Reading]:
    """Yield the readings logged under ``files.directory`` from the checkpoint on.

    Sets ``files.covered``, ``files.next_seq`` and the segments kept (those holding readings
    no checkpoint covers yet); deletes the others, sets the unreadable ones aside.
    """
    directory, stats = files.directory, files.stats
    segments = open_directory(directory, stats, aside)
    if segments is None:
        return  # nothing to replay; appends retry the directory
    covered = files.covered = _read_checkpoint(directory, stats, aside)
    end = covered
    for first_seq, path in segments:
        try:
            data = path.read_bytes()
        except OSError as exc:
            report_failure(stats, directory, f"read {path.name}", exc)
            end = max(end, first_seq + 1)  # never reuse its name for the new segment
            continue
        scan = _scan(path, first_seq, data, stats, aside)
        end = max(end, first_seq + scan.end)
        if scan.corrupt is None and scan.records and first_seq + scan.end > covered:
            files.segments.append(Segment(path, first_seq, scan.end, len(data)))
        elif scan.corrupt is None:
            with contextlib.suppress(OSError):
                path.unlink()  # covered, or nothing in it: the checkpoint makes it redundant
        for index, body in scan.records:
            seq = first_seq + index
            if seq < covered:
                continue
            try:
                reading = decode_record(body)
            except IngestLogCorruptError as exc:
                stats.corrupt_records += 1
                _log.error("ingest_log_bad_record", segment=path.name, seq=seq, error=str(exc))
                continue
            stats.replayed += 1
            yield reading
    files.next_seq = end
    if stats.replayed or stats.torn_records or stats.damaged_records or stats.corrupt_segments:
        _log.info(
            "ingest_log_replayed",
            replayed=stats.replayed,
            covered_seq=covered,
            torn_records=stats.torn_records,
            damaged_records=stats.damaged_records,
            corrupt_segments=stats.corrupt_segments,
        )


def _scan(
    path: Path, first_seq: int, data: bytes, stats: IngestLogStats, aside: SetAsideLog
) -> SegmentScan:
    """The segment's records, with what it lost counted and logged; set aside if unreadable."""
    if len(data) < HEADER_SIZE:
        if data:
            stats.torn_records += 1  # killed while creating it
        return SegmentScan()
    header = read_header(data)
    if header is None:
        scan = scan_framed(data, HEADER_SIZE)  # frames carry their own checks
        scan.corrupt = None if scan.records else "bad segment header"
        stats.last_error = f"damaged header in {path.name}"
        _log.error("ingest_log_damaged_header", segment=path.name, records=len(scan.records))
    elif header == (FORMAT_FRAMED, first_seq):
        scan = scan_framed(data, HEADER_SIZE)
    elif header == (FORMAT_UNFRAMED, first_seq):
        scan = scan_unframed(data, HEADER_SIZE)
    else:
        scan = SegmentScan(corrupt=f"header (format, first seq) {header} does not match its name")
    if scan.torn_at is not None:
        stats.torn_records += 1
        _log.warning(
            "ingest_log_torn_record",
            segment=path.name,
            offset=scan.torn_at,
            bytes=len(data) - scan.torn_at,
        )
    if scan.damaged_at is not None:
        stats.damaged_records += scan.damaged_records
        stats.last_error = f"damaged records in {path.name}"
        _log.error(
            "ingest_log_damaged_records",
            segment=path.name,
            records=scan.damaged_records,
            bytes=scan.damaged_bytes,
            offset=scan.damaged_at,
        )
    if scan.corrupt is not None:
        _set_aside(path, scan.corrupt, stats, aside)
    return scan


def _read_checkpoint(directory: Path, stats: IngestLogStats, aside: SetAsideLog) -> int:
    path = directory / CHECKPOINT_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        report_failure(stats, directory, f"read {path.name}", exc)
        return 0
    covered = parse_checkpoint(data)
    if covered is None:
        # Replaying everything retained is safe: the windows ignore what they already hold.
        _set_aside(path, "bad checkpoint", stats, aside)
        return 0
    return covered


def _set_aside(path: Path, reason: str, stats: IngestLogStats, aside: SetAsideLog) -> None:
    stats.corrupt_segments += 1
    stats.last_error = f"corrupt {path.name}: {reason}"
    aside.set_aside(path, kind="ingest log", reason=reason)
