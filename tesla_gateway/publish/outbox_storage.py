"""Where the outbox's rows live: its SQLite file, a fresh file in place of a corrupt one, or
memory while the disk refuses the file.

The file is opened in WAL mode with ``synchronous=NORMAL`` (a commit does not fsync; a power cut
may lose the last commits but never corrupts the file) and checked with ``quick_check``. Errors
fall in two kinds, told apart by SQLite's error code:

* the file is damaged (SQLite calls it corrupt, or a row cannot be converted): the file is set
  aside (:mod:`tesla_gateway.set_aside`) and a fresh one created, whose ids continue above every
  id already handed out, so an acknowledgement of an old message can never delete a new one;
* the disk refuses it (full, read-only, permissions): the file is kept for later, and with
  ``memory_fallback`` the queue lives in an SQLite memory database until the disk takes the
  file again and the memory queue has drained.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import structlog

from tesla_gateway.publish.errors import OutboxError
from tesla_gateway.set_aside import SetAsideLog

__all__ = ["READ_ERRORS", "OutboxStorage", "Transaction", "describe", "is_disk_error"]

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
_MEMORY_FIRST_ID = 1 << 53  # memory-queue ids never meet a file's ids (acks stay unambiguous)
_DISK_RETRY_S = 5.0  # how often a memory queue tries the file again

# What a damaged file makes SQLite or the sqlite3 module raise: SQLite's own errors, text that
# is not UTF-8 (UnicodeDecodeError, a ValueError) and wrong types met while converting a row.
READ_ERRORS = (sqlite3.Error, ValueError, TypeError)

_log = structlog.get_logger(__name__)


def is_disk_error(exc: BaseException) -> bool:
    """True for an SQLite error caused by the disk (full, read-only, ...), not by the file."""
    if isinstance(exc, OSError):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and (code & 0xFF) in _DISK_ERRORS


def describe(exc: BaseException) -> str:
    """SQLite's name for the error (``SQLITE_CORRUPT``, ...) and its message, for the logs."""
    name = getattr(exc, "sqlite_errorname", None)
    return f"{name or type(exc).__name__}: {exc}"


class OutboxStorage:
    """The database the queue is in; open with :meth:`open`.

    ``db`` is replaced by :meth:`replace` (a corrupt file) and :meth:`back_to_disk`; the queue
    then forgets what it knew about the rows.
    """

    def __init__(
        self,
        connection: sqlite3.Connection,
        path: Path,
        *,
        set_aside: SetAsideLog,
        memory_fallback: bool,
        in_memory_because: str | None,
        clock: Callable[[], float],
    ) -> None:
        self.db = connection
        self.path = path
        self._set_aside = set_aside
        self._memory_fallback = memory_fallback
        self.disk_error = in_memory_because  # None while the queue is in the file
        self.memory_periods = 1 if in_memory_because else 0
        self._clock = clock
        self._next_disk_try = clock() + _DISK_RETRY_S

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        set_aside: SetAsideLog,
        memory_fallback: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> Self:
        """Open (or create) the file; a corrupt one is set aside and a fresh one created.

        A disk that refuses the file raises :class:`OutboxError`, or with ``memory_fallback``
        starts in memory.
        """
        try:
            connection = _open_file(path, set_aside, first_id=0)
        except OutboxError as exc:
            if not memory_fallback:
                raise
            _log.error("outbox_in_memory", path=str(path), error=str(exc))
            return cls(
                _open_memory(),
                path,
                set_aside=set_aside,
                memory_fallback=True,
                in_memory_because=str(exc),
                clock=clock,
            )
        return cls(
            connection,
            path,
            set_aside=set_aside,
            memory_fallback=memory_fallback,
            in_memory_because=None,
            clock=clock,
        )

    def close(self) -> None:
        self.db.close()

    @property
    def in_memory(self) -> bool:
        return self.disk_error is not None

    def replace(self, reason: str, *, first_id: int) -> None:
        """The file is corrupt: set it aside and continue on a fresh one (or in memory), whose
        ids continue above ``first_id``."""
        if self.in_memory:  # SQLite's memory database cannot be corrupted by the disk
            raise OutboxError(f"outbox in memory failed: {reason}")
        self.db.close()
        self._set_aside.set_aside(self.path, kind="outbox", reason=reason, companions=_COMPANIONS)
        try:
            self.db = _open_file(self.path, self._set_aside, first_id=first_id)
        except OutboxError as exc:
            if not self._memory_fallback:
                raise
            self._to_memory(str(exc))

    def _to_memory(self, error: str) -> None:
        _log.error("outbox_in_memory", path=str(self.path), error=error)
        self.db = _open_memory()
        self.disk_error = error
        self.memory_periods += 1
        self._next_disk_try = self._clock() + _DISK_RETRY_S

    def back_to_disk(self) -> bool:
        """Move a drained memory queue back to its file once the disk takes it; True if moved
        (the file may hold older messages, with ids below any the memory queue handed out)."""
        if not self.in_memory or self._clock() < self._next_disk_try:
            return False
        (count,) = self.db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        if count:
            return False  # messages (maybe in flight) would change ids: wait until delivered
        self._next_disk_try = self._clock() + _DISK_RETRY_S
        try:
            connection = _open_file(self.path, self._set_aside, first_id=0)
        except OutboxError as exc:
            self.disk_error = str(exc)
            return False
        self.db.close()
        self.db = connection
        self.disk_error = None
        _log.info("outbox_on_disk_again", path=str(self.path))
        return True


def _open_file(path: Path, set_aside: SetAsideLog, *, first_id: int) -> sqlite3.Connection:
    """Open (or create) the queue file; set a corrupt one aside and create a fresh one.

    Raises :class:`OutboxError` when the disk refuses (full, read-only, permissions).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return _connect(path, first_id)
    except (*READ_ERRORS, OSError) as exc:
        if is_disk_error(exc):
            raise OutboxError(f"cannot open outbox {path}: {describe(exc)}") from exc
        moved = set_aside.set_aside(
            path, kind="outbox", reason=f"open: {describe(exc)}", companions=_COMPANIONS
        )
        if moved is None:
            raise OutboxError(f"corrupt outbox {path} cannot be moved aside: {exc}") from exc
    try:
        return _connect(path, first_id)
    except (*READ_ERRORS, OSError) as again:
        raise OutboxError(f"cannot create outbox {path}: {describe(again)}") from again


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


class Transaction:
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
