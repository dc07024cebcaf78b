"""A persisted, bounded FIFO of MQTT messages waiting for the broker's acknowledgement.

SQLite in WAL mode under the state directory: an append is one small transaction, a restart
finds the queue where it was, and a message leaves the queue only after the broker acknowledged
it (at-least-once). When the bound is reached the oldest messages are dropped and counted: the
newest calibrations are the ones worth keeping. Calls are synchronous and sub-millisecond (WAL,
``synchronous=NORMAL``: a commit does not fsync; a power cut may lose the last commits but never
corrupts the file), so the event loop calls them directly.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import structlog

from gateway.errors import GatewayError

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


class Outbox:
    """Bounded persistent FIFO; open with :meth:`open` or as a context manager."""

    def __init__(self, connection: sqlite3.Connection, path: Path, max_messages: int) -> None:
        self._db = connection
        self.path = path
        self.max_messages = max_messages

    @classmethod
    def open(cls, path: Path, *, max_messages: int) -> Self:
        """Open (or create) the queue; a corrupt file is set aside and a new queue started."""
        if max_messages < 1:
            raise OutboxError(f"outbox bound must be at least 1, got {max_messages}")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            connection = cls._connect(path)
        except sqlite3.DatabaseError as exc:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            structlog.get_logger("gateway.outbox").error(
                "outbox_corrupt_set_aside", path=str(path), moved_to=str(aside), error=str(exc)
            )
            for suffix in ("", "-wal", "-shm"):
                candidate = path.with_name(path.name + suffix)
                if candidate.exists():
                    candidate.replace(aside.with_name(aside.name + suffix))
            try:
                connection = cls._connect(path)
            except sqlite3.DatabaseError as again:
                raise OutboxError(f"cannot create outbox {path}: {again}") from again
        return cls(connection, path, max_messages)

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.executescript(_SCHEMA)
            (status,) = connection.execute("PRAGMA quick_check").fetchone()
            if status != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {status}")
        except sqlite3.DatabaseError:
            connection.close()
            raise
        return connection

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

    def append(self, messages: Sequence[OutboxMessage]) -> int:
        """Queue messages in order; return how many old ones were dropped to stay in bound."""
        if not messages:
            return 0
        now = time.time()
        try:
            with self._transaction():
                self._db.executemany(
                    "INSERT INTO outbox (topic, payload, qos, retain, queued_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [(m.topic, m.payload, m.qos, int(m.retain), now) for m in messages],
                )
                (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
                excess = max(0, int(count) - self.max_messages)
                if excess:
                    self._db.execute(
                        "DELETE FROM outbox WHERE id IN "
                        "(SELECT id FROM outbox ORDER BY id LIMIT ?)",
                        (excess,),
                    )
                    self._db.execute(
                        "INSERT INTO counters (name, value) VALUES ('dropped', ?) "
                        "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                        (excess,),
                    )
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot write to outbox {self.path}: {exc}") from exc
        return excess

    def peek(self, limit: int) -> list[QueuedMessage]:
        """The oldest ``limit`` messages, in delivery order, without removing them."""
        return self.peek_after(0, limit)

    def peek_after(self, after_id: int, limit: int) -> list[QueuedMessage]:
        """The next ``limit`` messages after id ``after_id`` (ids grow in delivery order)."""
        rows = self._db.execute(
            "SELECT id, topic, payload, qos, retain FROM outbox WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, limit),
        ).fetchall()
        return [
            QueuedMessage(
                id=row[0], topic=row[1], payload=bytes(row[2]), qos=row[3], retain=bool(row[4])
            )
            for row in rows
        ]

    def remove(self, ids: Sequence[int]) -> None:
        """Forget messages the broker acknowledged."""
        if not ids:
            return
        try:
            with self._transaction():
                for start in range(0, len(ids), _IDS_PER_STATEMENT):  # one statement per chunk
                    chunk = ids[start : start + _IDS_PER_STATEMENT]
                    marks = ",".join("?" * len(chunk))
                    self._db.execute(f"DELETE FROM outbox WHERE id IN ({marks})", chunk)  # noqa: S608
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot write to outbox {self.path}: {exc}") from exc

    def __len__(self) -> int:
        (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        return int(count)

    @property
    def dropped_total(self) -> int:
        """Messages dropped at the bound over the queue's whole life (survives restarts)."""
        row = self._db.execute("SELECT value FROM counters WHERE name = 'dropped'").fetchone()
        return int(row[0]) if row else 0

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


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
