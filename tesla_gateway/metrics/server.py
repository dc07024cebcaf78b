"""``/metrics`` as a small aiohttp app whose handler is prometheus_client's own.

The library's handler chooses the format from ``Accept`` (text or OpenMetrics) and asks aiohttp
to compress when the scraper accepts it; nothing here negotiates. The service runs
:meth:`MetricsServer.serve` as one task of its TaskGroup; cancelling it closes the listening
socket and the open connections. Each scrape renders the registry inside the handler, on the
event loop (the collector reads the live stats), so no thread touches the daemon's state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.process_collector import ProcessCollector

from tesla_gateway.connection_limits import ConnectionLimiter, ConnectionLimits, serve_limited
from tesla_gateway.metrics.collector import StatsCollector
from tesla_gateway.metrics.config import MetricsConfig
from tesla_gateway.metrics.listeners import ListenerCollector, ListenerStats

__all__ = ["MetricsServer"]

_log = structlog.get_logger(__name__)

# aiohttp's keepalive_timeout: a connection must send a whole request within this (from 3.14.4,
# the floor in pyproject.toml), and may sit idle between scrapes no longer than this.
_REQUEST_TIMEOUT_S = 10.0
# A connection without a byte either way for this many request timeouts is cut: it is past
# every deadline aiohttp applies, e.g. a scraper that stopped reading a large answer.
_IDLE_TIMEOUTS = 2
# How long cancellation waits for a scrape already being answered.
_SHUTDOWN_GRACE_S = 1.0

_INDEX = (
    b"<!DOCTYPE html>\n<html><head><title>tesla-gateway</title></head>\n"
    b'<body><h1>tesla-gateway</h1><p><a href="/metrics">Metrics</a></p></body></html>\n'
)


class MetricsServer:
    """Serves the collector's metrics (and the process's own) on ``config.listen``.

    Its connections are bounded (``max_connections``, ``max_connections_per_host``, an idle
    cut); ``listeners`` adds other listeners' connection counters to the scrape.
    """

    def __init__(
        self,
        config: MetricsConfig,
        collector: StatsCollector,
        *,
        request_timeout_s: float = _REQUEST_TIMEOUT_S,
        idle_timeout_s: float | None = None,
        listeners: Callable[[], ListenerStats] = dict,
    ) -> None:
        self._config = config
        self._request_timeout_s = request_timeout_s
        self.limiter = ConnectionLimiter(
            "metrics",
            ConnectionLimits(
                max_total=config.max_connections,
                max_per_host=config.max_connections_per_host,
                idle_timeout_s=idle_timeout_s or _IDLE_TIMEOUTS * request_timeout_s,
            ),
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.registry.register(
            ListenerCollector(lambda: {**listeners(), "metrics": self.limiter.stats()})
        )
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, RSS, open fds
        self._exposition = make_aiohttp_handler(self.registry)
        self._server: asyncio.Server | None = None
        self.listening = asyncio.Event()  # set while the socket accepts scrapes
        self.scrapes = 0

    @property
    def port(self) -> int | None:
        """The bound port while listening (None before and after)."""
        if self._server is None or not self._server.sockets:
            return None
        return int(self._server.sockets[0].getsockname()[1])

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
        server: asyncio.Server | None = None
        try:
            server = await serve_limited(
                runner, self._config.host, self._config.port, self.limiter, reuse_address=True
            )
            self._server = server
            self.listening.set()
            _log.info("metrics_listening", listen=self._config.listen)
            await asyncio.Event().wait()
        finally:
            self.listening.clear()
            self._server = None
            if server is not None:
                server.close()  # no new connections; the cleanup closes the open ones
            await runner.cleanup()
            stats = self.limiter.stats()
            _log.info(
                "metrics_stopped",
                scrapes=self.scrapes,
                connections_accepted=stats["accepted"],
                connections_refused=stats["refused_total"] + stats["refused_per_host"],
                connections_idle_closed=stats["idle_closed"],
            )

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.scrapes += 1
        return await self._exposition(request)

    @staticmethod
    async def _index(_request: web.Request) -> web.Response:
        return web.Response(body=_INDEX, content_type="text/html", charset="utf-8")
