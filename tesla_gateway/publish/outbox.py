"""A persisted, bounded FIFO of MQTT messages waiting for the broker's acknowledgement.

SQLite in WAL mode under the state directory: an append is one small transaction, a restart
finds the queue where it was, and a message leaves the queue only after the broker acknowledged
it (at-least-once). When the bound is reached the oldest messages are dropped and counted: the
newest calibrations are the ones worth keeping. Calls are synchronous and sub-millisecond (WAL,
``synchronous=NORMAL``: a commit does not fsync; a power cut may lose the last commits but never
corrupts the file), so the event loop calls them directly. The row count is kept by every
write, and a short queue is also held in memory (:mod:`tesla_gateway.publish.outbox_mirror`): in
steady state neither counting nor sending reads the file.

Reading it is total (a damaged file never stops the daemon):

* a file SQLite calls corrupt, at open or at any later read or write, is set aside
  (:mod:`tesla_gateway.set_aside`) and a fresh queue started, whose ids continue above every id
  already handed out (an acknowledgement of an old message can never delete a new one);
* a row of the wrong types or with text that is not UTF-8 is dropped and counted, never
  returned;
* a file that cannot be opened because of the disk (full, read-only, permissions) is left
  alone: with ``memory_fallback`` the queue lives in memory (same bound, counted, reported as
  ``storage: memory``) and moves back to the file once the disk takes it and the memory queue
  has drained.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

import structlog

from tesla_gateway.errors import GatewayError
from tesla_gateway.publish.outbox_mirror import QueueMirror
from tesla_gateway.set_aside import SetAsideLog

__all__ = ["Outbox", "OutboxError", "OutboxMessage", "QueuedMessage"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    queued_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


_IDS_PER_STATEMENT = 500  # below SQLite's oldest limit of 999 bound parameters
_COMPANIONS = ("-wal", "-shm")
# Errors that say the disk, not the file, is the problem: the file is kept for later.
_DISK_ERRORS = frozenset(
    {
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_AUTH,
    }
)
_MIRROR_CAPACITY = 16_384  # messages the in-memory copy holds at most (a few MB)
_MEMORY_FIRST_ID = 1 << 53  # memory-queue ids never meet a file's ids (acks stay unambiguous)
_DISK_RETRY_S = 5.0  # how often a memory queue tries the file again
_T = TypeVar("_T")

_log = structlog.get_logger(__name__)


class OutboxError(GatewayError):
    """The outbox database cannot be opened or written (disk full, permissions)."""


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """A message to deliver."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A message in the queue; ``id`` orders delivery and names it for :meth:`Outbox.remove`."""

    id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool


def _is_disk_error(exc: BaseException) -> bool:
    """True for an SQLite error caused by the disk (full, read-only, ...), not by the file."""
    if isinstance(exc, OSError):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and (code & 0xFF) in _DISK_ERRORS


def _describe(exc: BaseException) -> str:
    name = getattr(exc, "sqlite_errorname", None)
    return f"{name or type(exc).__name__}: {exc}"


# What a damaged file makes SQLite or the sqlite3 module raise: SQLite's own errors, text that
# is not UTF-8 (UnicodeDecodeError, a ValueError) and wrong types met while converting a row.
_READ_ERRORS = (sqlite3.Error, ValueError, TypeError)


