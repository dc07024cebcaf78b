"""Idle TCP connections from chosen loopback addresses, each timed until the server closes it.

Linux routes all of 127.0.0.0/8 to the loopback interface, so binding the client side to
127.0.0.2, 127.0.0.3, ... makes each address a different peer host to the listener while the
well-behaved client stays on 127.0.0.1. A connection never sends a byte; when the server closes
it (EOF or reset) the time since it was opened is recorded. :func:`stalled_reader` is the
other kind of idle peer: one that asks for an answer and never reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Flood", "IdleConnection", "raise_fd_limit", "stalled_reader"]

_TCP_CLOSED_BY_PEER = {7, 8}  # TCP_CLOSE (reset), TCP_CLOSE_WAIT (end of stream): linux/tcp.h


def raise_fd_limit(needed: int) -> None:
    """Lift this process's soft descriptor limit to ``needed`` (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


@dataclass
class IdleConnection:
    """One connection that never sends; ``closed_after_s`` once the server closed it."""

    source: str
    opened_at: float
    writer: asyncio.StreamWriter
    watcher: asyncio.Task[None] | None = None
    closed_after_s: float | None = None


@dataclass
class Flood:
    """Opens idle connections to ``port`` and watches each for the server's close."""

    port: int
    host: str = "127.0.0.1"
    connections: list[IdleConnection] = field(default_factory=list)
    not_connected: int = 0

    async def open(
        self, count: int, sources: Sequence[str], *, connect_timeout_s: float = 3.0
    ) -> None:
        """``count`` connections, spread round-robin over the ``sources`` addresses; a connect
        that the kernel does not complete in time (a full accept backlog) is counted in
        ``not_connected``."""
        for n in range(count):
            source = sources[n % len(sources)]
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, local_addr=(source, 0)),
                    connect_timeout_s,
                )
            except (TimeoutError, ConnectionError):
                self.not_connected += 1
                continue
            connection = IdleConnection(source, time.monotonic(), writer)
            connection.watcher = asyncio.create_task(self._watch(reader, connection))
            self.connections.append(connection)

    @staticmethod
    async def _watch(reader: asyncio.StreamReader, connection: IdleConnection) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):
                pass
        connection.closed_after_s = time.monotonic() - connection.opened_at

    def closed_within(self, seconds: float) -> list[IdleConnection]:
        return [
            c
            for c in self.connections
            if c.closed_after_s is not None and c.closed_after_s <= seconds
        ]

    def still_open(self) -> list[IdleConnection]:
        return [c for c in self.connections if c.closed_after_s is None]

    async def wait_all_closed(self, timeout_s: float) -> None:
        watchers = [c.watcher for c in self.connections if c.watcher is not None]
        await asyncio.wait_for(asyncio.gather(*watchers), timeout_s)

    async def close(self) -> None:
        for connection in self.connections:
            if connection.watcher is not None:
                connection.watcher.cancel()
            connection.writer.close()
        await asyncio.gather(
            *(c.watcher for c in self.connections if c.watcher is not None),
            return_exceptions=True,
        )


async def stalled_reader(port: int, request: bytes, *, limit_s: float) -> float:
    """Send ``request`` from a socket with a tiny receive buffer that then reads nothing; the
    seconds until the server cuts the connection (``limit_s`` if it never does)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, request)
        start = time.monotonic()
        while not _peer_closed(sock) and time.monotonic() - start < limit_s:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # polls the kernel's view of the socket, not an event
        return time.monotonic() - start
    finally:
        sock.close()


def _peer_closed(sock: socket.socket) -> bool:
    """True once the server cut the connection, whatever is still unread in the buffer."""
    state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    return state in _TCP_CLOSED_BY_PEER
