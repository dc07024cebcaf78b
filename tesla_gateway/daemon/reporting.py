"""What the daemon says about itself: one stats snapshot, the systemd status line, status.json.

Each component reports its own snapshot; this module puts them side by side under the names the
stats topic, the status file, the Prometheus collector and ``tesla-gateway status`` read, and
hands one snapshot to all of them every ``status_interval_s``. The status file is replaced by a
rename, so a reader never sees half of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from tesla_gateway import __version__
from tesla_gateway.daemon.config import GatewayConfig
from tesla_gateway.daemon.instance_lock import InstanceLock
from tesla_gateway.daemon.sd_notify import SdNotifier
from tesla_gateway.daemon.source_set import SourceSet
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.ingest.admission import SensorAdmission
from tesla_gateway.ingest.ingest_log import IngestLog
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.metrics.latency import HandoffLatency
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.monitor.monitor import Monitor
from tesla_gateway.mqtt.session_loss import session_problems
from tesla_gateway.publish.publisher import Publisher
from tesla_gateway.set_aside import SetAsideLog
from tesla_gateway.windows.snapshots import StateStore

__all__ = ["Reporter", "write_json_atomic"]

_log = structlog.get_logger(__name__)


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


class Reporter:
    """The stats, status line and status file of one daemon run, from its components.

    The service sets what only it knows as the run goes: ``phase``, the ``publisher`` once it
    exists, the ``publisher_final`` stats after its flush and the ``publish_failures``.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        ticker: Ticker,
        models: ModelSet,
        rejects: RejectCounter,
        admission: SensorAdmission,
        state: StateStore,
        set_aside: SetAsideLog,
        instance: InstanceLock,
        ingest_log: IngestLog,
        monitor: Monitor,
        sources: SourceSet,
        notifier: SdNotifier,
        latency: HandoffLatency,
        started_at: float,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._ticker = ticker
        self._models = models
        self._rejects = rejects
        self._admission = admission
        self._state = state
        self._set_aside = set_aside
        self._instance = instance
        self._ingest_log = ingest_log
        self._monitor = monitor
        self._sources = sources
        self._notifier = notifier
        self._latency = latency
        self._started_at = started_at
        self._clock = clock
        self.phase = "starting"
        self.publisher: Publisher | None = None
        self.publisher_final: dict[str, object] | None = None  # its outbox is closed after run
        self.publish_failures = 0  # readings and documents the outbox refused
        self.cluster_stats: Callable[[], dict[str, object]] | None = None  # cluster mode's
        # A status.json that cannot be written fails at every interval (a full disk: 66 lines
        # in 6 s at 0.1 s): logged when it starts, then at most once a minute, and when it ends.
        self._status_failed_at: float | None = None
        self._status_failures_not_logged = 0

    async def run(self, publisher: Publisher) -> None:
        """Every status interval: status.json, the stats topic and systemd's status line."""
        while True:
            stats = self.stats()  # one snapshot for the file, the stats topic and systemd
            self.write_status(stats)
            self._rejects.flush()  # the count of a reject flood that has stopped
            publisher.submit_stats(stats)
            self._notifier.status(self.status_line(stats))
            await asyncio.sleep(self._config.state.status_interval_s)

    def stats(self) -> dict[str, object]:
        """One snapshot for the status file, the stats topic, systemd and the metrics."""
        ticker = self._ticker.stats()
        return {
            "gateway_id": self._config.gateway_id,
            "version": __version__,
            "uptime_s": round(self._clock() - self._started_at, 1),
            "readings_in": ticker["readings_in"],
            "rejected": self._rejects.snapshot(),
            "admission": self._admission.snapshot(),
            "windows": ticker["windows"],
            "ticker": ticker["ticker"],
            "handoff_latency": self._latency.as_dict(),
            "models": self._models.stats(),
            "degraded": self._models.missing(),  # features with no model: nothing calibrated
            "state": {
                **self._state.stats.as_dict(),
                "set_aside": self._set_aside.as_dict(),
                "problems": self._instance.problems,
            },
            "ingest_log": self._ingest_log.stats.as_dict(),
            "publish_failures": self.publish_failures,
            **self._sources.stats(),
            **self._monitor.stats(),
            **({} if self.cluster_stats is None else {"cluster": self.cluster_stats()}),
        }

    def status_line(self, snapshot: Mapping[str, object]) -> str:
        """systemd's one-line status: the phase, the counts, and whatever is degraded."""
        stats = self._ticker.counters
        missing = self._models.missing()
        phase = (
            f"{self.phase}, degraded (no model: {', '.join(missing)})" if missing else self.phase
        )
        line = (
            f"{phase}: {stats.readings_in} readings, {stats.published} published, "
            f"{self._ticker.sensor_windows} sensor windows"
        )
        degraded = [*self._instance.problems]
        if self._set_aside.count:
            degraded.append(f"{self._set_aside.count} state file(s) set aside")
        if self.publisher is not None and self.publisher.outbox_in_memory:
            degraded.append("outbox in memory (state_dir refuses it)")
        stored = snapshot.get("mqtt_sessions")
        sessions: dict[str, object] = dict(stored) if isinstance(stored, Mapping) else {}
        if self.publisher is not None:
            sessions["publisher"] = self.publisher.session_stats()
        degraded.extend(session_problems(sessions, self._clock()))
        return "; ".join([line, *degraded])

    def write_status(self, stats: Mapping[str, object]) -> None:
        """status.json for ``tesla-gateway status``; a failed write is logged, never fatal."""
        document: dict[str, object] = {
            "pid": os.getpid(),
            "phase": self.phase,
            "started_at": self._started_at,
            "updated_at": self._clock(),
            **stats,
        }
        if self.publisher_final is not None:
            document["publisher"] = self.publisher_final
        elif self.publisher is not None and self.phase == "running":
            document["publisher"] = self.publisher.stats()
        try:
            write_json_atomic(self._config.status_file, document)
        except OSError as exc:
            now = time.monotonic()
            if self._status_failed_at is not None and now - self._status_failed_at < 60.0:
                self._status_failures_not_logged += 1
                return
            _log.error(
                "status_write_failed",
                path=str(self._config.status_file),
                error=str(exc),
                not_logged_since=self._status_failures_not_logged,
            )
            self._status_failed_at, self._status_failures_not_logged = now, 0
        else:
            if self._status_failed_at is not None:
                _log.info("status_write_recovered", path=str(self._config.status_file))
                self._status_failed_at, self._status_failures_not_logged = None, 0
