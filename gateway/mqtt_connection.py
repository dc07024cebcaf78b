"""One MQTT connection as an asyncio resource, shared by the MQTT source and the publisher.

paho-mqtt is a threaded library. We keep its network loop in its own thread (``loop_start``) and
marshal every callback onto the event loop with ``call_soon_threadsafe``, so all of our state is
touched by exactly one thread (the event loop) and paho's own locks guard paho's state. The
alternative, driving paho's socket from the event loop through its socket callbacks, needs the
blocking ``connect()`` to run on the loop thread (DNS and the TCP handshake would block every other
task) or the socket to be registered from another thread; the thread hand-off is simpler to
reason about and costs one thread per connection.

Each connection attempt uses a fresh paho client with ``reconnect_on_failure=False``: paho never
reconnects or replays on its own, so the supervising loop here owns reconnect and backoff, and
a publish that was not acknowledged fails loudly instead of being replayed behind the caller's
back (the publisher's outbox does the replaying, in order). A refused CONNACK is a failed attempt:
``connected`` becomes true only after a successful CONNACK.

Receiving is the gateway's hot path (thousands of readings per second, one message each), so it
avoids per-message overhead: :class:`_LeanClient` decodes QoS 0/1 PUBLISH packets without paho's
per-message objects, and messages cross from paho's thread to the event loop in batches (one
wake-up of the loop per burst, not one ``call_soon_threadsafe`` per message).

That hand-off (the inbox) is bounded by ``max_inbox`` messages, counting those the event loop has
taken but not yet handled, because a publisher can send faster than the gateway can calibrate:
unbounded, a QoS 0 flood of 2,000,000 messages grew the daemon from 72 to 755 MB (issue 12).
Beyond the bound a QoS 0 message is dropped and counted (:meth:`MqttConnection.inbox_stats`,
and a rate-limited log); a QoS 1/2 message is held in paho's thread, which then stops reading
the socket until there is room: the message is not acknowledged, so the broker keeps it (and,
past its own in-flight limit, sends no more).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import structlog
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from gateway.errors import ConfigError, GatewayError

__all__ = [
    "DEFAULT_MAX_INBOX",
    "InboundMessage",
    "MessageHandler",
    "MqttBrokerConfig",
    "MqttConnectError",
    "MqttConnection",
    "MqttError",
    "MqttNotConnectedError",
    "MqttPublishError",
    "MqttSubscribeError",
    "MqttTlsConfig",
    "Will",
    "check_plain_topic",
]

DEFAULT_MAX_INBOX = 10_000  # received messages waiting for on_message; ~3 MB of small readings


def check_plain_topic(value: str | None) -> str | None:
    """A configured topic (prefix) to publish on: no wildcards, no empty or edge levels."""
    if value is not None and (
        not value
        or "+" in value
        or "#" in value
        or value.startswith("/")
        or value.endswith("/")
        or "//" in value
    ):
        raise ValueError(
            f"{value!r} must be a topic without wildcards or empty/leading/trailing levels"
        )
    return value


class MqttError(GatewayError):
    """Root of the MQTT connection's errors."""


class MqttNotConnectedError(MqttError):
    """The broker is not connected (now, or the connection dropped before the acknowledgement)."""


class MqttConnectError(MqttError):
    """A connection attempt failed: unreachable broker, TLS failure or refused CONNACK."""


class MqttPublishError(MqttError):
    """The broker acknowledged a publish with a failure reason code (e.g. not authorised)."""


class MqttSubscribeError(MqttError):
    """The broker refused a subscription."""


