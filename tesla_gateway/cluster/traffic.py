"""What crosses the stream: readings in (decoded with the MQTT source's own rules), this
gateway's own readings out, and calibrated values out, each once.

A calibrated value's message id is ``<sensor>.<feature>.<period start>``: when a takeover makes a
second gateway calibrate a period the first had already published, the stream keeps one. A local
reading's id is ``<sensor>.<timestamp>``, so a retried publish is stored once too.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.engine import Engine, transient
from tesla_gateway.contract.calibrated import CalibratedReading
from tesla_gateway.contract.readings import Reading, ReadingRejectedError
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.publish.payloads import reading_message
from tesla_gateway.sources.mqtt_source import MqttSourceConfig
from tesla_gateway.sources.payloads import decode_payload

if TYPE_CHECKING:
    from tesla_gateway.cluster.engine import Engine
    from tesla_gateway.cluster.puller import StreamMessage

__all__ = ["SOURCE_NAME", "Traffic", "calibrated_id"]

SOURCE_NAME = "cluster"
_log = structlog.get_logger(__name__)
_CONCURRENT = 256  # publishes awaiting their acknowledgement at once
_GIVE_UP_S = 60.0


def calibrated_id(reading: CalibratedReading) -> str:
    """The message id of a calibrated value: (sensor, feature, period)."""
    return f"{reading.sensor_id}.{reading.feature}.{int(reading.period_start)}"


def local_payload(reading: Reading) -> bytes:
    """A reading this gateway received, as the JSON a node would have sent on MQTT."""
    document: dict[str, object] = {"ts": reading.timestamp, **reading.values}
    if reading.seq is not None:
        document["seq"] = reading.seq
    return json.dumps(document, separators=(",", ":")).encode()


class Traffic:
    """Decoding of stream messages and the two kinds of publishes, with their counters."""

    def __init__(
        self,
        config: ClusterConfig,
        rejects: RejectCounter,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._rejects = rejects
        self._rules = MqttSourceConfig().payload_rules()
        self._clock = clock
        self.decoded = 0
        self.calibrated_published = 0
        self.calibrated_duplicates = 0  # refused by the stream as already there
        self.calibrated_failed = 0
        self.local_forwarded = 0

    def decode(self, message: StreamMessage) -> Sequence[Reading]:
        """The readings of one stream message; rejects are counted as the MQTT source would."""
        sensor_id = message.subject.rsplit(".", 1)[1]
        try:
            decoded = decode_payload(
                message.data,
                topic_sensor_id=sensor_id,
                received_at=message.timestamp,
                source=SOURCE_NAME,
                rules=self._rules,
            )
        except ReadingRejectedError as exc:
            self._rejects.reject_error(
                exc, source=SOURCE_NAME, sensor=sensor_id, where=message.subject
            )
            return ()
        for reject in decoded.rejects:
            self._rejects.reject_error(
                reject, source=SOURCE_NAME, sensor=sensor_id, where=message.subject
            )
        self.decoded += len(decoded.readings)
        return decoded.readings

    async def publish_calibrated(
        self, engine: Engine, readings: Sequence[CalibratedReading]
    ) -> None:
        """Every value into the calibrated stream; retried (the id makes a retry harmless)
        until stored or for a minute, then counted as failed."""
        for start in range(0, len(readings), _CONCURRENT):
            chunk = readings[start : start + _CONCURRENT]
            await asyncio.gather(*(self._publish_one(engine, reading) for reading in chunk))

    async def _publish_one(self, engine: Engine, reading: CalibratedReading) -> None:
        subject = engine.subjects.calibrated(reading.sensor_id, reading.feature)
        headers = {"Nats-Msg-Id": calibrated_id(reading)}
        payload = reading_message(reading)
        deadline = time.monotonic() + _GIVE_UP_S
        while True:
            try:
                ack = await engine.js.publish(subject, payload, headers=headers, timeout=5.0)
            except transient() as exc:  # no leader for a few seconds, a reconnect
                if time.monotonic() > deadline:
                    self.calibrated_failed += 1
                    _log.error("cluster_calibrated_publish_failed", id=headers, error=str(exc))
                    return
                await asyncio.sleep(0.5)
                continue
            if ack.duplicate:
                self.calibrated_duplicates += 1
            else:
                self.calibrated_published += 1
            return

    async def forward_local(self, engine: Engine, queue: asyncio.Queue[Reading]) -> None:
        """Publish the gateway's own readings into the readings stream, in order."""
        while True:
            reading = await queue.get()
            subject = engine.subjects.reading(reading.sensor_id)
            headers = {"Nats-Msg-Id": f"{reading.sensor_id}.{reading.timestamp!r}"}
            while True:
                try:
                    await engine.js.publish(
                        subject, local_payload(reading), headers=headers, timeout=5.0
                    )
                    break
                except transient() as exc:  # kept until the stream takes it
                    _log.warning(
                        "cluster_local_publish_retry", error=str(exc) or type(exc).__name__
                    )
                    await asyncio.sleep(0.5)
            self.local_forwarded += 1

    def stats(self) -> dict[str, int]:
        return {
            "decoded": self.decoded,
            "calibrated_published": self.calibrated_published,
            "calibrated_duplicates": self.calibrated_duplicates,
            "calibrated_failed": self.calibrated_failed,
            "local_forwarded": self.local_forwarded,
        }
