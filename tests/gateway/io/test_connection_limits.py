"""The connection limiter over real loopback sockets, in front of a plain echo protocol: the
excess closed at once per host and in total, one warning per interval, idle and stalled peers
cut (issue 26 item 12). The listeners that use it: tests/gateway/io/test_listener_floods.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from tesla_gateway.connection_limits import ConnectionLimiter, ConnectionLimits
from tests.support.flood import Flood, stalled_reader

FLOODER = "127.0.0.2"
AT_ONCE_S = 0.3  # a refused connection is closed within this (the timeouts below are longer)
SLACK_S = 2.0  # how late a timed cut may come on a busy 2-core machine


class Echo(asyncio.Protocol):
    """The wrapped protocol in the limiter's own tests: echoes, or answers ``big`` with 16 MiB."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"x" * (16 << 20) if data == b"big" else data)


@contextlib.asynccontextmanager
async def echo_server(limiter: ConnectionLimiter) -> AsyncIterator[int]:
    server = await asyncio.get_running_loop().create_server(limiter.wrap(Echo), "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def echoes(port: int, source: str) -> bool:
    """Whether a connection from ``source`` is served (True) or closed at once (False)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(b"ping")
        return await asyncio.wait_for(reader.read(4), AT_ONCE_S + SLACK_S) == b"ping"
    except ConnectionError:
        return False
    finally:
        writer.close()


# -- the limiter -------------------------------------------------------------------------------


def test_the_limiter_closes_the_excess_at_once_per_host_and_in_total() -> None:
    limiter = ConnectionLimiter("echo", ConnectionLimits(4, 2, idle_timeout_s=30))

    async def scenario() -> tuple[int, int, bool, bool, bool]:
        async with echo_server(limiter) as port:
            flood = Flood(port)
            try:
                await flood.open(5, [FLOODER])
                await asyncio.sleep(AT_ONCE_S)
                refused_per_host = len(flood.closed_within(AT_ONCE_S))
                other_host = await echoes(port, "127.0.0.1")  # 2 + 1 of 4 open
                await flood.open(3, ["127.0.0.3"])  # 2 more fill the total, 1 refused
                await asyncio.sleep(AT_ONCE_S)
                full = await echoes(port, "127.0.0.4")
                kept = flood.still_open()
                kept[0].writer.close()  # a slot is free again
                await asyncio.sleep(0.2)
                after_one_left = await echoes(port, "127.0.0.4")
                return refused_per_host, len(kept), other_host, full, after_one_left
            finally:
                await flood.close()

    with capture_logs() as logs:
        refused_per_host, kept, other_host, full, after_one_left = asyncio.run(scenario())
    assert (refused_per_host, kept) == (3, 4)
    assert (other_host, full, after_one_left) == (True, False, True)
    stats = limiter.stats()
    assert stats["refused_per_host"] == 3 and stats["refused_total"] == 2
    assert stats["open"] == 0  # every connection released its slot when it closed
    warnings = [e for e in logs if e["event"] == "listener_connections_refused"]
    assert len(warnings) == 1, "one warning per interval, not one per refused connection"
    assert warnings[0]["listener"] == "echo" and warnings[0]["busiest_host"] == FLOODER


def test_the_warning_reports_what_was_refused_since_the_last_one() -> None:
    limiter = ConnectionLimiter("echo", ConnectionLimits(8, 1, 30), warn_interval_s=0.5)

    async def scenario() -> None:
        async with echo_server(limiter) as port:
            flood = Flood(port)
            try:
                await flood.open(4, [FLOODER])  # 1 kept, 3 refused: the first is reported
                await asyncio.sleep(0.6)
                await flood.open(1, [FLOODER])  # reported with the 2 folded before it
            finally:
                await flood.close()

    with capture_logs() as logs:
        asyncio.run(scenario())
    reported = [e["refused"] for e in logs if e["event"] == "listener_connections_refused"]
    assert reported == [1, 3]


def test_an_idle_connection_is_cut_at_the_idle_timeout_and_an_active_one_is_not() -> None:
    idle_s = 0.5
    limiter = ConnectionLimiter("echo", ConnectionLimits(8, 8, idle_timeout_s=idle_s))

    async def talk(port: int, seconds: float) -> bool:
        """Send a byte every tenth of a second; True if every one came back."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                writer.write(b"a")
                if await asyncio.wait_for(reader.read(1), SLACK_S) != b"a":
                    return False
                await asyncio.sleep(0.1)
            return True
        finally:
            writer.close()

    async def asks_for_16_mib_and_reads_none(port: int) -> float:
        return await stalled_reader(port, b"big", limit_s=idle_s + 3 * SLACK_S)

    async def scenario() -> tuple[float | None, bool, float]:
        async with echo_server(limiter) as port:
            flood = Flood(port)
            try:
                await flood.open(1, ["127.0.0.1"])
                active = await talk(port, idle_s * 3)
                await flood.wait_all_closed(idle_s + SLACK_S)
                stalled_s = await asks_for_16_mib_and_reads_none(port)
                return flood.connections[0].closed_after_s, active, stalled_s
            finally:
                await flood.close()

    idle_cut, active, stalled_s = asyncio.run(scenario())
    assert idle_cut is not None and idle_s * 0.9 <= idle_cut <= idle_s + SLACK_S
    assert active, "a connection that keeps talking is never cut"
    assert stalled_s <= idle_s + SLACK_S
    assert limiter.stats()["idle_closed"] == 2


def test_limits_must_be_positive() -> None:
    for bad in ((0, 1, 1.0), (1, 0, 1.0), (1, 1, 0.0)):
        with pytest.raises(ValueError, match="must be"):
            ConnectionLimits(*bad)
