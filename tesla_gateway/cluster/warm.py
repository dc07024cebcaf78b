"""Warm takeover: a partition's windows saved into the bucket and read back with the readings
after them, so a new owner starts where the old one was instead of re-warming for hours.

A snapshot up to ``max_kv_value_bytes`` is the value of ``snap.<p>``; a larger one goes to the
object store and ``snap.<p>`` points at it. The readings after it are read from the stream by
an ephemeral consumer starting at the snapshot's sequence + 1, or, without a snapshot, at
``N x period`` ago.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator

import structlog

from tesla_gateway.cluster.engine import Engine
from tesla_gateway.cluster.puller import StreamMessage

__all__ = ["SnapshotStore", "replay"]

_log = structlog.get_logger(__name__)
_FETCH = 1_000


class SnapshotStore:
    """``snap.<p>`` in the cluster bucket, spilling to the object store when too large."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._limit = engine.subjects.config.max_kv_value_bytes
        self.saved = 0
        self.saved_bytes = 0
        self.in_object_store = 0

    async def save(self, partition: int, blob: bytes) -> None:
        key = f"snap.{partition}"
        if len(blob) <= self._limit:
            await self._engine.kv.put(key, blob)
        else:
            name = f"part-{partition}"
            await self._engine.objects.put(name, blob)
            await self._engine.kv.put(key, json.dumps({"object": name}).encode())
            self.in_object_store += 1
        self.saved += 1
        self.saved_bytes = len(blob)

    async def load(self, partition: int) -> bytes | None:
        from nats.js.errors import KeyNotFoundError, NotFoundError

        try:
            entry = await self._engine.kv.get(f"snap.{partition}")
        except KeyNotFoundError:
            return None
        value = entry.value or b""
        if not value.startswith(b"{"):
            return value
        name = json.loads(value)["object"]
        try:
            result = await self._engine.objects.get(str(name))
        except NotFoundError:
            _log.warning("cluster_snapshot_object_missing", partition=partition, name=name)
            return None
        return bytes(result.data or b"")


async def replay(
    engine: Engine,
    partition: int,
    *,
    after_sequence: int | None,
    since: float | None,
) -> AsyncIterator[list[StreamMessage]]:
    """The partition's readings after ``after_sequence`` (or stored since ``since``, Unix s), in
    stream order, up to the end of the stream as it is now, in batches."""
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    config = engine.subjects.config
    if after_sequence is not None:
        consumer = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=after_sequence + 1,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
            num_replicas=1,
        )
    else:
        start = datetime.datetime.fromtimestamp(since or 0.0, datetime.UTC)
        consumer = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME,
            opt_start_time=start,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
            num_replicas=1,
        )
    subscription = await engine.js.pull_subscribe(
        engine.subjects.partition_filter(partition),
        stream=config.readings_stream,
        config=consumer,
    )
    try:
        if (await subscription.consumer_info()).num_pending == 0:
            return  # nothing after the snapshot: no fetch left to time out
        while True:
            try:
                messages = await subscription.fetch(_FETCH, timeout=1.0)
            except (NatsTimeoutError, TimeoutError):
                return  # nothing more (the consumer had nothing pending)
            batch = [
                StreamMessage(
                    subject=message.subject,
                    data=message.data,
                    sequence=message.metadata.sequence.stream,
                    timestamp=message.metadata.timestamp.timestamp(),
                )
                for message in messages
                if message.reply  # a status message has none
            ]
            if batch:
                yield batch
            if not messages or messages[-1].metadata.num_pending == 0:
                return
    finally:
        await subscription.unsubscribe()
