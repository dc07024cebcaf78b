"""``/metrics`` as a small aiohttp app whose handler is prometheus_client's own.

The library's handler chooses the format from ``Accept`` (text or OpenMetrics) and asks aiohttp
to compress when the scraper accepts it; nothing here negotiates. The service runs
:meth:`MetricsServer.serve` as one task of its TaskGroup; cancelling it closes the listening
socket and the open connections. Each scrape renders the registry inside the handler, on the
event loop (the collector reads the live stats), so no thread touches the daemon's state.
"""

from __future__ import annotations

import asyncio

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.process_collector import ProcessCollector

from tesla_gateway.metrics.collector import StatsCollector
from tesla_gateway.metrics.config import MetricsConfig

__all__ = ["MetricsServer"]

_log = structlog.get_logger(__name__)

# aiohttp's keepalive_timeout: a connection must send a whole request within this (from 3.14.4,
# the floor in pyproject.toml), and may sit idle between scrapes no longer than this.
_REQUEST_TIMEOUT_S = 10.0
# How long cancellation waits for a scrape already being answered.
_SHUTDOWN_GRACE_S = 1.0

_INDEX = (
    b"<!DOCTYPE html>\n<html><head><title>tesla-gateway</title></head>\n"
    b'<body><h1>tesla-gateway</h1><p><a href="/metrics">Metrics</a></p></body></html>\n'
)


class MetricsServer:
    """Serves the collector's metrics (and the process's own) on ``config.listen``."""

    def __init__(
        self,
        config: MetricsConfig,
        collector: StatsCollector,
        *,
        request_timeout_s: float = _REQUEST_TIMEOUT_S,
    ) -> None:
        self._config = config
        self._request_timeout_s = request_timeout_s
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, RSS, open fds
        self._exposition = make_aiohttp_handler(self.registry)
        self._runner: web.AppRunner | None = None
        self.listening = asyncio.Event()  # set while the socket accepts scrapes
        self.scrapes = 0

    @property
    def port(self) -> int | None:
        """The bound port while listening (None before and after)."""
        if self._runner is None or not self._runner.addresses:
            return None
        return int(self._runner.addresses[0][1])

    async def serve(self) -> None:
        """Listen until cancelled, then close the socket and every open connection."""
        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=_SHUTDOWN_GRACE_S,
            keepalive_timeout=self._request_timeout_s,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._config.host, self._config.port, reuse_address=True)
            await site.start()
            self._runner = runner
            self.listening.set()
            _log.info("metrics_listening", listen=self._config.listen)
            await asyncio.Event().wait()
        finally:
            self.listening.clear()
            self._runner = None
            await runner.cleanup()
            _log.info("metrics_stopped", scrapes=self.scrapes)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.scrapes += 1
        return await self._exposition(request)

    @staticmethod
    async def _index(_request: web.Request) -> web.Response:
        return web.Response(body=_INDEX, content_type="text/html", charset="utf-8")
