"""This gateway as a member of the cluster: it owns the partitions its leases and pins give it,
feeds their readings to the windows, snapshots them, and publishes their calibrated values once.

Per heartbeat (a fifth of the pin TTL): say it is alive, renew its leases, and move toward the
balanced placement (:func:`ownership.plan`). Taking a partition: win its lease, load its snapshot
into the windows, replay the stream after it, then pull with the pin. Losing one (a 423 on a
pull, a lease renewal refused): its windows go at once. Giving one back (rebalancing, shutdown):
stop pulling (its last pull waited out: :mod:`.puller`), snapshot, drop, unpin, release. The
daemon's tick lock keeps a snapshot from falling between a tick taking periods out of the
windows and their calibrated values reaching the stream, so a snapshot and the sequence it
covers always agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable

import structlog

from tesla_gateway.cluster import window_parts
from tesla_gateway.cluster.agreement import Agreement, shared_settings
from tesla_gateway.cluster.cancels import cancel, checkpoint, give_up_after
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.engine import Engine, connect, transient
from tesla_gateway.cluster.holdings import Counters, Owned, WindowOwner, stop_pulling
from tesla_gateway.cluster.ownership import Leases, plan
from tesla_gateway.cluster.puller import PartitionPuller, PinLostError, StreamMessage
from tesla_gateway.cluster.room import NoRoomError, Room
from tesla_gateway.cluster.traffic import Traffic
from tesla_gateway.cluster.warm import SnapshotStore, replay
from tesla_gateway.contract.calibrated import CalibratedReading
from tesla_gateway.contract.readings import Reading
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.snapshots import CorruptSnapshotError

__all__ = ["ClusterMember", "WindowOwner"]

_log = structlog.get_logger(__name__)
_RETRY_S = 1.0
_DRAIN_POLL_S = 0.05
_SNAPSHOT_WAIT_S = 5.0  # then the snapshot holds the periods still waiting
_INSTALL_WAIT_S = 30.0  # then the windows are rebuilt anyway (logged)
# SIGTERM's budget (devkit and tests wait 30 s, systemd 90 s): the last tick's calibrated values
# (traffic.FINAL_PUBLISH_S), the leave (snapshots, unpins, leases) and the connection's close are
# each bounded; what does not fit is abandoned with a warning, the others take over by the TTL.
LEAVE_S = 10.0
CLOSE_S = 3.0
_BEAT_REQUEST_SHARE = 0.25  # of the lease TTL: how long one heartbeat request may wait


class ClusterMember:
    """The cluster side of one gateway; ``run`` until cancelled (then it leaves cleanly)."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        gateway_id: str,
        ticker: WindowOwner,
        tick_lock: asyncio.Lock,
        ingest: Callable[[Reading], bool | None],
        on_dropped: Callable[[list[str]], None],
        rejects: RejectCounter,
        on_taken: Callable[[dict[str, float]], None] | None = None,
        max_sensors: int | None = None,
        clock: Callable[[], float] = time.time,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """``ingest`` returns False for a reading the windows refused ([sensors] admission);
        ``max_sensors`` bounds the sensors of the partitions this gateway takes; ``stopping``:
        the daemon is shutting down (retries end within traffic.FINAL_PUBLISH_S)."""
        self.config = config
        self.gateway_id = gateway_id
        self._ticker = ticker
        self._tick_lock = tick_lock
        self._ingest = ingest
        self._on_dropped = on_dropped
        self._on_taken = on_taken
        self._clock = clock
        self._owned: dict[int, Owned] = {}
        self._members: list[str] = []
        self._engine: Engine | None = None
        self._leases: Leases | None = None
        self._snapshots: SnapshotStore | None = None
        self._agreement: Agreement | None = None
        self._room = Room(max_sensors)
        self.traffic = Traffic(config, rejects, clock=clock, stopping=stopping)
        self.counters = Counters()
        self.connected = asyncio.Event()
        self._group: asyncio.TaskGroup | None = None

    # -- the daemon's side ------------------------------------------------------------------

    async def publish_calibrated(self, readings: list[CalibratedReading]) -> None:
        """Into the calibrated stream, each under its (sensor, feature, period) message id;
        returns once the stream has them (the tick lock is held meanwhile)."""
        if self._engine is not None and readings:
            await self.traffic.publish_calibrated(self._engine, readings)

    async def forward_local(self, queue: asyncio.Queue[Reading]) -> None:
        """Readings this gateway received itself (serial, fleet sources) into the stream, so
        their sensors are partitioned like every other."""
        try:
            await self.connected.wait()
        except asyncio.CancelledError:  # stopped before the servers were ever reached
            self.traffic.abandon(queue)
            raise
        assert self._engine is not None
        await self.traffic.forward_local(self._engine, queue)

    def stats(self) -> dict[str, object]:
        counters, snaps = self.counters, self._snapshots
        return {
            "connected": self._engine is not None and self._engine.nc.is_connected,
            "members": list(self._members),
            "partitions": {
                str(p): {
                    "since": owned.acquired_at,
                    "ready": owned.ready,
                    "sensors": len(owned.sensors),
                    "covered": owned.covered,
                }
                for p, owned in sorted(self._owned.items())
            },
            "acquired": counters.acquired,
            "warm_takeovers": counters.warm,
            "cold_takeovers": counters.cold,
            "lost": counters.lost,
            "released": counters.released,
            "replayed": counters.replayed,
            "snapshots": counters.snapshots,
            "corrupt_snapshots": counters.corrupt_snapshots,
            "mismatched_snapshots": counters.mismatched_snapshots,
            "refused_full": self._room.refused,
            "snapshot_bytes": 0 if snaps is None else snaps.saved_bytes,
            "snapshots_in_object_store": 0 if snaps is None else snaps.in_object_store,
            "last_takeover_s": round(counters.last_takeover_s, 3),
            "errors": counters.errors,
            "bad_keys": 0 if self._leases is None else self._leases.bad_keys,
            **self.traffic.stats(),
        }

    # -- the run ----------------------------------------------------------------------------

    async def run(self) -> None:
        engine = self._engine = await self._connect()
        assert self._leases is not None  # _agree's, on this engine: one count of bad keys
        self._snapshots = SnapshotStore(engine, self.gateway_id)
        self._drop_all_windows()  # windows restored from local files belong to nobody here
        self.connected.set()
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                snapshots = group.create_task(self._snapshot_loop(), name="cluster-snapshots")
                try:
                    await self._heartbeat_loop()
                finally:  # with the pullers still running, to wait out their last pulls
                    await cancel(snapshots)
                    await asyncio.shield(self._leave(engine))
                    for owned in list(self._owned.values()):  # what the leave left (logged)
                        await cancel(owned.task)
        finally:
            self._group = None

    async def _connect(self) -> Engine:
        """Connect, and refuse to join if a live gateway has this id (before the first
        heartbeat, which would renew its key); what may pass is asked again."""
        while True:
            try:  # connect() closes its connection on any failure
                return await connect(
                    self.config, f"tesla-gateway-{self.gateway_id}", agree=self._agree
                )
            except transient() as exc:  # unreachable servers, a stream electing a leader
                _log.warning("cluster_connect_failed", error=str(exc) or type(exc).__name__)
            checkpoint()
            await asyncio.sleep(_RETRY_S)

    async def _agree(self, engine: Engine) -> None:
        """Before the partition consumers are touched: no live twin, and this gateway's
        shared settings are the cluster's (:mod:`.agreement`). Their requests give up after a
        quarter of the TTL: one a dying server held waited 10 s, past the 5 s TTL, and the
        leases were lost to that wait, not by the TTL rule (now the next beat renews in time)."""
        beat = await engine.bounded(self.config.pin_ttl_s * _BEAT_REQUEST_SHARE)
        leases = self._leases = Leases(beat, self.gateway_id, self.config.pin_ttl_s)
        await leases.refuse_a_twin()
        store = self._ticker.store.items()
        geometries = {slot: windows.geometry for slot, windows in store}
        offsets = {slot: windows.utc_offset_s for slot, windows in store}
        settings = shared_settings(self.config, geometries, offsets)
        self._agreement = Agreement(beat, self.gateway_id, settings, leases.members)
        await self._agreement.join()

    async def _leave(self, engine: Engine) -> None:
        """A clean shutdown: every partition handed back with a fresh snapshot, within
        LEAVE_S; what is left then is abandoned (the others take it over by the TTL), and the
        connection closed within CLOSE_S."""
        try:
            async with asyncio.timeout(LEAVE_S):
                await self._release(list(self._owned))
                if self._leases is not None:
                    await self._leases.leave()
        except transient() as exc:  # the others take over by TTL anyway
            _log.warning(
                "cluster_leave_incomplete",
                error=str(exc) or type(exc).__name__,
                abandoned=sorted(self._owned),
                action="the other gateways take these partitions over when their leases expire",
            )
        await give_up_after(engine.close(), CLOSE_S, "cluster_close")

    async def _heartbeat_loop(self) -> None:
        assert self._leases is not None and self._agreement is not None
        leases, agreement = self._leases, self._agreement
        interval = self.config.pin_ttl_s / 5
        while True:
            try:
                await agreement.verify()  # a SettingsMismatchError ends the run
                await leases.heartbeat()
                for partition in await leases.renew():
                    await self._lose(partition, "lease renewal refused")
                self._members = await leases.members()
                holders = await leases.holders(self.config.partitions)
                moves = plan(self.gateway_id, self._members, holders, self.config.partitions)
                await self._release(moves.release)
                for partition in moves.acquire:
                    if self._room.waiting(partition):  # refused lately for want of room
                        continue
                    if await leases.acquire(partition):
                        self._take(partition)
            except transient() as exc:  # a server busy electing, a reconnect: next beat
                self.counters.errors += 1
                _log.warning("cluster_heartbeat_failed", error=str(exc) or type(exc).__name__)
            checkpoint()  # a SIGTERM's cancellation a reply swallowed ends the beats here
            await asyncio.sleep(interval)

    # -- taking, losing, giving back --------------------------------------------------------

    def _take(self, partition: int) -> None:
        assert self._group is not None
        owned = self._owned[partition] = Owned(acquired_at=self._clock())
        owned.task = self._group.create_task(
            self._own(partition, owned), name=f"cluster-partition-{partition}"
        )

    async def _own(self, partition: int, owned: Owned) -> None:
        """Load, replay, then pull the partition until its pin is lost or the task cancelled;
        a failed request gives the partition up (the next heartbeat may take it again)."""
        why = "stopped pulling"
        try:
            await self._load_replay_pull(partition, owned)
        except PinLostError:
            owned.pinned_elsewhere = True
            why = "pinned elsewhere"
        except NoRoomError:  # never pulled nor installed: only the lease to give back
            owned.releasing = True
            if self._owned.get(partition) is owned:
                del self._owned[partition]
                if self._leases is not None:
                    with contextlib.suppress(*transient()):
                        await self._leases.release(partition)
        except transient() as exc:
            self.counters.errors += 1
            why = f"{type(exc).__name__}: {exc}"
        if self._owned.get(partition) is owned and not owned.releasing:
            await self._lose(partition, why)  # not given back, nor taken again meanwhile

    async def _load_replay_pull(self, partition: int, owned: Owned) -> None:
        assert self._engine is not None and self._snapshots is not None
        started = time.monotonic()
        snapshot = await self._load(partition)
        async with self._drained(_INSTALL_WAIT_S):  # the windows are rebuilt
            held = sum(len(o.sensors) for p, o in self._owned.items() if p != partition)
            self._room.check(partition, held, len(self._sensors_of(snapshot)))
            self._drop_windows(owned.sensors | self._sensors_of(snapshot))
            if snapshot is not None:
                self._install(snapshot)
                owned.covered = snapshot.sequence
                for state in snapshot.states.values():
                    owned.sensors.update(state.sensor_ids)
        async for batch in replay(
            self._engine,
            partition,
            after_sequence=None if snapshot is None else snapshot.sequence,
            span_s=self._fallback_s(),  # without a snapshot: by the server's clock
        ):
            self.counters.replayed += len(batch)
            self._handle(partition, batch)
        checkpoint()  # not pulling for a partition given back meanwhile
        owned.ready = True
        if self._on_taken is not None:  # its sensors are this gateway's to speak for now
            ends, now = self._ticker.last_seen(), self._clock()
            self._on_taken({s: max(0.0, now - ends[s]) for s in owned.sensors if s in ends})
        self.counters.acquired += 1
        self.counters.cold += snapshot is None
        self.counters.warm += snapshot is not None
        self.counters.last_takeover_s = time.monotonic() - started
        _log.info(
            "cluster_partition_taken",
            partition=partition,
            warm=snapshot is not None,
            covered=owned.covered,
            sensors=len(owned.sensors),
            seconds=round(self.counters.last_takeover_s, 3),
        )
        puller = owned.puller = PartitionPuller(
            self._engine, partition, lambda batch: self._handle(partition, batch)
        )
        await puller.run()

    def _handle(self, partition: int, batch: list[StreamMessage]) -> None:
        owned = self._owned.get(partition)
        if owned is None:
            return
        for message in batch:
            for reading in self.traffic.decode(message):
                if self._ingest(reading) is not False:  # what the windows hold
                    owned.sensors.add(reading.sensor_id)
            owned.covered = max(owned.covered, message.sequence)

    async def _load(self, partition: int) -> window_parts.PartitionSnapshot | None:
        """The partition's snapshot, or None for a cold start (none, unreachable, or corrupt:
        a corrupt one is deleted, so no later owner stumbles on it again)."""
        assert self._snapshots is not None
        snapshots = self._snapshots
        try:
            blob = await snapshots.load(partition)
            if blob is None:
                return None
            geometries = {slot: windows.geometry for slot, windows in self._ticker.store.items()}
            snapshot = await asyncio.to_thread(
                window_parts.decode, blob, geometries, max_bytes=snapshots.max_bytes
            )
            if snapshot.mismatched:  # a warm start would leave those windows empty
                self.counters.mismatched_snapshots += 1
                _log.warning(
                    "cluster_snapshot_mismatched",
                    partition=partition,
                    slots=list(snapshot.mismatched),
                    action="another model window or period: not loaded; the partition starts "
                    "cold (fallback replay)",
                )
                return None
            return snapshot
        except CorruptSnapshotError as exc:
            self.counters.corrupt_snapshots += 1
            _log.error(
                "cluster_snapshot_corrupt",
                partition=partition,
                error=str(exc),
                action="deleted from the bucket; the partition starts cold (fallback replay)",
            )
            with contextlib.suppress(*transient()):  # then the next owner finds it corrupt too
                await snapshots.discard(partition)
            return None
        except transient() as exc:  # a cold start, never the partition lost
            self.counters.errors += 1
            _log.warning("cluster_snapshot_unreadable", partition=partition, error=str(exc))
            return None

    async def _lose(self, partition: int, why: str) -> None:
        """Another gateway has it: drop its windows now, nothing more to say to anyone. Its
        puller refuses what it brings before the release is awaited (it pulled on meanwhile,
        acknowledging readings no longer owned: dropped, lost for good)."""
        if (owned := self._owned.pop(partition, None)) is not None:
            await stop_pulling(owned, lost=True)
        if self._leases is not None:
            with contextlib.suppress(*transient()):  # it may be another's by now
                await self._leases.release(partition)
        if owned is None:
            return
        async with self._tick_lock:
            self._drop_windows(owned.sensors)
        self.counters.lost += 1
        _log.warning("cluster_partition_lost", partition=partition, why=why)

    async def _release(self, partitions: Iterable[int]) -> None:
        """Hand partitions back: stop pulling (their last pulls waited out side by side), then
        each: snapshot, drop, unpin, delete the lease."""
        given = [(p, owned) for p in partitions if (owned := self._owned.get(p)) is not None]
        await asyncio.gather(*(stop_pulling(owned) for _, owned in given))
        assert self._engine is not None and self._leases is not None
        for partition, owned in given:
            superseded = owned.ready and partition in await self._save({partition: owned})
            self._owned.pop(partition, None)
            async with self._tick_lock:
                self._drop_windows(owned.sensors)
            if not superseded and not owned.pinned_elsewhere:  # else the new owner's pin
                with contextlib.suppress(*transient()):  # unpinned by the TTL anyway
                    await self._engine.unpin(partition)
            await self._leases.release(partition)
            self.counters.released += 1
            _log.info("cluster_partition_released", partition=partition, covered=owned.covered)

    # -- snapshots --------------------------------------------------------------------------

    async def _snapshot_loop(self) -> None:
        while True:
            checkpoint()
            await asyncio.sleep(self.config.snapshot_interval_s)
            ready = {p: owned for p, owned in self._owned.items() if owned.ready}
            try:
                superseded = await self._save(ready)
            except transient() as exc:  # the next one may work; takeovers replay further
                self.counters.errors += 1
                _log.warning("cluster_snapshot_failed", error=str(exc) or type(exc).__name__)
                continue
            for partition in superseded:
                if self._owned.get(partition) is ready[partition]:
                    await self._lose(partition, "another gateway saved a later snapshot")

    async def _save(self, partitions: dict[int, Owned]) -> list[int]:
        """Snapshot these partitions; those whose stored snapshot covers a later sequence
        (another gateway owns them now) are returned, not overwritten."""
        superseded: list[int] = []
        if not partitions:
            return superseded
        assert self._snapshots is not None
        async with self._drained(_SNAPSHOT_WAIT_S):  # after the wait, with what waits
            # One lost while this waited for the lock has had its windows dropped: a snapshot
            # of it would hold no sensor yet claim its sequence, and its next owner would
            # replay only after it, losing every reading up to there.
            held = {p: o for p, o in partitions.items() if self._owned.get(p) is o}
            states = self._ticker.snapshot()
            covered = {p: (owned.covered, set(owned.sensors)) for p, owned in held.items()}
        for partition, (sequence, sensors) in covered.items():
            parts = {slot: window_parts.subset(state, sensors) for slot, state in states}
            snapshot = window_parts.PartitionSnapshot(sequence=sequence, states=parts)
            blob = await asyncio.to_thread(window_parts.encode, snapshot)
            if len(blob) > self._snapshots.max_bytes:  # no gateway would load it
                self.counters.errors += 1
                _log.error(
                    "cluster_snapshot_too_large",
                    partition=partition,
                    bytes=len(blob),
                    max_snapshot_bytes=self._snapshots.max_bytes,
                )
                continue
            if await self._snapshots.save(partition, blob, sequence):
                self.counters.snapshots += 1
            else:
                superseded.append(partition)
        return superseded

    @contextlib.asynccontextmanager
    async def _drained(self, wait_s: float) -> AsyncIterator[None]:
        """Hold the tick lock at a moment no closed period waits for the tick, or, after
        ``wait_s``, with whatever waits.

        A window's export keeps every closed period still waiting (WindowState.waiting), so
        no moment loses one; taken while nothing waits, a snapshot also holds no period this
        owner calibrates after it, which a new owner would calibrate again (a duplicate the
        calibrated stream refuses by its message id).
        """
        deadline = time.monotonic() + wait_s
        while True:
            await self._tick_lock.acquire()
            drained = self._ticker.store.pending_count == 0
            if drained or time.monotonic() >= deadline:
                break
            self._tick_lock.release()
            await asyncio.sleep(_DRAIN_POLL_S)
        try:
            yield
        finally:
            self._tick_lock.release()

    # -- the windows ------------------------------------------------------------------------

    def _install(self, snapshot: window_parts.PartitionSnapshot) -> None:
        for slot, part in snapshot.states.items():
            if slot not in self._ticker.store:
                continue
            current = self._ticker.store[slot]
            merged = window_parts.merge(current.export_state(), part)
            windows = ModelWindows.from_state(merged)
            windows.counts = current.counts
            self._ticker.install(slot, windows)

    def _drop_windows(self, sensors: set[str]) -> None:
        if sensors:
            self._ticker.remove_sensors(sensors)
            self._on_dropped(sorted(sensors))

    def _drop_all_windows(self) -> None:
        self._drop_windows({s for _, w in self._ticker.store.items() for s in w.sensor_ids})

    @staticmethod
    def _sensors_of(snapshot: window_parts.PartitionSnapshot | None) -> set[str]:
        states = () if snapshot is None else snapshot.states.values()
        return {s for state in states for s in state.sensor_ids}

    def _fallback_s(self) -> float:
        periods = self.config.fallback_replay_periods
        geometries = [windows.geometry for _, windows in self._ticker.store.items()]
        spans = [(periods or g.window_length + 2) * g.period_seconds for g in geometries]
        return float(max(spans, default=0.0))
