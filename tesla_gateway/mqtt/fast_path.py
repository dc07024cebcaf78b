"""The receive and publish hot path, built on paho's private methods, and the check that it holds.

:class:`LeanClient` overrides and calls private parts of paho 2.x (the ``PAHO_*`` tables below);
that is what makes the gateway keep up with thousands of readings a second on a Pi, and this is
the one module of the gateway that depends on paho's insides. paho is pinned to the tested minor
(pyproject.toml); :func:`contract_problems` checks the installed paho when a connection is made
(``tests/gateway/io/test_paho_contract.py`` checks it in CI), and when it does not hold the
connection uses :class:`tesla_gateway.mqtt.plain_client.PlainClient` instead.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import version
from typing import Any, Literal

from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from tesla_gateway.mqtt.wire import UINT16, puback_packets, publish_fields, publish_packet

__all__ = [
    "PAHO_ATTRIBUTES",
    "PAHO_METHODS",
    "PAHO_STATIC_METHODS",
    "LeanClient",
    "PublishCallback",
    "contract_holds",
    "contract_problems",
    "paho_version",
]

_READ_SIZE = 65_536
# Shared, never modified: what a plain PUBACK (remaining length 2) means.
_PUBACK_SUCCESS = ReasonCode(PacketTypes.PUBACK)
_NO_PROPERTIES = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]
# MQTT 5 PUBACK reason codes below 0x80 are successes (0x00, 0x10 "no matching subscribers").
_PUBACK_SUCCESSES = {code: ReasonCode(PacketTypes.PUBACK, identifier=code) for code in (0, 0x10)}

PublishCallback = Callable[[str, bytes, int, int, bool], None]


# What LeanClient relies on in paho.Client. Methods it overrides or calls, with their parameter
# names after ``self``, in order:
PAHO_METHODS: dict[str, tuple[str, ...]] = {
    "_handle_publish": (),
    "_handle_pubackcomp": ("cmd",),
    "_update_inflight": (),
    "_sock_recv": ("bufsize",),
    "loop_read": ("max_packets",),
    "_packet_queue": ("command", "packet", "mid", "qos", "info"),
    "_mid_generate": (),
    "_do_on_publish": ("mid", "reason_code", "properties"),
    "_send_puback": ("mid",),
    "_reset_sockets": ("sockpair_only",),
}
PAHO_STATIC_METHODS: dict[str, tuple[str, ...]] = {"_raise_for_invalid_topic": ("topic",)}
# Attributes it reads, with the type each has on a fresh client:
PAHO_ATTRIBUTES: dict[str, type] = {
    "_in_packet": dict,
    "_protocol": int,
    "_manual_ack": bool,
    "_out_messages": dict,
    "_inflight_messages": int,
    "_out_message_mutex": type(threading.RLock()),
}
PAHO_IN_PACKET_KEYS = ("command", "packet")  # of _in_packet
PAHO_PACKET_TYPES = {"PUBLISH": 0x30, "PUBACK": 0x40}  # paho.PUBLISH/PUBACK, for _packet_queue


def paho_version() -> str:
    """The installed paho-mqtt's version."""
    return version("paho-mqtt")


def _method_problem(name: str, parameters: tuple[str, ...], static: bool) -> str | None:
    found = inspect.getattr_static(paho.Client, name, None)
    if found is None:
        return f"paho.Client.{name} is gone"
    if isinstance(found, staticmethod) != static:
        return f"paho.Client.{name} changed between method and static method"
    actual = tuple(inspect.signature(getattr(paho.Client, name)).parameters)
    actual = actual if static else actual[1:]
    if actual != parameters:
        return f"paho.Client.{name} takes {actual}, expected {parameters}"
    return None


