"""Plain paho clients for tests: an independent observer of what reached the broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from devkit.broker import Mosquitto
from tesla_gateway.mqtt.config import MqttBrokerConfig


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    retain: bool
    qos: int = 1  # as delivered: the lower of the publish's and the subscription's


class Collector:
    """Subscribes with a plain paho client and records every message (thread-safe)."""

    def __init__(
        self,
        broker: Mosquitto,
        topics: list[str],
        persistent_id: str | None = None,
        *,
        qos: int = 1,
    ) -> None:
        self._lock = threading.Condition()
        self.messages: list[Received] = []
        self._subscribed = threading.Event()
        # With a persistent_id the broker queues QoS 1 messages for us across our (or its) outage.
        self._client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            protocol=MQTTProtocolVersion.MQTTv311,
            client_id=persistent_id or "",
            clean_session=persistent_id is None,
        )
        self._client.reconnect_delay_set(0.05, 0.2)  # type: ignore[arg-type]  # floats work
        self._client.on_message = self._on_message
        self._client.on_subscribe = lambda *_: self._subscribed.set()

        def on_connect(
            client: paho.Client, _u: object, flags: paho.ConnectFlags, *_: object
        ) -> None:
            if not flags.session_present:  # a kept session still has its subscriptions
                client.subscribe([(topic, qos) for topic in topics])
            else:
                self._subscribed.set()

        self._client.on_connect = on_connect
        self._client.connect(broker.host, broker.port)
        self._client.loop_start()
        if not self._subscribed.wait(10):
            raise TimeoutError("collector did not subscribe")

    def _on_message(self, _client: paho.Client, _userdata: object, msg: paho.MQTTMessage) -> None:
        with self._lock:
            self.messages.append(
                Received(msg.topic, bytes(msg.payload), bool(msg.retain), int(msg.qos))
            )
            self._lock.notify_all()

    def on(self, topic: str) -> list[bytes]:
        with self._lock:
            return [m.payload for m in self.messages if m.topic == topic]

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not predicate(self.messages):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"condition not met; have {self.messages[-5:]}")
                self._lock.wait(remaining)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


@contextmanager
def collecting(
    broker: Mosquitto, topics: list[str], persistent_id: str | None = None, *, qos: int = 1
) -> Iterator[Collector]:
    collector = Collector(broker, topics, persistent_id, qos=qos)
    try:
        yield collector
    finally:
        collector.close()


def publish_raw(broker: Mosquitto, messages: list[tuple[str, bytes]], qos: int = 1) -> None:
    """Publish with a plain paho client and wait for every PUBACK."""
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2)
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        infos = [client.publish(topic, payload, qos=qos) for topic, payload in messages]
        for info in infos:
            info.wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def broker_config(broker: Mosquitto, **overrides: object) -> MqttBrokerConfig:
    """A real broker config pointing at the test broker, with fast reconnects."""
    values: dict[str, object] = {
        "host": broker.host,
        "port": broker.port,
        "reconnect_initial_s": 0.05,
        "reconnect_max_s": 0.3,
        "connect_timeout_s": 5.0,
    }
    values.update(overrides)
    return MqttBrokerConfig.model_validate(values)


async def eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait (yielding to the loop) until ``predicate()`` holds."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.01)
