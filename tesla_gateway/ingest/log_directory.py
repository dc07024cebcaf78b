"""What the ingest log's directory may hold; anything else is set aside, never fatal.

The log writes only segments (``<20 digits>.seg``, first sequence numbers up to
:data:`~tesla_gateway.ingest.log_segments.MAX_SEQ`), its checkpoint and the checkpoint's
temporary file, all regular files. Anything else found at start (a file where the directory
should be, a directory or a stray file inside it, a name no sequence number fits) would make
every start fail, or every write, checkpoint or segment name after it: it is moved aside
(``*.corrupt-<time>``, :class:`~tesla_gateway.set_aside.SetAsideLog`), logged and counted
(``unexpected_files``), and the log starts without it. What was set aside before stays as
it is.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from tesla_gateway.ingest.log_checkpoint import CHECKPOINT_NAME, CHECKPOINT_TEMP_NAME
from tesla_gateway.ingest.log_segments import MAX_SEQ
from tesla_gateway.ingest.log_stats import IngestLogStats, report_failure
from tesla_gateway.set_aside import SetAsideLog

__all__ = ["open_directory"]

_SEGMENT_NAME = re.compile(r"([0-9]{20})\.seg")
_SET_ASIDE_MARK = ".corrupt-"


def open_directory(
    directory: Path, stats: IngestLogStats, aside: SetAsideLog
) -> list[tuple[int, Path]] | None:
    """The segments in ``directory`` (created if missing) by first sequence number, once the
    unexpected entries are set aside; None if the directory cannot be opened (reported)."""
    try:
        if not directory.is_dir() and (directory.exists() or directory.is_symlink()):
            _set_aside(directory, "not a directory", stats, aside)
        directory.mkdir(parents=True, exist_ok=True)
        entries = sorted(directory.iterdir())
    except OSError as exc:
        report_failure(stats, directory, "open", exc)
        return None
    segments: list[tuple[int, Path]] = []
    for path in entries:
        if _SET_ASIDE_MARK in path.name:
            continue
        try:
            regular = stat.S_ISREG(path.lstat().st_mode)
        except OSError:
            continue  # gone meanwhile
        match = _SEGMENT_NAME.fullmatch(path.name)
        if match is not None and int(match[1]) > MAX_SEQ:
            reason = "a segment name beyond any sequence number the log writes"
        elif match is None and path.name not in {CHECKPOINT_NAME, CHECKPOINT_TEMP_NAME}:
            reason = "not a file the ingest log writes"
        elif not regular:
            reason = "not a regular file"
        else:
            if match is not None:
                segments.append((int(match[1]), path))
            continue
        _set_aside(path, reason, stats, aside)
    segments.sort()
    return segments


def _set_aside(path: Path, reason: str, stats: IngestLogStats, aside: SetAsideLog) -> None:
    stats.unexpected_files += 1
    stats.last_error = f"unexpected {path.name}: {reason}"
    aside.set_aside(path, kind="ingest log", reason=reason)
