"""The ingest log's checkpoint: the file that says which readings the snapshots already hold.

``covered`` holds ``magic | version | covered sequence number | crc32``; it is replaced
atomically (a temporary file, fsync, rename, fsync of the directory) once the snapshots it
goes with are durable, and only then are the segments it covers deleted.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from tesla_gateway.ingest.log_segments import MAX_SEQ

__all__ = [
    "CHECKPOINT_NAME",
    "CHECKPOINT_TEMP_NAME",
    "IngestLogCheckpoint",
    "parse_checkpoint",
    "write_checkpoint_file",
]

CHECKPOINT_NAME = "covered"
CHECKPOINT_TEMP_NAME = f".{CHECKPOINT_NAME}.tmp"  # replaces it atomically
_CHECKPOINT_MAGIC = b"TGIC"
_VERSION = 1
_CHECKPOINT = struct.Struct("<4sBQI")  # magic, version, covered sequence number, crc32


@dataclass(frozen=True, slots=True)
class IngestLogCheckpoint:
    """What a snapshot covers, taken with it on the loop; written once the snapshot is saved."""

    covered_seq: int
    sealed: tuple[Path, ...] = field(default=())  # segments wholly below covered_seq


def parse_checkpoint(data: bytes) -> int | None:
    """The covered sequence number in a checkpoint file's bytes; None if they are not one."""
    if len(data) != _CHECKPOINT.size:
        return None
    magic, version, covered, crc = _CHECKPOINT.unpack(data)
    if (
        magic != _CHECKPOINT_MAGIC
        or version != _VERSION
        or crc != zlib.crc32(data[: _CHECKPOINT.size - 4])
        or covered > MAX_SEQ
    ):
        return None
    return int(covered)


def write_checkpoint_file(directory: Path, covered_seq: int) -> None:
    """Replace the checkpoint durably (call in a thread); raises :class:`OSError`."""
    path = directory / CHECKPOINT_NAME
    data = _CHECKPOINT.pack(_CHECKPOINT_MAGIC, _VERSION, covered_seq, 0)
    data = data[:-4] + struct.pack("<I", zlib.crc32(data[:-4]))
    temp = directory / CHECKPOINT_TEMP_NAME
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    temp.replace(path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
