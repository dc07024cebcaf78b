"""Bounds on the connections a TCP listener keeps open: in total, per peer host, and idle time.

Every accepted connection costs a file descriptor until it closes. Without a bound, idle
connections (a port scanner, a stuck scraper, a flood from one host) take descriptors until the
process has none left, and one host can keep every other client out. The limiter wraps a
listener's protocol factory (aiohttp's ``web.Server`` is one): a connection beyond a bound is
closed as soon as it is accepted, before the wrapped protocol exists; a connection that neither
sends a byte nor takes one of a stalled answer for ``idle_timeout_s`` is cut. Refusals are
counted and reported as one warning per ``warn_interval_s`` at most, never one per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["ConnectionLimiter", "ConnectionLimits", "serve_limited"]

_WARN_INTERVAL_S = 60.0
_UNKNOWN_HOST = "unknown"
_LINGER_RESET = struct.pack("ii", 1, 0)  # struct linger {l_onoff = 1, l_linger = 0}


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How many connections a listener keeps open, from one host and in all, and for how long idle.

    ``idle_timeout_s`` is a backstop beyond the listener's own request deadlines: it also cuts a
    peer that stops reading an answer, which no request deadline covers.
    """

    max_total: int
    max_per_host: int
    idle_timeout_s: float

    def __post_init__(self) -> None:
        if self.max_total < 1 or self.max_per_host < 1:
            raise ValueError("connection limits must be at least 1")
        if self.idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be positive")


class ConnectionLimiter:
    """Admits, counts and times out one listener's connections (one event loop, no threads)."""

    def __init__(
        self,
        name: str,
        limits: ConnectionLimits,
        *,
        warn_interval_s: float = _WARN_INTERVAL_S,
    ) -> None:
        self.name = name
        self.limits = limits
        self._warn_interval_s = warn_interval_s
        self._log = structlog.get_logger(__name__)
        self._open_by_host: Counter[str] = Counter()
        self._open = 0
        self._accepted = 0
        self._refused_total = 0
        self._refused_per_host = 0
        self._idle_closed = 0
        self._unreported: Counter[str] = Counter()  # refusals by host since the last warning
        self._next_warning_at = 0.0

    @property
    def open(self) -> int:
        return self._open

    def stats(self) -> dict[str, int]:
        """Counters for the stats snapshot and the metrics (refusals by which bound was hit)."""
        return {
            "open": self._open,
            "accepted": self._accepted,
            "refused_total": self._refused_total,
            "refused_per_host": self._refused_per_host,
            "idle_closed": self._idle_closed,
            "max_total": self.limits.max_total,
            "max_per_host": self.limits.max_per_host,
        }

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` that applies the limits to ``factory``."""
        return lambda: _LimitedProtocol(self, factory)

    # -- called by each connection's protocol ---------------------------------------------------

    def admit(self, host: str) -> bool:
        if self._open >= self.limits.max_total:
            self._refused_total += 1
        elif self._open_by_host[host] >= self.limits.max_per_host:
            self._refused_per_host += 1
        else:
            self._open += 1
            self._open_by_host[host] += 1
            self._accepted += 1
            return True
        self._unreported[host] += 1
        self._maybe_warn()
        return False

    def release(self, host: str) -> None:
        self._open -= 1
        self._open_by_host[host] -= 1
        if self._open_by_host[host] <= 0:
            del self._open_by_host[host]

    def count_idle_cut(self) -> None:
        self._idle_closed += 1

    def _maybe_warn(self) -> None:
        now = asyncio.get_running_loop().time()
        if now < self._next_warning_at:
            return
        self._next_warning_at = now + self._warn_interval_s
        busiest, busiest_count = self._unreported.most_common(1)[0]
        self._log.warning(
            "listener_connections_refused",
            listener=self.name,
            refused=sum(self._unreported.values()),
            hosts=len(self._unreported),
            busiest_host=busiest,
            busiest_host_refused=busiest_count,
            refused_total_bound=self._refused_total,
            refused_per_host_bound=self._refused_per_host,
            open=self._open,
            max_total=self.limits.max_total,
            max_per_host=self.limits.max_per_host,
            next_report_in_s=self._warn_interval_s,
        )
        self._unreported.clear()


class _LimitedProtocol(asyncio.Protocol):
    """Stands in front of the wrapped protocol: refuses, forwards, and watches for idleness."""

    def __init__(self, limiter: ConnectionLimiter, factory: Callable[[], asyncio.Protocol]) -> None:
        self._limiter = limiter
        self._factory = factory
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._host = _UNKNOWN_HOST
        self._last_activity = 0.0
        self._idle_handle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        host = _peer_host(transport)
        if not self._limiter.admit(host):
            _abort(transport)  # at once: no wrapped protocol, no answer, no buffered bytes
            return
        self._host = host
        self._transport = transport
        loop = asyncio.get_running_loop()
        self._last_activity = loop.time()
        self._idle_handle = loop.call_later(self._limiter.limits.idle_timeout_s, self._check_idle)
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._last_activity = asyncio.get_running_loop().time()
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._last_activity = asyncio.get_running_loop().time()  # the peer took bytes
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        inner, self._inner = self._inner, None
        if inner is None:  # refused, or already lost
            return
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None
        self._transport = None
        self._limiter.release(self._host)
        inner.connection_lost(exc)

    def _check_idle(self) -> None:
        self._idle_handle = None
        if self._transport is None:
            return
        loop = asyncio.get_running_loop()
        timeout = self._limiter.limits.idle_timeout_s
        quiet_for = loop.time() - self._last_activity
        if quiet_for < timeout:
            self._idle_handle = loop.call_later(timeout - quiet_for, self._check_idle)
            return
        self._limiter.count_idle_cut()
        _abort(self._transport, reset=True)


def _abort(transport: asyncio.BaseTransport, *, reset: bool = False) -> None:
    """Close now, dropping what is buffered; with ``reset``, what the kernel still holds too.

    An idle cut resets the connection (SO_LINGER 0): a peer that stopped reading would
    otherwise keep the unsent answer in the kernel until TCP gives up on it.
    """
    if reset:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    if isinstance(transport, asyncio.WriteTransport):
        transport.abort()
    else:
        transport.close()


def _peer_host(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer and isinstance(peer[0], str):
        return peer[0]
    return _UNKNOWN_HOST


async def serve_limited(
    runner: web.BaseRunner,
    host: str,
    port: int,
    limiter: ConnectionLimiter,
    *,
    reuse_address: bool | None = None,
) -> asyncio.Server:
    """Listen on ``host:port`` with the runner's HTTP server behind ``limiter``.

    This replaces ``web.TCPSite``, whose protocol factory cannot be wrapped: the caller closes
    the returned server before ``runner.cleanup()``, which closes the open connections.
    """
    server = runner.server
    if server is None:
        raise RuntimeError("serve_limited needs runner.setup() first")
    loop = asyncio.get_running_loop()
    return await loop.create_server(limiter.wrap(server), host, port, reuse_address=reuse_address)
