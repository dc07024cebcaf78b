"""Just enough HTTP/1.x over asyncio streams for the fleet sources, with every size bounded.

Two jobs: read one request on a listener (sensor.community firmware POSTs its readings) and
fetch one document from a device on the LAN (a PurpleAir unit's ``/json``). Both speak plain
HTTP/1.x on the local network; nothing here follows redirects, keeps connections alive,
decodes chunked bodies or talks TLS. A request always closes its connection (``Connection:
close``), so the body of a response without ``Content-Length`` runs to EOF.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
from dataclasses import dataclass
from urllib.parse import urlsplit

from tesla_gateway.errors import GatewayError

__all__ = [
    "HttpFetchError",
    "HttpRequest",
    "HttpRequestError",
    "basic_auth_matches",
    "http_get",
    "read_request",
    "write_response",
]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class HttpRequestError(GatewayError):
    """A request the listener refuses; ``status`` is the HTTP status it answers with."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class HttpFetchError(GatewayError):
    """A device could not be fetched (refused, timed out, not HTTP 200, too large)."""


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One request as read by :func:`read_request`; header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


async def read_request(
    reader: asyncio.StreamReader, *, max_header_bytes: int, max_body_bytes: int
) -> HttpRequest:
    """Read one request; raise :class:`HttpRequestError` for anything out of bounds.

    The caller bounds the time (``asyncio.timeout``): a client that stalls is its problem.
    """
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:
        raise HttpRequestError(431, "request head too large") from exc
    except asyncio.IncompleteReadError as exc:
        raise HttpRequestError(400, "connection closed before the request head ended") from exc
    if len(head) > max_header_bytes:
        raise HttpRequestError(431, f"request head of {len(head)} bytes")
    method, target, headers = _parse_head(head)
    body = await _read_body(reader, headers, max_body_bytes) if method == "POST" else b""
    path = urlsplit(target).path or "/"
    return HttpRequest(method=method, path=path, headers=headers, body=body)


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError as exc:
        raise HttpRequestError(400, "malformed request line") from exc
    if not version.startswith("HTTP/1."):
        raise HttpRequestError(400, f"unsupported protocol {version[:16]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpRequestError(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    return method, target, headers


async def _read_body(
    reader: asyncio.StreamReader, headers: dict[str, str], max_body_bytes: int
) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpRequestError(411, "chunked bodies are not accepted; send Content-Length")
    length_text = headers.get("content-length")
    if length_text is None:
        raise HttpRequestError(411, "Content-Length required")
    try:
        length = int(length_text)
    except ValueError as exc:
        raise HttpRequestError(400, "Content-Length is not a number") from exc
    if length < 0:
        raise HttpRequestError(400, "Content-Length is negative")
    if length > max_body_bytes:
        raise HttpRequestError(413, f"body of {length} bytes exceeds {max_body_bytes}")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise HttpRequestError(400, "connection closed before the body ended") from exc


async def write_response(writer: asyncio.StreamWriter, status: int, text: str = "") -> None:
    """Answer with a short plain-text body and close the connection."""
    body = (text or _REASONS.get(status, "")).encode() + b"\n"
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()


def basic_auth_matches(headers: dict[str, str], username: str, password: str) -> bool:
    """True when the request's ``Authorization: Basic`` header carries these credentials."""
    scheme, _, encoded = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    expected = f"{username}:{password}".encode()
    return hmac.compare_digest(decoded, expected)


async def http_get(url: str, *, timeout_s: float, max_bytes: int) -> bytes:
    """GET ``url`` (plain http) and return the body of a 200 answer; raise HttpFetchError."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise HttpFetchError(f"{url!r} is not an http:// URL")
    port = parts.port or 80
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Accept: application/json\r\nConnection: close\r\n\r\n"
    )
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(parts.hostname, port, limit=max_bytes)
            try:
                writer.write(request.encode("latin-1"))
                await writer.drain()
                return await _read_response(reader, url, max_bytes)
            finally:
                writer.close()
                with contextlib.suppress(OSError):  # it hung up first: the answer is read
                    await writer.wait_closed()
    except TimeoutError as exc:
        raise HttpFetchError(f"{url}: no complete answer within {timeout_s} s") from exc
    except OSError as exc:
        raise HttpFetchError(f"{url}: {exc.strerror or exc}") from exc


async def _read_response(reader: asyncio.StreamReader, url: str, max_bytes: int) -> bytes:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.LimitOverrunError, asyncio.IncompleteReadError) as exc:
        raise HttpFetchError(f"{url}: malformed or oversized response head") from exc
    lines = head.decode("latin-1").split("\r\n")
    status_parts = lines[0].split(" ", 2)
    if len(status_parts) < 2 or not status_parts[0].startswith("HTTP/1."):
        raise HttpFetchError(f"{url}: not an HTTP response")
    if status_parts[1] != "200":
        raise HttpFetchError(f"{url}: HTTP {status_parts[1]}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpFetchError(f"{url}: chunked responses are not supported")
    length_text = headers.get("content-length")
    if length_text is not None:
        try:
            length = int(length_text)
        except ValueError as exc:
            raise HttpFetchError(f"{url}: bad Content-Length") from exc
        if length > max_bytes:
            raise HttpFetchError(f"{url}: body of {length} bytes exceeds {max_bytes}")
        try:
            return await reader.readexactly(length)
        except asyncio.IncompleteReadError as exc:
            raise HttpFetchError(f"{url}: connection closed mid-body") from exc
    body = await reader.read(max_bytes + 1)
    while len(body) <= max_bytes:
        more = await reader.read(max_bytes + 1 - len(body))
        if not more:
            return body
        body += more
    raise HttpFetchError(f"{url}: body exceeds {max_bytes} bytes")