@functools.cache
def contract_problems() -> tuple[str, ...]:
    """What the installed paho no longer provides of what LeanClient relies on (empty: it holds).

    Cached: paho does not change while the daemon runs.
    """
    problems = [
        problem
        for static, methods in ((False, PAHO_METHODS), (True, PAHO_STATIC_METHODS))
        for name, parameters in methods.items()
        if (problem := _method_problem(name, parameters, static)) is not None
    ]
    for name, code in PAHO_PACKET_TYPES.items():
        if getattr(paho, name, None) != code:
            problems.append(f"paho.{name} is not {code:#x}")
    try:
        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            protocol=MQTTProtocolVersion.MQTTv5,
            manual_ack=True,
        )
    except Exception as exc:  # noqa: BLE001 - any failure means the contract does not hold
        return (*problems, f"paho.Client() as the gateway makes it fails: {exc!r}")
    for name, kind in PAHO_ATTRIBUTES.items():
        value = getattr(client, name, None)
        if not isinstance(value, kind):
            problems.append(f"paho.Client().{name} is {type(value).__name__}, not {kind.__name__}")
    in_packet = getattr(client, "_in_packet", None)
    if isinstance(in_packet, dict):
        missing = [key for key in PAHO_IN_PACKET_KEYS if key not in in_packet]
        if missing:
            problems.append(f"paho.Client()._in_packet has no {missing}")
    return tuple(problems)


def contract_holds() -> bool:
    """Whether LeanClient can run on the installed paho."""
    return not contract_problems()


def _plain_puback_reason(packet: bytes | bytearray) -> ReasonCode | None:
    """The success a PUBACK reports when it has no properties, else None (paho decodes it).

    MQTT 5 allows a success PUBACK as the packet id alone (length 2), with a reason code
    (length 3) or with an empty property list (length 4); mosquitto sends 0x10 "no matching
    subscribers" as a success too.
    """
    if len(packet) == 2:
        return _PUBACK_SUCCESS
    if len(packet) == 3 or (len(packet) == 4 and packet[3] == 0):
        return _PUBACK_SUCCESSES.get(packet[2])
    return None


def _puback_reason(packet: bytes | bytearray) -> ReasonCode:
    """The reason code of a PUBACK (properties, if any, are not needed here)."""
    plain = _plain_puback_reason(packet)
    if plain is not None:
        return plain
    try:
        return ReasonCode(PacketTypes.PUBACK, identifier=packet[2])
    except (KeyError, ValueError):  # a code MQTT 5 does not define for PUBACK
        return ReasonCode(PacketTypes.PUBACK, identifier=0x80)


