"""A persisted, bounded FIFO of MQTT messages waiting for the broker's acknowledgement.

SQLite in WAL mode under the state directory: an append is one small transaction, a restart
finds the queue where it was, and a message leaves the queue only after the broker acknowledged
it (at-least-once). When the bound is reached the oldest messages are dropped and counted: the
newest calibrations are the ones worth keeping. Calls are synchronous and sub-millisecond (a
commit does not fsync), so the event loop calls them directly. The row count is kept by every
write, and a short queue is also held in memory (:mod:`tesla_gateway.publish.outbox_mirror`): in
steady state neither counting nor sending reads the file.

Reading it is total (a damaged file never stops the daemon):

* a file SQLite calls corrupt, at open or at any later read or write, is set aside and a fresh
  queue started (:mod:`tesla_gateway.publish.outbox_storage`);
* a row of the wrong types or with text that is not UTF-8 is dropped and counted, never
  returned (:mod:`tesla_gateway.publish.outbox_messages`);
* a file that cannot be opened or written because of the disk (full, read-only, permissions)
  is left alone: with ``memory_fallback`` the queue lives in memory (same bound, counted,
  reported as ``storage: memory``), starting with the messages the file holds, and moves back
  to the file once the disk takes it and the memory queue has drained.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

import structlog

from tesla_gateway.publish.errors import OutboxError
from tesla_gateway.publish.outbox_messages import OutboxMessage, QueuedMessage, stored_message
from tesla_gateway.publish.outbox_mirror import QueueMirror
from tesla_gateway.publish.outbox_storage import (
    READ_ERRORS,
    OutboxStorage,
    Transaction,
    describe,
    is_disk_error,
)
from tesla_gateway.set_aside import SetAsideLog

__all__ = ["Outbox"]

_IDS_PER_STATEMENT = 500  # below SQLite's oldest limit of 999 bound parameters
_MIRROR_CAPACITY = 16_384  # messages the in-memory copy holds at most (a few MB)
_T = TypeVar("_T")

_log = structlog.get_logger(__name__)


class Outbox:
    """Bounded persistent FIFO; open with :meth:`open` or as a context manager."""

    def __init__(
        self, storage: OutboxStorage, max_messages: int, *, mirror_capacity: int = _MIRROR_CAPACITY
    ) -> None:
        self._storage = storage
        self.path = storage.path
        self.max_messages = max_messages
        self._rewind = False  # the next peek_after starts at the front (after a switch)
        self._max_id = 0  # the highest id handed out so far
        self._bad_ids: set[int] = set()  # invalid rows not yet deleted
        self.invalid_rows_dropped = 0
        self.resets = 0
        self.read_failures = 0
        self.memory_messages = 0  # messages queued while the queue was in memory
        self._last_len = 0
        self._last_dropped_total = 0
        # Rows in the table (None: not known, count them); kept by every write, so appends and
        # len() need no COUNT(*) (a scan of the table).
        self._count: int | None = None
        self._mirror: QueueMirror[QueuedMessage] = QueueMirror(min(max_messages, mirror_capacity))

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        max_messages: int,
        set_aside: SetAsideLog | None = None,
        memory_fallback: bool = False,
        clock: Callable[[], float] = time.monotonic,
        mirror_capacity: int = _MIRROR_CAPACITY,
    ) -> Self:
        """Open (or create) the queue; a corrupt file is set aside and a new queue started.

        A disk that refuses the file raises :class:`OutboxError`, or with ``memory_fallback``
        starts the queue in memory (see the module doc). While the queue is short, up to
        ``mirror_capacity`` messages are also held in memory for delivery to read
        (:mod:`tesla_gateway.publish.outbox_mirror`; 0: always read the file).
        """
        if max_messages < 1:
            raise OutboxError(f"outbox bound must be at least 1, got {max_messages}")
        storage = OutboxStorage.open(
            path,
            set_aside=set_aside if set_aside is not None else SetAsideLog(),
            memory_fallback=memory_fallback,
            clock=clock,
        )
        return cls(storage, max_messages, mirror_capacity=mirror_capacity)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._storage.close()

    @property
    def in_memory(self) -> bool:
        return self._storage.in_memory

    def stats(self) -> dict[str, object]:
        """How the queue is kept: ``storage`` disk or memory, and what went wrong."""
        return {
            "storage": "memory" if self.in_memory else "disk",
            "disk_error": self._storage.disk_error,
            "memory_periods": self._storage.memory_periods,
            "memory_messages": self.memory_messages,
            "taken_from_file": self._storage.taken_from_file,
            "invalid_rows_dropped": self.invalid_rows_dropped,
            "resets": self.resets,
            "read_failures": self.read_failures,
        }

    # -- writing ----------------------------------------------------------------------------

    def append(self, messages: Sequence[OutboxMessage]) -> int:
        """Queue messages in order; return how many old ones were dropped to stay in bound."""
        if not messages:
            return 0
        self.back_to_disk()
        now = time.time()
        rows = [(m.topic, m.payload, m.qos, int(m.retain), now) for m in messages]

        def insert(db: sqlite3.Connection) -> int:
            before = self._known_count(db)
            if before == 0 and not self._mirror.active:
                self._mirror.start()  # an empty queue: mirror it from here on
            with Transaction(db):
                db.executemany(
                    "INSERT INTO outbox (topic, payload, qos, retain, queued_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
                (last,) = db.execute("SELECT last_insert_rowid()").fetchone()
                count = before + len(rows)
                excess = max(0, count - self.max_messages)
                if excess:
                    db.execute(
                        "DELETE FROM outbox WHERE id IN "
                        "(SELECT id FROM outbox ORDER BY id LIMIT ?)",
                        (excess,),
                    )
                    db.execute(
                        "INSERT INTO counters (name, value) VALUES ('dropped', ?) "
                        "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                        (excess,),
                    )
            self._count = count - excess
            self._max_id = max(self._max_id, int(last))
            # One writer in one transaction: AUTOINCREMENT gave the rows consecutive ids.
            first = int(last) - len(messages) + 1
            self._mirror.appended(
                [
                    QueuedMessage(first + i, m.topic, m.payload, m.qos, m.retain)
                    for i, m in enumerate(messages)
                ]
                if self._mirror.active
                else []
            )
            return excess

        dropped = self._write("append", insert)
        if self.in_memory:
            self.memory_messages += len(messages)
        return dropped

    def remove(self, ids: Sequence[int]) -> None:
        """Forget messages the broker acknowledged."""
        wanted = [*ids, *self._bad_ids]
        if not wanted:
            return

        def delete(db: sqlite3.Connection) -> None:
            deleted = 0
            with Transaction(db):
                if _consecutive(wanted):  # the usual acknowledgement: the oldest, in order
                    cursor = db.execute(
                        "DELETE FROM outbox WHERE id BETWEEN ? AND ?", (wanted[0], wanted[-1])
                    )
                    deleted += cursor.rowcount
                else:
                    for start in range(0, len(wanted), _IDS_PER_STATEMENT):  # one per chunk
                        chunk = wanted[start : start + _IDS_PER_STATEMENT]
                        marks = ",".join("?" * len(chunk))
                        cursor = db.execute(
                            f"DELETE FROM outbox WHERE id IN ({marks})",  # noqa: S608
                            chunk,
                        )
                        deleted += cursor.rowcount
            if self._count is not None:
                self._count = max(0, self._count - deleted)

        self._write("remove", delete)
        self._mirror.removed(wanted)
        self._bad_ids.clear()

    def _write(self, what: str, operation: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run a write; a corrupt file is set aside and the write retried on a fresh queue, a
        file the disk refuses to write (with ``memory_fallback``) on the memory queue."""
        try:
            return operation(self._storage.db)
        except READ_ERRORS as exc:
            self._forget_shape()
            if not is_disk_error(exc):
                self._reset(f"{what}: {describe(exc)}")
            # The disk refuses the file: in memory, with the file's messages (ids kept).
            elif not self._storage.leave_disk(f"cannot write to outbox: {describe(exc)}"):
                raise OutboxError(f"cannot write to outbox {self.path}: {exc}") from exc
        try:
            return operation(self._storage.db)
        except READ_ERRORS as exc:
            self._forget_shape()
            raise OutboxError(f"cannot write to outbox {self.path}: {exc}") from exc

    def _forget_shape(self) -> None:
        """The table may not be what the count and the mirror say: read it again."""
        self._count = None
        self._mirror.stop()

    def _known_count(self, db: sqlite3.Connection) -> int:
        if self._count is None:
            (count,) = db.execute("SELECT COUNT(*) FROM outbox").fetchone()
            self._count = int(count)
        return self._count

    # -- reading ----------------------------------------------------------------------------

    def peek(self, limit: int) -> list[QueuedMessage]:
        """The oldest ``limit`` messages, in delivery order, without removing them."""
        return self.peek_after(0, limit)

    def peek_after(self, after_id: int, limit: int) -> list[QueuedMessage]:
        """The next ``limit`` messages after id ``after_id`` (ids grow in delivery order).

        Rows that are not a message (wrong types, text that is not UTF-8) are skipped, counted
        and deleted; they are never returned.
        """
        self.back_to_disk()
        if self._rewind:  # the queue changed under the caller: send from its front again
            self._rewind = False
            after_id = 0
        if self._mirror.active:
            return self._mirror.after(after_id, limit)
        found: list[QueuedMessage] = []
        cursor_id = after_id
        while len(found) < limit:
            try:
                rows = self._storage.db.execute(
                    "SELECT id, CAST(topic AS BLOB), typeof(topic), payload, typeof(payload), "
                    "qos, retain FROM outbox WHERE id > ? ORDER BY id LIMIT ?",
                    (cursor_id, limit - len(found)),
                ).fetchall()
            except READ_ERRORS as exc:
                if not self._read_failed("peek", exc):
                    return found
                continue  # a fresh queue: its ids are all above cursor_id
            if not rows:
                break
            for row in rows:
                message = stored_message(row)
                if message is None:
                    self._drop_invalid(row[0])
                else:
                    found.append(message)
            cursor_id = int(rows[-1][0])
            self._max_id = max(self._max_id, cursor_id)
        if self._bad_ids:
            self._delete_invalid()
        return found

    def __len__(self) -> int:
        try:
            count = self._known_count(self._storage.db)
            self._last_len = max(0, count - len(self._bad_ids))
        except READ_ERRORS as exc:
            if self._read_failed("count", exc):
                return len(self)
        return self._last_len

    @property
    def dropped_total(self) -> int:
        """Messages dropped at the bound over the queue's whole life (survives restarts)."""
        try:
            row = self._storage.db.execute(
                "SELECT value FROM counters WHERE name = 'dropped'"
            ).fetchone()
            value = row[0] if row else 0
            if isinstance(value, int):
                self._last_dropped_total = value
        except READ_ERRORS as exc:
            if self._read_failed("dropped_total", exc):
                return self.dropped_total
        return self._last_dropped_total

    def _read_failed(self, what: str, exc: BaseException) -> bool:
        """Handle a failed read: True if the queue was replaced by a fresh one (read again)."""
        if is_disk_error(exc):
            self.read_failures += 1
            _log.error("outbox_read_failed", path=str(self.path), what=what, error=describe(exc))
            return False
        self._reset(f"{what}: {describe(exc)}")
        return True

    def _drop_invalid(self, row_id: object) -> None:
        self.invalid_rows_dropped += 1
        if isinstance(row_id, int):
            self._bad_ids.add(row_id)
        _log.error("outbox_invalid_row_dropped", path=str(self.path), id=row_id)

    def _delete_invalid(self) -> None:
        try:
            self.remove([])
        except OutboxError as exc:  # kept in _bad_ids: skipped, not counted, deleted later
            _log.error("outbox_invalid_row_delete_failed", path=str(self.path), error=str(exc))

    # -- replacing the queue ----------------------------------------------------------------

    def _reset(self, reason: str) -> None:
        """The file is corrupt: continue on a fresh one (or in memory) whose ids continue."""
        self.resets += 1
        self._bad_ids.clear()
        self._forget_shape()
        self._storage.replace(reason, first_id=self._max_id)
        if self._storage.in_memory:  # (replace raises if it was in memory before)
            self._rewind = True

    def back_to_disk(self) -> bool:
        """Move a drained memory queue back to its file if the disk takes it (tried at most
        every few seconds); True if moved. Appends and reads try it too; an idle daemon's
        publisher calls it so that a quiet queue does not stay in memory."""
        if not self._storage.back_to_disk():
            return False
        self._forget_shape()
        self._rewind = True  # the file may hold older messages, with ids below the cursor
        return True


def _consecutive(ids: Sequence[int]) -> bool:
    """Ascending ids with none missing between the first and the last."""
    return (
        bool(ids)
        and ids[-1] - ids[0] == len(ids) - 1
        and all(b == a + 1 for a, b in itertools.pairwise(ids))
    )
