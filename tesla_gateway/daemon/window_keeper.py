"""The windows across restarts: restored at start, saved with an ingest-log checkpoint.

Loaded models get their saved windows back when the geometry still matches; the acknowledged
readings no snapshot holds are replayed from the ingest log through the normal ingest path.
Saving takes a consistent copy on the loop (never between a tick and its submit), syncs the
outbox's WAL first (a snapshot no longer holds the periods already calibrated, so their
messages must be on disk before it), writes the snapshots in a thread, and only then records in
the ingest log what the snapshots cover. Nothing is saved once a tick has failed between taking
its periods and handing them to the publisher: the checkpoint would claim readings whose periods
are nowhere, so the previous snapshot and checkpoint stay and a restart replays them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import structlog

from tesla_gateway.contract.readings import Reading
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.ingest.admission import SensorAdmission
from tesla_gateway.ingest.ingest_log import IngestLog
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.windows.snapshots import StateStore
from tesla_gateway.windows.state import WindowState

__all__ = ["WindowKeeper"]

_log = structlog.get_logger(__name__)


class WindowKeeper:
    """Restores the ticker's windows and saves them; :meth:`run` is the periodic save."""

    def __init__(
        self,
        *,
        models: ModelSet,
        ticker: Ticker,
        state: StateStore,
        admission: SensorAdmission,
        ingest_log: IngestLog,
        outbox_wal: Path,
        tick_lock: asyncio.Lock,
        queued: Callable[[], int],
        handing_off: Callable[[], bool],
        outbox_in_memory: Callable[[], bool],
        save_interval_s: float,
    ) -> None:
        self._models = models
        self._ticker = ticker
        self._state = state
        self._admission = admission
        self._ingest_log = ingest_log
        self._outbox_wal = outbox_wal
        self._tick_lock = tick_lock  # a snapshot never falls between a tick and its submit
        self._queued = queued  # readings in the ingest queue: logged, not yet in a window
        self._handing_off = handing_off  # a tick's periods out of the windows, not in the outbox
        self._outbox_in_memory = outbox_in_memory  # the disk refused the outbox: no durable copy
        self._save_interval_s = save_interval_s

    def sync_windows(self) -> None:
        """Give loaded models windows, restoring the saved ones where the geometry matches."""
        for slot in self._ticker.sync_models():
            calibrator = self._models.get(slot)
            if calibrator is None:
                continue
            restored = self._state.restore(slot, calibrator.geometry)
            if restored is not None:
                self._ticker.install(slot, restored)
        self._admission.adopt_windows()  # restored windows count toward sensors.max_sensors

    def replay_ingest_log(self, ingest: Callable[[Reading], object]) -> None:
        """Feed the acknowledged readings no snapshot holds through the normal ingest path."""
        for reading in self._ingest_log.replay():
            ingest(reading)
        self._ingest_log.start()

    def save_and_checkpoint(self) -> None:
        """Save every window, then record in the ingest log what the snapshots now cover."""
        queued = self._queued()
        if self._may_save() and self._write_snapshots_after_outbox(self._ticker.snapshot()):
            self._ingest_log.checkpoint_now(queued)
        self._ingest_log.close()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._save_interval_s)
            self._admission.evict_idle()  # before the snapshot, so evicted windows leave it too
            async with self._tick_lock:  # on the loop: a consistent copy, no tick half done
                if not self._may_save():
                    continue
                snapshots = self._ticker.snapshot()
                checkpoint = self._ingest_log.mark(self._queued())  # what the snapshots cover
            if await asyncio.to_thread(
                self._write_snapshots_after_outbox, snapshots
            ) and await asyncio.to_thread(self._ingest_log.write_checkpoint, checkpoint):
                self._ingest_log.checkpointed(checkpoint)

    def _may_save(self) -> bool:
        """False while a checkpoint would claim readings whose periods are nowhere durable.

        A snapshot no longer holds the periods already calibrated, so it may only be written (and
        the ingest log told those readings are covered) when their messages are in the outbox
        file: not after a tick failed between taking its periods and handing them off, and not
        while the outbox lives in memory (its state dir refused it). The previous snapshot and
        checkpoint stay, so a crash meanwhile replays those readings.
        """
        if self._handing_off():
            reason = "a tick's periods left the windows and never reached the outbox"
        elif self._outbox_in_memory():
            reason = "the outbox is in memory (its file was refused): its messages are not durable"
        else:
            return True
        _log.error(
            "windows_not_saved",
            reason=reason,
            consequence="the previous snapshot and checkpoint stay; a restart replays them",
        )
        return False

    def _write_snapshots_after_outbox(self, snapshots: list[tuple[str, WindowState]]) -> bool:
        """Snapshots no longer hold the periods already calibrated: against a power cut, their
        messages in the outbox (WAL commits, not fsynced) reach the disk first (in a thread)."""
        wal = self._outbox_wal
        try:
            fd = os.open(wal, os.O_RDONLY)
        except OSError:
            pass  # no WAL yet (nothing queued) or unreadable: nothing to sync
        else:
            try:
                os.fsync(fd)
            except OSError as exc:
                _log.error("outbox_sync_failed", path=str(wal), error=exc.strerror or str(exc))
            finally:
                os.close(fd)
        return self._state.write_snapshots(snapshots)
