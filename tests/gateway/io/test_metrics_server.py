"""The /metrics server on a real loopback socket, without a daemon.

What the daemon test (tests/gateway/e2e/test_metrics.py) cannot reach cheaply: the request
timeout, methods other than GET, that the scrape renders on the event
loop's thread, and that cancelling the task closes the port.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from devkit.broker import free_port
from tesla_gateway.metrics.collector import StatsCollector
from tesla_gateway.metrics.config import MetricsConfig
from tesla_gateway.metrics.server import MetricsServer


async def _exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes, return everything until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()


def _request(method: str, *headers: str) -> bytes:
    """One complete HTTP/1.1 request for /metrics that asks the server to close afterwards."""
    lines = [f"{method} /metrics HTTP/1.1", "Host: 127.0.0.1", *headers, "Connection: close"]
    return "\r\n".join([*lines, "", ""]).encode("ascii")


def _with_server(
    body: Callable[[MetricsServer, int], Awaitable[None]],
    snapshot: Callable[[], Mapping[str, object]] = lambda: {"readings_in": 7},
    **kwargs: Any,
) -> None:
    async def main() -> None:
        server = MetricsServer(
            MetricsConfig(listen=f"127.0.0.1:{free_port()}"), StatsCollector(snapshot), **kwargs
        )
        task = asyncio.create_task(server.serve())
        async with asyncio.timeout(10):
            await server.listening.wait()
        assert server.port is not None
        try:
            await body(server, server.port)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())


def test_head_answers_without_a_body_and_post_is_refused() -> None:
    async def body(_server: MetricsServer, port: int) -> None:
        head = await _exchange(port, _request("HEAD"))
        assert head.startswith(b"HTTP/1.1 200")
        assert head.endswith(b"\r\n\r\n")  # headers only
        post = await _exchange(port, _request("POST"))
        assert post.startswith(b"HTTP/1.1 405")

    _with_server(body)


def test_a_request_that_never_completes_is_dropped_after_the_timeout() -> None:
    async def body(_server: MetricsServer, port: int) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await _exchange(port, b"GET /metrics HTTP/1.1\r\n") == b""  # no blank line
        assert 0.2 <= loop.time() - started < 5
        assert await _exchange(port, b"") == b""  # connected, never a byte

    _with_server(body, request_timeout_s=0.3)


def test_the_scrape_renders_on_the_event_loop_thread() -> None:
    threads: list[int] = []

    def snapshot() -> Mapping[str, object]:
        threads.append(threading.get_ident())
        return {"readings_in": 7}

    async def body(server: MetricsServer, port: int) -> None:
        reply = await _exchange(port, _request("GET", "Accept-Encoding: gzip"))
        assert b"Content-Encoding: gzip" in reply
        assert threads == [threading.get_ident()]
        assert server.scrapes == 1

    _with_server(body, snapshot)


def test_cancelling_the_task_closes_the_port() -> None:
    ports: list[int] = []

    async def body(_server: MetricsServer, port: int) -> None:
        ports.append(port)
        reply = await _exchange(port, _request("GET"))
        assert b"tesla_gateway_readings_total 7.0" in reply

    with capture_logs() as logs:
        _with_server(body)
    assert [e["event"] for e in logs] == ["metrics_listening", "metrics_stopped"]
    assert logs[-1]["scrapes"] == 1

    async def refused() -> None:
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", ports[0])

    asyncio.run(refused())
