"""Event-loop mode (``io_loop = "event_loop"``): the event loop reads and writes paho's socket.

The blocking ``connect()`` (DNS, the TCP handshake, CONNECT) still runs in a worker thread; the
connected socket is then handed to the event loop: ``add_reader`` calls paho's ``loop_read``,
paho's socket callbacks register writes, a timer runs ``loop_misc`` (keepalive), and every paho
callback runs on the loop itself: no thread, no wake-up writes between threads. Back-pressure
there cannot be a waiting thread: the message that fills the inbox goes in (one over the bound)
and the socket is not read again until there is room (:func:`pause_reading`,
:func:`resume_reading`). TLS connections keep paho's thread: TLS records buffered inside the ssl
object would not wake the loop's selector.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tesla_gateway.mqtt.attempt import Attempt
from tesla_gateway.mqtt.errors import MqttNotConnectedError
from tesla_gateway.mqtt.fast_path import LeanClient

__all__ = ["attach", "detach", "pause_reading", "resume_reading"]

_MISC_INTERVAL_S = 1.0  # paho's keepalive check (PINGREQ, a silent broker)


def attach(loop: asyncio.AbstractEventLoop, attempt: Attempt) -> None:
    """Have ``loop`` read and write the attempt's connected socket and run its keepalive."""
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


def detach(attempt: Attempt) -> None:
    """After ``disconnect()``: stop the keepalive and write the DISCONNECT now."""
    if attempt.misc is not None:
        attempt.misc.cancel()
    with contextlib.suppress(OSError):
        attempt.client.loop_write()  # the DISCONNECT, now (it is a few bytes)


def pause_reading(loop: asyncio.AbstractEventLoop, attempt: Attempt) -> None:
    """Inbox full: read no more from the broker until there is room."""
    if attempt.paused or attempt.socket is None:
        return
    attempt.paused = True
    loop.remove_reader(attempt.socket)
    if isinstance(attempt.client, LeanClient):
        attempt.client.hold_reading = True  # the rest of its read buffer waits too


def resume_reading(loop: asyncio.AbstractEventLoop, attempt: Attempt) -> None:
    """There is room again: read the socket (and what the client's buffer still holds)."""
    if not attempt.paused:
        return
    attempt.paused = False
    client = attempt.client
    if isinstance(client, LeanClient):
        client.hold_reading = False
    readable = attempt.on_readable
    if attempt.lost.is_set() or client.socket() is None or readable is None:
        return
    loop.add_reader(attempt.socket, readable)
    loop.call_soon(readable)  # what its buffer still holds wakes no selector
