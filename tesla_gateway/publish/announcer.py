"""When each Home Assistant discovery config is sent: the sequencing around
:class:`~tesla_gateway.publish.discovery.Discovery`, which only builds them.

A config goes out once per connection (the broker's retained copy may have been lost with it),
before the first message it describes, the gateway's device first (the sensors' devices name it
as ``via_device``). These are sent directly, ahead of the outbox. An evicted sensor's configs
are removed through the outbox (empty retained payloads), and if it comes back in the same run
its configs go through the outbox too, behind those removals, so a removal can never follow
them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence

from tesla_gateway.contract.calibrated import CalibratedReading
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.publish.discovery import Discovery, DiscoveryMessage
from tesla_gateway.publish.topics import DocumentKind

__all__ = ["DiscoveryAnnouncer", "Send"]

Send = Callable[[MqttConnection, str, bytes], Awaitable[None]]
"""Publishes one retained config on a connection (a refusal must not stop delivery)."""


class DiscoveryAnnouncer:
    """The configs known this run and those already sent on this connection."""

    def __init__(self, discovery: Discovery, *, enabled: bool) -> None:
        self._discovery = discovery
        self._enabled = enabled
        self._known: dict[tuple[str, str], None] = {}  # (sensor, feature), insertion-ordered
        self._announced: set[tuple[str, str]] = set()
        self._known_documents: dict[tuple[str, str, DocumentKind], None] = {}
        self._announced_documents: set[tuple[str, str, DocumentKind]] = set()
        self._gateway_announced = False
        self._forgotten: set[str] = set()  # evicted this run: re-announced through the outbox

    def readings_queued(self, readings: Iterable[CalibratedReading]) -> None:
        """Readings are queued on their state topics: their configs are due before them."""
        known = self._known
        for reading in readings:
            known.setdefault((reading.sensor_id, reading.feature), None)

    def document_queued(self, sensor_id: str, feature: str, kind: DocumentKind) -> None:
        """A health or drift document is queued: its config is due before it."""
        self._known_documents.setdefault((sensor_id, feature, kind), None)

    def returning(self, readings: Sequence[CalibratedReading]) -> list[DiscoveryMessage]:
        """The configs of sensors evicted earlier this run and back now, to queue before their
        readings (behind the removals queued at eviction)."""
        if not self._forgotten or not self._enabled:
            return []
        messages: list[DiscoveryMessage] = []
        for reading in readings:
            if reading.sensor_id in self._forgotten:
                messages.extend(self._discovery.sensor(reading.sensor_id, reading.feature))
        self._forgotten.difference_update(r.sensor_id for r in readings)
        return messages

    def forget(self, sensor_ids: Sequence[str]) -> list[DiscoveryMessage]:
        """Evicted sensors: no longer announced; the removals of their configs, to queue."""
        gone = set(sensor_ids)
        for pair in [p for p in self._known if p[0] in gone]:
            del self._known[pair]
            self._announced.discard(pair)
        for key in [k for k in self._known_documents if k[0] in gone]:
            del self._known_documents[key]
            self._announced_documents.discard(key)
        if not self._enabled:
            return []
        self._forgotten.update(gone)
        return [m for sensor_id in sensor_ids for m in self._discovery.removals(sensor_id)]

    def new_connection(self) -> None:
        """A new connection: every config is sent again (before the messages it describes)."""
        self._announced.clear()
        self._announced_documents.clear()
        self._gateway_announced = False

    async def announce(self, connection: MqttConnection, send: Send) -> None:
        """Send the configs not yet sent on this connection (the gateway's device first)."""
        if not self._enabled:
            return
        if not self._gateway_announced:
            gateway = self._discovery.gateway()
            await send(connection, gateway.topic, gateway.payload)
            self._gateway_announced = True
        pending = [pair for pair in self._known if pair not in self._announced]
        for sensor_id, feature in pending:
            for message in self._discovery.sensor(sensor_id, feature):
                await send(connection, message.topic, message.payload)
            self._announced.add((sensor_id, feature))
        documents = [k for k in self._known_documents if k not in self._announced_documents]
        for sensor_id, feature, kind in documents:
            message = self._discovery.document(sensor_id, feature, kind)
            await send(connection, message.topic, message.payload)
            self._announced_documents.add((sensor_id, feature, kind))
