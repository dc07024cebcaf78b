"""The fleet sources' bounds on aiohttp: a request body read and a device document fetched.

aiohttp speaks HTTP (parsing, chunked bodies, keep-alive, redirects); this module only applies
the gateway's limits to it and turns its failures into the two errors the sources count. The
listener itself (routes, credentials, the runner) is in ``sensor_community``; the poll loop
is in ``purpleair``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
from types import TracebackType
from typing import Self

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from tesla_gateway.errors import GatewayError

__all__ = [
    "DeviceFetcher",
    "HttpFetchError",
    "HttpRequestError",
    "basic_auth_matches",
    "read_body",
    "server_logger",
    "text_response",
]

# aiohttp rounds a timeout at or above this up to a whole second; ours are kept as configured.
_NO_CEIL = math.inf


class HttpRequestError(GatewayError):
    """A request the listener refuses; ``status`` is the HTTP status it answers with."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class HttpFetchError(GatewayError):
    """A device could not be fetched (refused, timed out, not HTTP 200, too large)."""


async def read_body(request: web.Request, *, max_bytes: int, timeout_s: float) -> bytes:
    """The body of a request that declares its length, read within ``timeout_s``.

    A body longer than ``max_bytes`` is refused from its ``Content-Length`` before a byte
    of it is read; the application's ``client_max_size`` is the same bound, kept as a backstop.
    """
    length = request.content_length
    if length is None:
        if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            raise HttpRequestError(411, "chunked bodies are not accepted; send Content-Length")
        raise HttpRequestError(411, "Content-Length required")
    if length > max_bytes:
        raise HttpRequestError(413, f"body of {length} bytes exceeds {max_bytes}")
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError as exc:
        raise HttpRequestError(408, "request not received in time") from exc
    except web.HTTPRequestEntityTooLarge as exc:
        raise HttpRequestError(413, f"body exceeds {max_bytes} bytes") from exc
    except (web.RequestPayloadError, ConnectionError) as exc:
        raise HttpRequestError(400, "connection closed before the body ended") from exc


def server_logger(name: str) -> logging.Logger:
    """The stdlib logger to hand aiohttp's server, less a traceback per unparsable request.

    aiohttp answers a request it cannot parse (head too large, no Host, not HTTP) with 400 and
    logs it at ERROR with a traceback: on a LAN listener that is the client's fault, and a way
    to flood the journal. An exception in the gateway's own handler is still logged.
    """
    logger = logging.getLogger(name)
    logger.addFilter(_not_a_refused_request)  # the same function is added once, however often
    return logger


def _not_a_refused_request(record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], HttpProcessingError))


def text_response(status: int, text: str) -> web.Response:
    """A short plain-text answer after which the connection closes (one request each)."""
    response = web.Response(status=status, text=f"{text}\n")
    response.force_close()
    return response


def basic_auth_matches(header: str | None, username: str, password: str) -> bool:
    """True when an ``Authorization: Basic`` header carries these credentials.

    The decoded pair is compared in constant time, so the answer's timing does not tell how
    much of a guess was right.
    """
    if header is None:
        return False
    try:
        sent = aiohttp.BasicAuth.decode(header, encoding="utf-8")
    except ValueError:  # not Basic, not base64, not UTF-8, no colon
        return False
    given = f"{sent.login}:{sent.password}".encode()
    return hmac.compare_digest(given, f"{username}:{password}".encode())


class DeviceFetcher:
    """GETs small documents from devices on the LAN, each within a deadline and a size bound.

    One session (an async context manager) serves every poll of a source; each answer closes
    its connection, redirects are answered, not followed, and no proxy is taken from the
    environment.
    """

    def __init__(self, *, timeout_s: float, max_bytes: int) -> None:
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            timeout=aiohttp.ClientTimeout(total=self._timeout_s, ceil_threshold=_NO_CEIL),
            headers={"Accept": "application/json"},
            trust_env=False,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, url: str) -> bytes:
        """The body of a 200 answer from ``url`` (plain http); raise :class:`HttpFetchError`."""
        if self._session is None:
            raise RuntimeError("DeviceFetcher.get outside its async with block")
        if not url.startswith("http://"):
            raise HttpFetchError(f"{url!r} is not an http:// URL")
        try:
            async with self._session.get(url, allow_redirects=False) as response:
                if response.status != 200:
                    raise HttpFetchError(f"{url}: HTTP {response.status}")
                return await self._bounded_body(response, url)
        except TimeoutError as exc:
            raise HttpFetchError(f"{url}: no complete answer within {self._timeout_s} s") from exc
        except aiohttp.ClientError as exc:
            raise HttpFetchError(f"{url}: {exc}") from exc

    async def _bounded_body(self, response: aiohttp.ClientResponse, url: str) -> bytes:
        limit = self._max_bytes
        length = response.content_length
        if length is not None and length > limit:
            raise HttpFetchError(f"{url}: body of {length} bytes exceeds {limit}")
        body = bytearray()
        while len(body) <= limit:
            chunk = await response.content.read(limit + 1 - len(body))
            if not chunk:
                return bytes(body)
            body += chunk
        raise HttpFetchError(f"{url}: body exceeds {limit} bytes")
