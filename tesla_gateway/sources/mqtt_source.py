"""Readings from sensors that publish JSON over MQTT.

The source keeps a persistent session (fixed client id, clean start off, a session expiry) so
the broker queues QoS 1 readings published while the gateway is down and delivers them when it
returns. Each message is acknowledged only after its readings are in the queue and written to
the ingest log (``tesla_gateway.ingest.ingest_log``), so a SIGKILL cannot lose an acknowledged
reading.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated

import structlog
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from tesla_gateway.contract.readings import (
    SENSOR_ID_PATTERN,
    Reading,
    ReadingRejectedError,
    RejectReason,
)
from tesla_gateway.ingest.ingest_log import commit_queued
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.ingest.sharding import ShardConfig
from tesla_gateway.mqtt.config import DEFAULT_MAX_INBOX, MqttBrokerConfig
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.inbox import InboundMessage
from tesla_gateway.mqtt.topics import TopicFilter
from tesla_gateway.sources.payload_rules import PayloadRules
from tesla_gateway.sources.payloads import decode_payload_fully
from tesla_gateway.sources.payloads_fast import decode_plain_payload

__all__ = ["MqttSource", "MqttSourceConfig", "MqttSourceStats"]

SOURCE_NAME = "mqtt"


class MqttSourceConfig(BaseModel):
    """Where the sensors publish and how their payloads are read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    broker: MqttBrokerConfig = Field(
        default_factory=MqttBrokerConfig, description="Broker the sensors publish to."
    )
    topics: list[Annotated[str, AfterValidator(TopicFilter)]] = Field(
        default_factory=lambda: ["sensors/+/raw"],
        validate_default=True,
        min_length=1,
        description="Topic filters to subscribe to (MQTT wildcards allowed).",
    )
    sensor_id_topic_level: int | None = Field(
        default=1,
        ge=0,
        le=32,
        description=(
            "0-based topic level holding the sensor id ('sensors/<id>/raw' -> 1); "
            "null to take it from the payload's 'sensor' key."
        ),
    )
    qos: int = Field(default=1, ge=0, le=2, description="Subscription QoS; 1 for at-least-once.")
    client_id: str | None = Field(
        default=None,
        max_length=64,
        description="Fixed client id for the persistent session; default tesla-gateway-<id>-in.",
    )
    persistent_session: bool = Field(
        default=True,
        description="Keep the session (and queued readings) across gateway restarts.",
    )
    session_expiry_s: int = Field(
        default=7 * 24 * 3600,
        ge=0,
        description="MQTT 5: how long the broker keeps the session while the gateway is away.",
    )
    max_payload_bytes: int = Field(
        default=65_536, ge=64, le=16 * 1024 * 1024, description="Larger payloads are rejected."
    )
    max_batch: int = Field(default=1_000, ge=1, description="Most readings in one JSON array.")
    max_inbox_messages: int = Field(
        default=DEFAULT_MAX_INBOX,
        ge=1,
        le=1_000_000,
        description=(
            "Most received messages waiting to be decoded; beyond it QoS 0 messages are "
            "dropped (counted) and QoS 1 ones are left unacknowledged at the broker."
        ),
    )
    max_future_s: float = Field(
        default=300.0, ge=0, description="Readings further in the future are rejected."
    )
    max_age_s: float | None = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="Readings older than this are rejected as stale; null accepts any age.",
    )
    allowed_sensors: list[str] | None = Field(
        default=None, description="If set, readings from other sensor ids are rejected."
    )
    shard: ShardConfig | None = Field(
        default=None,
        description=(
            "Keep only the sensors of this shard of a consistent hash over sensor ids "
            "(several gateways on one topic space; docs/deployment.md). Omit: all sensors."
        ),
    )

    def payload_rules(self) -> PayloadRules:
        return PayloadRules(
            max_payload_bytes=self.max_payload_bytes,
            max_batch=self.max_batch,
            max_future_s=self.max_future_s,
            max_age_s=self.max_age_s,
            allowed_sensors=frozenset(self.allowed_sensors) if self.allowed_sensors else None,
        )


@dataclass(frozen=True, slots=True)
class MqttSourceStats:
    """A snapshot of one subscription: connected, readings of other shards, inbox hand-off,
    connections made, lost and taken over by another client with this client id."""

    connected: bool
    other_shard: int
    inbox: dict[str, int]
    session: dict[str, int | float | None]  # MqttConnection.session_stats()


