"""Where the outbox's rows live: its SQLite file, a fresh file in place of a corrupt one, or
memory while the disk refuses the file.

The file is opened in WAL mode with ``synchronous=NORMAL`` (a commit does not fsync; a power cut
may lose the last commits but never corrupts the file) and checked with ``quick_check``. Errors
fall in two kinds, told apart by SQLite's error code:

* the file is damaged (SQLite calls it corrupt, or a row cannot be converted): the file is set
  aside (:mod:`tesla_gateway.set_aside`) and a fresh one created, whose ids continue above every
  id already handed out, so an acknowledgement of an old message can never delete a new one;
* the disk refuses it (full, read-only, permissions), at open or at any later write: the file
  is kept for later, and with ``memory_fallback`` the queue lives in an SQLite memory database
  until the disk takes the file again and the memory queue has drained.

A file the disk refuses to write is usually still readable (a restart on a full disk: the file
opens, its first write fails). The memory queue therefore starts with the file's messages,
copied with their ids (:func:`_take_over`; read in SQLite's exclusive locking mode, which needs
no ``-shm`` file, so a file that cannot even be opened for writing is read too, and on a
read-only file system without locks when no ``-wal`` file holds rows): they are
delivered from memory, in order, ahead of the new ones, and removed from the file when the
queue moves back to it. Until then the file keeps them, so a restart in between sends them again
(at least once) rather than losing them. What only the memory queue holds is lost if the daemon
stops before the disk takes it (logged, ``outbox_memory_messages_lost``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import urllib.parse
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
        path: Path,
        *,
        set_aside: SetAsideLog,
        memory_fallback: bool,
        clock: Callable[[], float],
    ) -> None:
        self.db: sqlite3.Connection  # set by open(), replaced by the switches below
        self.path = path
        self._set_aside = set_aside
        self._memory_fallback = memory_fallback
        self.disk_error: str | None = None  # None while the queue is in the file
        self.memory_periods = 0
        self.taken_from_file = 0  # messages the memory queues took over from the file
        self._taken_up_to = 0  # the file's rows up to this id are in the memory queue
        self._taken_dropped = 0  # the file's count of dropped messages when taken over
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
        starts in memory with the messages the file holds.
        """
        storage = cls(path, set_aside=set_aside, memory_fallback=memory_fallback, clock=clock)
        try:
            storage.db = _open_file(path, set_aside, first_id=0)
        except OutboxError as exc:
            if not memory_fallback:
                raise
            storage._to_memory(str(exc), take_over=True)
        return storage

    def close(self) -> None:
        if self.in_memory:
            self._log_memory_lost()
        self.db.close()

    def _log_memory_lost(self) -> None:
        """Messages only the memory queue holds (not the file's) end with the process."""
        try:
            (lost,) = self.db.execute(
                "SELECT COUNT(*) FROM outbox WHERE id > ?", (self._taken_up_to,)
            ).fetchone()
        except sqlite3.Error:
            return
        if lost:
            _log.warning(
                "outbox_memory_messages_lost",
                path=str(self.path),
                messages=lost,
                why=self.disk_error,
            )

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
            self._to_memory(str(exc), take_over=False)  # the file was just set aside

    def leave_disk(self, error: str) -> bool:
        """The disk refused a write: continue in memory with the file's messages (ids kept, so
        messages in flight stay acknowledgeable); False without ``memory_fallback`` or when
        already in memory."""
        if self.in_memory or not self._memory_fallback:
            return False
        self.db.close()  # (its checkpoint may fail on a full disk: the WAL keeps the rows)
        self._to_memory(error, take_over=True)
        return True

    def _to_memory(self, error: str, *, take_over: bool) -> None:
        memory = _open_memory()
        taken = 0
        if take_over:
            taken, self._taken_up_to, self._taken_dropped = _take_over(memory, self.path)
            self.taken_from_file += taken
        else:
            self._taken_up_to = self._taken_dropped = 0
        _log.error("outbox_in_memory", path=str(self.path), error=error, taken_from_file=taken)
        self.db = memory
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
        try:
            self._hand_back(connection)
        except (*READ_ERRORS, OSError) as exc:  # the disk refuses this write too: stay
            connection.close()
            self.disk_error = f"cannot write to outbox {self.path}: {describe(exc)}"
            return False
        self.db.close()
        self.db = connection
        self.disk_error = None
        _log.info("outbox_on_disk_again", path=str(self.path))
        return True

    def _hand_back(self, file: sqlite3.Connection) -> None:
        """The drained memory queue goes back to the file: the messages it took over were
        delivered (or dropped at the bound, counted), so the file forgets them too."""
        dropped = max(0, _dropped(self.db) - self._taken_dropped)
        with Transaction(file):
            if self._taken_up_to:
                file.execute("DELETE FROM outbox WHERE id <= ?", (self._taken_up_to,))
            file.execute(
                "INSERT INTO counters (name, value) VALUES ('dropped', ?) "
                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (dropped,),
            )
        self._taken_up_to = self._taken_dropped = 0


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


