"""One MQTT connection as an asyncio resource, shared by the MQTT source and the publisher.

paho-mqtt is a threaded library. By default (``io_loop = "thread"``) we keep its network loop in
its own thread (``loop_start``) and marshal every callback onto the event loop with
``call_soon_threadsafe``, so all of our state is touched by exactly one thread (the event loop)
and paho's own locks guard paho's state. With ``io_loop = "event_loop"`` (plain TCP) the blocking
``connect()`` (DNS, the TCP handshake, CONNECT) still runs in a worker thread, and the connected
socket is then handed to the event loop: ``add_reader`` calls paho's ``loop_read``, paho's socket
callbacks register writes, a timer runs ``loop_misc`` (keepalive), and every paho callback runs on
the loop itself: no thread, no wake-up writes between threads. Back-pressure there cannot be a
waiting thread: the message that fills the inbox goes in (one over the bound) and the socket is not
read again until there is room.

Each connection attempt uses a fresh paho client with ``reconnect_on_failure=False``: paho never
reconnects or replays on its own, so the supervising loop here owns reconnect and backoff, and
a publish that was not acknowledged fails loudly instead of being replayed behind the caller's
back (the publisher's outbox does the replaying, in order). A refused CONNACK is a failed attempt:
``connected`` becomes true only after a successful CONNACK.

Receiving is the gateway's hot path (thousands of readings per second, one message each), so it
avoids per-message overhead: :class:`~tesla_gateway.mqtt.fast_path.LeanClient` decodes QoS 0/1
PUBLISH packets without paho's per-message objects, and messages cross from paho's thread to
the event loop in batches (one wake-up of the loop per burst, not one ``call_soon_threadsafe``
per message). ``client: plain`` in the broker config, or a paho that breaks the fast path's
contract, uses :class:`~tesla_gateway.mqtt.plain_client.PlainClient` (paho's public API) instead.

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
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import structlog
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from tesla_gateway.errors import ConfigError
from tesla_gateway.mqtt.config import DEFAULT_MAX_INBOX, ClientKind, MqttBrokerConfig, Will
from tesla_gateway.mqtt.errors import (
    MqttConnectError,
    MqttNotConnectedError,
    MqttPublishError,
    MqttSubscribeError,
)
from tesla_gateway.mqtt.fast_path import LeanClient, contract_problems, paho_version
from tesla_gateway.mqtt.plain_client import PlainClient
from tesla_gateway.mqtt.session_loss import (
    UNSTABLE_HINT_AFTER,
    SessionLossPolicy,
    taken_over_message,
)
from tesla_gateway.task_group import run_task_group

__all__ = ["InboundMessage", "MessageHandler", "MqttConnection"]


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

    client: LeanClient | PlainClient
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


@dataclass(frozen=True, slots=True)
class _Delivery:
    attempt: _Attempt
    mid: int
    message: InboundMessage


_COALESCE_BELOW = 16  # messages waiting: fewer than this, and the dispatcher waits _COALESCE_S
_COALESCE_S = 0.002
# A held-back message rechecks the room and the connection at least this often (a wake-up the
# loop's unlocked look at _inbox_waiting can miss costs at most this long).
_HOLD_POLL_S = 0.05
_DROP_LOG_INTERVAL_S = 10.0  # QoS 0 drops are logged at most this often
_MISC_INTERVAL_S = 1.0  # event-loop mode: paho's keepalive check (PINGREQ, a silent broker)


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
        self._log = structlog.get_logger("tesla_gateway.mqtt").bind(
            connection=name, broker=f"{broker.host}:{broker.port}", client_id=client_id
        )
        self._attempt: _Attempt | None = None
        self._losses = SessionLossPolicy(broker.reconnect_initial_s, broker.reconnect_max_s)
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
        self._runner: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client_class = _client_class(broker.client, self._log)
        # Event-loop mode (io_loop): paho's socket is read and written by this event loop, so
        # every paho callback already runs on it; with TLS the thread is kept (TLS records
        # buffered inside the ssl object would not wake the loop's selector).
        self._on_loop = broker.io_loop == "event_loop" and broker.tls is None
        if broker.io_loop == "event_loop" and broker.tls is not None:
            self._log.info("mqtt_io_loop_thread", reason="TLS connections keep paho's thread")

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        tasks = {"mqtt-supervisor": self._supervise()}
        if self._on_message is not None:
            tasks["mqtt-dispatch"] = self._dispatch()
        self._runner = asyncio.create_task(run_task_group(tasks), name="mqtt-connection")
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
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            await asyncio.wait({runner})
        attempt = self._attempt
        if attempt is not None:
            await self._teardown(attempt)
        error = None if runner is None or runner.cancelled() else runner.exception()
        if error is not None:  # a task failed (serve() raised it too): raised after the teardown
            raise error

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
        if self._runner is not None:
            await self._runner

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
        in order; each future resolves on its PUBACK (see :meth:`LeanClient.publish_many`).
        A topic paho would refuse gets a future failed with :class:`MqttPublishError`."""
        attempt = self._attempt
        if attempt is None or not self._connected:
            raise MqttNotConnectedError(f"not connected to {self._broker.host}; cannot publish")
        client = attempt.client
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
            attempt.publishes.update(zip(mids, slots, strict=True))
        return futures

    def _start_or_fail(self, topic: str, payload: bytes, retain: bool) -> asyncio.Future[None]:
        """:meth:`start_publish` at QoS 1, its error (if any) in the future it returns."""
        try:
            return self.start_publish(topic, payload, qos=1, retain=retain)
        except (MqttPublishError, MqttNotConnectedError) as exc:
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

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
        failures = 0
        while True:
            try:
                attempt = await self._connect_once()
            except MqttConnectError as exc:
                failures += 1
                delay = self._losses.after_failed_attempt()
                log = self._log.warning if failures == 1 else self._log.debug
                log("mqtt_connect_failed", error=str(exc), retry_in_s=delay, failures=failures)
                await asyncio.sleep(delay)
                continue
            failures = 0
            await attempt.lost.wait()
            self._mark_lost(attempt)
            wait = self._report_loss(attempt)
            await self._teardown(attempt)
            if wait > 0:
                await asyncio.sleep(wait)

    def session_stats(self) -> dict[str, int | float | None]:
        """Connections made, lost, and taken over by another client with this client id."""
        attempt = self._attempt
        up_since = attempt.connected_at if self._connected and attempt is not None else None
        up_for = None if up_since is None else time.monotonic() - up_since
        return self._losses.stats(self._generation, connected_for_s=up_for)

    def _report_loss(self, attempt: _Attempt) -> float:
        """Log a lost connection as what it was; the seconds to wait before reconnecting."""
        connected_at = attempt.connected_at
        lasted = time.monotonic() - connected_at if connected_at is not None else 0.0
        decision = self._losses.after_loss(lasted_s=lasted, reason_code=attempt.lost_reason)
        fields: dict[str, Any] = {
            "lasted_s": round(lasted, 1),
            "retry_in_s": decision.wait_s,
            "reason": _reason_name(attempt.lost_reason),
        }
        if decision.taken_over:
            log = self._log.error if decision.report else self._log.debug
            log(
                "mqtt_session_taken_over",
                error=taken_over_message(self._client_id),
                taken_over=self._losses.taken_over,
                **fields,
            )
        elif decision.unstable:
            if decision.in_a_row >= UNSTABLE_HINT_AFTER:
                fields["hint"] = (
                    "the broker keeps closing this connection right after accepting it; "
                    + taken_over_message(self._client_id)
                )
            log = self._log.warning if decision.report else self._log.debug
            log("mqtt_connection_unstable", in_a_row=decision.in_a_row, **fields)
        else:
            self._log.warning("mqtt_connection_lost", **fields)
        return decision.wait_s

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
            if self._on_loop:
                self._attach(attempt)
            else:
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
        attempt.connected_at = time.monotonic()
        self._generation += 1
        self._connected_event.set()
        self._connected_event = asyncio.Event()
        self._log.info("mqtt_connected", session_present=session_present)
        return attempt

    @property
    def client_kind(self) -> ClientKind:
        """The paho client in use: 'fast' (the lean path) or 'plain' (chosen, or the fallback)."""
        return "fast" if self._client_class is LeanClient else "plain"

    def _make_client(self) -> LeanClient | PlainClient:
        v5 = self._broker.protocol == "5"
        client = self._client_class(
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

    def _blocking_connect(self, client: LeanClient | PlainClient) -> None:
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
        if self._on_loop:
            if attempt.misc is not None:
                attempt.misc.cancel()
            with contextlib.suppress(OSError):
                client.loop_write()  # the DISCONNECT, now (it is a few bytes)
        else:
            await asyncio.to_thread(client.loop_stop)
        with contextlib.suppress(OSError):
            client.close_sockets()

    def _attach(self, attempt: _Attempt) -> None:
        """Event-loop mode: the loop reads and writes paho's socket and runs its keepalive."""
        loop = asyncio.get_running_loop()
        client = attempt.client
        sock = client.socket()
        if sock is None:
            raise MqttNotConnectedError("the connection closed during connect")

        def readable() -> None:
            client.loop_read()  # a failure closes the socket and calls on_disconnect

        def writable() -> None:
            client.loop_write()

        def closing(_client: object, _userdata: object, closed: Any) -> None:
            loop.remove_reader(closed)  # before paho closes it: its fd may be reused
            loop.remove_writer(closed)

        def keepalive() -> None:
            if attempt.lost.is_set():
                return
            client.loop_misc()
            attempt.misc = loop.call_later(_MISC_INTERVAL_S, keepalive)

        client.on_socket_close = closing
        client.on_socket_register_write = lambda _c, _u, s: loop.add_writer(s, writable)

        def unregister(_client: object, _userdata: object, written: Any) -> None:
            loop.remove_writer(written)

        client.on_socket_unregister_write = unregister
        attempt.socket, attempt.on_readable = sock, readable
        loop.add_reader(sock, readable)
        if client.want_write():
            client.loop_write()  # what connect() left unsent; registers the rest, if any
        attempt.misc = loop.call_later(_MISC_INTERVAL_S, keepalive)

    def _pause_reading(self, attempt: _Attempt) -> None:
        """Event-loop mode, inbox full: read no more from the broker until there is room."""
        if attempt.paused or attempt.socket is None or self._loop is None:
            return
        attempt.paused = True
        self._loop.remove_reader(attempt.socket)
        if isinstance(attempt.client, LeanClient):
            attempt.client.hold_reading = True  # the rest of its read buffer waits too

    def _resume_reading(self, attempt: _Attempt) -> None:
        if not attempt.paused or self._loop is None:
            return
        attempt.paused = False
        client = attempt.client
        if isinstance(client, LeanClient):
            client.hold_reading = False
        readable = attempt.on_readable
        if attempt.lost.is_set() or client.socket() is None or readable is None:
            return
        self._loop.add_reader(attempt.socket, readable)
        self._loop.call_soon(readable)  # what its buffer still holds wakes no selector

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
                if attempt.paused and len(self._inbox) + self._in_hand < self._max_inbox:
                    self._resume_reading(attempt)
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

        on_loop = self._on_loop  # paho calls back on the loop itself: no self-pipe wake-up

        def later(callback: Callable[..., None], *args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # loop already closed at interpreter exit
                if on_loop:
                    loop.call_soon(callback, attempt, *args)
                else:
                    loop.call_soon_threadsafe(callback, attempt, *args)

        client = attempt.client
        client.on_connect = lambda _c, _u, flags, rc, p: later(self._on_connack, flags, rc, p)
        client.on_disconnect = lambda _c, _u, flags, rc, _p: later(
            self._on_disconnect, rc, flags.is_disconnect_packet_from_server
        )
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
            if on_loop:
                self._inbox_ready.set()
                return
            with contextlib.suppress(RuntimeError):  # loop already closed at interpreter exit
                loop.call_soon_threadsafe(self._inbox_ready.set)

        def received_by_paho(message: paho.MQTTMessage) -> None:
            try:
                topic = message.topic
            except UnicodeDecodeError:
                topic = bytes(message._topic).decode("utf-8", "replace")
            received(topic, bytes(message.payload), message.qos, message.mid, message.retain)

        client.on_message = lambda _c, _u, msg: received_by_paho(msg)
        if isinstance(client, LeanClient):
            client.on_lean_puback = published
            client.on_publish_received = received

    def _make_room(self, attempt: _Attempt, qos: int) -> bool:
        """paho's thread, inbox lock held, inbox full: may this message go in?

        QoS 0: no, it is dropped and counted. QoS 1/2: wait, holding it (paho's thread reads
        no more from the socket meanwhile), until the loop has made room; False if the attempt
        was given up meanwhile (unacknowledged, the broker redelivers it).
        """
        if qos == 0:
            self._inbox_dropped += 1
            if self._on_loop:
                # Reading on and dropping here would take the loop's time from the readings
                # already in (a 2,000,000-message flood: 33,070 ingested, against 799,409 with
                # the thread): stop reading until there is room; the broker's queue takes the
                # excess (and drops it past its limit: seen through the senders' seq).
                self._pause_reading(attempt)
            return False
        self._inbox_held += 1
        if self._on_loop:
            # The loop cannot wait for itself: this message goes in (one over the bound) and
            # the socket is read no more until the dispatcher has made room; the broker keeps
            # the rest unacknowledged.
            self._pause_reading(attempt)
            return True
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

    def _on_disconnect(self, attempt: _Attempt, rc: ReasonCode, from_server: bool) -> None:
        if from_server and attempt.lost_reason is None:
            attempt.lost_reason = rc.value
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


def _client_class(kind: ClientKind, log: Any) -> type[LeanClient] | type[PlainClient]:
    """The paho client class for ``kind``: the fast one unless the installed paho breaks it."""
    if kind == "plain":
        return PlainClient
    problems = contract_problems()
    if not problems:
        return LeanClient
    log.warning(
        "mqtt_fast_path_unavailable",
        paho_version=paho_version(),
        problems=list(problems),
        using="plain",
    )
    return PlainClient


def _reason_name(code: int | None) -> str | None:
    """The DISCONNECT reason's name (MQTT 5), e.g. 'Session taken over'; None without one."""
    if code is None:
        return None
    try:
        return str(ReasonCode(PacketTypes.DISCONNECT, identifier=code))
    except (KeyError, ValueError):
        return f"reason code {code}"