class Outbox:
    """Bounded persistent FIFO; open with :meth:`open` or as a context manager."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        path: Path,
        max_messages: int,
        *,
        set_aside: SetAsideLog | None = None,
        memory_fallback: bool = False,
        in_memory_because: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        mirror_capacity: int = _MIRROR_CAPACITY,
    ) -> None:
        self._db = connection
        self.path = path
        self.max_messages = max_messages
        self._set_aside = set_aside if set_aside is not None else SetAsideLog()
        self._memory_fallback = memory_fallback
        self.disk_error = in_memory_because  # None while the queue is in the file
        self._clock = clock
        self._next_disk_try = clock() + _DISK_RETRY_S
        self._rewind = False  # the next peek_after starts at the front (after a switch)
        self._max_id = 0  # the highest id handed out so far
        self._bad_ids: set[int] = set()  # invalid rows not yet deleted
        self.invalid_rows_dropped = 0
        self.resets = 0
        self.read_failures = 0
        self.memory_periods = 1 if in_memory_because else 0
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
        set_aside = set_aside if set_aside is not None else SetAsideLog()
        try:
            connection = _open_file(path, set_aside, first_id=0)
        except OutboxError as exc:
            if not memory_fallback:
                raise
            _log.error("outbox_in_memory", path=str(path), error=str(exc))
            return cls(
                _open_memory(),
                path,
                max_messages,
                set_aside=set_aside,
                memory_fallback=True,
                in_memory_because=str(exc),
                clock=clock,
                mirror_capacity=mirror_capacity,
            )
        return cls(
            connection,
            path,
            max_messages,
            set_aside=set_aside,
            memory_fallback=memory_fallback,
            clock=clock,
            mirror_capacity=mirror_capacity,
        )

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
        self._db.close()

    @property
    def in_memory(self) -> bool:
        return self.disk_error is not None

    def stats(self) -> dict[str, object]:
        """How the queue is kept: ``storage`` disk or memory, and what went wrong."""
        return {
            "storage": "memory" if self.in_memory else "disk",
            "disk_error": self.disk_error,
            "memory_periods": self.memory_periods,
            "memory_messages": self.memory_messages,
            "invalid_rows_dropped": self.invalid_rows_dropped,
            "resets": self.resets,
            "read_failures": self.read_failures,
        }

    # -- writing ----------------------------------------------------------------------------

    def append(self, messages: Sequence[OutboxMessage]) -> int:
        """Queue messages in order; return how many old ones were dropped to stay in bound."""
        if not messages:
            return 0
        self._maybe_back_to_disk()
        if self.in_memory:
            self.memory_messages += len(messages)
        now = time.time()
        rows = [(m.topic, m.payload, m.qos, int(m.retain), now) for m in messages]

        def insert(db: sqlite3.Connection) -> int:
            before = self._known_count(db)
            if before == 0 and not self._mirror.active:
                self._mirror.start()  # an empty queue: mirror it from here on
            with _Transaction(db):
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

        return self._write("append", insert)

    def remove(self, ids: Sequence[int]) -> None:
        """Forget messages the broker acknowledged."""
        wanted = [*ids, *self._bad_ids]
        if not wanted:
            return

        def delete(db: sqlite3.Connection) -> None:
            deleted = 0
            with _Transaction(db):
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
        """Run a write; a corrupt file is set aside and the write retried on a fresh queue."""
        try:
            return operation(self._db)
        except _READ_ERRORS as exc:
            self._forget_shape()
            if _is_disk_error(exc):
                raise OutboxError(f"cannot write to outbox {self.path}: {exc}") from exc
            self._reset(f"{what}: {_describe(exc)}")
        try:
            return operation(self._db)
        except _READ_ERRORS as exc:
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
        self._maybe_back_to_disk()
        if self._rewind:  # the queue changed under the caller: send from its front again
            self._rewind = False
            after_id = 0
        if self._mirror.active:
            return self._mirror.after(after_id, limit)
        found: list[QueuedMessage] = []
        cursor_id = after_id
        while len(found) < limit:
            try:
                rows = self._db.execute(
                    "SELECT id, CAST(topic AS BLOB), typeof(topic), payload, typeof(payload), "
                    "qos, retain FROM outbox WHERE id > ? ORDER BY id LIMIT ?",
                    (cursor_id, limit - len(found)),
                ).fetchall()
            except _READ_ERRORS as exc:
                if not self._read_failed("peek", exc):
                    return found
                continue  # a fresh queue: its ids are all above cursor_id
            if not rows:
                break
            for row in rows:
                message = _message(row)
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
            count = self._known_count(self._db)
            self._last_len = max(0, count - len(self._bad_ids))
        except _READ_ERRORS as exc:
            if self._read_failed("count", exc):
                return len(self)
        return self._last_len

    @property
    def dropped_total(self) -> int:
        """Messages dropped at the bound over the queue's whole life (survives restarts)."""
        try:
            row = self._db.execute("SELECT value FROM counters WHERE name = 'dropped'").fetchone()
            value = row[0] if row else 0
            if isinstance(value, int):
                self._last_dropped_total = value
        except _READ_ERRORS as exc:
            if self._read_failed("dropped_total", exc):
                return self.dropped_total
        return self._last_dropped_total

    def _read_failed(self, what: str, exc: BaseException) -> bool:
        """Handle a failed read: True if the queue was replaced by a fresh one (read again)."""
        if _is_disk_error(exc):
            self.read_failures += 1
            _log.error("outbox_read_failed", path=str(self.path), what=what, error=_describe(exc))
            return False
        self._reset(f"{what}: {_describe(exc)}")
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
        """The file is corrupt: set it aside and continue on a fresh one (or in memory)."""
        self.resets += 1
        self._bad_ids.clear()
        self._forget_shape()
        first_id = self._max_id
        if self.in_memory:  # SQLite's memory database cannot be corrupted by the disk
            raise OutboxError(f"outbox in memory failed: {reason}")
        self._db.close()
        self._set_aside.set_aside(self.path, kind="outbox", reason=reason, companions=_COMPANIONS)
        try:
            self._db = _open_file(self.path, self._set_aside, first_id=first_id)
        except OutboxError as exc:
            if not self._memory_fallback:
                raise
            self._to_memory(str(exc))

    def _to_memory(self, error: str) -> None:
        _log.error("outbox_in_memory", path=str(self.path), error=error)
        self._db = _open_memory()
        self._forget_shape()
        self.disk_error = error
        self.memory_periods += 1
        self._next_disk_try = self._clock() + _DISK_RETRY_S
        self._rewind = True

    def _maybe_back_to_disk(self) -> None:
        """Move a drained memory queue back to its file once the disk takes it."""
        if not self.in_memory or self._clock() < self._next_disk_try:
            return
        (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        if count:
            return  # messages (maybe in flight) would change ids: wait until delivered
        self._next_disk_try = self._clock() + _DISK_RETRY_S
        try:
            connection = _open_file(self.path, self._set_aside, first_id=0)
        except OutboxError as exc:
            self.disk_error = str(exc)
            return
        self._db.close()
        self._db = connection
        self._forget_shape()
        self.disk_error = None
        self._rewind = True  # the file may hold older messages, with ids below the cursor
        _log.info("outbox_on_disk_again", path=str(self.path))


def _consecutive(ids: Sequence[int]) -> bool:
    """Ascending ids with none missing between the first and the last."""
    return (
        bool(ids)
        and ids[-1] - ids[0] == len(ids) - 1
        and all(b == a + 1 for a, b in itertools.pairwise(ids))
    )


def _message(row: tuple[object, ...]) -> QueuedMessage | None:
    """The row as a message, or None if any field is not what :meth:`Outbox.append` wrote."""
    row_id, topic, topic_type, payload, payload_type, qos, retain = row
    if not isinstance(row_id, int) or topic_type != "text" or payload_type != "blob":
        return None
    if not isinstance(topic, bytes) or not isinstance(payload, bytes) or len(topic) > 65_535:
        return None  # (an MQTT topic is at most 65,535 bytes)
    if qos not in (0, 1, 2) or retain not in (0, 1) or isinstance(qos, bool):
        return None
    try:
        text = topic.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not text or "\0" in text or "+" in text or "#" in text:
        return None
    return QueuedMessage(id=row_id, topic=text, payload=payload, qos=int(qos), retain=bool(retain))


def _open_file(path: Path, set_aside: SetAsideLog, *, first_id: int) -> sqlite3.Connection:
    """Open (or create) the queue file; set a corrupt one aside and create a fresh one.

    Raises :class:`OutboxError` when the disk refuses (full, read-only, permissions).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return _connect(path, first_id)
    except (*_READ_ERRORS, OSError) as exc:
        if _is_disk_error(exc):
            raise OutboxError(f"cannot open outbox {path}: {_describe(exc)}") from exc
        moved = set_aside.set_aside(
            path, kind="outbox", reason=f"open: {_describe(exc)}", companions=_COMPANIONS
        )
        if moved is None:
            raise OutboxError(f"corrupt outbox {path} cannot be moved aside: {exc}") from exc
    try:
        return _connect(path, first_id)
    except (*_READ_ERRORS, OSError) as again:
        raise OutboxError(f"cannot create outbox {path}: {_describe(again)}") from again


def _connect(path: Path | str, first_id: int) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
    try:
        if path != ":memory:":
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
        connection.executescript(_SCHEMA)
        (status,) = connection.execute("PRAGMA quick_check").fetchone()
        if status != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {status}")
        if first_id > 0:  # ids continue above those of the file this one replaces
            connection.execute(
                "INSERT INTO sqlite_sequence (name, seq) SELECT 'outbox', ? "
                "WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'outbox')",
                (first_id,),
            )
    except BaseException:
        connection.close()
        raise
    return connection


def _open_memory() -> sqlite3.Connection:
    return _connect(":memory:", _MEMORY_FIRST_ID)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on error (autocommit connection)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