class MqttTlsConfig(BaseModel):
    """TLS towards the broker; with no ``ca_file`` the system's trust store is used."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path | None = Field(
        default=None, description="PEM bundle of the CA(s) that signed the broker certificate."
    )
    cert_file: Path | None = Field(
        default=None, description="PEM client certificate, for brokers that require one."
    )
    key_file: Path | None = Field(default=None, description="PEM private key of cert_file.")
    insecure: bool = Field(
        default=False,
        description="Skip the broker host name check. Only for testing: it allows impostors.",
    )

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be given together")
        return self


class MqttBrokerConfig(BaseModel):
    """Where the broker is and how to authenticate; shared by the source and the publisher."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", min_length=1, description="Broker host name or IP.")
    port: int = Field(default=1883, ge=1, le=65535, description="Broker port (8883 for TLS).")
    transport: Literal["tcp"] = Field(default="tcp", description="Transport; only tcp for now.")
    protocol: Literal["5", "3.1.1"] = Field(default="5", description="MQTT protocol version.")
    keepalive: int = Field(
        default=60, ge=5, le=65535, description="Seconds between keep-alive pings."
    )
    tls: MqttTlsConfig | None = Field(default=None, description="TLS settings; omit for plain TCP.")
    username: str | None = Field(default=None, description="User name for authentication.")
    password: SecretStr | None = Field(
        default=None, description="Password; prefer password_file so it stays out of the config."
    )
    password_file: Path | None = Field(
        default=None, description="File whose first line is the password (e.g. a systemd secret)."
    )
    connect_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds to wait for TCP connect and CONNACK."
    )
    reconnect_initial_s: float = Field(
        default=0.5, gt=0, description="First delay before reconnecting; doubles per failure."
    )
    reconnect_max_s: float = Field(default=30.0, gt=0, description="Longest reconnect delay.")

    @model_validator(mode="after")
    def _credentials_consistent(self) -> Self:
        if self.password is not None and self.password_file is not None:
            raise ValueError("give either password or password_file, not both")
        if (self.password is not None or self.password_file is not None) and not self.username:
            raise ValueError("a password needs a username")
        if self.reconnect_max_s < self.reconnect_initial_s:
            raise ValueError("reconnect_max_s must not be smaller than reconnect_initial_s")
        return self

    def resolve_password(self) -> SecretStr | None:
        """The password, reading ``password_file`` if configured (at connect, so rotation works)."""
        if self.password_file is None:
            return self.password
        try:
            text = self.password_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"mqtt password_file {self.password_file} cannot be read: {exc.strerror}"
            ) from exc
        lines = text.splitlines()
        return SecretStr(lines[0] if lines else "")


