"""The daemon: wires sources, windows, ticker, models and publisher under one TaskGroup.

Data flows one way: sources -> queue -> ingest (windows) -> tick (batched invoke) -> publisher.
SIGTERM and SIGINT set one stop event; the one shutdown path then stops the sources, feeds what
they already queued, runs a final tick, saves the windows, lets the publisher flush its outbox,
and stops every other loop, so the TaskGroup ends and the process exits 0. SIGHUP asks for a
model reload. systemd is told READY when the service runs and WATCHDOG only while the ingest and
tick loops are making progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path

import structlog

from tesla_gateway import __version__
from tesla_gateway.contract.readings import Reading
from tesla_gateway.daemon.config import GatewayConfig, MqttSourceEntry
from tesla_gateway.daemon.instance_lock import AlreadyRunningError, InstanceLock
from tesla_gateway.daemon.memory import release_free_heap
from tesla_gateway.daemon.sd_notify import SdNotifier
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.ingest.admission import SensorAdmission
from tesla_gateway.ingest.clock_sanity import ClockSanity
from tesla_gateway.ingest.ingest_log import IngestLog, JournaledQueue
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.models.watch import ModelSet, ReloadOutcome
from tesla_gateway.monitor.monitor import ModelInfo, Monitor, SensorDocument
from tesla_gateway.monitor.references import ReferenceConfig
from tesla_gateway.mqtt.session_loss import session_problems
from tesla_gateway.ota.config import OtaConfig
from tesla_gateway.ota.service import OtaService
from tesla_gateway.publish.errors import OutboxError, PublisherError
from tesla_gateway.publish.publisher import OUTBOX_FILENAME, Publisher
from tesla_gateway.set_aside import SetAsideLog
from tesla_gateway.sources.fleet import make_fleet_source
from tesla_gateway.sources.fleet_common import FleetSource
from tesla_gateway.sources.mqtt_source import MqttSource, MqttSourceConfig
from tesla_gateway.sources.serial_source import NodePortConfig, Pms5003PortConfig, SerialSource
from tesla_gateway.windows.snapshots import StateStore
from tesla_gateway.windows.state import WindowState

__all__ = ["AlreadyRunningError", "GatewayService", "read_pid_file", "write_json_atomic"]

_log = structlog.get_logger(__name__)

_QUEUE_BOUND = 10_000  # readings waiting for ingest; sources wait (backpressure) beyond it
_HEARTBEAT_S = 1.0  # the ingest and tick loops wake at least this often
_INGEST_BURST = 1_000  # readings ingested in one go before the loop yields to other tasks
_PROGRESS_TIMEOUT_S = 30.0  # WATCHDOG=1 only if both loops beat within this


_SourceRun = Callable[[asyncio.Queue[Reading], RejectCounter], Coroutine[None, None, None]]


def write_json_atomic(path: Path, document: object) -> None:
    """Replace ``path`` by a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2, sort_keys=True, default=str)
            out.write("\n")
        Path(temp_name).replace(path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def read_pid_file(path: Path) -> int | None:
    """The pid recorded in ``path`` if that process is alive, else None."""
    try:
        pid = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # alive, owned by someone else
    try:  # after a crash and a reboot the pid may belong to an unrelated process
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return pid  # no /proc: trust the pid
    return pid if _is_gateway_command(args) else None


def _is_gateway_command(args: list[str]) -> bool:
    """``tesla-gateway run ...`` or ``python -m tesla_gateway run ...``."""
    if "run" not in args:
        return False
    if any(Path(arg).name == "tesla-gateway" for arg in args[:3]):
        return True
    return any(a == "-m" and b == "tesla_gateway" for a, b in itertools.pairwise(args))


class GatewayService:
    """One run of the daemon; construct, then ``await run()``."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        notifier: SdNotifier | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.notifier = notifier if notifier is not None else SdNotifier()
        self._clock = clock
        self.rejects = RejectCounter()
        self.models = ModelSet(
            config.model_dirs,
            config.runtime.preference,
            num_threads=config.runtime.num_threads,
            trust=config.model_trust(),
            features=config.model_features,
        )
        self.set_aside = SetAsideLog(clock=clock)  # state files that could not be read
        self.state = StateStore(config.state_dir, clock=clock, set_aside=self.set_aside)
        self._instance = InstanceLock(config.state_dir, config.pid_file)
        self.ticker = Ticker(
            self.models,
            grace_s=config.tick.grace_s,
            clock_sanity=ClockSanity(self.rejects),
            clock=clock,
        )
        self.publisher: Publisher | None = None
        self.ingest_log = IngestLog(
            config.state_dir / "ingest-log",
            max_bytes=config.state.ingest_log_max_bytes,
            fsync_interval_s=config.state.ingest_log_fsync_s,
            clock=clock,
            set_aside=self.set_aside,
        )
        self._queue: asyncio.Queue[Reading] | None = None
        self._tick_lock = asyncio.Lock()  # a snapshot never falls between a tick and its submit
        self._started_at = clock()
        self._phase = "starting"
        self._ingest_beat = time.monotonic()
        self._tick_beat = time.monotonic()
        self._publish_failures = 0
        self._publisher_final: dict[str, object] | None = None  # its outbox is closed after run
        self._stop: asyncio.Event | None = None
        self._reload: asyncio.Event | None = None
        self._tick_wanted: asyncio.Event | None = None
        self._mqtt_sources: dict[str, MqttSource] = {}
        self._fleet_sources: dict[str, FleetSource] = {}
        self._evicted_early: list[str] = []  # evicted before the publisher exists (at start)
        self.admission = SensorAdmission(
            config.sensors, self.ticker, self.rejects, clock=clock, on_evicted=self._evicted
        )
        self._serial_source: SerialSource | None = None
        self.ota: OtaService | None = None
        self.reference_rejects = RejectCounter()
        self._reference_sources: dict[str, MqttSource] = {}
        self.monitor = Monitor(
            health=config.health,
            drift=config.drift,
            pairs=config.pairs,
            references=config.references,
            state_dir=config.state_dir,
            model_info=self._model_info,
            now=clock(),
        )

    # -- control ----------------------------------------------------------------------------

    def request_stop(self, reason: str = "requested") -> None:
        if self._stop is not None and not self._stop.is_set():
            _log.info("shutdown_requested", reason=reason)
            self._stop.set()

    def request_reload(self) -> None:
        if self._reload is not None:
            _log.info("reload_requested")
            self._reload.set()

    # -- the run ----------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until stopped; returns the process exit code (0 after a clean shutdown)."""
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()
        self._tick_wanted = asyncio.Event()
        self._claim_pid_file()
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        try:
            loop.add_signal_handler(signal.SIGTERM, self.request_stop, "SIGTERM")
            loop.add_signal_handler(signal.SIGINT, self.request_stop, "SIGINT")
            loop.add_signal_handler(signal.SIGHUP, self.request_reload)
            await self._start_models()
            self._replay_ingest_log()
            self.publisher = Publisher(
                self.config.publisher,
                gateway_id=self.config.gateway_id,
                state_dir=self.config.state_dir,
                set_aside=self.set_aside,
            )
            self._evicted(self._evicted_early)
            self.publisher.adopt_sensors(self.admission.idle_seconds())
            await self._serve(self.publisher)
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)
            self._phase = "stopped"
            self.rejects.flush(final=True)
            self.monitor.close()  # fsync the pairs dataset
            self._save_windows_and_checkpoint()  # also after a crash: keep what we have
            self._write_status(self._stats())
            self._instance.release()
        _log.info("gateway_stopped")
        return 0

    def _evicted(self, sensor_ids: list[str]) -> None:
        """Evicted sensors: the publisher withdraws them (discovery, availability), the
        monitor forgets their health."""
        self.monitor.forget_sensors(sensor_ids)
        if self.publisher is None:
            self._evicted_early.extend(sensor_ids)
        else:
            self.publisher.forget_sensors(sensor_ids)

    def _claim_pid_file(self) -> None:
        """One daemon per state_dir; an unwritable one is reported, not fatal (instance_lock)."""
        self._instance.claim(read_pid_file(self.config.pid_file))

    async def _start_models(self) -> None:
        """Load the models; a feature with none still starts (degraded), so a release or a
        copied model directory can repair it while the daemon runs."""
        results = await asyncio.to_thread(self.models.refresh, force=True)
        for result in results:
            if self.models.get(result.slot) is None:
                _log.error(
                    "model_unavailable",
                    feature=result.feature,
                    slot_id=result.slot,
                    error=result.error,
                )
        self._sync_windows()

    def _sync_windows(self) -> None:
        """Give loaded models windows, restoring the saved ones where the geometry matches."""
        for slot in self.ticker.sync_models():
            calibrator = self.models.get(slot)
            if calibrator is None:
                continue
            restored = self.state.restore(slot, calibrator.geometry)
            if restored is not None:
                self.ticker.install(slot, restored)
        self.admission.adopt_windows()  # restored windows count toward sensors.max_sensors

    def _replay_ingest_log(self) -> None:
        """Feed the acknowledged readings no snapshot holds through the normal ingest path."""
        for reading in self.ingest_log.replay():
            self._ingest(reading)
        self.ingest_log.start()

    def _save_windows_and_checkpoint(self) -> None:
        """Save every window, then record in the ingest log what the snapshots now cover."""
        queued = self._queue.qsize() if self._queue is not None else 0
        if self._write_snapshots_after_outbox(self.ticker.snapshot()):
            self.ingest_log.checkpoint_now(queued)
        self.ingest_log.close()

    async def _serve(self, publisher: Publisher) -> None:
        assert self._stop is not None
        # Every reading is appended to the ingest log as it enters the queue (before its ack).
        queue = self._queue = JournaledQueue(self.ingest_log, maxsize=_QUEUE_BOUND)
        sources = self._make_sources()
        references = self._make_references()
        if self.config.ota is not None:
            self.ota = self._make_ota(self.config.ota)  # a bad key file fails here, at start
        async with asyncio.TaskGroup() as group:
            publisher_task = group.create_task(publisher.run(), name="publisher")
            source_tasks: list[asyncio.Task[None]] = [
                group.create_task(run(queue, self.rejects), name=name) for name, run in sources
            ]
            for name, (run, reference_queue) in references.items():
                source_tasks.append(
                    group.create_task(
                        run(reference_queue, self.reference_rejects), name=f"reference-{name}"
                    )
                )
            reference_tasks = [
                group.create_task(
                    self._reference_loop(name, reference_queue), name=f"reference-{name}-in"
                )
                for name, (_, reference_queue) in references.items()
            ]
            ingest_task = group.create_task(self._ingest_loop(queue), name="ingest")
            tick_task = group.create_task(self._tick_loop(publisher), name="tick")
            helpers = [
                group.create_task(self._watch_loop(), name="model-watch"),
                group.create_task(self._status_loop(publisher), name="status"),
                group.create_task(self._save_loop(), name="state-save"),
                group.create_task(self.ingest_log.run(), name="ingest-log-fsync"),
                group.create_task(self._watchdog_loop(), name="watchdog"),
            ]
            if self.ota is not None:
                helpers.append(group.create_task(self.ota.run(), name="ota"))
            if self.config.metrics is not None:
                helpers.append(group.create_task(self._serve_metrics(publisher), name="metrics"))
            # Everything built so far (imports, models, restored windows: with 10,000 sensors
            # over a million objects) lives as long as the process: keep it out of the cyclic
            # collector's full passes, which otherwise stall the loop for tens of milliseconds.
            gc.freeze()
            release_free_heap()  # what parsing the window snapshot left behind
            self._phase = "running"
            self.notifier.ready(self._status_line(self._stats()))
            _log.info(
                "gateway_started",
                gateway_id=self.config.gateway_id,
                version=__version__,
                models={f: f"{c.name} v{c.version}" for f, c in self.models.loaded().items()},
                degraded=self.models.missing(),
                runtime=sorted({c.runtime_name for c in self.models.loaded().values()}),
                sources=[name for name, _ in sources],
            )
            await self._stop.wait()
            # The one shutdown path, in data-flow order.
            self._phase = "stopping"
            self.notifier.stopping("stopping: flushing windows and outbox")
            await _cancel_and_wait(source_tasks)
            await _cancel_and_wait([ingest_task, *reference_tasks])
            while not queue.empty():
                self._ingest(queue.get_nowait())
            for name, (_, reference_queue) in references.items():
                while not reference_queue.empty():
                    self._observe_reference(name, reference_queue.get_nowait())
            await _cancel_and_wait([tick_task])
            await self._tick_once(publisher)
            await _cancel_and_wait(helpers)
            self.state.write_snapshots(self.ticker.snapshot())
            await _cancel_and_wait([publisher_task])  # delivers within shutdown_flush_s
            self._publisher_final = publisher.stats()  # after the flush: what is left queued

    async def _serve_metrics(self, publisher: Publisher) -> None:
        """The Prometheus endpoint (imported here: prometheus_client is an optional extra)."""
        from tesla_gateway.metrics.collector import StatsCollector
        from tesla_gateway.metrics.server import MetricsServer

        assert self.config.metrics is not None
        collector = StatsCollector(
            lambda: {**self._stats(), "publisher": publisher.stats()},
            sensor_idle=self.admission.idle_seconds if self.config.metrics.per_sensor else None,
        )
        await MetricsServer(self.config.metrics, collector).serve()

    def _make_sources(self) -> list[tuple[str, _SourceRun]]:
        made: list[tuple[str, _SourceRun]] = []
        serial_ports: list[NodePortConfig | Pms5003PortConfig] = []
        for index, source in enumerate(self.config.sources):
            if isinstance(source, MqttSourceEntry):
                mqtt = MqttSource(source, gateway_id=self.config.gateway_id, clock=self._clock)
                self._mqtt_sources[f"mqtt-source-{index}"] = mqtt
                made.append((f"mqtt-source-{index}", mqtt.run))
            elif isinstance(source, NodePortConfig | Pms5003PortConfig):
                serial_ports.append(source)
            else:
                fleet = make_fleet_source(
                    source, gateway_id=self.config.gateway_id, index=index, clock=self._clock
                )
                self._fleet_sources[f"{source.kind}-source-{index}"] = fleet
                made.append((f"{source.kind}-source-{index}", fleet.run))
        if serial_ports:
            self._serial_source = SerialSource(serial_ports, clock=self._clock)
            made.append(("serial-sources", self._serial_source.run))
        return made

    def _make_references(self) -> dict[str, tuple[_SourceRun, asyncio.Queue[Reading]]]:
        """One MQTT subscription per reference station (by name), each with its own queue."""
        made: dict[str, tuple[_SourceRun, asyncio.Queue[Reading]]] = {}
        for reference in self.config.references:
            mqtt = MqttSource(
                _reference_source_config(reference, self.config.gateway_id),
                gateway_id=self.config.gateway_id,
                clock=self._clock,
            )
            self._reference_sources[reference.name] = mqtt
            made[reference.name] = (mqtt.run, asyncio.Queue(maxsize=_QUEUE_BOUND))
        return made

    def _model_info(self, feature: str) -> ModelInfo | None:
        calibrator = self.models.primary(feature)
        if calibrator is None:
            return None
        manifest = calibrator.manifest
        return ModelInfo(
            name=manifest.name,
            version=manifest.version,
            period_seconds=manifest.period_seconds,
            input_range=manifest.input_range,
            test_rmse=manifest.test.model.rmse,
        )

    def _make_ota(self, config: OtaConfig) -> OtaService:
        return OtaService(
            config,
            gateway_id=self.config.gateway_id,
            broker=self.config.publisher.broker,
            links=self._serial_source.links if self._serial_source is not None else {},
            models=self.models,
            on_installed=self._sync_windows,
            clock=self._clock,
        )

    # -- loops ------------------------------------------------------------------------------

    async def _reference_loop(self, name: str, queue: asyncio.Queue[Reading]) -> None:
        while True:
            self._observe_reference(name, await queue.get())

    def _observe_reference(self, name: str, reading: Reading) -> None:
        documents = self.monitor.observe_reference(name, reading, self._clock())
        if documents and self.publisher is not None:
            self._submit_documents(self.publisher, documents)

    async def _ingest_loop(self, queue: asyncio.Queue[Reading]) -> None:
        while True:
            if queue.empty():
                try:
                    async with asyncio.timeout(_HEARTBEAT_S):  # a timer, not a task (wait_for)
                        self._ingest(await queue.get())
                except TimeoutError:
                    self._ingest_beat = time.monotonic()
                    continue
            else:
                await asyncio.sleep(0)  # after a burst, let the other tasks run
            # Take what else is queued in one go, bounded by _INGEST_BURST readings.
            for _ in range(min(queue.qsize(), _INGEST_BURST)):
                self._ingest(queue.get_nowait())

    def _ingest(self, reading: Reading) -> None:
        self._ingest_beat = time.monotonic()
        if not self.admission.admit(reading):
            return
        if self.publisher is not None:
            self.publisher.sensor_seen(reading.sensor_id)
        self.monitor.observe_reading(reading, self.ticker.ingest(reading))
        wanted = self._tick_wanted
        # Once a tick is wanted, no reading needs to ask the windows again (a sum over the
        # models per reading: 2.6 % of the busy samples in a py-spy profile under load).
        if wanted is not None and not wanted.is_set() and self.ticker.has_closed_periods:
            wanted.set()

    async def _tick_loop(self, publisher: Publisher) -> None:
        assert self._tick_wanted is not None
        poll_s = min(_HEARTBEAT_S, max(self.config.tick.grace_s / 2, 0.05))
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tick_wanted.wait(), poll_s)
                await asyncio.sleep(self.config.tick.settle_s)  # let the others cross too
            self._tick_wanted.clear()
            await self._tick_once(publisher)

    async def _tick_once(self, publisher: Publisher) -> None:
        # Closed periods leave the windows at collect and reach the outbox at submit: a
        # snapshot taken in between would hold neither them nor the readings they came from.
        async with self._tick_lock:
            await self._calibrate_and_submit(publisher)

    async def _calibrate_and_submit(self, publisher: Publisher) -> None:
        readings = await self.ticker.tick()
        self._tick_beat = time.monotonic()
        now = self._clock()
        documents = self.monitor.observe_tick(readings, now) if readings else []
        documents += self.monitor.poll(now)
        if readings:
            try:
                publisher.submit(readings)
            except (OutboxError, PublisherError) as exc:
                self._publish_failures += len(readings)
                _log.error("publish_submit_failed", readings=len(readings), error=str(exc))
        self._submit_documents(publisher, documents)

    def _submit_documents(self, publisher: Publisher, documents: list[SensorDocument]) -> None:
        """Health and drift documents go through the outbox like the readings."""
        if not documents:
            return
        try:
            publisher.submit_documents(documents)
        except (OutboxError, PublisherError) as exc:
            self._publish_failures += len(documents)
            _log.error("publish_submit_failed", documents=len(documents), error=str(exc))

    async def _watch_loop(self) -> None:
        assert self._reload is not None
        while True:
            force = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload.wait(), self.config.runtime.model_poll_s)
                force = True
            self._reload.clear()
            results = await asyncio.to_thread(self.models.refresh, force=force)
            if any(r.outcome is ReloadOutcome.LOADED for r in results):
                self._sync_windows()
            if force:
                _log.info(
                    "reload_done",
                    results={r.slot: r.outcome.value for r in results},
                )

    async def _status_loop(self, publisher: Publisher) -> None:
        while True:
            stats = self._stats()  # one snapshot for the file, the stats topic and systemd
            self._write_status(stats)
            self.rejects.flush()  # the count of a reject flood that has stopped
            publisher.submit_stats(stats)
            self.notifier.status(self._status_line(stats))
            await asyncio.sleep(self.config.state.status_interval_s)

    async def _save_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.state.save_interval_s)
            self.admission.evict_idle()  # before the snapshot, so evicted windows leave it too
            async with self._tick_lock:  # on the loop: a consistent copy, no tick half done
                snapshots = self.ticker.snapshot()
                queued = self._queue.qsize() if self._queue is not None else 0
                checkpoint = self.ingest_log.mark(queued)  # what the snapshots cover
            if await asyncio.to_thread(
                self._write_snapshots_after_outbox, snapshots
            ) and await asyncio.to_thread(self.ingest_log.write_checkpoint, checkpoint):
                self.ingest_log.checkpointed(checkpoint)

    def _write_snapshots_after_outbox(self, snapshots: list[tuple[str, WindowState]]) -> bool:
        """Snapshots no longer hold the periods already calibrated: against a power cut, their
        messages in the outbox (WAL commits, not fsynced) reach the disk first (in a thread)."""
        wal = self.config.state_dir / f"{OUTBOX_FILENAME}-wal"
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
        return self.state.write_snapshots(snapshots)

    async def _watchdog_loop(self) -> None:
        interval = self.notifier.watchdog_interval_s
        if interval is None:
            return
        # Both loops beat at least every _HEARTBEAT_S; a stall longer than the systemd watchdog
        # period itself (twice our ping interval), or _PROGRESS_TIMEOUT_S, withholds the ping.
        timeout = max(3 * _HEARTBEAT_S, min(_PROGRESS_TIMEOUT_S, 2 * interval))
        while True:
            now = time.monotonic()
            if now - self._ingest_beat < timeout and now - self._tick_beat < timeout:
                self.notifier.watchdog()
            else:
                _log.error(
                    "watchdog_withheld",
                    ingest_idle_s=round(now - self._ingest_beat, 1),
                    tick_idle_s=round(now - self._tick_beat, 1),
                )
            await asyncio.sleep(interval)

    # -- reporting --------------------------------------------------------------------------

    def _stats(self) -> dict[str, object]:
        ticker = self.ticker.stats()
        sources = {name: source.stats() for name, source in self._mqtt_sources.items()}
        fleet = {name: source.stats() for name, source in self._fleet_sources.items()}
        references = {name: source.stats() for name, source in self._reference_sources.items()}
        return {
            "gateway_id": self.config.gateway_id,
            "version": __version__,
            "uptime_s": round(self._clock() - self._started_at, 1),
            "readings_in": ticker["readings_in"],
            "rejected": self.rejects.snapshot(),
            "admission": self.admission.snapshot(),
            "windows": ticker["windows"],
            "ticker": ticker["ticker"],
            "models": self.models.stats(),
            "degraded": self.models.missing(),  # features with no model: nothing calibrated
            "state": {
                **self.state.stats.as_dict(),
                "set_aside": self.set_aside.as_dict(),
                "problems": self._instance.problems,
            },
            "ingest_log": self.ingest_log.stats.as_dict(),
            "publish_failures": self._publish_failures,
            "mqtt_sources_connected": {name: s.connected for name, s in sources.items()},
            "mqtt_other_shard": {name: s.other_shard for name, s in sources.items()},
            "mqtt_inbox": {name: s.inbox for name, s in sources.items()},
            # Session counters of every subscribing connection (the publisher's are in its own
            # stats): sensor sources, references, MQTT fleet sources.
            "mqtt_sessions": {
                **{name: s.session for name, s in sources.items()},
                **{f"reference-{name}": s.session for name, s in references.items()},
                **{name: f["session"] for name, f in fleet.items() if "session" in f},
            },
            "fleet_sources": fleet,
            "references_connected": {name: s.connected for name, s in references.items()},
            "references_rejected": self.reference_rejects.snapshot(),
            **self.monitor.stats(),
        }

    def _status_line(self, snapshot: Mapping[str, object]) -> str:
        stats = self.ticker.counters
        missing = self.models.missing()
        phase = (
            f"{self._phase}, degraded (no model: {', '.join(missing)})" if missing else self._phase
        )
        line = (
            f"{phase}: {stats.readings_in} readings, {stats.published} published, "
            f"{self.ticker.sensor_windows} sensor windows"
        )
        degraded = [*self._instance.problems]
        if self.set_aside.count:
            degraded.append(f"{self.set_aside.count} state file(s) set aside")
        if self.publisher is not None and self.publisher.outbox_in_memory:
            degraded.append("outbox in memory (state_dir refuses it)")
        stored = snapshot.get("mqtt_sessions")
        sessions: dict[str, object] = dict(stored) if isinstance(stored, Mapping) else {}
        if self.publisher is not None:
            sessions["publisher"] = self.publisher.session_stats()
        degraded.extend(session_problems(sessions, self._clock()))
        return "; ".join([line, *degraded])

    def _write_status(self, stats: Mapping[str, object]) -> None:
        document: dict[str, object] = {
            "pid": os.getpid(),
            "phase": self._phase,
            "started_at": self._started_at,
            "updated_at": self._clock(),
            **stats,
        }
        if self._publisher_final is not None:
            document["publisher"] = self._publisher_final
        elif self.publisher is not None and self._phase == "running":
            document["publisher"] = self.publisher.stats()
        try:
            write_json_atomic(self.config.status_file, document)
        except OSError as exc:
            _log.error("status_write_failed", path=str(self.config.status_file), error=str(exc))


def _reference_source_config(reference: ReferenceConfig, gateway_id: str) -> MqttSourceConfig:
    """The reference's subscription, with a client id of its own (never the sensors' one)."""
    client_id = reference.mqtt.client_id or f"tesla-gateway-{gateway_id}-ref-{reference.name}"
    return reference.mqtt.model_copy(update={"client_id": client_id[:64]})


async def _cancel_and_wait(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel tasks and wait until they have finished their own clean-up."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
