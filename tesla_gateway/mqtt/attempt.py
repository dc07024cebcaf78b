"""One connection attempt: a fresh paho client and what waits on it (CONNACK, PUBACKs, SUBACKs).

Every attempt has its own paho client and its own futures, so a callback that arrives late from
an attempt already given up settles only that attempt's futures and cannot touch the next one.
The ``settle_*`` methods run on the event loop (paho's callbacks are marshalled there first).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from paho.mqtt import client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from tesla_gateway.mqtt.errors import (
    MqttConnectError,
    MqttNotConnectedError,
    MqttPublishError,
    MqttSubscribeError,
)
from tesla_gateway.mqtt.fast_path import LeanClient
from tesla_gateway.mqtt.plain_client import PlainClient

__all__ = ["Attempt", "PahoClient"]

PahoClient = LeanClient | PlainClient


@dataclass(eq=False)
class Attempt:
    """State of one paho client (one connection attempt); stale callbacks are recognised by it."""

    client: PahoClient
    connack: asyncio.Future[bool]
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    # Set (on the loop) when the attempt is given up: a message paho's thread holds back for
    # room in the inbox is then let go (unacknowledged: the broker redelivers it).
    released: threading.Event = field(default_factory=threading.Event)
    publishes: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    subscribes: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    # Event-loop mode: the socket the loop reads, the keepalive timer, reading paused.
    socket: Any = None
    on_readable: Callable[[], None] | None = None
    misc: asyncio.TimerHandle | None = None
    paused: bool = False
    connected_at: float | None = None  # monotonic time of the CONNACK that made it usable
    lost_reason: int | None = None  # the broker's DISCONNECT reason code (MQTT 5), if it sent one

    def start_publish(
        self, topic: str, payload: bytes, qos: int, retain: bool
    ) -> asyncio.Future[None]:
        """Hand a message to paho now; the future resolves on the broker's acknowledgement."""
        try:
            info = self.client.publish(topic, payload, qos=qos, retain=retain)
        except ValueError as exc:  # paho's check of the topic, QoS and payload size
            raise MqttPublishError(f"cannot publish to {topic!r}: {exc}") from exc
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise MqttNotConnectedError(
                f"publish to {topic} not sent: {paho.error_string(info.rc)}"
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if qos == 0:
            future.set_result(None)
        else:
            self.publishes[info.mid] = future
        return future

    def start_publish_many(
        self, messages: Sequence[tuple[str, bytes, bool]]
    ) -> list[asyncio.Future[None]]:
        """QoS 1 publishes of ``(topic, payload, retain)``, in one write with the fast client;
        a topic paho would refuse gets a future failed with :class:`MqttPublishError`."""
        client = self.client
        if not isinstance(client, LeanClient):
            return [
                self._start_or_fail(topic, payload, retain) for topic, payload, retain in messages
            ]
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = [loop.create_future() for _ in messages]
        sendable: list[tuple[bytes, bytes, bool]] = []
        slots: list[asyncio.Future[None]] = []
        for (topic, payload, retain), future in zip(messages, futures, strict=True):
            encoded = topic.encode("utf-8")
            try:
                client.check_topic(encoded)  # the check paho's publish makes
            except ValueError as exc:
                future.set_exception(MqttPublishError(f"cannot publish to {topic!r}: {exc}"))
                continue
            sendable.append((encoded, payload, retain))
            slots.append(future)
        if sendable:
            mids = client.publish_many(sendable)
            self.publishes.update(zip(mids, slots, strict=True))
        return futures

    def _start_or_fail(self, topic: str, payload: bytes, retain: bool) -> asyncio.Future[None]:
        """:meth:`start_publish` at QoS 1, its error (if any) in the future it returns."""
        try:
            return self.start_publish(topic, payload, qos=1, retain=retain)
        except (MqttPublishError, MqttNotConnectedError) as exc:
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    def fail_pending(self) -> None:
        """Fail every publish and subscribe still waiting for the broker's acknowledgement."""
        error = MqttNotConnectedError(
            "the connection to the broker was lost before it acknowledged"
        )
        for pending in (self.publishes, self.subscribes):
            for future in pending.values():
                if not future.done():
                    future.set_exception(error)
                    future.exception()  # retrieved here so an abandoned future does not warn
            pending.clear()

    def settle_connack(self, flags: paho.ConnectFlags, rc: ReasonCode) -> None:
        """A refused CONNACK fails the attempt; an accepted one says if the session was kept."""
        if self.connack.done():
            return
        if rc.is_failure:
            self.connack.set_exception(
                MqttConnectError(f"broker refused the connection: {rc}; check credentials/ACL")
            )
            self.connack.exception()
        else:
            self.connack.set_result(bool(flags.session_present))

    def settle_disconnect(self, rc: ReasonCode, from_server: bool) -> None:
        """Keep the broker's reason (its first DISCONNECT); a loss before CONNACK fails it."""
        if from_server and self.lost_reason is None:
            self.lost_reason = rc.value
        if not self.connack.done():
            self.connack.set_exception(MqttConnectError(f"disconnected before CONNACK: {rc}"))
            self.connack.exception()

    def settle_puback(self, mid: int, rc: ReasonCode) -> None:
        """Resolve the publish ``mid``, or fail it with the broker's reason."""
        future = self.publishes.pop(mid, None)
        if future is None or future.done():
            return
        if rc.is_failure:
            future.set_exception(MqttPublishError(f"broker rejected the publish: {rc}"))
        else:
            future.set_result(None)

    def settle_suback(self, mid: int, codes: list[ReasonCode]) -> None:
        """Resolve the subscription ``mid``, or fail it with the topics the broker refused."""
        future = self.subscribes.pop(mid, None)
        if future is None or future.done():
            return
        refused = [str(code) for code in codes if code.is_failure]
        if refused:
            future.set_exception(MqttSubscribeError(f"broker refused subscription: {refused}"))
        else:
            future.set_result(None)