class MqttSource:
    """Subscribes to the sensor topics and feeds validated readings into the gateway's queue."""

    def __init__(
        self,
        config: MqttSourceConfig,
        *,
        gateway_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._client_id = config.client_id or f"tesla-gateway-{gateway_id}-in"
        self._clock = clock
        self._rules = config.payload_rules()
        self._log = structlog.get_logger("tesla_gateway.sources.mqtt")
        self._connection: MqttConnection | None = None
        self._started = asyncio.Event()
        self._inbox_stats: dict[str, int] = {}
        self._session_stats: dict[str, int | float | None] = {}
        self._other_shard = 0  # readings left to the gateways of other shards (not rejects)

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.connected

    @property
    def other_shard(self) -> int:
        """Readings left to the gateways of other shards (not rejects)."""
        return self._other_shard

    def stats(self) -> MqttSourceStats:
        """This source's part of the stats topic."""
        connection = self._connection
        if connection is not None:
            self._session_stats = connection.session_stats()
        return MqttSourceStats(
            connected=self.connected,
            other_shard=self._other_shard,
            inbox=self.inbox_stats(),
            session=dict(self._session_stats),
        )

    def inbox_stats(self) -> dict[str, int]:
        """The connection's receive hand-off (:meth:`MqttConnection.inbox_stats`); the last
        figures once the source has stopped."""
        connection = self._connection
        if connection is not None:
            self._inbox_stats = connection.inbox_stats()
        return self._inbox_stats

    async def wait_connected(self) -> None:
        """Return once subscribed (tests and start-up ordering use this)."""
        while True:
            await self._started.wait()
            connection = self._connection
            if connection is not None:
                await connection.wait_connected()
                return

    async def run(self, queue: asyncio.Queue[Reading], rejects: RejectCounter) -> None:
        """Run until cancelled; reconnects on its own; bad payloads are counted, never raised."""

        async def on_message(message: InboundMessage) -> None:
            for reading in self._decode(message, rejects):
                try:
                    queue.put_nowait(reading)  # refused, and nothing logged, when full
                except asyncio.QueueFull:
                    await queue.put(reading)  # backpressure: wait for the ingest loop

        persistent = self._config.persistent_session
        connection = MqttConnection(
            self._config.broker,
            client_id=self._client_id,
            clean_start=not persistent,
            on_message=on_message,
            before_ack=lambda: commit_queued(queue),  # in the ingest log before the PUBACKs
            session_expiry_s=self._config.session_expiry_s if persistent else 0,
            max_inbox=self._config.max_inbox_messages,
            name="source",
        )
        async with connection:
            self._connection = connection
            self._started.set()
            try:
                await connection.subscribe(self._config.topics, qos=self._config.qos)
                await connection.serve()
            finally:
                self._inbox_stats = connection.inbox_stats()
                self._session_stats = connection.session_stats()
                self._connection = None
                self._started.clear()

    def _decode(self, message: InboundMessage, rejects: RejectCounter) -> Sequence[Reading]:
        topic_sensor_id: str | None = None
        shard = self._config.shard
        try:
            topic_sensor_id = self._topic_sensor_id(message.topic)
            if (
                topic_sensor_id is not None
                and shard is not None
                and not shard.owns(topic_sensor_id)
            ):
                self._other_shard += 1
                return ()  # another gateway's sensor: not even parsed
            received_at = self._clock()
            # decode_payload's two steps, taken here so that the usual message (plainly valid,
            # no rejects) costs no DecodedPayload: this runs for every message.
            readings = decode_plain_payload(
                message.payload,
                topic_sensor_id=topic_sensor_id,
                received_at=received_at,
                source=SOURCE_NAME,
                rules=self._rules,
            )
            if readings is None:
                decoded = decode_payload_fully(
                    message.payload,
                    topic_sensor_id=topic_sensor_id,
                    received_at=received_at,
                    source=SOURCE_NAME,
                    rules=self._rules,
                )
                readings = decoded.readings
                for reject in decoded.rejects:
                    rejects.reject_error(
                        reject, source=SOURCE_NAME, sensor=topic_sensor_id, where=message.topic
                    )
        except ReadingRejectedError as exc:
            rejects.reject_error(
                exc, source=SOURCE_NAME, sensor=topic_sensor_id, where=message.topic
            )
            return ()
        if shard is None:
            return readings
        owned = [reading for reading in readings if shard.owns(reading.sensor_id)]
        self._other_shard += len(readings) - len(owned)
        return owned

    def _topic_sensor_id(self, topic: str) -> str | None:
        level = self._config.sensor_id_topic_level
        if level is None:
            return None
        levels = topic.split("/")
        if level >= len(levels):
            raise ReadingRejectedError(
                RejectReason.BAD_SENSOR_ID,
                f"topic {topic[:100]!r} has no level {level} to take the sensor id from",
            )
        sensor_id = levels[level]
        if not SENSOR_ID_PATTERN.fullmatch(sensor_id):
            raise ReadingRejectedError(
                RejectReason.BAD_SENSOR_ID,
                f"topic level {level} {sensor_id[:64]!r} is not a valid sensor id",
            )
        return sensor_id
