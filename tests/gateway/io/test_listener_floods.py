"""Both listeners flooded with idle connections from one host (issue 26 item 12): the excess is
closed at once, a well-behaved client still gets through while the flood's connections are open,
the ones kept are cut at the listener's timeout, and the counts reach the stats and /metrics.

Each flood comes from 127.0.0.2 (tests/support/flood.py); the well-behaved client (a scrape, a
station's POST) connects from 127.0.0.1. Nothing here needs the limiter's own API, so the same
file runs against the listeners before the limiter existed (and fails there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from devkit.broker import free_port
from tesla_gateway.metrics.collector import StatsCollector
from tesla_gateway.metrics.config import MetricsConfig
from tesla_gateway.metrics.server import MetricsServer
from tests.gateway.io.test_fleet_http import STATION_BODY, listening, post
from tests.support.flood import Flood, IdleConnection, stalled_reader

FLOODER = "127.0.0.2"
AT_ONCE_S = 0.3  # a refused connection is closed within this (the timeouts below are longer)
SLACK_S = 2.0  # how late a timed cut may come on a busy 2-core machine


# -- /metrics ----------------------------------------------------------------------------------


class HugeHelp(Collector):
    """One family whose HELP text is 8 MiB: an answer larger than loopback's socket buffers."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("huge", "h" * (8 << 20), value=1)


@contextlib.asynccontextmanager
async def metrics_server(**kwargs: Any) -> AsyncIterator[MetricsServer]:
    server = MetricsServer(
        MetricsConfig(listen=f"127.0.0.1:{free_port()}"),
        StatsCollector(lambda: {"readings_in": 7}),
        **kwargs,
    )
    task = asyncio.create_task(server.serve())
    await asyncio.wait_for(server.listening.wait(), 10)
    try:
        yield server
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


async def scrape(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        return await asyncio.wait_for(reader.read(), SLACK_S)
    finally:
        writer.close()


def report(what: str, flood: Flood, kept: list[IdleConnection]) -> None:
    """The measured figures, for the record (pytest -s)."""
    refused = [c.closed_after_s or 0.0 for c in flood.connections if c not in kept]
    cuts = [c.closed_after_s or 0.0 for c in kept]
    print(
        f"{what}: {len(flood.connections)} idle connections from one host, {len(kept)} accepted, "
        f"{len(refused)} closed after at most {max(refused, default=0) * 1000:.1f} ms, "
        f"the accepted cut after {min(cuts, default=0):.2f}-{max(cuts, default=0):.2f} s"
    )


def test_metrics_flooded_from_one_host_still_answers_a_scrape() -> None:
    timeout_s = 1.0

    async def scenario() -> tuple[Flood, bytes, MetricsServer]:
        async with metrics_server(request_timeout_s=timeout_s) as server:
            assert server.port is not None
            flood = Flood(server.port)
            try:
                await flood.open(100, [FLOODER])
                await asyncio.sleep(AT_ONCE_S)
                answer = await scrape(server.port)  # while the flood's 8 are still open
                await flood.wait_all_closed(timeout_s + SLACK_S)
                return flood, answer, server
            finally:
                await flood.close()

    flood, answer, server = asyncio.run(scenario())
    kept = [c for c in flood.connections if c not in flood.closed_within(AT_ONCE_S)]
    report("/metrics", flood, kept)
    assert len(kept) == 8, "max_connections_per_host, the rest closed at once"
    for connection in kept:  # cut by the request timeout: they never sent a request head
        assert connection.closed_after_s is not None
        assert timeout_s * 0.9 <= connection.closed_after_s <= timeout_s + SLACK_S
    assert answer.startswith(b"HTTP/1.1 200")
    series = b'_listener_connections_refused_total{bound="per_host",listener="metrics"}'
    assert b"tesla_gateway" + series + b" 92.0" in answer
    stats = server.limiter.stats()
    assert (stats["accepted"], stats["refused_per_host"], stats["open"]) == (9, 92, 0)


def test_a_scraper_that_stops_reading_a_large_answer_is_cut_at_the_idle_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No request deadline covers an answer being written; the idle cut (twice the request
    timeout without a byte either way) does."""

    async def scenario() -> tuple[float, MetricsServer]:
        async with metrics_server(request_timeout_s=0.5) as server:
            server.registry.register(HugeHelp())
            assert server.port is not None
            request = b"GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n"
            return await stalled_reader(server.port, request, limit_s=1.0 + 3 * SLACK_S), server

    elapsed, server = asyncio.run(scenario())
    print(f"/metrics: a scraper that stopped reading was cut after {elapsed:.2f} s")
    assert elapsed <= 1.0 + SLACK_S
    assert server.limiter.stats()["idle_closed"] == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# -- the sensor.community listener -------------------------------------------------------------


def test_sensor_community_flooded_from_one_host_still_takes_a_station_post() -> None:
    timeout_s = 1.0

    async def scenario() -> tuple[Flood, int, dict[str, object]]:
        async with listening(request_timeout_s=timeout_s) as listener:
            flood = Flood(listener.config.port)
            try:
                await flood.open(200, [FLOODER])
                await asyncio.sleep(AT_ONCE_S)
                status, _ = await listener.exchange(post(STATION_BODY))  # the flood's 4 are open
                await flood.wait_all_closed(timeout_s + SLACK_S)
                return flood, status, listener.source.stats()
            finally:
                await flood.close()

    flood, status, stats = asyncio.run(scenario())
    kept = [c for c in flood.connections if c not in flood.closed_within(AT_ONCE_S)]
    report("sensor.community", flood, kept)
    assert len(kept) == 4, "max_connections_per_host, the rest closed at once"
    for connection in kept:  # cut by request_timeout_s: they never sent a request head
        assert connection.closed_after_s is not None
        assert timeout_s * 0.9 <= connection.closed_after_s <= timeout_s + SLACK_S
    assert status == 200
    assert stats["connections"] == {
        "open": 0,
        "accepted": 5,
        "refused_total": 0,
        "refused_per_host": 196,
        "idle_closed": 0,
        "max_total": 64,
        "max_per_host": 4,
    }