def _take_over(memory: sqlite3.Connection, path: Path) -> tuple[int, int, int]:
    """Copy the file's messages (ids and values as stored) and its count of dropped messages
    into the memory queue; returns (messages copied, highest id copied, dropped).

    Read only, in exclusive locking mode: no ``-shm`` file is needed (a full disk may refuse to
    create one) and the rows still in the ``-wal`` file are read. A read-only file system
    refuses that lock; without a ``-wal`` file to read the file is then read as immutable (no
    locks at all). A file that is missing or cannot be read is left alone (0, 0, 0): it is read
    again when the queue moves back.
    """
    quoted = urllib.parse.quote(str(path))
    uris = [f"file:{quoted}?mode=rw"]  # (never creates the file)
    if _wal_bytes(path) == 0:  # all is in the file itself: reading it unlocked is exact
        uris.append(f"file:{quoted}?mode=ro&immutable=1")
    memory.execute("PRAGMA locking_mode=EXCLUSIVE")  # before the attach: applies to it
    error: BaseException | None = None
    for uri in uris:
        try:
            return _copy(memory, uri)
        except READ_ERRORS as exc:
            error = exc
    if error is not None and os.path.exists(path):  # noqa: PTH110  # never raises on EACCES
        _log.error("outbox_file_unreadable", path=str(path), error=describe(error))
    return 0, 0, 0


def _copy(memory: sqlite3.Connection, uri: str) -> tuple[int, int, int]:
    """One attempt of :func:`_take_over`; raises (leaving the memory queue empty) on failure."""
    memory.execute("ATTACH DATABASE ? AS file", (uri,))
    try:  # (no BEGIN IMMEDIATE: it would take a write lock on the file too)
        memory.execute(
            "INSERT OR IGNORE INTO main.outbox (id, topic, payload, qos, retain, queued_at) "
            "SELECT id, topic, payload, qos, retain, queued_at FROM file.outbox ORDER BY id"
        )
        memory.execute(
            "INSERT OR REPLACE INTO main.counters (name, value) "
            "SELECT name, value FROM file.counters WHERE name = 'dropped'"
        )
        copied, highest = memory.execute(
            "SELECT COUNT(*), COALESCE(MAX(id), 0) FROM main.outbox"
        ).fetchone()
    except READ_ERRORS:
        memory.execute("DELETE FROM main.outbox")
        memory.execute("DELETE FROM main.counters")
        raise
    finally:
        try:
            memory.execute("DETACH DATABASE file")
        except sqlite3.Error as exc:  # the file stays locked: moving back waits for a restart
            _log.error("outbox_file_not_released", uri=uri, error=describe(exc))
    return int(copied), int(highest), _dropped(memory)


def _wal_bytes(path: Path) -> int | None:
    """The size of the file's ``-wal`` file: 0 without one, None when it cannot be told."""
    try:
        return path.with_name(f"{path.name}-wal").stat().st_size
    except FileNotFoundError:
        return 0
    except OSError:
        return None


def _dropped(db: sqlite3.Connection) -> int:
    """The queue's count of messages dropped at the bound (0 if missing or damaged)."""
    row = db.execute("SELECT value FROM counters WHERE name = 'dropped'").fetchone()
    return row[0] if row and isinstance(row[0], int) else 0


class Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on error (autocommit connection).

    SQLite rolls a transaction back itself on some errors (SQLITE_FULL, SQLITE_IOERR,
    SQLITE_BUSY, SQLITE_NOMEM): a ROLLBACK then fails with "no transaction is active", an error
    that would hide the cause (a full disk taken for a corrupt file), so it is only issued while
    a transaction is open, and its own failure never replaces the error being handled.
    """

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
        if exc_type is not None:
            self._roll_back()
            return
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error:
            self._roll_back()  # a COMMIT that failed may leave the transaction open
            raise

    def _roll_back(self) -> None:
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the error being raised says why
                self._db.execute("ROLLBACK")
