"""A synchronous MQTT 5 client for the broker tests of deploy/ (paho, loop in a thread)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.reasoncodes import ReasonCode

WAIT_S = 10.0


class Client:
    """A synchronous MQTT 5 client (TLS when given a CA): connect result, publish and subscribe
    outcomes, messages received."""

    def __init__(
        self,
        port: int,
        user: str | None,
        password: str | None = None,
        *,
        ca: Path | None = None,
    ) -> None:
        self.connack: ReasonCode | None = None
        self.messages: list[tuple[str, bytes]] = []
        self._connected = threading.Event()
        self._acks: dict[int, list[ReasonCode]] = {}
        self._acked = threading.Condition()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        if ca is not None:
            self.client.tls_set(ca_certs=str(ca))
        if user is not None:
            self.client.username_pw_set(user, password)
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_ack
        self.client.on_subscribe = lambda _c, _u, mid, codes, _p: self._record(mid, list(codes))
        self.client.on_message = lambda _c, _u, m: self.messages.append((m.topic, bytes(m.payload)))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self._connected.wait(WAIT_S), "no CONNACK"

    def _on_connect(self, _c: object, _u: object, _f: object, rc: ReasonCode, _p: object) -> None:
        self.connack = rc
        self._connected.set()

    def _on_ack(self, _c: object, _u: object, mid: int, rc: ReasonCode, _p: object) -> None:
        self._record(mid, [rc])

    def _record(self, mid: int, codes: list[ReasonCode]) -> None:
        with self._acked:
            self._acks[mid] = codes
            self._acked.notify_all()

    def _wait(self, mid: int) -> list[ReasonCode]:
        with self._acked:
            assert self._acked.wait_for(lambda: mid in self._acks, WAIT_S), "no acknowledgement"
            return self._acks.pop(mid)

    def publish(self, topic: str, payload: bytes = b"{}") -> bool:
        """True if the broker accepted the QoS 1 publish (PUBACK without a failure code)."""
        info = self.client.publish(topic, payload, qos=1)
        return not self._wait(info.mid)[0].is_failure

    def subscribe(self, topic: str) -> bool:
        _, mid = self.client.subscribe(topic, qos=1)
        assert mid is not None
        return not self._wait(mid)[0].is_failure

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def received(self, count: int) -> list[tuple[str, bytes]]:
        """The messages received, once there are ``count`` (or the wait is over)."""
        deadline = time.monotonic() + WAIT_S
        while len(self.messages) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return sorted(self.messages)


def reach(
    port: int, user: str | None, password: str | None, topics: tuple[str, ...], **tls: Path
) -> tuple[str, ...]:
    """What one client gets from a listener: ``("refused",)``, or per topic ``"write+read"``
    (its own publish accepted and delivered back to it), ``"write"``, ``"read"`` (a ``$SYS``
    topic's retained message received) or ``"none"``.

    mosquitto 2.0 grants every subscription and applies the ACL on delivery; it sends a QoS 1
    publish on to subscribers before its PUBACK and retained messages right after the SUBACK, so
    a PUBACK of a later publish proves that nothing more is coming (no waiting on absences).
    """
    client = Client(port, user, password, ca=tls.get("ca"))
    try:
        assert client.connack is not None
        if client.connack.is_failure:
            return ("refused",)
        outcome = []
        for topic in topics:
            client.messages.clear()
            assert client.subscribe(topic)
            wrote = False if topic.startswith("$") else client.publish(topic, b"probe")
            client.publish("probe-barrier/x", b"")  # its PUBACK follows every delivery above
            got = any(name == topic for name, _ in client.messages)
            outcome.append({(True, True): "write+read", (True, False): "write"}.get(
                (wrote, got), "read" if got else "none"))  # fmt: skip
        return tuple(outcome)
    finally:
        client.close()
