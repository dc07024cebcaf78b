"""Calibrated readings, health/drift documents and stats out over MQTT, store-and-forward.

The composition of the publish package: ``submit`` never waits for the network: messages
(:mod:`tesla_gateway.publish.payloads`, on the topics of
:mod:`tesla_gateway.publish.topics`) go into the
persisted :class:`Outbox` and the :class:`Delivery` window sends them in order whenever the broker
is connected, deleting each from the outbox only once acknowledged. Discovery configs go ahead
of what they describe (:mod:`tesla_gateway.publish.announcer`). The availability topic is
``online`` while connected and ``offline`` (the retained last will, or an explicit message on
clean shutdown) otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import structlog

from tesla_gateway.contract.calibrated import CalibratedReading
from tesla_gateway.contract.readings import SENSOR_ID_PATTERN
from tesla_gateway.monitor.monitor import SensorDocument
from tesla_gateway.mqtt.config import Will
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.errors import MqttNotConnectedError
from tesla_gateway.publish.announcer import DiscoveryAnnouncer
from tesla_gateway.publish.availability import SensorAvailability
from tesla_gateway.publish.config import PublisherConfig
from tesla_gateway.publish.delivery import Delivery
from tesla_gateway.publish.discovery import Discovery
from tesla_gateway.publish.errors import PublisherError
from tesla_gateway.publish.outbox import Outbox
from tesla_gateway.publish.outbox_messages import OutboxMessage
from tesla_gateway.publish.payloads import batch_payloads, document_payload, reading_message
from tesla_gateway.publish.stats_topic import StatsTopic
from tesla_gateway.publish.topics import OWN_PREFIX_PROBLEM, TopicScheme, shares_levels
from tesla_gateway.set_aside import SetAsideLog
from tesla_gateway.task_group import run_task_group

__all__ = ["OUTBOX_FILENAME", "Publisher"]

OUTBOX_FILENAME = "outbox.sqlite3"
_OUTBOX_HOME_POLL_S = 1.0  # how often a memory outbox is offered its file (it retries every 5 s)
_LOGGED_IDS = 1024  # unpublishable sensor ids named in the log once each, at most this many


def _mark_retrieved(future: asyncio.Future[Any]) -> None:
    """Outcomes reach serve()'s caller through the shield; after a cancel, aclose() sees them."""
    if not future.cancelled():
        future.exception()


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
        cluster_prefix: str | None = None,
    ) -> None:
        """``cluster_prefix`` (cluster mode): the sensors' topics go under it, the same on every
        gateway, and the gateway's own (status, stats) stay under ``topic_prefix``."""
        if not SENSOR_ID_PATTERN.fullmatch(gateway_id):
            raise PublisherError(
                f"gateway id {gateway_id!r} must match {SENSOR_ID_PATTERN.pattern}"
            )
        self._config = config
        self._gateway_id = gateway_id
        own_prefix = config.topic_prefix or f"tesla/{gateway_id}"
        if cluster_prefix is not None and shares_levels(own_prefix, cluster_prefix):
            raise PublisherError(OWN_PREFIX_PROBLEM.format(own_prefix, cluster_prefix))
        self._cluster = cluster_prefix is not None
        self.topic_prefix = cluster_prefix or own_prefix
        self.topics = TopicScheme(self.topic_prefix, own_prefix=own_prefix)
        self._client_id = config.client_id or f"tesla-gateway-{gateway_id}-out"
        self._outbox = Outbox.open(  # a disk that refuses it: in memory, reported in stats
            state_dir / OUTBOX_FILENAME,
            max_messages=config.outbox_max_messages,
            set_aside=set_aside,
            memory_fallback=True,
        )
        self._log = structlog.get_logger("tesla_gateway.publish.publisher").bind(
            prefix=self.topic_prefix
        )
        self._delivery = Delivery(
            self._outbox,
            in_flight=config.in_flight,
            before_send=self._announce,
            log=self._log,
        )
        discovery = Discovery(
            discovery_prefix=config.discovery_prefix,
            gateway_id=gateway_id,
            topics=self.topics,
            sensor_availability=config.sensor_offline_after_s is not None,
            support_url=config.discovery_support_url,
            cluster=self._cluster,
            expire_after_s=config.discovery_expire_after_s,
        )
        self._announcer = DiscoveryAnnouncer(discovery, enabled=config.discovery)
        self._availability = (
            None
            if config.sensor_offline_after_s is None
            else SensorAvailability(config.sensor_offline_after_s)
        )
        self._stats_topic = StatsTopic(
            self.topics.stats, interval_s=config.stats_interval_s, counters=self.stats
        )
        self._dropped = 0
        self._unpublishable = 0  # values skipped: their sensor or feature cannot be a topic
        self._unpublishable_logged: set[str] = set()
        self._connection: MqttConnection | None = None
        self._runner: asyncio.Task[None] | None = None  # delivery and stats, in a TaskGroup
        self._closed_counts: tuple[int, int] | None = None  # (queued, dropped_total) at close
        self._session: dict[str, int | float | None] = {}  # the connection's, kept after close

    # -- the non-blocking side -------------------------------------------------------------

    def submit(self, readings: Sequence[CalibratedReading]) -> None:
        """Queue calibrated readings for delivery (persisted; returns at once). A reading whose
        ids cannot be a topic is skipped and counted; the others go out."""
        if self._closed_counts is not None:
            raise PublisherError("the publisher is closed; readings can no longer be queued")
        readings = [r for r in readings if self._publishable(r.sensor_id, r.feature)]
        returning = self._announcer.returning(readings)  # evicted earlier, back: configs first
        messages = [self._retained(m.topic, m.payload) for m in returning]
        if self._config.per_sensor_topics:
            for reading in readings:
                messages.append(
                    OutboxMessage(
                        topic=self.topics.state(reading.sensor_id, reading.feature),
                        payload=reading_message(reading),
                        qos=self._config.qos,
                        retain=self._config.retain,
                    )
                )
            self._announcer.readings_queued(readings)
        if self._config.batch_topic:
            messages.extend(self._batch_messages(readings))
        self._enqueue(messages)

    def _publishable(self, sensor_id: str, feature: str) -> bool:
        """False (counted, the id logged once) for ids that cannot be topic levels: one such
        value must not cost the batch it came in."""
        try:
            self.topics.check_ids(sensor_id, feature)
        except PublisherError as exc:
            self._unpublishable += 1
            key = f"{sensor_id[:80]}/{feature[:40]}"
            if (
                key not in self._unpublishable_logged
                and len(self._unpublishable_logged) < _LOGGED_IDS
            ):
                self._unpublishable_logged.add(key)
                self._log.error(
                    "publish_unpublishable",
                    sensor=sensor_id[:80],
                    feature=feature[:40],
                    error=str(exc),
                    hint="skipped (counted in stats 'unpublishable'); sensor ids must match "
                    f"{SENSOR_ID_PATTERN.pattern}",
                )
            return False
        return True

    def _retained(self, topic: str, payload: bytes) -> OutboxMessage:
        return OutboxMessage(topic=topic, payload=payload, qos=self._config.qos, retain=True)

    def sensor_seen(self, sensor_id: str) -> None:
        """A reading of this sensor was admitted: ``online`` on its availability topic if it
        was not (per-sensor availability on)."""
        if self._availability is None or self._closed_counts is not None:
            return
        if self._availability.seen(sensor_id):
            self._enqueue([self._retained(self.topics.availability(sensor_id), b"online")])

    def adopt_sensors(self, idle_s: Mapping[str, float]) -> None:
        """Sensors with restored windows, by seconds since their last reading: each gets its
        true availability now (the previous run's retained state may be stale). Not in a
        cluster: a sensor's availability is its current owner's, which says ``online`` when it
        takes the sensor, and this gateway may own it no more."""
        if not self._cluster:
            self.take_over_sensors(idle_s)

    def expire_quiet_sensors(self) -> list[str]:
        """Sensors quiet for ``sensor_offline_after_s`` go ``offline``; the ids (also run by the
        availability task)."""
        if self._availability is None or self._closed_counts is not None:
            return []
        quiet = self._availability.expire()
        if quiet:
            self._enqueue([self._retained(self.topics.availability(s), b"offline") for s in quiet])
            self._log.info("sensors_offline", count=len(quiet), sensors=quiet[:20])
        return quiet

    def take_over_sensors(self, idle_s: Mapping[str, float]) -> None:
        """This gateway of the cluster took these sensors over (seconds since their last
        reading): those not seen since go ``online`` or, quiet too long, ``offline``, so a
        sensor that went quiet as its owner died does not stay ``online``."""
        if self._availability is None or self._closed_counts is not None:
            return
        online, offline = self._availability.adopt(idle_s)
        self._enqueue(
            [self._retained(self.topics.availability(s), b"online") for s in online]
            + [self._retained(self.topics.availability(s), b"offline") for s in offline]
        )

    def hand_off_sensors(self, sensor_ids: Sequence[str]) -> None:
        """Another gateway of the cluster publishes these sensors now: no longer tracked, and
        nothing said (their topics, availability and discovery configs are the cluster's)."""
        if self._availability is not None:
            self._availability.forget(sensor_ids)

    def forget_sensors(self, sensor_ids: Sequence[str]) -> None:
        """Evicted sensors: their discovery configs and availability are removed (empty
        retained payloads, through the outbox), so Home Assistant drops their entities."""
        if not sensor_ids or self._closed_counts is not None:
            return
        removals = self._announcer.forget(sensor_ids)
        messages: list[OutboxMessage] = []
        if self._availability is not None:
            self._availability.forget(sensor_ids)
            messages.extend(self._retained(self.topics.availability(s), b"") for s in sensor_ids)
        messages.extend(self._retained(m.topic, m.payload) for m in removals)
        self._enqueue(messages)

    def _batch_messages(self, readings: Sequence[CalibratedReading]) -> list[OutboxMessage]:
        """Each feature's readings as JSON arrays of the per-sensor documents plus 'sensor'."""
        return [
            OutboxMessage(
                topic=self.topics.batch(feature),
                payload=payload,
                qos=self._config.qos,
                retain=False,
            )
            for feature, payload in batch_payloads(readings, self._config.batch_max_readings)
        ]

    def submit_documents(self, documents: Sequence[SensorDocument]) -> None:
        """Queue the monitor's retained documents (health, drift: docs/mqtt.md) behind the
        readings, each on ``<prefix>/<sensor>/<feature>/<kind>``. In a cluster each names
        the gateway that judged it (the sensor's owner then), as its topic no longer does."""
        if self._closed_counts is not None:
            raise PublisherError("the publisher is closed; documents can no longer be queued")
        judge = {"gateway": self._gateway_id} if self._cluster else {}
        documents = [d for d in documents if self._publishable(d.sensor_id, d.feature)]
        messages = [
            OutboxMessage(
                topic=self.topics.sensor(d.sensor_id, d.feature, d.kind),
                payload=document_payload({**d.document, **judge}),
                qos=self._config.qos,
                retain=True,
            )
            for d in documents
        ]
        for d in documents:
            self._announcer.document_queued(d.sensor_id, d.feature, d.kind)
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
            self._delivery.notify()

    def submit_stats(self, stats: Mapping[str, object]) -> None:
        """Replace the snapshot published on the stats topic every ``stats_interval_s``."""
        self._stats_topic.submit(stats)

    def stats(self) -> dict[str, object]:
        """The publisher's own counters (also merged into the stats topic under 'publisher')."""
        queued, dropped_total = self._closed_counts or (
            len(self._outbox),
            self._outbox.dropped_total,
        )
        delivered = self._delivery.stats()
        return {
            "sensors_online": None if self._availability is None else len(self._availability),
            "connected": self.connected,
            "queued": queued,
            "published": delivered.published,
            "dropped": self._dropped,
            "unpublishable": self._unpublishable,
            "dropped_total": dropped_total,
            "refused": delivered.refused,
            "outbox": self._outbox.stats(),
            "session": self.session_stats(),
        }

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.connected

    def session_stats(self) -> dict[str, int | float | None]:
        """The connection's: made, lost, taken over by another client with this client id."""
        if self._connection is not None:
            self._session = self._connection.session_stats()
        return dict(self._session)

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
            will=Will(self.topics.status, b"offline", qos=1, retain=True),
            max_in_flight=self._config.in_flight,
            name="publisher",
        )
        await connection.__aenter__()
        self._connection = connection
        tasks = {
            "publisher-deliver": self._delivery.run(connection, on_connected=self._online),
            "publisher-stats": self._stats_topic.publish_forever(connection),
        }
        if self._availability is not None:
            tasks["publisher-availability"] = self._expire_forever(self._availability)
        tasks["publisher-outbox-home"] = self._outbox_home_forever()
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
        await self._delivery.wait_idle()

    async def aclose(self) -> None:
        """Deliver what can be delivered within ``shutdown_flush_s``, say offline, disconnect."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._session = connection.session_stats()
        try:
            if connection is not None and connection.connected and len(self._outbox):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._config.shutdown_flush_s):
                        await self.wait_idle()
            runner, self._runner = self._runner, None
            if runner is not None:
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            if connection is not None:
                if connection.connected:
                    with contextlib.suppress(MqttNotConnectedError, TimeoutError):
                        async with asyncio.timeout(2.0):
                            await connection.publish(self.topics.status, b"offline", retain=True)
                await connection.close()
        finally:
            if self._closed_counts is None:
                self._closed_counts = (len(self._outbox), self._outbox.dropped_total)
                self._outbox.close()
            self._log.info("publisher_closed", queued=self._closed_counts[0])

    # -- delivery --------------------------------------------------------------------------

    async def _online(self, connection: MqttConnection) -> None:
        """A new connection: ``online`` on the status topic, discovery configs sent again."""
        await self._delivery.publish_or_log(connection, self.topics.status, b"online")
        self._announcer.new_connection()

    async def _announce(self, connection: MqttConnection) -> None:
        """Discovery configs not yet sent on this connection, before the messages they
        describe."""
        await self._announcer.announce(connection, self._delivery.publish_or_log)

    async def _expire_forever(self, availability: SensorAvailability) -> None:
        interval = max(0.05, min(availability.offline_after_s / 4, 10.0))
        while True:
            await asyncio.sleep(interval)
            self.expire_quiet_sensors()

    async def _outbox_home_forever(self) -> None:
        """An outbox in memory (the disk refused its file) goes back to the file once the disk
        takes it, also while no message comes to try it."""
        while True:
            await asyncio.sleep(_OUTBOX_HOME_POLL_S)
            if self._outbox.in_memory and self._outbox.back_to_disk() and len(self._outbox):
                self._delivery.notify()  # the file held messages the memory queue had not

    async def publish_stats(self, connection: MqttConnection | None = None) -> bool:
        """Publish the stats snapshot now; False if not connected (the next one replaces it)."""
        return await self._stats_topic.publish(connection or self._connection)
