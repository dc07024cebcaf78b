"""The append-only dataset of (raw, reference) pairs that ``training retrain`` reads.

Layout (one directory per feature under the state directory)::

    <state_dir>/pairs/<feature>/pairs-YYYYMMDD.csv      first file of a UTC day
    <state_dir>/pairs/<feature>/pairs-YYYYMMDD-1.csv    next file of that day, once the first
    <state_dir>/pairs/<feature>/pairs-YYYYMMDD-2.csv    reached max_file_bytes, and so on

Each file starts with the header line :data:`HEADER`; then one row per (sensor, period):

* ``timestamp``: period start, ISO-8601 UTC with ``Z`` (``2020-01-10T12:34:00Z``); the file's
  date is this timestamp's UTC date;
* ``sensor_id``: the low-cost sensor;
* ``raw``: the period mean of its readings; ``reference``: the period mean of the reference;
* ``calibrated``: the published calibration, empty when the window was not valid;
* ``model_version``: integer, empty without a model;
* ``rh``, ``temp_c``: period means of the sensor's covariates, empty when it sent none;
* ``quality``: the published period's quality values joined by ``;`` (``ok``, ``stuck``,
  ``warming_up;gap``): retraining drops a frozen sensor's run by it, even when the reference's
  sparse periods leave fewer rows of the run than training's own rule needs.

A file of another header (e.g. one written before ``quality`` existed) is never appended to:
the writer takes the day's next part, so every file holds one shape of row.

Each row is flushed to the OS as it is written (a crash loses at most the row being written; a
torn last line is cut off when the file is next opened) and a file is fsynced when it is closed
(rotation, shutdown). A write failure (disk full, read-only) loses the rows, is counted and
logged, and never raises: calibration goes on.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import structlog
from pydantic import BaseModel, ConfigDict, Field

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.readings import SENSOR_ID_PATTERN

__all__ = [
    "HEADER",
    "PAIRS_DIRNAME",
    "QUALITY_SEPARATOR",
    "PairRow",
    "PairsConfig",
    "PairsWriter",
    "format_row",
    "pairs_file_name",
    "pairs_file_part",
]

PAIRS_DIRNAME = "pairs"
HEADER = "timestamp,sensor_id,raw,reference,calibrated,model_version,rh,temp_c,quality"
QUALITY_SEPARATOR = ";"
_HEADER_LINE = (HEADER + "\n").encode("ascii")
_TAIL_BYTES = 4096  # longer than any row: enough to find a torn last line
_PART = re.compile(r"^pairs-(\d{8})(?:-(\d+))?\.csv$")

_log = structlog.get_logger(__name__)


class PairsConfig(BaseModel):
    """``[pairs]``: how reference pairs are formed and recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_file_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="A day's file rotates to pairs-YYYYMMDD-<n>.csv before exceeding this size.",
    )
    reference_grace_s: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Wall-clock fallback: a reference period is closed at most this long after its end "
            "(or its last reading) when no later reference reading arrives."
        ),
    )
    max_pending_periods: int = Field(
        default=1440,
        ge=1,
        description=(
            "Periods a sensor's closed period waits for the reference (and reference means are "
            "kept for late sensor periods) before it is dropped unpaired."
        ),
    )


@dataclass(frozen=True, slots=True)
class PairRow:
    """One row of the dataset."""

    period_start: float  # Unix seconds, UTC
    sensor_id: str
    raw: float
    reference: float
    calibrated: float | None
    model_version: int | None
    rh: float | None
    temp_c: float | None
    quality: tuple[Quality, ...] = ()  # of the published period


def _number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return ""
    return repr(round(float(value), 4))


