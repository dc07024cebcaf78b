"""The JetStream objects of cluster mode, made idempotently by every gateway at start.

The readings stream takes ``<subject>.<sensor>.raw`` and stores it as
``<subject>.part.<p>.<sensor>`` by the server's own ``partition(P, wildcard)`` transform, so
which partition a sensor belongs to is the engine's rule, not ours. One durable pull consumer
per partition with a pinned-client priority group (nats-py 2.16 has no fields for it: these
are plain ``$JS.API`` requests). The calibrated stream deduplicates by ``Nats-Msg-Id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import structlog

from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.errors import (
    ClusterAuthError,
    ClusterError,
    PartitionsMismatchError,
    ServerTooOldError,
    SettingsMismatchError,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue
    from nats.js.object_store import ObjectStore

__all__ = [
    "GROUP",
    "MIN_API_LEVEL",
    "WRONG_LAST_SEQUENCE",
    "Engine",
    "Subjects",
    "check_api_level",
    "connect",
    "transient",
]

MIN_API_LEVEL = 1  # nats-server 2.11: priority groups, per-message TTL
GROUP = "owners"  # the priority group every partition consumer has
WRONG_LAST_SEQUENCE = (10071, 10164)  # JetStream's refusal of a compare-and-set
_log = structlog.get_logger(__name__)
_REQUEST_S = 10.0
_NS = 1_000_000_000


def transient() -> tuple[type[Exception], ...]:
    """What a request may fail with while servers elect a leader or a link reconnects (the
    nats errors, ours, timeouts and sockets): retried or counted, never fatal."""
    import nats.errors

    return (nats.errors.Error, ClusterError, TimeoutError, OSError)


@dataclass(frozen=True, slots=True)
class Subjects:
    """Every subject and name cluster mode uses, from ``[cluster]``."""

    config: ClusterConfig

    def reading(self, sensor_id: str) -> str:
        return f"{self.config.readings_subject}.{sensor_id}.raw"

    def partition_filter(self, partition: int) -> str:
        return f"{self.config.readings_subject}.part.{partition}.*"

    def consumer(self, partition: int) -> str:
        return f"part-{partition}"

    def calibrated(self, sensor_id: str, feature: str) -> str:
        return f"{self.config.calibrated_subject}.{sensor_id}.{feature}"

    @staticmethod
    def partition_of(subject: str) -> tuple[int, str]:
        """``<prefix>.part.<p>.<sensor>`` -> (p, sensor)."""
        head, sensor_id = subject.rsplit(".", 1)
        return int(head.rsplit(".", 1)[1]), sensor_id


@dataclass(slots=True)
class Engine:
    """A connection with the cluster's stream, bucket and object store at hand."""

    nc: Client
    js: JetStreamContext
    kv: KeyValue
    objects: ObjectStore
    subjects: Subjects
    api_level: int
    request_s: float = _REQUEST_S  # how long a request waits for its reply

    async def bounded(self, request_s: float) -> Engine:
        """The same connection, its requests (JetStream, KV, ``$JS.API``) given up after
        ``request_s``: the heartbeat's, so that a request the server never answers (it died
        holding it) fails well inside the lease TTL and the next beat renews in time."""
        js = self.nc.jetstream(timeout=request_s)
        kv = await js.key_value(self.subjects.config.bucket)
        return replace(self, js=js, kv=kv, request_s=request_s)

    async def request(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        """One ``$JS.API`` request; a JetStream error becomes :class:`ClusterError`."""
        reply = await self.nc.request(subject, json.dumps(body).encode(), timeout=self.request_s)
        document = json.loads(reply.data)
        if not isinstance(document, dict):
            raise ClusterError(f"{subject}: unexpected reply {reply.data[:200]!r}")
        error = document.get("error")
        if error:
            raise ClusterError(f"{subject}: {error.get('description', error)}")
        return document

    async def unpin(self, partition: int) -> None:
        """Give up a partition's pin now (a release), instead of after the pin TTL."""
        stream = self.subjects.config.readings_stream
        await self.request(
            f"$JS.API.CONSUMER.UNPIN.{stream}.{self.subjects.consumer(partition)}",
            {"group": GROUP},
        )

    async def close(self) -> None:
        """Close the connection, not drain it: nats-py's drain swallows a cancellation and
        then flushes for 10 s. Bound it with :func:`.cancels.give_up_after`."""
        await self.nc.close()


async def connect(
    config: ClusterConfig, name: str, *, agree: Callable[[Engine], Awaitable[None]] | None = None
) -> Engine:
    """Connect, refuse a server older than 2.11, and make (or find) every object; ``agree``
    (the member's check of the cluster's shared settings) runs before the partition consumers
    are made or updated, so a refused gateway changes none of them."""
    from nats.js.api import KeyValueConfig, ObjectStoreConfig

    nc = await _open(config, name)
    try:
        js = nc.jetstream(timeout=_REQUEST_S)
        engine = Engine(nc, js, None, None, Subjects(config), 0)  # type: ignore[arg-type]
        info = await engine.request("$JS.API.INFO", {})
        version = str(nc._server_info.get("version", "?"))  # the INFO it sent at connect
        engine.api_level = check_api_level(info, version, str(nc.connected_url))
        await _streams(engine, config)
        engine.kv = await js.create_key_value(
            KeyValueConfig(bucket=config.bucket, history=1, replicas=config.replicas)
        )
        engine.objects = await js.create_object_store(
            f"{config.bucket}_snapshots", config=ObjectStoreConfig(replicas=config.replicas)
        )
        if agree is not None:
            await agree(engine)
        for partition in range(config.partitions):
            await _partition_consumer(engine, config, partition)
    except BaseException:
        await nc.close()
        raise
    return engine


async def _open(config: ClusterConfig, name: str) -> Client:
    """The connection, retried while servers are unreachable (as before), but refused at once
    with :class:`ClusterAuthError` when a server refuses the credentials: nats-py would retry
    those forever too, saying nothing."""
    import nats.aio.client

    client = nats.aio.client.Client()
    user, password = config.credentials()
    refused: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()

    async def on_error(exc: Exception) -> None:
        if "authorization violation" in str(exc).lower():
            if not refused.done():
                refused.set_result(exc)
            _log.warning("cluster_nats_refused_credentials", error=str(exc))

    connecting = asyncio.ensure_future(
        client.connect(
            servers=list(config.servers),
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,  # type: ignore[arg-type]  # a float works; typed int
            connect_timeout=5,
            error_cb=on_error,
            user=user,
            password=password,
        )
    )
    try:
        waited: list[asyncio.Future[Any]] = [connecting, refused]
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, *transient()):
                await connecting
    if not connecting.cancelled() and connecting.exception() is None:
        return client
    error = None if connecting.cancelled() else connecting.exception()
    await client.close()
    if refused.done():
        raise ClusterAuthError(
            f"the NATS servers refused this gateway's credentials ({refused.result()}): set "
            "[cluster] user and password_file to the gateways' user of the servers' "
            "configuration (deploy/nats/users.conf: user 'gateway', $TESLA_NATS_GATEWAY_PASSWORD)"
        ) from error
    assert error is not None  # connecting ended by itself, or refused is done
    raise error


