"""An in-memory copy of the whole outbox while it is small: the delivery path reads it instead
of the file.

In steady state the outbox is a short queue: each tick appends its messages and the delivery
window sends and removes them within moments. Reading them back from SQLite (a ``SELECT`` and a
row check per message) and counting the table (``COUNT(*)``, a scan) cost more than encoding
them. The mirror holds exactly the rows of the table, in id order, from the moment the queue is
empty until it outgrows ``capacity`` (a broker outage) or the file is replaced; then the outbox
reads the file again until the queue next empties. The file stays the durable copy throughout.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["QueueMirror"]


class _Identified(Protocol):
    @property
    def id(self) -> int: ...


_M = TypeVar("_M", bound=_Identified)
_by_id = operator.attrgetter("id")
_COMPACT_AT = 4096  # consumed entries kept before the list is compacted


class QueueMirror(Generic[_M]):
    """The table's rows in id order, or nothing (``active`` False) when it cannot be sure."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._rows: list[_M] = []
        self._head = 0  # rows before it were removed (compacted lazily)
        self.active = False

    def __len__(self) -> int:
        return len(self._rows) - self._head

    def start(self) -> None:
        """The table is empty now: mirror it from here on."""
        self._rows, self._head, self.active = [], 0, True

    def stop(self) -> None:
        """The table changed in a way not mirrored (a reset, a switch, an overflow)."""
        self._rows, self._head, self.active = [], 0, False

    def appended(self, rows: Sequence[_M]) -> None:
        """Rows inserted at the end of the table (ids above every mirrored one)."""
        if not self.active:
            return
        if len(self) + len(rows) > self.capacity:
            # (Also whenever the outbox drops its oldest: its bound is at least the capacity.)
            self.stop()
            return
        self._rows.extend(rows)

    def removed(self, ids: Sequence[int]) -> None:
        """Rows deleted by id (acknowledged); usually the oldest, in order."""
        if not self.active or not ids:
            return
        head, rows = self._head, self._rows
        end = head + len(ids)
        if end <= len(rows) and all(
            rows[i].id == wanted for i, wanted in zip(range(head, end), ids, strict=True)
        ):
            self._advance(len(ids))
            return
        gone = set(ids)
        self._rows = [row for row in rows[head:] if row.id not in gone]
        self._head = 0

    def after(self, after_id: int, limit: int) -> list[_M]:
        """Up to ``limit`` rows with ids above ``after_id``, in order."""
        start = bisect.bisect_right(self._rows, after_id, lo=self._head, key=_by_id)
        return self._rows[start : start + limit]

    def _advance(self, count: int) -> None:
        self._head += count
        if self._head >= _COMPACT_AT or self._head == len(self._rows):
            del self._rows[: self._head]
            self._head = 0
