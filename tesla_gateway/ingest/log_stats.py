"""What the ingest log counts, for the status file and the stats topic, and how it reports a
failed file operation (counted and logged, never raised: the daemon keeps calibrating)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

__all__ = ["REPEAT_LOG_S", "IngestLogStats", "report_failure"]

REPEAT_LOG_S = 60.0  # a failure that repeats is logged at most this often

_log = structlog.get_logger(__name__)


@dataclass(slots=True)
class IngestLogStats:
    """Counters for the status file and the stats topic (``ingest_log``)."""

    bytes: int = 0
    segments: int = 0
    replayed: int = 0
    torn_records: int = 0  # a segment's last record cut short (a kill or power cut mid-write)
    damaged_records: int = 0  # lost to damage inside a segment; the records after it replay
    corrupt_segments: int = 0  # set aside whole: a bad header, or format 1 damaged inside
    corrupt_records: int = 0  # intact (crc32) but not a reading
    dropped_segments: int = 0
    dropped_records: int = 0
    unexpected_files: int = 0  # found in the directory, not written by the log: set aside
    write_failures: int = 0
    fsyncs: int = 0
    covered_seq: int = 0
    next_seq: int = 0
    last_error: str | None = None
    # Not reported: when a failure was last logged, and how many repeats were not since.
    failure_logged_at: float | None = None
    failures_not_logged: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "bytes": self.bytes,
            "segments": self.segments,
            "replayed": self.replayed,
            "torn_records": self.torn_records,
            "damaged_records": self.damaged_records,
            "corrupt_segments": self.corrupt_segments,
            "corrupt_records": self.corrupt_records,
            "dropped_segments": self.dropped_segments,
            "dropped_records": self.dropped_records,
            "unexpected_files": self.unexpected_files,
            "write_failures": self.write_failures,
            "fsyncs": self.fsyncs,
            "covered_seq": self.covered_seq,
            "next_seq": self.next_seq,
            "last_error": self.last_error,
        }


def report_failure(
    stats: IngestLogStats,
    directory: Path,
    what: str,
    exc: OSError,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Keep the error for the stats topic and log it: at once, then at most once a minute with
    how many repeats were not logged (a full disk fails every write: 39 lines in 6 s before)."""
    stats.last_error = f"{what}: {exc.strerror or exc}"
    now = clock()
    if stats.failure_logged_at is not None and now - stats.failure_logged_at < REPEAT_LOG_S:
        stats.failures_not_logged += 1
        return
    _log.error(
        "ingest_log_failed",
        directory=str(directory),
        operation=what,
        error=exc.strerror or str(exc),
        errno=exc.errno,
        not_logged_since=stats.failures_not_logged,
    )
    stats.failure_logged_at = now
    stats.failures_not_logged = 0