def check_api_level(info: dict[str, Any], version: str, where: str) -> int:
    """The JetStream API level of an account-info reply; :class:`ServerTooOldError` below 1
    (servers before 2.11 have no level and silently ignore pinned consumers and key TTLs)."""
    api = info.get("api")
    level = int(api.get("level") or 0) if isinstance(api, dict) else 0
    if level < MIN_API_LEVEL:
        raise ServerTooOldError(
            f"nats-server {version} at {where} has JetStream API level {level}; cluster mode "
            f"needs level {MIN_API_LEVEL} (nats-server 2.11 or newer) for pinned consumers and "
            "per-key TTL: upgrade the servers"
        )
    return level


async def _streams(engine: Engine, config: ClusterConfig) -> None:
    prefix = config.readings_subject
    readings = {
        "name": config.readings_stream,
        "subjects": [f"{prefix}.*.raw"],
        "subject_transform": {
            "src": f"{prefix}.*.raw",
            "dest": f"{prefix}.part.{{{{partition({config.partitions},1)}}}}.{{{{wildcard(1)}}}}",
        },
        "retention": "limits",
        "storage": "file",
        "num_replicas": config.replicas,
        "max_age": int(config.retention_s * _NS),
        "duplicate_window": 120 * _NS,
        "discard": "old",
    }
    calibrated = {
        "name": config.calibrated_stream,
        "subjects": [f"{config.calibrated_subject}.>"],
        "retention": "limits",
        "storage": "file",
        "num_replicas": config.replicas,
        "max_age": int(max(config.retention_s, config.dedup_window_s) * _NS),
        "duplicate_window": int(config.dedup_window_s * _NS),
        "discard": "old",
    }
    if not await _create_or_match(engine, "STREAM", config.readings_stream, readings):
        await _check_partitions(engine, config)
        await _must_match(engine, "STREAM", config.readings_stream, readings, _READINGS_KEYS)
    if not await _create_or_match(engine, "STREAM", config.calibrated_stream, calibrated):
        await _must_match(engine, "STREAM", config.calibrated_stream, calibrated, _CALIBRATED_KEYS)


