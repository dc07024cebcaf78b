"""The retained stats topic: the service's latest snapshot with the publisher's own counters.

The service hands its snapshot over whenever it takes one; the topic is published every
``interval_s`` while connected, and not queued while the broker is away (the next one replaces
it), so stats never compete with readings for the outbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from tesla_gateway.contract.timefmt import iso8601
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.errors import MqttNotConnectedError
from tesla_gateway.publish.payloads import document_payload

__all__ = ["StatsTopic"]


class StatsTopic:
    """The document on ``<prefix>/stats``: the submitted snapshot, ``publisher`` and ``ts``."""

    def __init__(
        self, topic: str, *, interval_s: float, counters: Callable[[], dict[str, object]]
    ) -> None:
        self._topic = topic
        self._interval_s = interval_s
        self._counters = counters  # the publisher's, read at each publication
        self._snapshot: dict[str, object] | None = None

    def submit(self, stats: Mapping[str, object]) -> None:
        """Replace the snapshot published from now on."""
        self._snapshot = dict(stats)

    async def publish(self, connection: MqttConnection | None) -> bool:
        """Publish the document now; False if not connected."""
        if connection is None or not connection.connected:
            return False
        document = {**(self._snapshot or {}), "publisher": self._counters(), "ts": iso8601(_now())}
        payload = document_payload(document)
        try:
            await connection.publish(self._topic, payload, qos=1, retain=True)
        except MqttNotConnectedError:
            return False
        return True

    async def publish_forever(self, connection: MqttConnection) -> None:
        """Publish every ``interval_s`` (a task of the publisher's group)."""
        while True:
            await asyncio.sleep(self._interval_s)
            await self.publish(connection)


def _now() -> float:
    return datetime.now(UTC).timestamp()
