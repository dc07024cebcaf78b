"""What the servers stored, by the servers' clock: a stream's time now and the keys under a
prefix, and a key's last message with the time it was stored.

Ages of keys and the start of a fallback replay are measured on the server's clock, never the
gateway's: a gateway hours ahead or behind would otherwise count a dead key alive, or replay
nothing. Values are returned as bytes, never decoded here: what they must be is the caller's.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any

from tesla_gateway.cluster.engine import Engine
from tesla_gateway.cluster.errors import ClusterError

__all__ = ["StoredKey", "parse_time", "read_key", "stream_now"]

_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")
_KV_OPERATION = "KV-Operation"
_TTL_HEADER = "Nats-TTL"


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A KV key's last message: ``value`` None for a delete or purge marker."""

    key: str
    value: bytes | None
    revision: int
    stored_at: float  # Unix seconds, the server's clock when it was stored
    ttl_s: float | None  # its per-message TTL (None: none, it never expires by itself)


def parse_time(text: object) -> float:
    """A JetStream RFC 3339 time (nanoseconds, 'Z') as Unix seconds; :class:`ClusterError` for
    anything else."""
    found = _TIME.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise ClusterError(f"the server sent {text!r} where a time was expected")
    whole, fraction, zone = found.groups()
    stamp = datetime.datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    return stamp.timestamp() + float(fraction or 0.0)


async def stream_now(
    engine: Engine, stream: str, subjects_filter: str | None = None
) -> tuple[float, list[str]]:
    """The server's time now (its stream-info reply's ``ts``) and the subjects holding messages
    that ``subjects_filter`` matches (none without a filter)."""
    body: dict[str, Any] = {} if subjects_filter is None else {"subjects_filter": subjects_filter}
    info = await engine.request(f"$JS.API.STREAM.INFO.{stream}", body)
    subjects = (info.get("state") or {}).get("subjects") or {}
    return parse_time(info.get("ts")), sorted(subjects) if isinstance(subjects, dict) else []


async def read_key(engine: Engine, key: str) -> StoredKey | None:
    """``key``'s last message in the cluster bucket (None: it never had one), asked of the
    stream leader, with the server's time of storing it."""
    from nats.js.errors import NotFoundError

    bucket = engine.subjects.config.bucket
    try:
        message = await engine.js.get_msg(f"KV_{bucket}", subject=f"$KV.{bucket}.{key}")
    except NotFoundError:
        return None
    headers = message.headers or {}
    deleted = headers.get(_KV_OPERATION) in ("DEL", "PURGE")
    stored_at = message.time.timestamp() if message.time is not None else 0.0
    return StoredKey(
        key=key,
        value=None if deleted else bytes(message.data or b""),
        revision=int(message.seq or 0),
        stored_at=stored_at,
        ttl_s=_seconds(headers.get(_TTL_HEADER)),
    )


def _seconds(ttl: object) -> float | None:
    """A ``Nats-TTL`` header's seconds ('5', '5s', '1m'...); None for none, 'never' or junk."""
    if not isinstance(ttl, str):
        return None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", ttl.strip())
    if found is None:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[found.group(2) or "s"]
    return float(found.group(1)) * scale