async def _check_partitions(engine: Engine, config: ClusterConfig) -> None:
    """Refuse a readings stream made with another partition count: the gateways would split
    partitions that are not all there (some never pulled) instead of the stream's."""
    info = await engine.request(f"$JS.API.STREAM.INFO.{config.readings_stream}", {})
    transform = (info.get("config") or {}).get("subject_transform") or {}
    found = re.search(r"partition\((\d+),", str(transform.get("dest", "")))
    existing = int(found.group(1)) if found else None
    if existing != config.partitions:
        raise PartitionsMismatchError(
            f"the stream {config.readings_stream} on the servers has {existing} partitions, "
            f"this gateway's [cluster] partitions = {config.partitions}: every gateway of a "
            "cluster needs the stream's partition count (fixed for the stream's life)"
        )


async def _partition_consumer(engine: Engine, config: ClusterConfig, partition: int) -> None:
    """Make the partition's durable consumer, or find it: its filter and priority group must be
    this gateway's (a CONSUMER.CREATE would rewrite them: the last gateway to start won), then
    its other settings (the pin TTL the cluster agreed on) are brought up to date."""
    name = engine.subjects.consumer(partition)
    body: dict[str, Any] = {
        "stream_name": config.readings_stream,
        "action": "create",  # the server refuses one that exists with other settings
        "config": {
            "durable_name": name,
            "filter_subject": engine.subjects.partition_filter(partition),
            "deliver_policy": "all",
            "ack_policy": "explicit",
            "ack_wait": 30 * _NS,
            "max_ack_pending": 50_000,
            "max_waiting": 64,
            "priority_groups": [GROUP],
            "priority_policy": "pinned_client",
            "priority_timeout": config.pin_ttl_ns,
        },
    }
    qualified = f"{config.readings_stream}.{name}"
    if await _create_or_match(engine, "CONSUMER", qualified, body):
        return
    existing = await _must_match(engine, "CONSUMER", qualified, body["config"], _CONSUMER_KEYS)
    if existing.get("priority_timeout") != config.pin_ttl_ns:
        await engine.request(f"$JS.API.CONSUMER.CREATE.{qualified}", body | {"action": "update"})


async def _create_or_match(engine: Engine, kind: str, name: str, body: dict[str, Any]) -> bool:
    """Create (True), or find it made before (False): the server says "already in use" (or
    "already exists") also when its settings differ, so the caller compares them."""
    try:
        await engine.request(f"$JS.API.{kind}.CREATE.{name}", body)
    except ClusterError as exc:
        if "already in use" not in str(exc) and "already exists" not in str(exc):
            raise ClusterError(
                f"cannot create the {kind.lower()} {name}: {exc} (a different one of that "
                "name exists? [cluster] partitions and names are fixed for a stream's life)"
            ) from exc
        return False
    return True


@dataclass(frozen=True, slots=True)
class _Key:
    """A field of a stream's or consumer's config every gateway must want alike, the
    ``[cluster]`` setting that decides it and how to say that setting's value from the field."""

    field: str
    setting: str
    setting_value: Callable[[Any], object]


def _prefix(value: Any, tail: str) -> object:
    """``'sensors.*.raw'`` -> ``'sensors'`` (the subject prefix a field was made from)."""
    text = str(value[0] if isinstance(value, list) and value else value)
    return text.split(tail, 1)[0] if tail in text else text


_READINGS_KEYS = (
    _Key("subjects", "readings_subject", lambda v: _prefix(v, ".*.raw")),
    _Key("subject_transform", "readings_subject", lambda v: _prefix((v or {}).get("src"), ".*")),
)
_CALIBRATED_KEYS = (_Key("subjects", "calibrated_subject", lambda v: _prefix(v, ".>")),)
_CONSUMER_KEYS = (
    _Key("filter_subject", "readings_subject", lambda v: _prefix(v, ".part.")),
    _Key("priority_groups", "readings_stream", lambda v: f"a consumer of group {v}"),
    _Key("priority_policy", "readings_stream", lambda v: f"a consumer of policy {v}"),
)


async def _must_match(
    engine: Engine, kind: str, name: str, wanted: dict[str, Any], keys: tuple[_Key, ...]
) -> dict[str, Any]:
    """The existing object's config; :class:`SettingsMismatchError` naming the first field that
    differs from ``wanted`` and the setting the cluster uses (it is never updated)."""
    info = await engine.request(f"$JS.API.{kind}.INFO.{name}", {})
    existing = info.get("config") or {}
    for key in keys:
        theirs, ours = existing.get(key.field), wanted.get(key.field)
        if theirs != ours:
            raise SettingsMismatchError(
                f"the {kind.lower()} {name} on the servers has {key.field} = {theirs!r}, this "
                f"gateway wants {ours!r}: [cluster] {key.setting} must be the same on every "
                f"gateway of the cluster (the cluster uses {key.setting_value(theirs)!r}; "
                f"this gateway has {key.setting_value(ours)!r}); set it, or run it as a "
                "separate cluster with its own stream and bucket names"
            )
    return dict(existing)
