"""The daemon: wires sources, windows, ticker, models and publisher under one TaskGroup.

Data flows one way: sources -> queue -> ingest (windows) -> tick (batched invoke) -> publisher.
SIGTERM and SIGINT set one stop event; the one shutdown path then stops the sources, feeds what
they already queued, lets a tick under way finish (its periods taken from the windows reach the
outbox: ``uncancellable``), runs a final tick, saves the windows, lets the publisher flush its
outbox, and stops every other loop, so the TaskGroup ends and the process exits 0. SIGHUP asks
for a model reload. systemd is told READY when the service runs and WATCHDOG only while the
ingest and tick loops are making progress. What is not composition lives beside it: the sources
(``source_set``), the windows across restarts (``window_keeper``), the reports
(``reporting``), the signals (``signals``) and the watchdog (``watchdog``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from tesla_gateway import __version__
from tesla_gateway.contract.readings import Reading
from tesla_gateway.daemon.clock_steps import ClockSteps
from tesla_gateway.daemon.cluster_mode import ingest_queue, make_member, make_publisher
from tesla_gateway.daemon.config import GatewayConfig
from tesla_gateway.daemon.instance_lock import AlreadyRunningError, InstanceLock, read_pid_file
from tesla_gateway.daemon.memory import release_free_heap
from tesla_gateway.daemon.reporting import Reporter
from tesla_gateway.daemon.sd_notify import SdNotifier
from tesla_gateway.daemon.signals import signal_handlers
from tesla_gateway.daemon.source_set import SourceSet
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.daemon.uncancellable import run_to_completion
from tesla_gateway.daemon.watchdog import HEARTBEAT_S, ProgressWatchdog
from tesla_gateway.daemon.window_keeper import WindowKeeper
from tesla_gateway.ingest.admission import SensorAdmission
from tesla_gateway.ingest.clock_sanity import ClockSanity
from tesla_gateway.ingest.ingest_log import IngestLog
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.metrics.latency import HandoffLatency
from tesla_gateway.metrics.sensor_values import LatestValues
from tesla_gateway.models.served import SERVED_FILENAME, ServedVersions
from tesla_gateway.models.watch import ModelSet, ReloadOutcome
from tesla_gateway.monitor.monitor import ModelInfo, Monitor, SensorDocument
from tesla_gateway.ota.config import OtaConfig
from tesla_gateway.ota.service import OtaService
from tesla_gateway.publish.errors import OutboxError, PublisherError
from tesla_gateway.publish.publisher import OUTBOX_FILENAME, Publisher
from tesla_gateway.set_aside import SetAsideLog
from tesla_gateway.windows.snapshots import StateStore

if TYPE_CHECKING:
    from tesla_gateway.metrics.collector import StatsCollector

__all__ = ["AlreadyRunningError", "GatewayService"]

_log = structlog.get_logger(__name__)

_QUEUE_BOUND = 10_000  # readings waiting for ingest; sources wait (backpressure) beyond it
_INGEST_BURST = 1_000  # readings ingested in one go before the loop yields to other tasks


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
        self.set_aside = SetAsideLog(clock=clock)  # state files that could not be read
        self.models = ModelSet(
            config.model_dirs,
            config.runtime.preference,
            num_threads=config.runtime.num_threads,
            trust=config.model_trust(),
            features=config.model_features,
            # Each slot's floor across restarts (read at the first load, after the pid claim).
            served=ServedVersions(config.state_dir / SERVED_FILENAME, set_aside=self.set_aside),
            allow_downgrade=config.ota is not None and config.ota.allow_downgrade,
        )
        self.state = StateStore(config.state_dir, clock=clock, set_aside=self.set_aside)
        self._instance = InstanceLock(config.state_dir, config.pid_file)
        self.ticker = Ticker(
            self.models,
            grace_s=config.tick.grace_s,
            clock_sanity=ClockSanity(self.rejects),
            clock=clock,
            clock_steps=ClockSteps(),  # the wall clock's steps re-anchor the windows
            timezone=config.timezone,  # the hour of models that read it
            stuck_periods=config.health.stuck_periods if config.health.withhold_stuck else None,
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
        self._handing_off = 0  # ticks between taking periods and submitting them (or failed)
        started_at = clock()
        self._progress = ProgressWatchdog(self.notifier)
        self._stop: asyncio.Event | None = None
        self._reload: asyncio.Event | None = None
        self._tick_wanted: asyncio.Event | None = None
        self.sources = SourceSet(config, clock=clock)
        self._evicted_early: list[str] = []  # evicted before the publisher exists (at start)
        self.handoff_latency = HandoffLatency()  # period end -> calibrated reading in the outbox
        # The newest value per (sensor, feature), kept only for [metrics] sensor_gauges.
        self.latest_values = (
            LatestValues() if config.metrics is not None and config.metrics.sensor_gauges else None
        )
        self.admission = SensorAdmission(
            config.sensors, self.ticker, self.rejects, clock=clock, on_evicted=self._evicted
        )
        self.ota: OtaService | None = None
        # [cluster]: readings come from the stream's partitions this gateway owns (cluster/)
        self.cluster = make_member(config, self, clock)
        self.monitor = Monitor(
            health=config.health,
            drift=config.drift,
            pairs=config.pairs,
            references=config.references,
            state_dir=config.state_dir,
            model_info=self._model_info,
            now=clock(),
        )
        self.windows = WindowKeeper(
            models=self.models,
            ticker=self.ticker,
            state=self.state,
            admission=self.admission,
            ingest_log=self.ingest_log,
            outbox_wal=config.state_dir / f"{OUTBOX_FILENAME}-wal",
            tick_lock=self._tick_lock,
            queued=self._queued,
            handing_off=lambda: self._handing_off > 0,
            outbox_in_memory=lambda: self.publisher is not None and self.publisher.outbox_in_memory,
            save_interval_s=config.state.save_interval_s,
        )
        self.reporter = Reporter(
            config,
            ticker=self.ticker,
            models=self.models,
            rejects=self.rejects,
            admission=self.admission,
            state=self.state,
            set_aside=self.set_aside,
            instance=self._instance,
            ingest_log=self.ingest_log,
            monitor=self.monitor,
            sources=self.sources,
            notifier=self.notifier,
            latency=self.handoff_latency,
            started_at=started_at,
            clock=clock,
        )

    # -- control ----------------------------------------------------------------------------

    def request_stop(self, reason: str = "requested") -> None:
        if self._stop is not None and not self._stop.is_set():
            _log.info("shutdown_requested", reason=reason)
            self._stop.set()

    @property
    def stopping(self) -> bool:  # a stop was requested (SIGTERM): the cluster's last publishes
        return self._stop is not None and self._stop.is_set()

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
        try:
            with signal_handlers(loop, stop=self.request_stop, reload=self.request_reload):
                await self._start_models()
                self.windows.replay_ingest_log(self._ingest)
                self.publisher = make_publisher(self.config, self.set_aside)
                self.reporter.publisher = self.publisher
                self._evicted(self._evicted_early)
                self.publisher.adopt_sensors(self.admission.idle_seconds())
                await self._serve(self.publisher)
        finally:
            self.reporter.phase = "stopped"
            self.rejects.flush(final=True)
            self.monitor.close()  # fsync the pairs dataset
            self.windows.save_and_checkpoint()  # also after a crash: keep what we have
            self.reporter.write_status(self.reporter.stats())
            self._instance.release()
        _log.info("gateway_stopped")
        return 0

    def _evicted(self, sensor_ids: list[str]) -> None:
        """Evicted sensors: the publisher withdraws them (discovery, availability), the
        monitor forgets their health, the metrics their values."""
        self.monitor.forget_sensors(sensor_ids)
        if self.latest_values is not None:
            self.latest_values.forget(sensor_ids)
        if self.publisher is None:
            self._evicted_early.extend(sensor_ids)
        else:
            self.publisher.forget_sensors(sensor_ids)

    def _claim_pid_file(self) -> None:
        """One daemon per state_dir; an unwritable one is reported, not fatal (instance_lock)."""
        self._instance.claim(read_pid_file(self.config.pid_file))

    def _queued(self) -> int:
        """Readings in the ingest queue: in the ingest log, not yet in a window."""
        return self._queue.qsize() if self._queue is not None else 0

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
        self.windows.sync_windows()

    async def _serve(self, publisher: Publisher) -> None:
        assert self._stop is not None
        # Every reading goes to the ingest log as it enters the queue (before its ack); in
        # cluster mode the queue feeds the stream, which keeps it.
        queue = self._queue = ingest_queue(self.cluster, self.ingest_log, _QUEUE_BOUND)
        sources = self.sources.make_sources()
        references = self.sources.make_references(_QUEUE_BOUND)
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
                        run(reference_queue, self.sources.reference_rejects),
                        name=f"reference-{name}",
                    )
                )
            reference_tasks = [
                group.create_task(
                    self._reference_loop(name, reference_queue), name=f"reference-{name}-in"
                )
                for name, (_, reference_queue) in references.items()
            ]
            cluster = self.cluster
            ingest = self._ingest_loop(queue) if cluster is None else cluster.forward_local(queue)
            ingest_task = group.create_task(ingest, name="ingest")
            tick_task = group.create_task(self._tick_loop(publisher), name="tick")
            helpers = [
                group.create_task(self._watch_loop(), name="model-watch"),
                group.create_task(self.reporter.run(publisher), name="status"),
                group.create_task(self.windows.run(), name="state-save"),
                group.create_task(self.ingest_log.run(), name="ingest-log-fsync"),
                group.create_task(self._progress.run(), name="watchdog"),
            ]
            if self.ota is not None:
                helpers.append(group.create_task(self.ota.run(), name="ota"))
            if self.config.metrics is not None:
                helpers.append(group.create_task(self._serve_metrics(publisher), name="metrics"))
            if self.cluster is not None:  # leaves (snapshots, releases) after the last tick
                helpers.append(group.create_task(self.cluster.run(), name="cluster"))
                self.reporter.cluster_stats = self.cluster.stats
            # Everything built so far (imports, models, restored windows: with 10,000 sensors
            # over a million objects) lives as long as the process: keep it out of the cyclic
            # collector's full passes, which otherwise stall the loop for tens of milliseconds.
            gc.freeze()
            release_free_heap()  # what parsing the window snapshot left behind
            self.reporter.phase = "running"
            self.notifier.ready(self.reporter.status_line(self.reporter.stats()))
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
            self.reporter.phase = "stopping"
            self.notifier.stopping("stopping: flushing windows and outbox")
            await _cancel_and_wait(source_tasks)
            await _cancel_and_wait([ingest_task, *reference_tasks])
            while self.cluster is None and not queue.empty():
                self._ingest(queue.get_nowait())
            for name, (_, reference_queue) in references.items():
                while not reference_queue.empty():
                    self._observe_reference(name, reference_queue.get_nowait())
            await _cancel_and_wait([tick_task])
            await self._tick_once(publisher)
            await _cancel_and_wait(helpers)
            self.state.write_snapshots(self.ticker.snapshot())
            await _cancel_and_wait([publisher_task])  # delivers within shutdown_flush_s
            # After the flush: what is left queued.
            self.reporter.publisher_final = publisher.stats()

    async def _serve_metrics(self, publisher: Publisher) -> None:
        """The Prometheus endpoint (imported here: prometheus_client is an optional extra)."""
        from tesla_gateway.metrics.server import MetricsServer

        metrics = self.config.metrics
        assert metrics is not None
        collector = self.metrics_collector(publisher)
        await MetricsServer(metrics, collector, listeners=self.sources.listener_stats).serve()

    def metrics_collector(self, publisher: Publisher) -> StatsCollector:
        """What ``/metrics`` reads at each scrape: the stats snapshot with the publisher's, and
        the per-sensor records ``[metrics]`` asks for (needs the ``metrics`` extra)."""
        from tesla_gateway.metrics.collector import StatsCollector

        metrics = self.config.metrics
        return StatsCollector(
            lambda: {**self.reporter.stats(), "publisher": publisher.stats()},
            last_readings=(
                self.admission.last_reading_times
                if metrics is not None and metrics.sensor_staleness
                else None
            ),
            sensor_values=None if self.latest_values is None else self.latest_values.values,
        )

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
            intervals_for=manifest.intervals_for,
        )

    def _make_ota(self, config: OtaConfig) -> OtaService:
        return OtaService(
            config,
            gateway_id=self.config.gateway_id,
            broker=self.config.publisher.broker,
            links=self.sources.links,
            models=self.models,
            on_installed=self.windows.sync_windows,
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
                    async with asyncio.timeout(HEARTBEAT_S):  # a timer, not a task (wait_for)
                        self._ingest(await queue.get())
                except TimeoutError:
                    self._progress.ingest_beat = time.monotonic()
                    continue
            else:
                await asyncio.sleep(0)  # after a burst, let the other tasks run
            # Take what else is queued in one go, bounded by _INGEST_BURST readings.
            for _ in range(min(queue.qsize(), _INGEST_BURST)):
                self._ingest(queue.get_nowait())

    def _ingest(self, reading: Reading) -> bool:
        """Into the windows; False when admission refused it ([sensors])."""
        self._progress.ingest_beat = time.monotonic()
        if not self.admission.admit(reading):
            return False
        if self.publisher is not None:
            self.publisher.sensor_seen(reading.sensor_id)
        self.monitor.observe_reading(reading, self.ticker.ingest(reading))
        wanted = self._tick_wanted
        # Once a tick is wanted, readings stop asking the windows (2.6 % of busy time, py-spy).
        if wanted is not None and not wanted.is_set() and self.ticker.has_closed_periods:
            wanted.set()
        return True

    async def _tick_loop(self, publisher: Publisher) -> None:
        assert self._tick_wanted is not None
        poll_s = min(HEARTBEAT_S, max(self.config.tick.grace_s / 2, 0.05))
        while True:
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
                # comes with the event (the shutdown's last ingest wants a tick, then cancels
                # this loop), and the loop ran on forever (CPython gh-86296).
                async with asyncio.timeout(poll_s):
                    await self._tick_wanted.wait()
                await asyncio.sleep(self.config.tick.settle_s)  # let the others cross too
            self._tick_wanted.clear()
            await self._tick_once(publisher)

    async def _tick_once(self, publisher: Publisher) -> None:
        # Closed periods leave the windows at collect and reach the outbox at submit: a
        # snapshot taken in between would hold neither them nor the readings they came from,
        # and a cancellation in between (the shutdown cancels the tick loop) would lose them.
        # So the lock keeps snapshots out, and the step runs to its end whatever happens to
        # this task: the shutdown waits for it (uncancellable).
        async with self._tick_lock:
            await run_to_completion(self._calibrate_and_submit(publisher))

    async def _calibrate_and_submit(self, publisher: Publisher) -> None:
        self._handing_off += 1  # from here a tick's periods may be out of the windows ...
        readings = await self.ticker.tick()
        self._progress.tick_beat = time.monotonic()
        now = self._clock()
        documents = self.monitor.observe_tick(readings, now) if readings else []
        documents += self.monitor.poll(now)
        if readings:
            try:
                if self.cluster is not None:  # in the stream before the tick lock is free
                    await self.cluster.publish_calibrated(readings)
                publisher.submit(readings)
            except (OutboxError, PublisherError) as exc:
                self.reporter.publish_failures += len(readings)
                _log.error("publish_submit_failed", readings=len(readings), error=str(exc))
            else:  # in the outbox: the end-to-end latency ends here (metrics/latency.py)
                self.handoff_latency.observe(readings, self._clock())
                if self.latest_values is not None:
                    self.latest_values.record(readings)
        self._handing_off -= 1  # ... and from here in the outbox (or counted as failed)
        self._submit_documents(publisher, documents)

    def _submit_documents(self, publisher: Publisher, documents: list[SensorDocument]) -> None:
        """Health and drift documents go through the outbox like the readings."""
        if not documents:
            return
        try:
            publisher.submit_documents(documents)
        except (OutboxError, PublisherError) as exc:
            self.reporter.publish_failures += len(documents)
            _log.error("publish_submit_failed", documents=len(documents), error=str(exc))

    async def _watch_loop(self) -> None:
        assert self._reload is not None
        while True:
            force = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.runtime.model_poll_s):  # (_tick_loop)
                    await self._reload.wait()
                force = True
            self._reload.clear()
            results = await asyncio.to_thread(self.models.refresh, force=force)
            if any(r.outcome is ReloadOutcome.LOADED for r in results):
                self.windows.sync_windows()
            if force:
                _log.info(
                    "reload_done",
                    results={r.slot: r.outcome.value for r in results},
                )


async def _cancel_and_wait(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel tasks and wait until they have finished their own clean-up."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
