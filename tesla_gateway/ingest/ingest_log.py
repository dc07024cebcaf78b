"""Acknowledged readings survive a SIGKILL: an append-only log written before the broker's ack.

Every reading a source hands to the ingest loop goes through :class:`JournaledQueue`, which
appends it to the log as it enters the queue, so the log's order is the queue's order. A source
calls :func:`commit_queued` before it acknowledges what it put (MQTT: once per batch of messages
the connection hands over, just before their PUBACKs; serial: once per chunk read), which is one
``write()`` of the encoded records: from then on they are in the kernel's page cache and a
SIGKILL cannot lose them. ``fsync`` runs every ``fsync_interval_s`` in a worker thread, for
power cuts.

A window snapshot covers every reading ingested when it was taken: ``next_seq - queue depth``.
Once the snapshots are durable, :meth:`IngestLog.write_checkpoint` records that number
(``covered``) and deletes the segments it covers. At start, :meth:`IngestLog.replay` yields the
records from ``covered`` on, which the service feeds through its normal ingest path. A replayed
reading that a snapshot already holds is a duplicate (its open period remembers its timestamp)
or late (its period is closed) in the windows: never counted twice in a mean.

The parts: :mod:`~tesla_gateway.ingest.log_record` (one record's bytes and frame),
:mod:`~tesla_gateway.ingest.log_segments` (the files, rotation, the size bound, fsync),
:mod:`~tesla_gateway.ingest.log_checkpoint` (the ``covered`` file),
:mod:`~tesla_gateway.ingest.log_replay` (reading it all back at start: what damage costs),
:mod:`~tesla_gateway.ingest.log_scan` (the records in a segment's bytes) and
:mod:`~tesla_gateway.ingest.log_directory` (what else the directory holds: set aside).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tesla_gateway.contract.readings import Reading
from tesla_gateway.ingest.log_checkpoint import IngestLogCheckpoint, write_checkpoint_file
from tesla_gateway.ingest.log_record import RecordEncoder
from tesla_gateway.ingest.log_replay import replay_segments
from tesla_gateway.ingest.log_segments import SegmentFiles
from tesla_gateway.ingest.log_stats import IngestLogStats, report_failure
from tesla_gateway.set_aside import SetAsideLog

__all__ = [
    "IngestLog",
    "IngestLogCheckpoint",
    "IngestLogStats",
    "JournaledQueue",
    "commit_queued",
]

_FLUSH_AT = 4096  # readings waiting that force a write even before a commit


class JournaledQueue(asyncio.Queue[Reading]):
    """The sources' hand-off to the ingest loop: a reading is logged as it enters the queue."""

    def __init__(self, log: IngestLog, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self.log = log

    def put_nowait(self, item: Reading) -> None:
        if self.full():
            raise asyncio.QueueFull  # before logging: the caller will put it again
        self.log.append(item)
        super().put_nowait(item)

    def commit(self) -> None:
        """Write what was put so far (one ``write()``): from here a SIGKILL cannot lose it."""
        self.log.commit()


def commit_queued(queue: asyncio.Queue[Reading]) -> None:
    """Make the readings a source put so far durable before it acknowledges them."""
    if isinstance(queue, JournaledQueue):
        queue.commit()


class IngestLog:
    """The append-only log of readings under ``directory``: replay, append, checkpoint."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        fsync_interval_s: float | None,
        segment_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        set_aside: SetAsideLog | None = None,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(4096, min(8 * 1024 * 1024, max_bytes // 4))
        self.fsync_interval_s = fsync_interval_s
        self.stats = IngestLogStats()
        self._aside = set_aside if set_aside is not None else SetAsideLog(clock=clock)
        self._files = SegmentFiles(
            directory,
            self.stats,
            max_bytes=max_bytes,
            segment_bytes=self.segment_bytes,
            fsync_interval_s=fsync_interval_s,
        )
        self._pending: list[Reading] = []  # put, not yet encoded and written
        self._replay_done = False
        self._encoder = RecordEncoder()

    # -- start: replay, then open a new segment ------------------------------------------------

    def replay(self) -> Iterator[Reading]:
        """Yield the logged readings no snapshot covers, oldest first; then :meth:`start`."""
        yield from replay_segments(self._files, self._aside)
        self._replay_done = True

    def start(self) -> None:
        """Open a fresh segment for appends (after :meth:`replay`; never append to old ones)."""
        if not self._replay_done:
            for _ in self.replay():
                pass
        self._files.open()
        self._files.update_stats()

    # -- appending (on the event loop) ----------------------------------------------------------

    def append(self, reading: Reading) -> None:
        """Take one reading; :meth:`commit` encodes and writes it."""
        pending = self._pending
        pending.append(reading)  # encoded at commit, in one tight loop: cheaper per reading
        if len(pending) >= _FLUSH_AT:
            self.commit()

    def commit(self) -> None:
        """One ``write()`` of everything buffered; a failed write is counted, never raised."""
        pending = self._pending
        if not pending:
            return
        files = self._files
        data = self._encoder.encode(pending, files.next_index)
        records = len(pending)
        pending.clear()
        files.append(data, records)

    # -- checkpoints ----------------------------------------------------------------------------

    def mark(self, queued: int) -> IngestLogCheckpoint:
        """What a snapshot taken now covers (``queued``: readings still waiting for ingest).

        Call on the loop together with the snapshot; seals the active segment so that it can be
        deleted at a later checkpoint.
        """
        self.commit()
        files = self._files
        covered = files.next_seq - queued
        if not files.is_open and self._replay_done:
            files.open()  # retry after a failure (disk full, read-only)
        elif files.segments[-1].records:
            files.rotate()
        return IngestLogCheckpoint(covered_seq=covered, sealed=files.sealed_below(covered))

    def write_checkpoint(self, checkpoint: IngestLogCheckpoint) -> bool:
        """Record ``covered`` durably and delete the segments it covers (call in a thread)."""
        try:
            write_checkpoint_file(self.directory, checkpoint.covered_seq)
        except OSError as exc:
            report_failure(self.stats, self.directory, "checkpoint", exc)
            return False
        for sealed in checkpoint.sealed:
            with contextlib.suppress(OSError):
                sealed.unlink()
        return True

    def checkpointed(self, checkpoint: IngestLogCheckpoint) -> None:
        """Bookkeeping on the loop after :meth:`write_checkpoint` succeeded."""
        self._files.forget(set(checkpoint.sealed), checkpoint.covered_seq)

    def checkpoint_now(self, queued: int) -> None:
        """Mark, write and account in one go (shutdown, with the windows just saved)."""
        if not self._replay_done:
            return  # never started (e.g. no model loaded): the log is left as it was
        checkpoint = self.mark(queued)
        if self.write_checkpoint(checkpoint):
            self.checkpointed(checkpoint)

    # -- durability against power cuts ------------------------------------------------------------

    async def run(self) -> None:
        """Every ``fsync_interval_s``: write what is buffered and fsync what was written."""
        if self.fsync_interval_s is None:
            return
        while True:
            await asyncio.sleep(self.fsync_interval_s)
            await self.sync()

    async def sync(self) -> None:
        """Write what is buffered, then fsync every segment written since the last sync."""
        if not self._files.is_open and self._replay_done:
            self._files.open()  # retry after a failure (disk full, read-only)
        self.commit()
        await self._files.sync()

    def close(self) -> None:
        """Write, fsync and close (shutdown); an empty active segment is removed."""
        self.commit()
        self._files.close()