@dataclass(frozen=True, slots=True)
class Will:
    """Last will: what the broker publishes for us if we vanish without a clean DISCONNECT."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A message received on a subscription."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


MessageHandler = Callable[[InboundMessage], Awaitable[None]]


@dataclass(eq=False)
class _Attempt:
    """State of one paho client (one connection attempt); stale callbacks are recognised by it."""

    client: _LeanClient
    connack: asyncio.Future[bool]
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    # Set (on the loop) when the attempt is given up: a message paho's thread holds back for
    # room in the inbox is then let go (unacknowledged: the broker redelivers it).
    released: threading.Event = field(default_factory=threading.Event)
    publishes: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    subscribes: dict[int, asyncio.Future[None]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Delivery:
    attempt: _Attempt
    mid: int
    message: InboundMessage


_UINT16 = struct.Struct("!H")
_PUBACK = struct.Struct("!BBH")  # fixed header, remaining length 2, packet id
_READ_SIZE = 65_536
# Shared, never modified: what a plain PUBACK (remaining length 2) means.
_PUBACK_SUCCESS = ReasonCode(PacketTypes.PUBACK)
_NO_PROPERTIES = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]
# MQTT 5 PUBACK reason codes below 0x80 are successes (0x00, 0x10 "no matching subscribers").
_PUBACK_SUCCESSES = {code: ReasonCode(PacketTypes.PUBACK, identifier=code) for code in (0, 0x10)}
_COALESCE_BELOW = 16  # messages waiting: fewer than this, and the dispatcher waits _COALESCE_S
_COALESCE_S = 0.002
# A held-back message rechecks the room and the connection at least this often (a wake-up the
# loop's unlocked look at _inbox_waiting can miss costs at most this long).
_HOLD_POLL_S = 0.05
_DROP_LOG_INTERVAL_S = 10.0  # QoS 0 drops are logged at most this often
_PublishCallback = Callable[[str, bytes, int, int, bool], None]


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


def _publish_header(retain: bool, remaining: int) -> bytes:
    """Fixed header of a QoS 1 PUBLISH: type and flags, then the variable-length size."""
    header = bytearray([0x32 | int(retain)])
    while True:
        byte, remaining = remaining % 128, remaining // 128
        header.append(byte | (0x80 if remaining else 0))
        if not remaining:
            return bytes(header)


class _LeanClient(paho.Client):
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

    This overrides paho 2.x's ``_handle_publish``, ``_handle_pubackcomp``, ``_update_inflight``,
    ``_sock_recv`` and ``loop_read`` and uses its ``_in_packet``, ``_protocol``, ``_manual_ack``,
    ``_packet_queue``, ``_mid_generate``, ``_out_messages``, ``_out_message_mutex``,
    ``_inflight_messages``, ``_do_on_publish`` and ``_reset_sockets`` (``MqttConnection`` also
    calls ``_raise_for_invalid_topic``); paho is pinned below 3 and tests/gateway/io exercise
    every path (TLS included).
    """

    on_publish_received: _PublishCallback | None = None
    on_lean_puback: Callable[[int, ReasonCode], None] | None = None
    _read_buffer = b""
    _read_position = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lean_mids: set[int] = set()  # publish_many's packets awaiting PUBACK

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
        (mid,) = _UINT16.unpack_from(packet)
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
        Topics must already be valid (:meth:`MqttConnection.start_publish_many` makes paho's
        check). Returns the packet ids, in order.
        """
        v5 = self._protocol == paho.MQTTv5
        parts: list[bytes] = []
        mids: list[int] = []
        for topic, payload, retain in messages:
            mid = self._mid_generate()
            body_length = 2 + len(topic) + 2 + (1 if v5 else 0) + len(payload)
            parts += (
                _publish_header(retain, body_length),
                _UINT16.pack(len(topic)),
                topic,
                _UINT16.pack(mid),
                b"\x00" if v5 else b"",
                payload,
            )
            mids.append(mid)
        with self._out_message_mutex:
            self._lean_mids.update(mids)
        self._packet_queue(paho.PUBLISH, b"".join(parts), mids[-1] if mids else 0, 1)
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
        packet = b"".join(_PUBACK.pack(paho.PUBACK, 2, mid) for mid in mids)
        self._packet_queue(paho.PUBACK, packet, 0, 0)

    def close_sockets(self) -> None:
        """Close the connection's socket and the wake-up socket pair of paho's thread now.

        paho closes them only when the client is garbage collected, and in a reference cycle the
        sockets may be finalised first (an 'unclosed socket' ResourceWarning).
        """
        self._reset_sockets()

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        rc = super().loop_read(max_packets)
        # Packets already in the buffer would not wake the select() in paho's loop.
        while rc == MQTTErrorCode.MQTT_ERR_SUCCESS and self._read_position < len(self._read_buffer):
            rc = super().loop_read(1)
        return rc

    def _handle_publish(self) -> MQTTErrorCode:
        callback = self.on_publish_received
        header = self._in_packet["command"]
        qos = (header & 0x06) >> 1
        if callback is None or qos == 2:
            return super()._handle_publish()
        packet = self._in_packet["packet"]
        try:
            (length,) = _UINT16.unpack_from(packet, 0)
            position = 2 + length
            mid = 0
            if qos:
                (mid,) = _UINT16.unpack_from(packet, position)
                position += 2
            if self._protocol == MQTTProtocolVersion.MQTTv5:
                if packet[position] != 0:  # MQTT 5 properties (or a topic alias): paho's path
                    return super()._handle_publish()
                position += 1
        except (struct.error, IndexError):
            return super()._handle_publish()  # malformed: paho reports it
        if length == 0:
            return super()._handle_publish()
        topic = bytes(packet[2 : 2 + length]).decode("utf-8", "replace")
        callback(topic, bytes(packet[position:]), qos, mid, bool(header & 0x01))
        if qos == 1 and not self._manual_ack:
            return self._send_puback(mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS


class MqttConnection:
    """A supervised MQTT connection: reconnects with backoff until closed.

    ``publish`` completes only when the broker acknowledged (QoS 1/2) and raises
    :class:`MqttNotConnectedError` when there is no connection; nothing is queued silently.
    Incoming messages are handed to ``on_message`` one at a time, in order, and acknowledged
    only after it returns (and after ``before_ack``, called once per batch of acknowledgements),
    so a message the gateway never processed is redelivered by a persistent session. At most
    ``max_inbox`` received messages wait for ``on_message`` (module doc: QoS 0 beyond that is
    dropped and counted, QoS 1/2 waits at the broker).
    """

    def __init__(
        self,
        broker: MqttBrokerConfig,
        *,
        client_id: str,
        clean_start: bool,
        will: Will | None = None,
        on_message: MessageHandler | None = None,
        before_ack: Callable[[], None] | None = None,
        session_expiry_s: int = 0,
        max_in_flight: int | None = None,
        max_inbox: int = DEFAULT_MAX_INBOX,
        name: str = "mqtt",
    ) -> None:
        if max_inbox < 1:
            raise ValueError(f"max_inbox must be at least 1, got {max_inbox}")
        self._broker = broker
        self._client_id = client_id
        self._clean_start = clean_start
        self._will = will
        self._on_message = on_message
        self._before_ack = before_ack  # e.g. make what on_message queued durable, per batch
        self._session_expiry_s = session_expiry_s
        self._max_in_flight = max_in_flight
        self.server_receive_maximum = 65_535  # from the last CONNACK (MQTT 5); 65,535 if absent
        self._log = structlog.get_logger("gateway.mqtt").bind(
            connection=name, broker=f"{broker.host}:{broker.port}", client_id=client_id
        )
        self._attempt: _Attempt | None = None
        self._connected = False
        self._connected_event = asyncio.Event()
        self._generation = 0
        self._subscriptions: dict[str, int] = {}
        # Received messages cross from paho's thread to the loop through this inbox: the
        # thread appends under the lock and wakes the loop only when the inbox was empty.
        # ``_in_hand`` (written by the loop only) counts messages taken from the inbox and not
        # yet handled; the bound applies to both together.
        self._inbox: deque[_Delivery] = deque()
        self._inbox_lock = threading.Lock()
        self._inbox_room = threading.Condition(self._inbox_lock)
        self._inbox_signalled = False
        self._inbox_ready = asyncio.Event()
        self._max_inbox = max_inbox
        self._in_hand = 0
        self._inbox_waiting = 0  # paho threads holding a message back for room
        self._inbox_peak = 0
        self._inbox_dropped = 0  # QoS 0 messages dropped at the bound
        self._inbox_held = 0  # QoS 1/2 messages held back at the bound (back-pressure)
        self._drops_logged = 0
        self._next_drop_log = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.create_task(self._supervise(), name="mqtt-supervisor"))
        if self._on_message is not None:
            self._tasks.append(asyncio.create_task(self._dispatch(), name="mqtt-dispatch"))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop reconnecting and disconnect cleanly (a clean DISCONNECT suppresses the will)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        attempt = self._attempt
        if attempt is not None:
            await self._teardown(attempt)

    # -- state -----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True only between a successful CONNACK and the loss of that connection."""
        return self._connected

    @property
    def generation(self) -> int:
        """Number of successful connections so far; changes on every reconnect."""
        return self._generation

    async def serve(self) -> None:
        """Wait while the connection works in the background; raises if its tasks fail."""
        await asyncio.gather(*self._tasks)

    def inbox_stats(self) -> dict[str, int]:
        """The receive hand-off: waiting now, the most ever waiting, its bound, QoS 0 messages
        dropped at the bound and QoS 1/2 messages held back (left at the broker) at it."""
        return {
            "buffered": len(self._inbox) + self._in_hand,
            "peak": self._inbox_peak,
            "max": self._max_inbox,
            "dropped_qos0": self._inbox_dropped,
            "held_back": self._inbox_held,
        }

    async def wait_connected(self) -> None:
        """Return once connected (immediately if already)."""
        while not self._connected:
            await self._connected_event.wait()

    async def wait_disconnected(self) -> None:
        """Return once the current connection is lost (immediately if not connected)."""
        attempt = self._attempt
        if not self._connected or attempt is None:
            return
        await attempt.lost.wait()

    # -- operations ------------------------------------------------------------------------

    def start_publish(
        self, topic: str, payload: bytes, qos: int = 1, retain: bool = False
    ) -> asyncio.Future[None]:
        """Hand a message to the broker now; the future resolves on its acknowledgement.

        Calls made one after another reach the broker in that order, which lets the publisher
        keep several messages in flight without reordering them.
        """
        attempt = self._attempt
        if attempt is None or not self._connected:
            raise MqttNotConnectedError(f"not connected to {self._broker.host}; cannot publish")
        try:
            info = attempt.client.publish(topic, payload, qos=qos, retain=retain)
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
            attempt.publishes[info.mid] = future
        return future

    def start_publish_many(
        self, messages: Sequence[tuple[str, bytes, bool]]
    ) -> list[asyncio.Future[None]]:
        """QoS 1 publishes of ``(topic, payload, retain)`` handed to the broker in one write,
        in order; each future resolves on its PUBACK (see :meth:`_LeanClient.publish_many`).
        A topic paho would refuse gets a future failed with :class:`MqttPublishError`."""
        attempt = self._attempt
        if attempt is None or not self._connected:
            raise MqttNotConnectedError(f"not connected to {self._broker.host}; cannot publish")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = [loop.create_future() for _ in messages]
        sendable: list[tuple[bytes, bytes, bool]] = []
        slots: list[asyncio.Future[None]] = []
        for (topic, payload, retain), future in zip(messages, futures, strict=True):
            encoded = topic.encode("utf-8")
            try:
                paho.Client._raise_for_invalid_topic(encoded)  # the check paho's publish makes
            except ValueError as exc:
                future.set_exception(MqttPublishError(f"cannot publish to {topic!r}: {exc}"))
                continue
            sendable.append((encoded, payload, retain))
            slots.append(future)
        if sendable:
            mids = attempt.client.publish_many(sendable)
            attempt.publishes.update(zip(mids, slots, strict=True))
        return futures

    async def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Publish and wait for the broker's acknowledgement (QoS 1 PUBACK)."""
        await self.start_publish(topic, payload, qos=qos, retain=retain)

    async def subscribe(self, topics: Sequence[str], qos: int = 1) -> None:
        """Subscribe now if connected (waiting for SUBACK) and on every future connection."""
        for topic in topics:
            self._subscriptions[topic] = qos
        attempt = self._attempt
        if attempt is not None and self._connected:
            await self._send_subscribe(attempt, dict.fromkeys(topics, qos))

    # -- supervision -----------------------------------------------------------------------

    async def _supervise(self) -> None:
        delay = self._broker.reconnect_initial_s
        failures = 0
        while True:
            try:
                attempt = await self._connect_once()
            except MqttConnectError as exc:
                failures += 1
                log = self._log.warning if failures == 1 else self._log.debug
                log("mqtt_connect_failed", error=str(exc), retry_in_s=delay, failures=failures)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._broker.reconnect_max_s)
                continue
            delay = self._broker.reconnect_initial_s
            failures = 0
            await attempt.lost.wait()
            self._mark_lost(attempt)
            self._log.warning("mqtt_connection_lost")
            await self._teardown(attempt)

    async def _connect_once(self) -> _Attempt:
        loop = asyncio.get_running_loop()
        client = self._make_client()
        attempt = _Attempt(client=client, connack=loop.create_future())
        self._bind_callbacks(attempt)
        self._attempt = attempt
        try:
            await asyncio.wait_for(
                asyncio.to_thread(self._blocking_connect, client),
                timeout=self._broker.connect_timeout_s,
            )
            client.loop_start()
            session_present = await asyncio.wait_for(
                asyncio.shield(attempt.connack), timeout=self._broker.connect_timeout_s
            )
            if self._subscriptions and not session_present:
                # Before reporting "connected", so nothing published to us in between is missed.
                await asyncio.wait_for(
                    self._send_subscribe(attempt, dict(self._subscriptions)),
                    timeout=self._broker.connect_timeout_s,
                )
            if attempt.lost.is_set():  # dropped again between CONNACK and now
                raise MqttNotConnectedError("the connection closed right after CONNACK")
        except (MqttNotConnectedError, MqttSubscribeError) as exc:
            await self._teardown(attempt)
            raise MqttConnectError(f"connection unusable after CONNACK: {exc}") from exc
        except (OSError, TimeoutError, ValueError, MqttConnectError) as exc:
            await self._teardown(attempt)
            if isinstance(exc, MqttConnectError):
                raise
            raise MqttConnectError(
                f"cannot connect to {self._broker.host}:{self._broker.port}: {exc or type(exc)}"
            ) from exc
        except asyncio.CancelledError:
            await self._teardown(attempt)
            raise
        self._connected = True
        self._generation += 1
        self._connected_event.set()
        self._connected_event = asyncio.Event()
        self._log.info("mqtt_connected", session_present=session_present)
        return attempt

    def _make_client(self) -> _LeanClient:
        v5 = self._broker.protocol == "5"
        client = _LeanClient(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self._client_id,
            clean_session=None if v5 else self._clean_start,
            protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
            transport=self._broker.transport,
            reconnect_on_failure=False,
            manual_ack=True,
        )
        client.connect_timeout = self._broker.connect_timeout_s
        if self._max_in_flight is not None:  # paho's own cap (20) on unacknowledged publishes
            client.max_inflight_messages_set(self._max_in_flight)
        if self._broker.username:
            password = self._broker.resolve_password()
            client.username_pw_set(
                self._broker.username,
                password.get_secret_value() if password is not None else None,
            )
        tls = self._broker.tls
        if tls is not None:
            try:
                client.tls_set(
                    ca_certs=str(tls.ca_file) if tls.ca_file else None,
                    certfile=str(tls.cert_file) if tls.cert_file else None,
                    keyfile=str(tls.key_file) if tls.key_file else None,
                )
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                raise ConfigError(
                    f"mqtt tls: cannot load ca_file/cert_file/key_file ({exc}); "
                    "check the paths and that the key matches the certificate"
                ) from exc
            client.tls_insecure_set(tls.insecure)
        if self._will is not None:
            client.will_set(
                self._will.topic, self._will.payload, qos=self._will.qos, retain=self._will.retain
            )
        return client

    def _blocking_connect(self, client: _LeanClient) -> None:
        """Runs in a worker thread: DNS, TCP (and TLS) handshake and sending CONNECT."""
        if self._broker.protocol == "5":
            properties = None
            if self._session_expiry_s > 0:
                properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
                properties.SessionExpiryInterval = self._session_expiry_s
            client.connect(
                self._broker.host,
                self._broker.port,
                self._broker.keepalive,
                clean_start=self._clean_start,
                properties=properties,
            )
        else:
            client.connect(self._broker.host, self._broker.port, self._broker.keepalive)

    async def _teardown(self, attempt: _Attempt) -> None:
        """Stop one client for good: DISCONNECT if open (no will), end its thread."""
        self._mark_lost(attempt)
        client = attempt.client
        client.disconnect()  # also tells paho's thread to exit instead of reconnecting
        await asyncio.to_thread(client.loop_stop)
        with contextlib.suppress(OSError):
            client.close_sockets()

    def _mark_lost(self, attempt: _Attempt) -> None:
        attempt.lost.set()
        with self._inbox_lock:
            attempt.released.set()
            self._inbox_room.notify_all()
        if self._attempt is attempt:
            self._attempt = None
            self._connected = False
        error = MqttNotConnectedError(
            "the connection to the broker was lost before it acknowledged"
        )
        for pending in (attempt.publishes, attempt.subscribes):
            for future in pending.values():
                if not future.done():
                    future.set_exception(error)
                    future.exception()  # retrieved here so an abandoned future does not warn
            pending.clear()

    async def _send_subscribe(self, attempt: _Attempt, topics: dict[str, int]) -> None:
        result, mid = attempt.client.subscribe(list(topics.items()))
        if result != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise MqttNotConnectedError(f"subscribe not sent: {paho.error_string(result)}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        attempt.subscribes[mid] = future
        await future
        self._log.info("mqtt_subscribed", topics=sorted(topics))

    async def _dispatch(self) -> None:
        handler = self._on_message
        assert handler is not None
        while True:
            await self._inbox_ready.wait()
            if len(self._inbox) < _COALESCE_BELOW:
                # Sensors spread over time arrive one message per wake-up; waiting a moment
                # lets a batch form (one wake-up and one acknowledgement write for all).
                await asyncio.sleep(_COALESCE_S)
            with self._inbox_lock:
                batch = list(self._inbox)
                self._inbox.clear()
                self._in_hand = len(batch)
                self._inbox_signalled = False
                self._inbox_ready.clear()
            self._log_drops()
            acks: dict[_Attempt, list[int]] = {}
            for delivery in batch:
                await handler(delivery.message)
                self._in_hand -= 1
                if self._inbox_waiting:  # paho's thread holds a message back: there is room now
                    with self._inbox_lock:
                        self._inbox_room.notify_all()
                attempt = delivery.attempt
                # A message of a lost connection is redelivered, not acknowledged. A live one is
                # acknowledged even before the connection is reported up: the broker sends a
                # persistent session's queue right after CONNACK, and a message left
                # unacknowledged on a live connection holds one of the broker's in-flight slots
                # for good (20 of them stalled delivery after a broker restart).
                if (
                    delivery.message.qos == 0
                    or attempt is not self._attempt
                    or attempt.lost.is_set()
                ):
                    continue
                if delivery.message.qos == 1:
                    acks.setdefault(attempt, []).append(delivery.mid)
                else:
                    if self._before_ack is not None:
                        self._before_ack()
                    attempt.client.ack(delivery.mid, delivery.message.qos)
            if self._before_ack is not None and acks:
                self._before_ack()
            for attempt, mids in acks.items():
                if attempt is self._attempt and not attempt.lost.is_set():
                    attempt.client.ack_many(mids)

    def _log_drops(self) -> None:
        """Log QoS 0 drops at the inbox bound, at most once per _DROP_LOG_INTERVAL_S."""
        dropped = self._inbox_dropped
        if dropped == self._drops_logged or time.monotonic() < self._next_drop_log:
            return
        self._log.warning(
            "mqtt_inbox_full_dropped",
            qos=0,
            dropped=dropped - self._drops_logged,
            dropped_total=dropped,
            max_inbox=self._max_inbox,
        )
        self._drops_logged = dropped
        self._next_drop_log = time.monotonic() + _DROP_LOG_INTERVAL_S

    # -- paho callbacks (paho's thread) -> event loop -------------------------------------

    def _bind_callbacks(self, attempt: _Attempt) -> None:
        loop = self._loop or asyncio.get_running_loop()

        def later(callback: Callable[..., None], *args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # loop already closed at interpreter exit
                loop.call_soon_threadsafe(callback, attempt, *args)

        client = attempt.client
        client.on_connect = lambda _c, _u, flags, rc, p: later(self._on_connack, flags, rc, p)
        client.on_disconnect = lambda _c, _u, _f, rc, _p: later(self._on_disconnect, rc)
        client.on_subscribe = lambda _c, _u, mid, rcs, _p: later(self._on_suback, mid, rcs)

        # PUBACKs come in bursts (the publisher keeps many messages in flight): one hand-off to
        # the loop per burst, in arrival order, ahead of anything paho reports after them.
        pubacks: list[tuple[int, ReasonCode]] = []
        pubacks_lock = threading.Lock()

        def published(mid: int, rc: ReasonCode) -> None:
            with pubacks_lock:
                pubacks.append((mid, rc))
                if len(pubacks) > 1:
                    return  # a hand-off is already scheduled and will take this one too
            later(settle_pubacks)

        def settle_pubacks(attempt: _Attempt) -> None:
            with pubacks_lock:
                batch = list(pubacks)
                pubacks.clear()
            for mid, rc in batch:
                self._on_puback(attempt, mid, rc)

        client.on_publish = lambda _c, _u, mid, rc, _p: published(mid, rc)
        client.on_lean_puback = published

        def received(topic: str, payload: bytes, qos: int, mid: int, retain: bool) -> None:
            delivery = _Delivery(attempt, mid, InboundMessage(topic, payload, qos, retain))
            with self._inbox_lock:
                if len(self._inbox) + self._in_hand >= self._max_inbox and not self._make_room(
                    attempt, qos
                ):
                    return
                self._inbox.append(delivery)
                self._inbox_peak = max(self._inbox_peak, len(self._inbox) + self._in_hand)
                if self._inbox_signalled:
                    return
                self._inbox_signalled = True
            with contextlib.suppress(RuntimeError):  # loop already closed at interpreter exit
                loop.call_soon_threadsafe(self._inbox_ready.set)

        def received_by_paho(message: paho.MQTTMessage) -> None:
            try:
                topic = message.topic
            except UnicodeDecodeError:
                topic = bytes(message._topic).decode("utf-8", "replace")
            received(topic, bytes(message.payload), message.qos, message.mid, message.retain)

        client.on_message = lambda _c, _u, msg: received_by_paho(msg)
        client.on_publish_received = received

    def _make_room(self, attempt: _Attempt, qos: int) -> bool:
        """paho's thread, inbox lock held, inbox full: may this message go in?

        QoS 0: no, it is dropped and counted. QoS 1/2: wait, holding it (paho's thread reads
        no more from the socket meanwhile), until the loop has made room; False if the attempt
        was given up meanwhile (unacknowledged, the broker redelivers it).
        """
        if qos == 0:
            self._inbox_dropped += 1
            return False
        self._inbox_held += 1
        self._inbox_waiting += 1
        try:
            while len(self._inbox) + self._in_hand >= self._max_inbox:
                if attempt.released.is_set():
                    return False
                self._inbox_room.wait(_HOLD_POLL_S)
        finally:
            self._inbox_waiting -= 1
        return not attempt.released.is_set()

    def _on_connack(
        self,
        attempt: _Attempt,
        flags: paho.ConnectFlags,
        rc: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if attempt.connack.done():
            return
        # MQTT 5: the broker may announce how many unacknowledged publishes it accepts.
        limit = getattr(properties, "ReceiveMaximum", None)
        self.server_receive_maximum = limit if isinstance(limit, int) and limit > 0 else 65_535
        if rc.is_failure:
            attempt.connack.set_exception(
                MqttConnectError(f"broker refused the connection: {rc}; check credentials/ACL")
            )
            attempt.connack.exception()
        else:
            attempt.connack.set_result(bool(flags.session_present))

    def _on_disconnect(self, attempt: _Attempt, rc: ReasonCode) -> None:
        if not attempt.connack.done():
            attempt.connack.set_exception(MqttConnectError(f"disconnected before CONNACK: {rc}"))
            attempt.connack.exception()
        self._mark_lost(attempt)

    def _on_puback(self, attempt: _Attempt, mid: int, rc: ReasonCode) -> None:
        future = attempt.publishes.pop(mid, None)
        if future is None or future.done():
            return
        if rc.is_failure:
            future.set_exception(MqttPublishError(f"broker rejected the publish: {rc}"))
        else:
            future.set_result(None)

    def _on_suback(self, attempt: _Attempt, mid: int, codes: list[ReasonCode]) -> None:
        future = attempt.subscribes.pop(mid, None)
        if future is None or future.done():
            return
        refused = [str(code) for code in codes if code.is_failure]
        if refused:
            future.set_exception(MqttSubscribeError(f"broker refused subscription: {refused}"))
        else:
            future.set_result(None)
