"""Replay at start: the logged readings no checkpoint covers, oldest first.

A bad record at the end of a segment is a torn write (kill or power cut mid-write): skipped
and counted. A bad record with data after it means a corrupt segment: its valid records are
replayed, the file is set aside (``*.corrupt-<time>``) and counted; so is a checkpoint that
cannot be read. Nothing read from the log can stop the daemon from starting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import structlog

from tesla_gateway.contract.readings import Reading
from tesla_gateway.ingest.log_checkpoint import CHECKPOINT_NAME, parse_checkpoint
from tesla_gateway.ingest.log_record import (
    IngestLogCorruptError,
    declared_end,
    decode_record,
    scan_records,
)
from tesla_gateway.ingest.log_segments import (
    HEADER_SIZE,
    SUFFIX,
    Segment,
    SegmentFiles,
    header_matches,
)
from tesla_gateway.ingest.log_stats import IngestLogStats, report_failure
from tesla_gateway.set_aside import SetAsideLog

__all__ = ["replay_segments"]

_log = structlog.get_logger(__name__)


def replay_segments(files: SegmentFiles, aside: SetAsideLog) -> Iterator[Reading]:
    """Yield the readings logged under ``files.directory`` from the checkpoint on.

    Sets ``files.covered``, ``files.next_seq`` and the segments kept (those holding readings
    no checkpoint covers yet); deletes the others, sets the corrupt ones aside.
    """
    directory, stats = files.directory, files.stats
    try:
        directory.mkdir(parents=True, exist_ok=True)
        names = sorted(directory.iterdir())
    except OSError as exc:
        report_failure(stats, directory, "open", exc)
        return  # nothing to replay; appends retry the directory
    covered = files.covered = _read_checkpoint(directory, stats, aside)
    segments: list[tuple[int, Path]] = []
    for path in names:
        if path.suffix == SUFFIX and path.stem.isdigit():
            segments.append((int(path.stem), path))
    segments.sort()
    end = covered
    for first_seq, path in segments:
        try:
            data = path.read_bytes()
        except OSError as exc:
            report_failure(stats, directory, f"read {path.name}", exc)
            end = max(end, first_seq + 1)  # never reuse its name for the new segment
            continue
        bodies, corrupt = _scan(path, first_seq, data, stats)
        end = max(end, first_seq + len(bodies))
        if corrupt:
            _set_aside(path, corrupt, stats, aside)
        elif first_seq + len(bodies) <= covered or not bodies:
            with contextlib.suppress(OSError):
                path.unlink()  # covered, or nothing in it: the checkpoint makes it redundant
        else:
            files.segments.append(Segment(path, first_seq, len(bodies), len(data)))
        for seq, body in enumerate(bodies, start=first_seq):
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
    if stats.replayed or stats.torn_records or stats.corrupt_segments:
        _log.info(
            "ingest_log_replayed",
            replayed=stats.replayed,
            covered_seq=covered,
            torn_records=stats.torn_records,
            corrupt_segments=stats.corrupt_segments,
        )


def _scan(
    path: Path, first_seq: int, data: bytes, stats: IngestLogStats
) -> tuple[list[memoryview], str | None]:
    """The segment's valid record bodies and, if it is corrupt (not just torn), why."""
    if len(data) < HEADER_SIZE:
        if data:
            stats.torn_records += 1  # killed while creating it
        return [], None
    if not header_matches(data, first_seq):
        return [], "bad segment header"
    bodies, position = scan_records(data, HEADER_SIZE)
    size = len(data)
    if position < size:
        rest = data[position:]
        if declared_end(data, position) >= size or not rest.strip(b"\0"):
            stats.torn_records += 1
            _log.warning(
                "ingest_log_torn_record", segment=path.name, offset=position, bytes=len(rest)
            )
        else:
            return bodies, f"bad record at offset {position} with data after it"
    return bodies, None


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
