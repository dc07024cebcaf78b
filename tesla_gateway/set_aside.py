"""State files that could not be read at start: moved aside, logged and counted, never fatal.

A daemon that exits on a corrupt file under its state directory crash-loops: systemd restarts
it, it meets the same file and exits again. Every reader of a state file (window snapshots,
the outbox) therefore hands a file it cannot decode to :class:`SetAsideLog`, which renames it
to ``<name>.corrupt-<UTC time>`` (kept for a post-mortem, never read again), logs
``state_file_set_aside`` with the reason, and reports it on the stats topic under
``state.set_aside``. The caller then starts without it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

__all__ = ["SetAsideLog", "SetAsideRecord"]

_KEPT_RECORDS = 20  # the newest set-asides listed on stats (the count covers all)

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SetAsideRecord:
    """One file moved aside: where it was, where it went (None if the move failed), why."""

    kind: str
    path: str
    moved_to: str | None
    reason: str
    at: float

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "path": self.path,
            "moved_to": self.moved_to,
            "reason": self.reason,
            "at": self.at,
        }


class SetAsideLog:
    """Moves unreadable state files aside and keeps the count and the newest records."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.count = 0
        self.move_failures = 0
        self._records: deque[SetAsideRecord] = deque(maxlen=_KEPT_RECORDS)

    def set_aside(
        self, path: Path, *, kind: str, reason: str, companions: Sequence[str] = ()
    ) -> Path | None:
        """Rename ``path`` (and ``path`` + each suffix in ``companions``, if present) aside.

        Returns the new path of ``path``, or None if it could not be moved (a read-only
        directory: logged and counted; the caller must then not use the file either).
        """
        now = self._clock()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        aside = path.with_name(f"{path.name}.corrupt-{stamp}")
        serial = 1
        while aside.exists():  # two set-asides within a second keep both files
            aside = path.with_name(f"{path.name}.corrupt-{stamp}-{serial}")
            serial += 1
        moved_to: Path | None = aside
        try:
            path.replace(aside)
            for suffix in companions:
                companion = path.with_name(path.name + suffix)
                if companion.exists():
                    companion.replace(aside.with_name(aside.name + suffix))
        except OSError as exc:
            self.move_failures += 1
            moved_to = None
            reason = f"{reason}; could not move it aside: {exc.strerror or exc}"
        self.count += 1
        record = SetAsideRecord(
            kind=kind,
            path=str(path),
            moved_to=None if moved_to is None else str(moved_to),
            reason=reason,
            at=now,
        )
        self._records.append(record)
        _log.error(
            "state_file_set_aside",
            kind=kind,
            path=record.path,
            moved_to=record.moved_to,
            reason=reason,
        )
        return moved_to

    def as_dict(self) -> dict[str, object]:
        return {
            "count": self.count,
            "move_failures": self.move_failures,
            "files": [record.as_dict() for record in self._records],
        }
