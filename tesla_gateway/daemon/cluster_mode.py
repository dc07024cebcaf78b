"""What changes in the daemon when ``[cluster]`` is set, in one place: the member is built (and
nats imported) only then, the publisher's topics take the cluster-wide prefix, and the sources
the gateway runs itself feed the stream instead of the windows."""

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
from tesla_gateway.publish.config import PublisherConfig

if TYPE_CHECKING:
    from tesla_gateway.cluster.member import ClusterMember, WindowOwner

__all__ = ["ingest_queue", "make_member", "publisher_config"]


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

    def _ingest(self, reading: Reading) -> None: ...


def publisher_config(config: GatewayConfig) -> PublisherConfig:
    """In cluster mode a sensor's topics do not depend on which gateway calibrated it; and no
    per-sensor availability: a gateway that handed a sensor on would call it offline while its
    new owner still publishes it."""
    if config.cluster is None:
        return config.publisher
    return config.publisher.model_copy(
        update={
            "topic_prefix": config.cluster.calibrated_topic_prefix,
            "sensor_offline_after_s": None,
        }
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
        are the cluster's)."""
        service.admission.forget(sensor_ids)
        service.monitor.forget_sensors(sensor_ids)

    return ClusterMember(
        config.cluster,
        gateway_id=config.gateway_id,
        ticker=service.ticker,
        tick_lock=service._tick_lock,  # the service's own lock, lent
        ingest=service._ingest,  # the service's one ingest path
        on_dropped=moved_away,
        rejects=service.rejects,
        clock=clock,
    )


def ingest_queue(
    member: ClusterMember | None, log: IngestLog, bound: int
) -> asyncio.Queue[Reading]:
    """The sources' queue: journaled into the ingest log for one gateway; in cluster mode
    plain, drained into the stream (which keeps the readings)."""
    if member is None:
        return JournaledQueue(log, maxsize=bound)
    return asyncio.Queue(maxsize=bound)