def _utc(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


def format_row(row: PairRow) -> str:
    """The CSV line of a row (with its newline); sensor ids never need quoting."""
    if not SENSOR_ID_PATTERN.fullmatch(row.sensor_id):
        raise ValueError(f"sensor id {row.sensor_id!r} must match {SENSOR_ID_PATTERN.pattern}")
    fields = (
        _utc(row.period_start).strftime("%Y-%m-%dT%H:%M:%SZ"),
        row.sensor_id,
        _number(row.raw),
        _number(row.reference),
        _number(row.calibrated),
        "" if row.model_version is None else str(int(row.model_version)),
        _number(row.rh),
        _number(row.temp_c),
        QUALITY_SEPARATOR.join(Quality(value).value for value in row.quality),
    )
    return ",".join(fields) + "\n"


def pairs_file_name(day: str, part: int) -> str:
    """``pairs-YYYYMMDD.csv`` for part 0, ``pairs-YYYYMMDD-<part>.csv`` after that."""
    return f"pairs-{day}.csv" if part == 0 else f"pairs-{day}-{part}.csv"


def pairs_file_part(name: str) -> tuple[str, int] | None:
    """``(day, part)`` of a name :func:`pairs_file_name` made; None for any other file."""
    match = _PART.match(name)
    return None if match is None else (match.group(1), int(match.group(2) or 0))


class PairsWriter:
    """Appends rows to one feature's directory, rotating by UTC day and by size."""

    def __init__(self, directory: Path, *, max_file_bytes: int) -> None:
        self.directory = directory
        self.max_file_bytes = max_file_bytes
        self._handle: BinaryIO | None = None
        self._day: str | None = None
        self._part = 0
        self._size = 0
        self.rows_written = 0
        self.rows_failed = 0
        self.files_opened = 0
        self.last_error: str | None = None
        self._failing = False

    @property
    def current_file(self) -> Path | None:
        if self._handle is None or self._day is None:
            return None
        return self.directory / pairs_file_name(self._day, self._part)

    def stats(self) -> dict[str, object]:
        current = self.current_file
        return {
            "rows_written": self.rows_written,
            "rows_failed": self.rows_failed,
            "files_opened": self.files_opened,
            "last_error": self.last_error,
            "file": None if current is None else current.name,
        }

    def append(self, rows: Sequence[PairRow]) -> int:
        """Write rows in order; return how many were written (failures are counted, not raised)."""
        written = 0
        for row in rows:
            line = format_row(row).encode("ascii")
            try:
                self._write(_utc(row.period_start).strftime("%Y%m%d"), line)
            except OSError as exc:
                self.rows_failed += 1
                self.last_error = f"{exc.strerror or exc}"
                if not self._failing:
                    _log.error(
                        "pairs_write_failed",
                        directory=str(self.directory),
                        error=self.last_error,
                        detail="pairs are lost until the directory is writable again",
                    )
                self._failing = True
                self._abandon()
                continue
            if self._failing:
                _log.info("pairs_write_recovered", directory=str(self.directory))
                self._failing = False
            written += 1
            self.rows_written += 1
        return written

    def close(self) -> None:
        """Flush and fsync the open file (at shutdown); failures are counted like writes."""
        try:
            self._close_file()
        except OSError as exc:
            self.last_error = f"{exc.strerror or exc}"
            _log.error("pairs_close_failed", directory=str(self.directory), error=self.last_error)
            self._abandon()

    # -- files ------------------------------------------------------------------------------

    def _write(self, day: str, line: bytes) -> None:
        if self._handle is None or day != self._day:
            self._close_file()
            self._open_latest(day)
        elif self._size > len(_HEADER_LINE) and self._size + len(line) > self.max_file_bytes:
            self._close_file()
            self._open_part(day, self._part + 1)
        handle = self._handle
        assert handle is not None
        handle.write(line)
        handle.flush()  # per row: a crash loses at most the line being written
        self._size += len(line)

    def _open_latest(self, day: str) -> None:
        """Append to the day's newest file (a restart, or rows of an earlier day arriving)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        parts = [0]
        for path in self.directory.iterdir():
            found = pairs_file_part(path.name)
            if found is not None and found[0] == day:
                parts.append(found[1])
        self._open_part(day, max(parts))

    def _open_part(self, day: str, part: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            path = self.directory / pairs_file_name(day, part)
            created = not path.exists()
            handle = path.open("r+b" if not created else "w+b")
            try:
                size = _prepare(handle)
            except BaseException:
                handle.close()
                raise
            if size is None or size >= self.max_file_bytes:
                # Another format (an older header too: a file holds one shape of row), or
                # already full: take the next part.
                handle.close()
                part += 1
                continue
            break
        if created:
            _fsync_directory(self.directory)
        self._handle, self._day, self._part = handle, day, part
        self._size = size
        self.files_opened += 1

    def _close_file(self) -> None:
        handle, self._handle = self._handle, None
        if handle is None:
            return
        try:
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            handle.close()

    def _abandon(self) -> None:
        """Drop the handle after a failure; the next row reopens (and repairs) the file."""
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()


def _prepare(handle: BinaryIO) -> int | None:
    """Ready an opened file for appending and return its size, or None if it is not ours.

    A new or empty file (or one torn inside its header) gets the header; a torn last row (a
    crash mid-write) is cut off. Only the head and the tail of the file are read.
    """
    size = handle.seek(0, os.SEEK_END)
    handle.seek(0)
    head = handle.read(len(_HEADER_LINE))
    if size <= len(_HEADER_LINE) and _HEADER_LINE.startswith(head) and head != _HEADER_LINE:
        handle.seek(0)
        handle.truncate()
        handle.write(_HEADER_LINE)
        handle.flush()
        return len(_HEADER_LINE)
    if head != _HEADER_LINE:
        return None
    tail_start = max(len(_HEADER_LINE), size - _TAIL_BYTES)
    handle.seek(tail_start)
    tail = handle.read()
    if tail and not tail.endswith(b"\n"):
        size = tail_start + tail.rfind(b"\n") + 1  # rfind -1: back to the header's end
        handle.seek(size)
        handle.truncate()
    handle.seek(size)
    return size


def _fsync_directory(directory: Path) -> None:
    """Make a new file's directory entry durable (best effort: not every platform allows it)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
