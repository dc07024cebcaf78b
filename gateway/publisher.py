"""Calibrated readings out over MQTT, with store-and-forward (topics: docs/mqtt.md).

``submit`` never waits for the network: messages go into the persisted :class:`Outbox` and a
delivery task sends them in order whenever the broker is connected, keeping up to ``in_flight``
messages awaiting PUBACK and deleting each from the outbox only once acknowledged. The
availability topic is ``online`` while connected and ``offline`` (the retained last will, or an
explicit message on clean shutdown) otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.calibrated import CalibratedReading
from gateway.discovery import discovery_message
from gateway.errors import GatewayError
from gateway.mqtt.config import MqttBrokerConfig, Will
from gateway.mqtt.connection import MqttConnection
from gateway.mqtt.errors import MqttNotConnectedError, MqttPublishError
from gateway.mqtt.topics import PublishTopic
from gateway.outbox import Outbox, OutboxMessage, QueuedMessage
from gateway.readings import SENSOR_ID_PATTERN
from gateway.set_aside import SetAsideLog
from gateway.task_group import run_task_group

__all__ = [
    "OUTBOX_FILENAME",
    "Publisher",
    "PublisherConfig",
    "PublisherError",
    "iso8601",
    "reading_payload",
]

OUTBOX_FILENAME = "outbox.sqlite3"
DISPLAY_UNIT = "µg/m³"
_NOT_CONNECTED_RETRY_S = 0.05


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark an abandoned publish's outcome as seen (asyncio logs unretrieved exceptions)."""
    if not future.cancelled():
        future.exception()


_UNIT_ALIASES = {"ug/m3": DISPLAY_UNIT, "µg/m3": DISPLAY_UNIT, DISPLAY_UNIT: DISPLAY_UNIT}


class PublisherError(GatewayError):
    """A calibrated reading cannot be turned into a valid topic (a bug upstream)."""


class PublisherConfig(BaseModel):
    """Where and how calibrated readings are published."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    broker: MqttBrokerConfig = Field(
        default_factory=MqttBrokerConfig, description="Broker to publish to."
    )
    topic_prefix: str | None = Field(
        default=None, description="Topic prefix; default 'tesla/<gateway_id>'."
    )
    client_id: str | None = Field(
        default=None, max_length=64, description="Client id; default tesla-gateway-<id>-out."
    )
    qos: Literal[1, 2] = Field(
        default=1, description="QoS of calibrated readings (at least 1: the outbox needs acks)."
    )
    retain: bool = Field(default=True, description="Retain the latest value of each topic.")
    stats_interval_s: float = Field(
        default=60.0, gt=0, description="How often the stats topic is published."
    )
    discovery: bool = Field(default=False, description="Publish Home Assistant discovery configs.")
    discovery_prefix: str = Field(
        default="homeassistant", min_length=1, description="Home Assistant discovery prefix."
    )
    outbox_max_messages: int = Field(
        default=100_000,
        ge=1,
        description="Bound of the store-and-forward queue; beyond it the oldest are dropped.",
    )
    in_flight: int = Field(
        default=256,
        ge=1,
        le=65_535,
        description=(
            "Messages sent ahead while awaiting PUBACKs (a sliding window); the broker's "
            "MQTT 5 Receive Maximum caps it (mosquitto: max_inflight_messages, default 20)."
        ),
    )
    shutdown_flush_s: float = Field(
        default=5.0, ge=0, description="On shutdown, how long to keep delivering queued messages."
    )
    per_sensor_topics: bool = Field(
        default=True,
        description="Publish each calibrated reading on <prefix>/<sensor_id>/<feature>.",
    )
    batch_topic: bool = Field(
        default=False,
        description=(
            "Also (or, with per_sensor_topics = false, only) publish each tick's readings as JSON "
            "arrays on <prefix>/_batch/<feature>: one message per batch_max_readings readings."
        ),
    )
    batch_max_readings: int = Field(
        default=1000, ge=1, le=100_000, description="Most readings in one batch message."
    )

    @field_validator("topic_prefix", "discovery_prefix")
    @classmethod
    def _plain_topic(cls, value: str | None) -> str | None:
        return None if value is None else PublishTopic(value)

    @model_validator(mode="after")
    def _publishes_readings(self) -> Self:
        if not (self.per_sensor_topics or self.batch_topic):
            raise ValueError("per_sensor_topics and batch_topic cannot both be false")
        return self


@functools.lru_cache(maxsize=4096)  # a tick's readings share their period's two timestamps
def iso8601(timestamp: float) -> str:
    """UTC ISO-8601 with a 'Z', as every timestamp on our topics."""
    text = datetime.fromtimestamp(timestamp, UTC).isoformat()
    return text.replace("+00:00", "Z")


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _mark_retrieved(future: asyncio.Future[Any]) -> None:
    """Outcomes reach serve()'s caller through the shield; after a cancel, aclose() sees them."""
    if not future.cancelled():
        future.exception()


