"""What crosses the stream: readings in (decoded with the MQTT source's own rules), this
gateway's own readings out, and calibrated values out, each once.

A calibrated value's message id is ``<sensor>.<feature>.<period start>``: when a takeover makes a
second gateway calibrate a period the first had already published, the stream keeps one. A local
reading's id is ``<sensor>.<timestamp>``, so a retried publish is stored once too.

A sensor id is one subject token here (:func:`token_problem`): a token that is no sensor id is
rejected at the decode, and a local reading whose id has a '.' at the forward, each counted as
``bad_sensor_id``. A local reading no stream takes is dropped and counted, not retried forever.

Once the daemon is stopping, a calibrated value still failing after :data:`FINAL_PUBLISH_S`
is given up (counted): the next owner replays its period from the last snapshot and publishes
it. The local readings still queued at the shutdown are dropped with a warning.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from tesla_gateway.cluster.cancels import checkpoint
from tesla_gateway.cluster.config import SUBJECT_TOKEN, ClusterConfig
from tesla_gateway.cluster.engine import Engine, transient
from tesla_gateway.contract.calibrated import CalibratedReading
from tesla_gateway.contract.readings import (
    Reading,
    ReadingRejectedError,
    RejectReason,
)
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.publish.payloads import reading_message
from tesla_gateway.sources.mqtt_source import MqttSourceConfig
from tesla_gateway.sources.payloads import decode_payload

if TYPE_CHECKING:
    from tesla_gateway.cluster.engine import Engine
    from tesla_gateway.cluster.puller import StreamMessage

__all__ = ["FINAL_PUBLISH_S", "SOURCE_NAME", "Traffic", "calibrated_id", "token_problem"]

SOURCE_NAME = "cluster"
_log = structlog.get_logger(__name__)
_CONCURRENT = 256  # publishes awaiting their acknowledgement at once
_GIVE_UP_S = 60.0
FINAL_PUBLISH_S = 5.0  # once stopping: a publish still failing then is given up
_PUBLISH_TIMEOUT_S = 5.0
_RETRY_S = 0.5
_CLUSTER_IDS = "cluster mode takes sensor ids of letters, digits, '_' and '-' (no '.'), up to 64"


def token_problem(sensor_id: str) -> str | None:
    """Why ``sensor_id`` cannot be a sensor's one subject token in cluster mode, or None: the
    shared sensor-id rule, and no '.' (it would split the id across tokens, and no stream
    takes ``<subject>.<a>.<b>.raw``)."""
    if "//" in sensor_id:  # nats-server's MQTT listener writes a topic level's '.' as '//'
        shown = sensor_id[:80].replace("//", ".")
        return f"sensor id {shown!r} (an MQTT topic level; NATS spells it {sensor_id[:80]!r}): " + (
            f"{_CLUSTER_IDS}; rename the node"
        )
    if not SUBJECT_TOKEN.fullmatch(sensor_id):
        return f"sensor id {sensor_id[:80]!r}: {_CLUSTER_IDS}; rename the node"
    return None


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
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """``stopping`` says the daemon is shutting down: retries then end soon."""
        self._config = config
        self._stopping = stopping
        self._stop_seen: float | None = None  # monotonic s when a retry first saw it
        self._rejects = rejects
        self._rules = MqttSourceConfig().payload_rules()
        self._clock = clock
        self.decoded = 0
        self.calibrated_published = 0
        self.calibrated_duplicates = 0  # refused by the stream as already there
        self.calibrated_failed = 0
        self.local_forwarded = 0
        self.local_rejected = 0  # an id that cannot be one subject token
        self.local_refused = 0  # no stream takes its subject
        self.local_failed = 0  # still failing after a minute connected
        self.local_abandoned = 0  # still queued when the daemon stopped

    def decode(self, message: StreamMessage) -> Sequence[Reading]:
        """The readings of one stream message; rejects are counted as the MQTT source would."""
        sensor_id = message.subject.rsplit(".", 1)[1]
        problem = token_problem(sensor_id)
        if problem is not None:  # acknowledged by the puller like any reject: never back
            self._rejects.reject(
                RejectReason.BAD_SENSOR_ID,
                source=SOURCE_NAME,
                detail=problem,
                where=message.subject,
            )
            return ()
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
        until stored or for a minute, then counted as failed; stopping, for FINAL_PUBLISH_S
        in all (the values then given up or not tried are counted and logged once)."""
        failed = self.calibrated_failed
        for start in range(0, len(readings), _CONCURRENT):
            if time.monotonic() > self._give_up_at(float("inf")):
                self.calibrated_failed += len(readings) - start
                break
            chunk = readings[start : start + _CONCURRENT]
            await asyncio.gather(*(self._publish_one(engine, reading) for reading in chunk))
        if self._stop_seen is not None and self.calibrated_failed > failed:
            _log.warning(
                "cluster_calibrated_publish_abandoned",
                values=self.calibrated_failed - failed,
                of=len(readings),
                action="the gateway is stopping; the next owner of their partitions replays "
                "and publishes them",
            )

    async def _publish_one(self, engine: Engine, reading: CalibratedReading) -> None:
        subject = engine.subjects.calibrated(reading.sensor_id, reading.feature)
        headers = {"Nats-Msg-Id": calibrated_id(reading)}
        payload = reading_message(reading)
        deadline = time.monotonic() + _GIVE_UP_S
        while True:
            try:
                ack = await engine.js.publish(
                    subject, payload, headers=headers, timeout=self._timeout(deadline)
                )
            except transient() as exc:  # no leader for a few seconds, a reconnect
                if time.monotonic() > self._give_up_at(deadline):
                    self.calibrated_failed += 1
                    if self._stop_seen is not None:  # logged once, by publish_calibrated
                        return
                    _log.error(
                        "cluster_calibrated_publish_failed",
                        id=headers,
                        error=str(exc) or type(exc).__name__,
                    )
                    return
                checkpoint()
                await asyncio.sleep(_RETRY_S)
                continue
            if ack.duplicate:
                self.calibrated_duplicates += 1
            else:
                self.calibrated_published += 1
            return

    def _give_up_at(self, deadline: float) -> float:
        """``deadline``, or FINAL_PUBLISH_S after the shutdown was first seen if sooner."""
        if self._stop_seen is None and self._stopping():
            self._stop_seen = time.monotonic()
        if self._stop_seen is None:
            return deadline
        return min(deadline, self._stop_seen + FINAL_PUBLISH_S)

    def _timeout(self, deadline: float) -> float:
        """One publish's wait for its acknowledgement: within what is left of the retries."""
        left = self._give_up_at(deadline) - time.monotonic()
        return min(_PUBLISH_TIMEOUT_S, max(left, _RETRY_S))

    async def forward_local(self, engine: Engine, queue: asyncio.Queue[Reading]) -> None:
        """Publish the gateway's own readings into the readings stream, in order; cancelled
        (the shutdown), what is still queued is dropped with a warning."""
        try:
            await self._forward_queue(engine, queue)
        finally:
            self.abandon(queue)

    def abandon(self, queue: asyncio.Queue[Reading]) -> None:
        """The shutdown: the readings still queued are dropped, counted and logged. Taken out
        of the queue: the daemon's last ingest-log checkpoint counts what is queued as in the
        log, which in cluster mode it is not (a negative sequence: exit 1 after the stop)."""
        queued = 0
        while not queue.empty():
            queue.get_nowait()
            queued += 1
        if queued:
            self.local_abandoned += queued
            _log.warning(
                "cluster_local_readings_abandoned",
                readings=queued,
                why="the gateway stopped before the readings stream took them",
            )

    async def _forward_queue(self, engine: Engine, queue: asyncio.Queue[Reading]) -> None:
        while True:
            checkpoint()  # a cancellation a reply swallowed: the shutdown goes on
            reading = await queue.get()
            problem = token_problem(reading.sensor_id)
            if problem is None:
                await self._forward_one(engine, reading)
                continue
            self.local_rejected += 1
            self._rejects.reject(
                RejectReason.BAD_SENSOR_ID,
                source=reading.source,
                detail=problem,
                sensor=reading.sensor_id,
                where="cluster readings stream",
            )

    async def _forward_one(self, engine: Engine, reading: Reading) -> None:
        """One reading into the stream: retried while the failure is transient (a server
        down keeps it, however long); dropped and counted when no stream takes its subject
        or after a minute of failing while connected, so it cannot hold the queue forever."""
        from nats.js.errors import NoStreamResponseError

        subject = engine.subjects.reading(reading.sensor_id)
        headers = {"Nats-Msg-Id": f"{reading.sensor_id}.{reading.timestamp!r}"}
        payload = local_payload(reading)
        failing_s = 0.0
        while True:
            checkpoint()  # else, swallowed while the server is down, it retried forever
            started, connected = time.monotonic(), engine.nc.is_connected
            try:
                await engine.js.publish(subject, payload, headers=headers, timeout=5.0)
            except transient() as exc:
                error = str(exc) or type(exc).__name__
                refused = isinstance(exc, NoStreamResponseError)
            else:
                self.local_forwarded += 1
                return
            if refused and await self._no_stream_takes(engine, subject):
                self.local_refused += 1
                _log.error(
                    "cluster_local_no_stream",
                    sensor=reading.sensor_id,
                    subject=subject,
                    hint=f"no stream takes it: is [cluster] readings_subject the same on every "
                    f"gateway, and does the stream {engine.subjects.config.readings_stream!r} "
                    "exist? (a gateway makes it at start)",
                )
                return
            if connected and engine.nc.is_connected:
                failing_s += time.monotonic() - started + _RETRY_S
                if failing_s > _GIVE_UP_S:
                    self.local_failed += 1
                    _log.error(
                        "cluster_local_publish_failed", sensor=reading.sensor_id, error=error
                    )
                    return
            _log.warning("cluster_local_publish_retry", sensor=reading.sensor_id, error=error)
            await asyncio.sleep(_RETRY_S)

    @staticmethod
    async def _no_stream_takes(engine: Engine, subject: str) -> bool:
        """True when the server says no stream's subjects take ``subject`` (a lasting
        refusal); False when one does (a leader being elected) or the server cannot say."""
        try:
            names = await engine.request("$JS.API.STREAM.NAMES", {"subject": subject})
        except transient():
            return False
        return not names.get("streams")

    def stats(self) -> dict[str, int]:
        return {
            "decoded": self.decoded,
            "calibrated_published": self.calibrated_published,
            "calibrated_duplicates": self.calibrated_duplicates,
            "calibrated_failed": self.calibrated_failed,
            "local_forwarded": self.local_forwarded,
            "local_rejected": self.local_rejected,
            "local_refused": self.local_refused,
            "local_failed": self.local_failed,
            "local_abandoned": self.local_abandoned,
        }