class LeanClient(paho.Client):
    """paho's client with a lean receive path.

    For every message received paho builds an ``MQTTMessage`` (with a ``threading.Condition``)
    and, under MQTT 5, a ``Properties`` object whose constructor fills several lookup tables:
    measured with py-spy, 60 % of the daemon's CPU at 6,000 readings/s. Messages at QoS 0 or 1
    without MQTT 5 properties (what sensors send) are decoded here and handed to
    ``on_publish_received(topic, payload, qos, mid, retain)`` directly; QoS 2, messages with
    properties and clients without that callback take paho's own path (``on_message``).

    paho also reads every packet with three or more ``recv`` calls (the first byte, each byte of
    the length, the rest) and handles one packet per wake-up of its loop. Here the socket is read
    64 KiB at a time into a buffer that paho's reads are served from, and a wake-up handles every
    packet already buffered.

    QoS 1 acknowledgements of a batch go out as one write (:meth:`ack_many`), a plain PUBACK
    received (success, no properties) is read without paho's per-packet objects, and paho's
    walk over every unacknowledged message after each PUBACK is skipped when none is queued.

    Everything of paho's it overrides, calls or reads is in the ``PAHO_*`` tables; tests/gateway/io
    exercise every path (TLS included).
    """

    on_publish_received: PublishCallback | None = None
    on_lean_puback: Callable[[int, ReasonCode], None] | None = None
    # Set by an event-loop connection whose inbox is full: loop_read stops after the current
    # packet and leaves the rest of its buffer for when reading resumes.
    hold_reading = False
    _read_buffer = b""
    _read_position = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lean_mids: set[int] = set()  # publish_many's packets awaiting PUBACK

    @staticmethod
    def check_topic(topic: bytes) -> None:
        """Raise ValueError for a topic paho's ``publish`` would refuse."""
        paho.Client._raise_for_invalid_topic(topic)

    def _sock_recv(self, bufsize: int) -> bytes:
        if self._read_position >= len(self._read_buffer):
            data = super()._sock_recv(_READ_SIZE)  # BlockingIOError when nothing is there
            if not data:
                return data  # the connection closed
            self._read_buffer, self._read_position = data, 0
        start = self._read_position
        self._read_position = start + bufsize
        return self._read_buffer[start : start + bufsize]

    def _handle_pubackcomp(self, cmd: Literal["PUBACK", "PUBCOMP"]) -> MQTTErrorCode:
        packet = self._in_packet["packet"]
        if cmd != "PUBACK" or len(packet) < 2:
            return super()._handle_pubackcomp(cmd)  # QoS 2 (PUBCOMP) or malformed
        (mid,) = UINT16.unpack_from(packet)
        with self._out_message_mutex:
            lean = mid in self._lean_mids
            self._lean_mids.discard(mid)
        if lean:  # sent by publish_many: paho holds no state for it
            if self.on_lean_puback is not None:
                self.on_lean_puback(mid, _puback_reason(packet))
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        reason = _plain_puback_reason(packet)
        if reason is None:
            return super()._handle_pubackcomp(cmd)  # a failure, or properties
        # A plain success: paho's decoder would build a ReasonCode and a Properties per PUBACK.
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, reason, _NO_PROPERTIES)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def publish_many(self, messages: Sequence[tuple[bytes, bytes, bool]]) -> list[int]:
        """QoS 1 PUBLISH packets for ``(topic, payload, retain)``, queued as one write.

        paho's ``publish`` builds an ``MQTTMessage`` with a ``threading.Condition``, takes
        three locks and wakes its thread once per message. Here the packets are encoded
        directly (MQTT 5 with an empty property list) and paho's thread is woken once; their
        PUBACKs go to ``on_lean_puback(mid, reason)``. With the lean PUBACKs this took a
        publisher from 90 to 37 µs of CPU per message (10,000 messages to a real mosquitto).
        Topics must already be valid (:meth:`check_topic`). Returns the packet ids, in order.
        """
        v5 = self._protocol == paho.MQTTv5
        packets: list[bytes] = []
        mids: list[int] = []
        for topic, payload, retain in messages:
            mid = self._mid_generate()
            packets.append(publish_packet(topic, payload, mid, 1, retain=retain, v5=v5))
            mids.append(mid)
        with self._out_message_mutex:
            self._lean_mids.update(mids)
        self._packet_queue(paho.PUBLISH, b"".join(packets), mids[-1] if mids else 0, 1)
        return mids

    def _update_inflight(self) -> MQTTErrorCode:
        # paho walks every unacknowledged message after each PUBACK to find queued ones to
        # send: O(window) per acknowledgement. Queued ones exist only when it holds more
        # messages than it has in flight.
        if len(self._out_messages) <= self._inflight_messages:
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return super()._update_inflight()

    def ack_many(self, mids: Sequence[int]) -> None:
        """PUBACK several QoS 1 messages with one write (``ack`` wakes paho's thread for each)."""
        self._packet_queue(paho.PUBACK, puback_packets(mids), 0, 0)

    def close_sockets(self) -> None:
        """Close the connection's socket and the wake-up socket pair of paho's thread now.

        paho closes them only when the client is garbage collected, and in a reference cycle the
        sockets may be finalised first (an 'unclosed socket' ResourceWarning).
        """
        self._reset_sockets()

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        rc = super().loop_read(max_packets)
        # Packets already in the buffer would not wake the select() in paho's loop.
        while (
            rc == MQTTErrorCode.MQTT_ERR_SUCCESS
            and self._read_position < len(self._read_buffer)
            and not self.hold_reading
        ):
            rc = super().loop_read(1)
        return rc

    def _handle_publish(self) -> MQTTErrorCode:
        callback = self.on_publish_received
        header = self._in_packet["command"]
        qos = (header & 0x06) >> 1
        if callback is None or qos == 2:
            return super()._handle_publish()
        packet = self._in_packet["packet"]
        fields = publish_fields(packet, qos, self._protocol == MQTTProtocolVersion.MQTTv5)
        if fields is None:  # malformed, a topic alias or MQTT 5 properties: paho's path
            return super()._handle_publish()
        length, mid, position = fields
        topic = bytes(packet[2 : 2 + length]).decode("utf-8", "replace")
        callback(topic, bytes(packet[position:]), qos, mid, bool(header & 0x01))
        if qos == 1 and not self._manual_ack:
            return self._send_puback(mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS
