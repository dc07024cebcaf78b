"""A minimal MQTT 3.1.1 client for the benchmark's load generator and subscriber.

Measurement equipment, not product code: on a 2-core machine the generator and the subscriber
share the machine with the daemon they measure, so they must cost as little CPU as possible.
paho reads every packet with several one-byte ``recv`` calls and sends each publish on its own;
here a publisher packs many PUBLISH packets into one ``sendall`` and a subscriber reads 1 MiB at
a time, stamping every packet in a read with the time the read returned. Only what the benchmark
needs: CONNECT (clean session, no keep-alive), PUBLISH QoS 0/1, PUBACK, SUBSCRIBE, DISCONNECT.
Loopback only. The packets themselves are encoded and decoded by the gateway's own codec
(:mod:`tesla_gateway.mqtt.wire`), so the benchmark speaks exactly what the gateway speaks.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

from tesla_gateway.mqtt.wire import (
    PUBACK,
    PUBLISH,
    UINT16,
    encode_string,
    publish_fields,
    remaining_length,
    split_packets,
)

__all__ = ["Inbound", "WireError", "WirePublisher", "WireSubscriber"]

_CONNECT, _CONNACK, _SUBSCRIBE, _SUBACK = 1, 2, 8, 9
_DISCONNECT = b"\xe0\x00"
_READ_SIZE = 1 << 20


class WireError(RuntimeError):
    """The broker refused or closed the connection."""


def _connect(host: str, port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    variable = encode_string("MQTT") + bytes([4, 0x02]) + UINT16.pack(0)  # clean, no keep-alive
    body = variable + encode_string(client_id)
    sock.sendall(bytes([_CONNECT << 4]) + remaining_length(len(body)) + body)
    connack = _read_exact(sock, 4)
    if connack[0] >> 4 != _CONNACK or connack[3] != 0:
        raise WireError(f"broker refused the connection: {connack!r}")
    sock.settimeout(None)
    return sock


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise WireError("broker closed the connection")
        data += chunk
    return data


class WirePublisher:
    """QoS 1 publisher that sends many messages per write; a thread counts the PUBACKs."""

    def __init__(self, host: str, port: int, client_id: str, *, max_unacked: int = 30_000) -> None:
        self._sock = _connect(host, port, client_id)
        self._next_id = 0
        self._max_unacked = max_unacked  # < 65,535 so that no packet id is reused in flight
        self.sent = 0
        self.acked = 0
        self._closed = False
        self._reader = threading.Thread(target=self._read_acks, daemon=True, name="pubacks")
        self._reader.start()

    def packet_ids(self, count: int) -> list[int]:
        """The next ``count`` packet ids (1…65535, wrapping); waits while too many are unacked."""
        while self.sent + count - self.acked > self._max_unacked:
            time.sleep(0.001)
        ids = [(self._next_id + i) % 65_535 + 1 for i in range(count)]
        self._next_id = (self._next_id + count) % 65_535
        return ids

    def send(self, packets: bytes, count: int) -> None:
        """Write ``count`` PUBLISH packets made with ids from :meth:`packet_ids`."""
        self._sock.sendall(packets)
        self.sent += count

    def wait_acked(self, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.acked < self.sent:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.sendall(_DISCONNECT)
        finally:
            self._sock.close()

    def _read_acks(self) -> None:
        buffer = bytearray()
        while not self._closed:
            try:
                chunk = self._sock.recv(_READ_SIZE)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            packets, used = split_packets(buffer)
            del buffer[:used]
            self.acked += sum(1 for first, _ in packets if first >> 4 == PUBACK)


@dataclass(frozen=True, slots=True)
class Inbound:
    """A message as it arrived: ``arrival`` is time.monotonic() when its read returned."""

    arrival: float
    topic: str
    payload: bytes
    retained: bool


class WireSubscriber:
    """QoS 0 subscriber (no acknowledgements to send) that stamps messages on arrival."""

    def __init__(self, host: str, port: int, client_id: str, topic_filter: str) -> None:
        self._sock = _connect(host, port, client_id)
        body = UINT16.pack(1) + encode_string(topic_filter) + b"\x00"
        self._sock.sendall(bytes([(_SUBSCRIBE << 4) | 0x02]) + remaining_length(len(body)) + body)
        self._buffer = bytearray()
        self._subscribed = False

    def wait_subscribed(self) -> None:
        while not self._subscribed:
            self.read(timeout_s=10.0)

    def read(self, timeout_s: float) -> list[Inbound]:
        """Messages from one read (empty on timeout)."""
        self._sock.settimeout(timeout_s)
        try:
            chunk = self._sock.recv(_READ_SIZE)
        except TimeoutError:
            return []
        arrival = time.monotonic()
        if not chunk:
            raise WireError("broker closed the connection")
        self._buffer += chunk
        packets, used = split_packets(self._buffer)
        del self._buffer[:used]
        out: list[Inbound] = []
        for first, body in packets:
            kind = first >> 4
            if kind == _SUBACK:
                self._subscribed = True
            elif kind == PUBLISH:
                fields = publish_fields(body, (first >> 1) & 0x03, v5=False)
                if fields is None:
                    continue  # not sent by the gateway (an empty topic)
                topic_length, _, start = fields
                topic = body[2 : 2 + topic_length].decode()
                out.append(Inbound(arrival, topic, body[start:], bool(first & 0x01)))
        return out

    def close(self) -> None:
        try:
            self._sock.sendall(_DISCONNECT)
        finally:
            self._sock.close()
