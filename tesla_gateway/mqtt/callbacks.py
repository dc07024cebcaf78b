"""paho's callbacks, marshalled onto the event loop, so the gateway's state has one thread.

With paho's network loop in its own thread (``io_loop = "thread"``), every callback is handed to
the event loop with ``call_soon_threadsafe``; paho's own locks guard paho's state. In event-loop
mode paho already calls back on the loop, and ``call_soon`` keeps the same order without a
wake-up write. Bursts cross in one hand-off each: PUBACKs (the publisher keeps many messages in
flight) and received messages (through the :class:`~tesla_gateway.mqtt.inbox.Inbox`).
:class:`~tesla_gateway.mqtt.fast_path.LeanClient` reports both without paho's per-message
objects; :class:`~tesla_gateway.mqtt.plain_client.PlainClient` through paho's ``on_message`` and
``on_publish``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from paho.mqtt import client as paho
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from tesla_gateway.mqtt.attempt import Attempt
from tesla_gateway.mqtt.fast_path import LeanClient
from tesla_gateway.mqtt.inbox import Delivery, InboundMessage, Inbox

__all__ = ["OnConnack", "OnDisconnect", "bind_callbacks"]

# (attempt, flags, reason, properties) and (attempt, reason, sent by the broker), on the loop.
OnConnack = Callable[[Attempt, paho.ConnectFlags, ReasonCode, Properties | None], None]
OnDisconnect = Callable[[Attempt, ReasonCode, bool], None]


def bind_callbacks(
    attempt: Attempt,
    loop: asyncio.AbstractEventLoop,
    *,
    on_loop: bool,
    inbox: Inbox,
    on_connack: OnConnack,
    on_disconnect: OnDisconnect,
) -> None:
    """Route the attempt's client's callbacks to the loop: CONNACK and DISCONNECT to the two
    given, acknowledgements to ``attempt``, messages into ``inbox``. ``on_loop``: paho calls
    back on ``loop`` itself (event-loop mode), so no self-pipe wake-up is needed."""

    def later(callback: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # loop already closed at interpreter exit
            if on_loop:
                loop.call_soon(callback, attempt, *args)
            else:
                loop.call_soon_threadsafe(callback, attempt, *args)

    client = attempt.client
    client.on_connect = lambda _c, _u, flags, rc, p: later(on_connack, flags, rc, p)
    client.on_disconnect = lambda _c, _u, flags, rc, _p: later(
        on_disconnect, rc, flags.is_disconnect_packet_from_server
    )
    client.on_subscribe = lambda _c, _u, mid, rcs, _p: later(Attempt.settle_suback, mid, rcs)

    # PUBACKs come in bursts: one hand-off to the loop per burst, in arrival order, ahead of
    # anything paho reports after them.
    pubacks: list[tuple[int, ReasonCode]] = []
    pubacks_lock = threading.Lock()

    def published(mid: int, rc: ReasonCode) -> None:
        with pubacks_lock:
            pubacks.append((mid, rc))
            if len(pubacks) > 1:
                return  # a hand-off is already scheduled and will take this one too
        later(settle_pubacks)

    def settle_pubacks(attempt: Attempt) -> None:
        with pubacks_lock:
            batch = list(pubacks)
            pubacks.clear()
        for mid, rc in batch:
            attempt.settle_puback(mid, rc)

    client.on_publish = lambda _c, _u, mid, rc, _p: published(mid, rc)

    def received(topic: str, payload: bytes, qos: int, mid: int, retain: bool) -> None:
        delivery = Delivery(attempt, mid, InboundMessage(topic, payload, qos, retain))
        if not inbox.put(delivery):
            return
        if on_loop:
            inbox.wake()
            return
        with contextlib.suppress(RuntimeError):  # loop already closed at interpreter exit
            loop.call_soon_threadsafe(inbox.wake)

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
