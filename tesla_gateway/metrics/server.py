"""``GET /metrics`` over a small asyncio HTTP server: no thread, no shared state.

The service runs :meth:`MetricsServer.serve` as one task of its TaskGroup; cancelling it closes
the listening socket and the open connections. Each scrape renders the registry on the event
loop (the collector reads the live stats), so nothing is copied between threads.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

from tesla_gateway.metrics.collector import StatsCollector
from tesla_gateway.metrics.config import MetricsConfig

__all__ = ["MetricsServer"]

_log = structlog.get_logger(__name__)

_REQUEST_TIMEOUT_S = 10.0
_MAX_HEADER_LINES = 100


class MetricsServer:
    """Serves the collector's metrics (and the process's own) on ``config.listen``."""

    def __init__(self, config: MetricsConfig, collector: StatsCollector) -> None:
        self._config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, RSS, open fds
        self._server: asyncio.Server | None = None
        self.scrapes = 0

    @property
    def port(self) -> int | None:
        """The bound port (the configured one, or the kernel's choice for port 0)."""
        if self._server is None or not self._server.sockets:
            return None
        return int(self._server.sockets[0].getsockname()[1])

    async def serve(self) -> None:
        """Listen until cancelled, then close the socket and every open connection."""
        server = await asyncio.start_server(
            self._handle, self._config.host, self._config.port, reuse_address=True
        )
        self._server = server
        _log.info("metrics_listening", listen=self._config.listen)
        try:
            async with server:
                await server.serve_forever()
        finally:
            self._server = None
            _log.info("metrics_stopped", scrapes=self.scrapes)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_REQUEST_TIMEOUT_S):
                request = await reader.readline()
                for _ in range(_MAX_HEADER_LINES):
                    if (await reader.readline()).strip() == b"":
                        break
            method, target = _request_line(request)
            if method not in {"GET", "HEAD"}:
                await _respond(writer, 405, b"only GET\n", "text/plain; charset=utf-8")
            elif target.split("?", 1)[0] != "/metrics":
                await _respond(writer, 404, b"see /metrics\n", "text/plain; charset=utf-8")
            else:
                body = generate_latest(self.registry)
                self.scrapes += 1
                await _respond(writer, 200, b"" if method == "HEAD" else body, CONTENT_TYPE_LATEST)
        except (TimeoutError, ValueError, ConnectionError):
            pass  # a slow, garbled or vanished client: drop it
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _request_line(line: bytes) -> tuple[str, str]:
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError("not an HTTP request line")
    return parts[0], parts[1]


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}


async def _respond(
    writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str
) -> None:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()