def reading_payload(reading: CalibratedReading) -> dict[str, object]:
    """The JSON document of a calibrated topic (docs/mqtt.md)."""
    return {
        "ts": iso8601(reading.period_start + reading.period_seconds),
        "period_start": iso8601(reading.period_start),
        "period_s": reading.period_seconds,
        "raw": _finite(reading.raw),
        "calibrated": _finite(reading.calibrated),
        "unit": _UNIT_ALIASES.get(reading.unit, reading.unit),
        "model": reading.model_name,
        "model_version": reading.model_version,
        "quality": [quality.value for quality in reading.quality],
    }


class Publisher:
    """Publishes calibrated readings, availability, stats and discovery; owns its outbox.

    The outbox is opened at construction so :meth:`submit` works before the network side runs;
    ``async with publisher`` (or ``await publisher.run()``) connects and delivers.
    """

    def __init__(
        self,
        config: PublisherConfig,
        *,
        gateway_id: str,
        state_dir: Path,
        set_aside: SetAsideLog | None = None,
    ) -> None:
        if not SENSOR_ID_PATTERN.fullmatch(gateway_id):
            raise PublisherError(
                f"gateway id {gateway_id!r} must match {SENSOR_ID_PATTERN.pattern}"
            )
        self._config = config
        self._gateway_id = gateway_id
        self.topic_prefix = config.topic_prefix or f"tesla/{gateway_id}"
        self._client_id = config.client_id or f"tesla-gateway-{gateway_id}-out"
        self._outbox = Outbox.open(  # a disk that refuses it: in memory, reported in stats
            state_dir / OUTBOX_FILENAME,
            max_messages=config.outbox_max_messages,
            set_aside=set_aside,
            memory_fallback=True,
        )
        self._log = structlog.get_logger("gateway.publisher").bind(prefix=self.topic_prefix)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._known: dict[tuple[str, str], None] = {}  # (sensor, feature), insertion-ordered
        self._announced: set[tuple[str, str]] = set()
        self._stats: dict[str, object] | None = None
        self._published = 0
        self._dropped = 0
        self._refused = 0
        self._connection: MqttConnection | None = None
        self._runner: asyncio.Task[None] | None = None  # delivery and stats, in a TaskGroup
        self._closed_counts: tuple[int, int] | None = None  # (queued, dropped_total) at close

    # -- topics ----------------------------------------------------------------------------

    @property
    def status_topic(self) -> str:
        return f"{self.topic_prefix}/status"

    @property
    def stats_topic(self) -> str:
        return f"{self.topic_prefix}/stats"

    def state_topic(self, sensor_id: str, feature: str) -> str:
        return f"{self.topic_prefix}/{sensor_id}/{feature}"

    def sensor_topic(self, sensor_id: str, feature: str, kind: Literal["health", "drift"]) -> str:
        """``<prefix>/<sensor>/<feature>/health`` or ``.../drift`` (docs/mqtt.md)."""
        if not SENSOR_ID_PATTERN.fullmatch(sensor_id) or not SENSOR_ID_PATTERN.fullmatch(feature):
            raise PublisherError(f"sensor {sensor_id!r} / feature {feature!r} cannot be a topic")
        return f"{self.state_topic(sensor_id, feature)}/{kind}"

    # -- the non-blocking side -------------------------------------------------------------

    def submit(self, readings: Sequence[CalibratedReading]) -> None:
        """Queue calibrated readings for delivery (persisted; returns at once)."""
        if self._closed_counts is not None:
            raise PublisherError("the publisher is closed; readings can no longer be queued")
        messages: list[OutboxMessage] = []
        for reading in readings:
            if not SENSOR_ID_PATTERN.fullmatch(
                reading.sensor_id
            ) or not SENSOR_ID_PATTERN.fullmatch(reading.feature):
                raise PublisherError(
                    f"sensor {reading.sensor_id!r} / feature {reading.feature!r} cannot be a topic"
                )
        if self._config.per_sensor_topics:
            for reading in readings:
                payload = json.dumps(reading_payload(reading), ensure_ascii=False).encode("utf-8")
                messages.append(
                    OutboxMessage(
                        topic=self.state_topic(reading.sensor_id, reading.feature),
                        payload=payload,
                        qos=self._config.qos,
                        retain=self._config.retain,
                    )
                )
                self._known.setdefault((reading.sensor_id, reading.feature), None)
        if self._config.batch_topic:
            messages.extend(self._batch_messages(readings))
        self._enqueue(messages)

    def batch_topic(self, feature: str) -> str:
        """``<prefix>/_batch/<feature>``: a sensor id cannot start with '_', so no clash."""
        return f"{self.topic_prefix}/_batch/{feature}"

    def _batch_messages(self, readings: Sequence[CalibratedReading]) -> list[OutboxMessage]:
        """Each feature's readings as JSON arrays of the per-sensor documents plus 'sensor'."""
        by_feature: dict[str, list[dict[str, object]]] = {}
        for reading in readings:
            document = {"sensor": reading.sensor_id, **reading_payload(reading)}
            by_feature.setdefault(reading.feature, []).append(document)
        size = self._config.batch_max_readings
        return [
            OutboxMessage(
                topic=self.batch_topic(feature),
                payload=json.dumps(documents[start : start + size], ensure_ascii=False).encode(),
                qos=self._config.qos,
                retain=False,
            )
            for feature, documents in by_feature.items()
            for start in range(0, len(documents), size)
        ]

    def submit_documents(self, documents: Sequence[tuple[str, Mapping[str, object]]]) -> None:
        """Queue retained JSON documents (health, drift: docs/mqtt.md) behind the readings.

        Each topic must lie under this publisher's prefix (build it with :meth:`sensor_topic`).
        """
        if self._closed_counts is not None:
            raise PublisherError("the publisher is closed; documents can no longer be queued")
        messages: list[OutboxMessage] = []
        for topic, document in documents:
            if not topic.startswith(self.topic_prefix + "/"):
                raise PublisherError(f"topic {topic!r} is not under {self.topic_prefix!r}")
            payload = json.dumps(document, ensure_ascii=False, default=str).encode("utf-8")
            messages.append(
                OutboxMessage(topic=topic, payload=payload, qos=self._config.qos, retain=True)
            )
        self._enqueue(messages)

    def _enqueue(self, messages: Sequence[OutboxMessage]) -> None:
        dropped = self._outbox.append(messages)
        if dropped:
            self._dropped += dropped
            self._log.warning(
                "outbox_full_dropped_oldest",
                dropped=dropped,
                dropped_total=self._outbox.dropped_total,
                bound=self._config.outbox_max_messages,
            )
        if messages:
            self._idle.clear()
            self._wake.set()

    def submit_stats(self, stats: Mapping[str, object]) -> None:
        """Replace the snapshot published on the stats topic every ``stats_interval_s``."""
        self._stats = dict(stats)

    def stats(self) -> dict[str, object]:
        """The publisher's own counters (also merged into the stats topic under 'publisher')."""
        queued, dropped_total = self._closed_counts or (
            len(self._outbox),
            self._outbox.dropped_total,
        )
        return {
            "connected": self.connected,
            "queued": queued,
            "published": self._published,
            "dropped": self._dropped,
            "dropped_total": dropped_total,
            "refused": self._refused,
            "outbox": self._outbox.stats(),
        }

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.connected

    @property
    def outbox_in_memory(self) -> bool:
        """The outbox could not use its file (full or read-only disk): kept in memory."""
        return self._outbox.in_memory

    @property
    def queued(self) -> int:
        return self._closed_counts[0] if self._closed_counts else len(self._outbox)

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        connection = MqttConnection(
            self._config.broker,
            client_id=self._client_id,
            clean_start=True,
            will=Will(self.status_topic, b"offline", qos=1, retain=True),
            max_in_flight=self._config.in_flight,
            name="publisher",
        )
        await connection.__aenter__()
        self._connection = connection
        tasks = {
            "publisher-deliver": self._deliver_forever(connection),
            "publisher-stats": self._stats_forever(connection),
        }
        self._runner = asyncio.create_task(run_task_group(tasks), name="publisher")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def run(self) -> None:
        """Connect and deliver until cancelled, then shut down cleanly."""
        async with self:
            await self.serve()

    async def serve(self) -> None:
        """Wait while delivering; raises if a background task fails."""
        connection, runner = self._connection, self._runner
        if connection is None or runner is None:
            raise PublisherError("Publisher.serve() needs 'async with publisher' first")
        # Shielded: cancelling serve() (a shutdown) must not cancel delivery, or aclose() could
        # not flush the outbox; aclose() stops the tasks itself once it has flushed.
        watched = asyncio.gather(connection.serve(), runner)
        watched.add_done_callback(_mark_retrieved)
        await asyncio.shield(watched)

    async def wait_idle(self) -> None:
        """Return once everything queued so far has been acknowledged by the broker."""
        while len(self._outbox):
            self._idle.clear()
            await self._idle.wait()

    async def aclose(self) -> None:
        """Deliver what can be delivered within ``shutdown_flush_s``, say offline, disconnect."""
        connection, self._connection = self._connection, None
        try:
            if connection is not None and connection.connected and len(self._outbox):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wait_idle(), self._config.shutdown_flush_s)
            runner, self._runner = self._runner, None
            if runner is not None:
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            if connection is not None:
                if connection.connected:
                    with contextlib.suppress(MqttNotConnectedError, TimeoutError):
                        await asyncio.wait_for(
                            connection.publish(self.status_topic, b"offline", retain=True), 2.0
                        )
                await connection.close()
        finally:
            if self._closed_counts is None:
                self._closed_counts = (len(self._outbox), self._outbox.dropped_total)
                self._outbox.close()
            self._log.info("publisher_closed", queued=self._closed_counts[0])

    # -- delivery --------------------------------------------------------------------------

    async def _deliver_forever(self, connection: MqttConnection) -> None:
        while True:
            await connection.wait_connected()
            try:
                await self._publish_or_log(connection, self.status_topic, b"online")
                self._announced.clear()
                await self._drain(connection)
            except MqttNotConnectedError:
                self._log.info("publisher_waiting_for_broker", queued=len(self._outbox))
                # paho can refuse a publish a moment before its disconnect reaches the loop;
                # yield to it (and back off) rather than spin on a connection already gone.
                await asyncio.sleep(_NOT_CONNECTED_RETRY_S)

    async def _drain(self, connection: MqttConnection) -> None:
        """Send the outbox in order until the connection is lost (then raise).

        A sliding window: up to ``in_flight`` messages await their PUBACK, and each
        acknowledgement lets the next message go, so the link never idles while messages are
        queued. (Sending ``in_flight`` and waiting for all of them left it idle for a round
        trip every 32 messages: p99 0.6-2.3 s at 10,000 per-sensor messages a second.)
        """
        pending: deque[tuple[QueuedMessage, asyncio.Future[None]]] = deque()
        sent_up_to = 0  # outbox id of the last message handed to the broker on this connection
        try:
            while True:
                window = min(self._config.in_flight, connection.server_receive_maximum)
                room = window - len(pending)
                batch = self._outbox.peek_after(sent_up_to, room) if room > 0 else []
                if batch:
                    await self._announce(connection)
                    pending.extend(zip(batch, self._start(connection, batch), strict=True))
                    sent_up_to = batch[-1].id
                    continue
                if not pending:
                    self._idle.set()
                    self._wake.clear()
                    if not len(self._outbox):
                        await self._wait_for_work(connection)
                    continue
                # Nothing more to send now: wait for the oldest acknowledgement or, if the
                # window has room, for new messages (no await since the peek: none missed).
                self._wake.clear()
                await self._wait_for_progress(pending[0][1], room > 0)
                self._settle_acknowledged(pending)
        finally:
            for _, future in pending:  # resolved later by the connection; nobody awaits them
                future.add_done_callback(_retrieve)

    @staticmethod
    def _start(
        connection: MqttConnection, batch: list[QueuedMessage]
    ) -> list[asyncio.Future[None]]:
        """Hand a batch to the broker in one write (QoS 1), or one by one at another QoS."""
        if all(message.qos == 1 for message in batch):
            return connection.start_publish_many([(m.topic, m.payload, m.retain) for m in batch])
        futures: list[asyncio.Future[None]] = []
        for message in batch:
            try:
                futures.append(
                    connection.start_publish(
                        message.topic, message.payload, qos=message.qos, retain=message.retain
                    )
                )
            except MqttPublishError as exc:  # refused before sending: settled as refused
                refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                refused.set_exception(exc)
                futures.append(refused)
        return futures

    async def _wait_for_progress(self, oldest: asyncio.Future[None], or_new_work: bool) -> None:
        if not or_new_work:
            await asyncio.wait({oldest})
            return
        wake: asyncio.Future[Any] = asyncio.ensure_future(self._wake.wait())
        waiting: set[asyncio.Future[Any]] = {oldest, wake}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()

    def _settle_acknowledged(
        self, pending: deque[tuple[QueuedMessage, asyncio.Future[None]]]
    ) -> None:
        """Settle the acknowledged messages at the front of the window (all resolved ones once
        the connection is lost, so that no acknowledged message is sent again)."""
        settled: list[tuple[QueuedMessage, asyncio.Future[None]]] = []
        while pending and pending[0][1].done():
            settled.append(pending.popleft())
        if any(isinstance(f.exception(), MqttNotConnectedError) for _, f in settled):
            settled += [entry for entry in pending if entry[1].done()]
        if settled:
            self._settle([m for m, _ in settled], [f.exception() for _, f in settled])

    def _settle(self, batch: list[QueuedMessage], results: list[BaseException | None]) -> None:
        done: list[int] = []
        lost = False
        for message, result in zip(batch, results, strict=True):
            if result is None:
                done.append(message.id)
                self._published += 1
            elif isinstance(result, MqttPublishError):
                # The broker will never take it (e.g. ACL): retrying would block the queue.
                done.append(message.id)
                self._refused += 1
                self._log.error("publish_refused", topic=message.topic, error=str(result))
            elif isinstance(result, MqttNotConnectedError):
                lost = True
            else:
                raise result
        self._outbox.remove(done)
        if lost:
            raise MqttNotConnectedError("connection lost during delivery; will resume in order")

    async def _wait_for_work(self, connection: MqttConnection) -> None:
        wake = asyncio.create_task(self._wake.wait())
        lost = asyncio.create_task(connection.wait_disconnected())
        try:
            await asyncio.wait({wake, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
            lost.cancel()
        if not connection.connected:
            raise MqttNotConnectedError("connection lost while idle")

    async def _announce(self, connection: MqttConnection) -> None:
        if not self._config.discovery:
            return
        pending = [pair for pair in self._known if pair not in self._announced]
        for sensor_id, feature in pending:
            topic, payload = discovery_message(
                discovery_prefix=self._config.discovery_prefix,
                gateway_id=self._gateway_id,
                sensor_id=sensor_id,
                feature=feature,
                state_topic=self.state_topic(sensor_id, feature),
                availability_topic=self.status_topic,
            )
            await self._publish_or_log(connection, topic, payload)
            self._announced.add((sensor_id, feature))

    async def _publish_or_log(self, connection: MqttConnection, topic: str, payload: bytes) -> None:
        """Retained QoS 1 publish whose refusal by the broker (an ACL) must not stop delivery."""
        try:
            await connection.publish(topic, payload, qos=1, retain=True)
        except MqttPublishError as exc:
            self._refused += 1
            self._log.error("publish_refused", topic=topic, error=str(exc))

    async def _stats_forever(self, connection: MqttConnection) -> None:
        while True:
            await asyncio.sleep(self._config.stats_interval_s)
            await self.publish_stats(connection)

    async def publish_stats(self, connection: MqttConnection | None = None) -> bool:
        """Publish the stats snapshot now; False if not connected (the next one replaces it)."""
        connection = connection or self._connection
        if connection is None or not connection.connected:
            return False
        document = {**(self._stats or {}), "publisher": self.stats(), "ts": iso8601(_now())}
        payload = json.dumps(document, ensure_ascii=False, default=str).encode("utf-8")
        try:
            await connection.publish(self.stats_topic, payload, qos=1, retain=True)
        except MqttNotConnectedError:
            return False
        return True


def _now() -> float:
    return datetime.now(UTC).timestamp()
