"""A TCP proxy in front of a real broker that cuts the link right after one acknowledgement.

A broker on loopback acknowledges a batch within a millisecond, so a lost connection never
lands between the PUBACKs of one batch on its own. Once armed with a topic, this proxy lets the
next PUBLISH to that topic reach the broker, drops every later packet the client sends, passes
the broker's PUBACK for that one message back, and closes both legs: the client sees message 1
acknowledged and the rest of its batch lost with the connection. The next connection goes
through untouched. The proxy frames MQTT packets (fixed header, remaining length) and reads
only the PUBLISH topic and the packet ids.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

__all__ = ["PubackCut"]

_PUBLISH = 3
_PUBACK = 4


async def _read_packet(reader: asyncio.StreamReader) -> bytes:
    """One whole MQTT control packet (raises IncompleteReadError at the end of the stream)."""
    head = await reader.readexactly(1)
    length_bytes = b""
    length = 0
    for shift in range(0, 28, 7):
        byte = await reader.readexactly(1)
        length_bytes += byte
        length |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            break
    return head + length_bytes + await reader.readexactly(length)


def _body(packet: bytes) -> bytes:
    index = 1
    while packet[index] & 0x80:
        index += 1
    return packet[index + 1 :]


def _publish_topic_and_id(packet: bytes) -> tuple[str, int | None]:
    body = _body(packet)
    topic_length = int.from_bytes(body[:2], "big")
    topic = body[2 : 2 + topic_length].decode("utf-8")
    qos = (packet[0] >> 1) & 0x03
    if qos == 0:
        return topic, None
    return topic, int.from_bytes(body[2 + topic_length : 4 + topic_length], "big")


@dataclass
class _Cut:
    topic: str
    done: asyncio.Event
    packet_id: int | None = None  # of the one PUBLISH let through


class PubackCut:
    """``async with PubackCut(host, port) as proxy``: clients connect to ``proxy.port``."""

    def __init__(self, broker_host: str, broker_port: int) -> None:
        self._broker = (broker_host, broker_port)
        self._server: asyncio.Server | None = None
        self._cut: _Cut | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> PubackCut:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._server.wait_closed()

    def arm(self, topic: str) -> asyncio.Event:
        """Cut after the next PUBLISH to ``topic`` is acknowledged; the event is set then."""
        self._cut = _Cut(topic, asyncio.Event())
        return self._cut.done

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        broker_r, broker_w = await asyncio.open_connection(*self._broker)
        upstream = asyncio.create_task(self._client_to_broker(client_r, broker_w))
        try:
            await self._broker_to_client(broker_r, client_w)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            upstream.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await upstream
            for writer in (client_w, broker_w):
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()
            self._tasks.discard(task)

    async def _client_to_broker(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                packet = await _read_packet(reader)
                cut = self._cut
                if cut is not None and cut.packet_id is not None:
                    continue  # the link is being cut: later packets never reach the broker
                if cut is not None and packet[0] >> 4 == _PUBLISH:
                    topic, packet_id = _publish_topic_and_id(packet)
                    if topic == cut.topic and packet_id is not None:
                        cut.packet_id = packet_id
                writer.write(packet)
                await writer.drain()

    async def _broker_to_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            packet = await _read_packet(reader)
            writer.write(packet)
            await writer.drain()
            cut = self._cut
            if (
                cut is not None
                and cut.packet_id is not None
                and packet[0] >> 4 == _PUBACK
                and int.from_bytes(_body(packet)[:2], "big") == cut.packet_id
            ):
                self._cut = None
                cut.done.set()
                return  # both legs close: the client loses the rest of its batch
