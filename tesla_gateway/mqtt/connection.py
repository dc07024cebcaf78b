"""One MQTT connection as an asyncio resource, shared by the MQTT source and the publisher.

:class:`MqttConnection` is the supervisor: one loop owns reconnect and backoff (the policy is
:mod:`~tesla_gateway.mqtt.session_loss`), each attempt with a fresh paho client
(:mod:`~tesla_gateway.mqtt.client_factory`) that never reconnects or replays on its own, so a
publish that was not acknowledged fails loudly instead of being replayed behind the caller's
back (the publisher's outbox does the replaying, in order). A refused CONNACK is a failed attempt:
``connected`` becomes true only after a successful CONNACK.

paho is a threaded library. By default (``io_loop = "thread"``) its network loop runs in its own
thread (``loop_start``) and every callback is marshalled onto the event loop
(:mod:`~tesla_gateway.mqtt.callbacks`), so all of our state is touched by exactly one thread;
with ``io_loop = "event_loop"`` (plain TCP) the event loop reads and writes the socket itself
(:mod:`~tesla_gateway.mqtt.loop_io`). Received messages reach ``on_message`` through a bounded
:class:`~tesla_gateway.mqtt.inbox.Inbox` (QoS 0 beyond the bound is dropped and counted, QoS 1/2
waits at the broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

import structlog
from paho.mqtt import client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from tesla_gateway.mqtt import loop_io
from tesla_gateway.mqtt.attempt import Attempt
from tesla_gateway.mqtt.callbacks import bind_callbacks
from tesla_gateway.mqtt.client_factory import ClientFactory, choose_client_class
from tesla_gateway.mqtt.config import DEFAULT_MAX_INBOX, ClientKind, MqttBrokerConfig, Will
from tesla_gateway.mqtt.errors import MqttConnectError, MqttNotConnectedError, MqttSubscribeError
from tesla_gateway.mqtt.inbox import Inbox, MessageHandler
from tesla_gateway.mqtt.session_loss import (
    SessionLossPolicy,
    report_connect_failure,
    report_loss,
)
from tesla_gateway.task_group import run_task_group

__all__ = ["MqttConnection"]


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
        self._broker = broker
        self._on_message = on_message
        self._before_ack = before_ack  # e.g. make what on_message queued durable, per batch
        self.server_receive_maximum = 65_535  # from the last CONNACK (MQTT 5); 65,535 if absent
        self._log = structlog.get_logger("tesla_gateway.mqtt").bind(
            connection=name, broker=f"{broker.host}:{broker.port}", client_id=client_id
        )
        # Event-loop mode (io_loop): paho's socket is read and written by this event loop, so
        # every paho callback already runs on it; with TLS the thread is kept (module doc of
        # tesla_gateway.mqtt.loop_io).
        self._on_loop = broker.io_loop == "event_loop" and broker.tls is None
        self._inbox = Inbox(
            max_inbox, self._log, pause_reading=self._pause_reading if self._on_loop else None
        )
        self._attempt: Attempt | None = None
        self._losses = SessionLossPolicy(broker.reconnect_initial_s, broker.reconnect_max_s)
        self._connected = False
        self._connected_event = asyncio.Event()
        self._generation = 0
        self._subscriptions: dict[str, int] = {}
        self._runner: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients = ClientFactory(
            broker,
            choose_client_class(broker.client, self._log),
            client_id=client_id,
            clean_start=clean_start,
            will=will,
            session_expiry_s=session_expiry_s,
            max_in_flight=max_in_flight,
        )
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
        return self._inbox.stats()

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
        return self._live_attempt().start_publish(topic, payload, qos=qos, retain=retain)

    def start_publish_many(
        self, messages: Sequence[tuple[str, bytes, bool]]
    ) -> list[asyncio.Future[None]]:
        """QoS 1 publishes of ``(topic, payload, retain)`` handed to the broker in one write,
        in order; each future resolves on its PUBACK (see :meth:`LeanClient.publish_many`).
        A topic paho would refuse gets a future failed with :class:`MqttPublishError`."""
        return self._live_attempt().start_publish_many(messages)

    def _live_attempt(self) -> Attempt:
        attempt = self._attempt
        if attempt is None or not self._connected:
            raise MqttNotConnectedError(f"not connected to {self._broker.host}; cannot publish")
        return attempt

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
        while True:
            try:
                attempt = await self._connect_once()
            except MqttConnectError as exc:
                # A warning at once, then at most once a minute while it lasts (session_loss).
                await asyncio.sleep(report_connect_failure(self._losses, self._log, error=str(exc)))
                continue
            await attempt.lost.wait()
            self._mark_lost(attempt)
            connected_at = attempt.connected_at
            lasted = time.monotonic() - connected_at if connected_at is not None else 0.0
            wait = report_loss(
                self._losses,
                self._log,
                client_id=self._clients.client_id,
                lasted_s=lasted,
                reason_code=attempt.lost_reason,
            )
            await self._teardown(attempt)
            if wait > 0:
                await asyncio.sleep(wait)

    def session_stats(self) -> dict[str, int | float | None]:
        """Connections made, lost, and taken over by another client with this client id."""
        attempt = self._attempt
        up_since = attempt.connected_at if self._connected and attempt is not None else None
        up_for = None if up_since is None else time.monotonic() - up_since
        return self._losses.stats(self._generation, connected_for_s=up_for)

    async def _connect_once(self) -> Attempt:
        loop = asyncio.get_running_loop()
        client = self._clients.make()
        attempt = Attempt(client=client, connack=loop.create_future())
        bind_callbacks(
            attempt,
            self._loop or loop,
            on_loop=self._on_loop,
            inbox=self._inbox,
            on_connack=self._on_connack,
            on_disconnect=self._on_disconnect,
        )
        self._attempt = attempt
        timeout = self._broker.connect_timeout_s
        # asyncio.timeout, never asyncio.wait_for: on Python 3.11 wait_for returns the awaited
        # result when the close's cancellation arrives just as the step completes (CPython
        # gh-86296); the supervisor then connected and waited for a loss that never came, and
        # close() (a SIGTERM's shutdown) waited for the supervisor forever.
        try:
            async with asyncio.timeout(timeout):
                await asyncio.to_thread(self._connect_in_thread, attempt)
            if self._on_loop:
                loop_io.attach(loop, attempt)
            else:
                client.loop_start()
            async with asyncio.timeout(timeout):
                session_present = await asyncio.shield(attempt.connack)
            if self._subscriptions and not session_present:
                # Before reporting "connected", so nothing published to us in between is missed.
                async with asyncio.timeout(timeout):
                    await self._send_subscribe(attempt, dict(self._subscriptions))
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
        self._log.info(
            "mqtt_connected",
            session_present=session_present,
            after_failed_attempts=self._losses.after_connected(),
        )
        return attempt

    def _connect_in_thread(self, attempt: Attempt) -> None:
        """The blocking connect, in a worker thread that a cancellation or a timeout does not
        stop. An attempt given up meanwhile (teardown released it) has its socket closed here:
        left open, it would hold this client id at the broker and could take over the session
        of the next attempt."""
        if attempt.released.is_set():
            return
        self._clients.connect(attempt.client)
        if attempt.released.is_set():
            with contextlib.suppress(OSError):
                attempt.client.close_sockets()

    @property
    def client_kind(self) -> ClientKind:
        """The paho client in use: 'fast' (the lean path) or 'plain' (chosen, or the fallback)."""
        return self._clients.kind

    async def _teardown(self, attempt: Attempt) -> None:
        """Stop one client for good: DISCONNECT if open (no will), end its thread."""
        self._mark_lost(attempt)
        client = attempt.client
        client.disconnect()  # also tells paho's thread to exit instead of reconnecting
        if self._on_loop:
            loop_io.detach(attempt)
        else:
            await asyncio.to_thread(client.loop_stop)
        with contextlib.suppress(OSError):
            client.close_sockets()

    def _mark_lost(self, attempt: Attempt) -> None:
        attempt.lost.set()
        self._inbox.release(attempt)
        if self._attempt is attempt:
            self._attempt = None
            self._connected = False
        attempt.fail_pending()

    def _pause_reading(self, attempt: Attempt) -> None:
        """Event-loop mode, inbox full: read no more from the broker until there is room."""
        if self._loop is not None:
            loop_io.pause_reading(self._loop, attempt)

    async def _send_subscribe(self, attempt: Attempt, topics: dict[str, int]) -> None:
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
        inbox = self._inbox
        while True:
            batch = await inbox.next_batch()
            acks: dict[Attempt, list[int]] = {}
            for attempt, mid, message in batch:  # each a Delivery
                await handler(message)
                inbox.handled_one()
                if attempt.paused and inbox.has_room() and self._loop is not None:
                    loop_io.resume_reading(self._loop, attempt)
                # A message of a lost connection is redelivered, not acknowledged. A live one is
                # acknowledged even before the connection is reported up: the broker sends a
                # persistent session's queue right after CONNACK, and a message left
                # unacknowledged on a live connection holds one of the broker's in-flight slots
                # for good (20 of them stalled delivery after a broker restart).
                qos = message.qos
                if qos == 0 or attempt is not self._attempt or attempt.lost.is_set():
                    continue
                if qos == 1:
                    acks.setdefault(attempt, []).append(mid)
                else:
                    if self._before_ack is not None:
                        self._before_ack()
                    attempt.client.ack(mid, qos)
            if self._before_ack is not None and acks:
                self._before_ack()
            for attempt, mids in acks.items():
                if attempt is self._attempt and not attempt.lost.is_set():
                    attempt.client.ack_many(mids)

    # -- paho's callbacks, on the event loop (tesla_gateway.mqtt.callbacks) -----------------

    def _on_connack(
        self,
        attempt: Attempt,
        flags: paho.ConnectFlags,
        rc: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if attempt.connack.done():
            return
        # MQTT 5: the broker may announce how many unacknowledged publishes it accepts.
        limit = getattr(properties, "ReceiveMaximum", None)
        self.server_receive_maximum = limit if isinstance(limit, int) and limit > 0 else 65_535
        attempt.settle_connack(flags, rc)

    def _on_disconnect(self, attempt: Attempt, rc: ReasonCode, from_server: bool) -> None:
        attempt.settle_disconnect(rc, from_server)
        self._mark_lost(attempt)
