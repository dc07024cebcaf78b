"""What changes in the daemon when ``[cluster]`` is set, in one place: the member is built (and
nats imported) only then, the sensors' topics take the cluster-wide prefix (the gateway's own
status and stats keep its prefix), and the sources the gateway runs itself feed the stream
instead of the windows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tesla_gateway.contract.readings import Reading
from tesla_gateway.daemon.config import GatewayConfig
from tesla_gateway.ingest.admission import SensorAdmission
from tesla_gateway.ingest.ingest_log import IngestLog, JournaledQueue
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.monitor.monitor import Monitor
from tesla_gateway.publish.publisher import Publisher
from tesla_gateway.set_aside import SetAsideLog

if TYPE_CHECKING:
    from tesla_gateway.cluster.member import ClusterMember, WindowOwner

__all__ = ["ingest_queue", "make_member", "make_publisher"]


class _Service(Protocol):
    """The parts of the daemon's service the member works with."""

    @property
    def ticker(self) -> WindowOwner: ...
    @property
    def _tick_lock(self) -> asyncio.Lock: ...
    @property
    def admission(self) -> SensorAdmission: ...
    @property
    def monitor(self) -> Monitor: ...
    @property
    def rejects(self) -> RejectCounter: ...
    @property
    def publisher(self) -> Publisher | None: ...
    @property
    def stopping(self) -> bool: ...

    def _ingest(self, reading: Reading) -> bool: ...


def make_publisher(config: GatewayConfig, set_aside: SetAsideLog) -> Publisher:
    """In cluster mode a sensor's topics (calibrated values, health, drift, availability,
    discovery) do not depend on which gateway calibrated it; the gateway's status (its will)
    and stats stay its own."""
    return Publisher(
        config.publisher,
        gateway_id=config.gateway_id,
        state_dir=config.state_dir,
        set_aside=set_aside,
        cluster_prefix=None if config.cluster is None else config.cluster.calibrated_topic_prefix,
    )


def make_member(
    config: GatewayConfig, service: _Service, clock: Callable[[], float]
) -> ClusterMember | None:
    """The cluster member, or None for one gateway (nats is then never imported)."""
    if config.cluster is None:
        return None
    from tesla_gateway.cluster.member import ClusterMember

    def moved_away(sensor_ids: list[str]) -> None:
        """Another gateway calibrates these now: forgotten here, not withdrawn (their topics
        are the cluster's); their availability is the new owner's to say."""
        service.admission.forget(sensor_ids)
        service.monitor.forget_sensors(sensor_ids)
        if service.publisher is not None:
            service.publisher.hand_off_sensors(sensor_ids)

    def taken(idle_s: dict[str, float]) -> None:
        """Sensors of a partition just taken, by seconds since their last reading: their
        availability is said by this gateway now, also for those quiet since the snapshot."""
        if service.publisher is not None:
            service.publisher.take_over_sensors(idle_s)

    return ClusterMember(
        config.cluster,
        gateway_id=config.gateway_id,
        ticker=service.ticker,
        tick_lock=service._tick_lock,  # the service's own lock, lent
        ingest=service._ingest,  # the service's one ingest path
        on_dropped=moved_away,
        on_taken=taken,
        rejects=service.rejects,
        max_sensors=config.sensors.max_sensors,
        clock=clock,
        stopping=lambda: service.stopping,  # SIGTERM's
    )


def ingest_queue(
    member: ClusterMember | None, log: IngestLog, bound: int
) -> asyncio.Queue[Reading]:
    """The sources' queue: journaled into the ingest log for one gateway; in cluster mode
    plain, drained into the stream (which keeps the readings)."""
    if member is None:
        return JournaledQueue(log, maxsize=bound)
    return asyncio.Queue(maxsize=bound)
