"""Warm takeover: a partition's windows saved into the bucket and read back with the readings
after them, so a new owner starts where the old one was instead of re-warming for hours.

A snapshot up to ``max_kv_value_bytes`` is the value of ``snap.<p>``; a larger one goes to the
object store and ``snap.<p>`` points at it (with the sequence it covers). A snapshot replaces
only one covering an earlier stream sequence. The readings after it are read from the stream by
an ephemeral consumer starting at the snapshot's sequence + 1, or, without a snapshot, at
``(N + 2) x period`` ago by the server's clock (a gateway's clock hours ahead replayed nothing).
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import AsyncIterator
from typing import Any

import structlog

from tesla_gateway.cluster import window_parts
from tesla_gateway.cluster.engine import WRONG_LAST_SEQUENCE, Engine, transient
from tesla_gateway.cluster.errors import ClusterError
from tesla_gateway.cluster.puller import StreamMessage
from tesla_gateway.cluster.stored import stream_now
from tesla_gateway.windows.snapshots import CorruptSnapshotError

__all__ = ["SnapshotStore", "replay"]

_log = structlog.get_logger(__name__)
_FETCH = 1_000
_CAS_ATTEMPTS = 4


class SnapshotStore:
    """``snap.<p>`` in the cluster bucket, spilling to the object store when too large.

    A save never puts an older snapshot over a newer one: it is a compare-and-set on the
    key's revision as this gateway last read or wrote it, and when another gateway wrote the
    key since, the stream sequence the stored snapshot covers decides. A gateway paused past
    its pin TTL thus learns it lost the partition instead of overwriting the new owner's
    snapshot with its older windows.
    """

    def __init__(self, engine: Engine, gateway_id: str) -> None:
        self._engine = engine
        config = engine.subjects.config
        self._limit = config.max_kv_value_bytes
        self.max_bytes = config.max_snapshot_bytes
        self._me = gateway_id
        self._revisions: dict[int, int] = {}  # partition -> revision of snap.<p> we know
        self._objects: dict[int, str] = {}  # partition -> the object that revision points at
        self.saved_bytes = 0
        self.in_object_store = 0

    async def save(self, partition: int, blob: bytes, sequence: int) -> bool:
        """Store the partition's snapshot covering ``sequence``; False when the stored one
        covers a later sequence (another gateway owns the partition now)."""
        value, name = blob, None
        if len(blob) > self._limit:  # an object per writer: a refused save spoils no other's
            name = f"part-{partition}-{self._me}"
            await self._engine.objects.put(name, blob)
            value = json.dumps({"object": name, "sequence": sequence}).encode()
        replaced = self._objects.get(partition)
        for _ in range(_CAS_ATTEMPTS):
            last = self._revisions.get(partition)
            if last is not None and await self._update(partition, value, last):
                break
            last, stored, replaced = await self._head(partition)
            if stored is not None and stored > sequence:
                _log.warning(
                    "cluster_snapshot_superseded",
                    partition=partition,
                    ours=sequence,
                    stored=stored,
                )
                if name is not None and name != replaced:  # ours, pointed at by nobody
                    with contextlib.suppress(*transient()):
                        await self._engine.objects.delete(name)
                return False
            if await self._update(partition, value, last):
                break
        else:
            raise ClusterError(
                f"snap.{partition}: the key kept changing under {_CAS_ATTEMPTS} saves"
            )
        if name is not None:
            self.in_object_store += 1
            self._objects[partition] = name
        else:
            self._objects.pop(partition, None)
        if replaced is not None and replaced != name:  # the previous writer's, or a spill
            with contextlib.suppress(*transient()):  # left for the next save to delete
                await self._engine.objects.delete(replaced)
        self.saved_bytes = len(blob)
        return True

    async def _update(self, partition: int, value: bytes, last: int) -> bool:
        from nats.js.errors import KeyWrongLastSequenceError

        try:  # kv.update turns the server's "wrong last sequence" into this error
            self._revisions[partition] = await self._engine.kv.update(
                f"snap.{partition}", value, last=last
            )
        except KeyWrongLastSequenceError:
            self._revisions.pop(partition, None)
            return False
        return True

    async def _head(self, partition: int) -> tuple[int, int | None, str | None]:
        """The key's revision now (0: never written), the sequence its snapshot covers (None:
        none, or undecodable, which any snapshot may replace) and the object it points at."""
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self._engine.kv.get(f"snap.{partition}")
        except KeyNotFoundError as absent:  # never written, or deleted (a marker)
            return (0 if absent.entry is None else int(absent.entry.revision or 0)), None, None
        revision = int(entry.revision or 0)
        value = entry.value or b""
        try:
            if value.startswith(b"{"):
                name, sequence = _pointer(value, partition)
                return revision, sequence, name
            return revision, window_parts.sequence_of(value, max_bytes=self.max_bytes), None
        except CorruptSnapshotError:
            return revision, None, None

    async def load(self, partition: int) -> bytes | None:
        """The stored snapshot's bytes (None: none); :class:`CorruptSnapshotError` when the key
        holds what no gateway wrote or a snapshot over ``max_snapshot_bytes``."""
        from nats.js.errors import KeyNotFoundError, NotFoundError

        self._revisions.pop(partition, None)
        self._objects.pop(partition, None)
        try:
            entry = await self._engine.kv.get(f"snap.{partition}")
        except KeyNotFoundError:
            return None
        self._revisions[partition] = int(entry.revision or 0)
        value = entry.value or b""
        if not value.startswith(b"{"):
            return value
        name, _ = _pointer(value, partition)
        self._objects[partition] = name
        try:
            info = await self._engine.objects.get_info(name)
            if int(info.size or 0) > self.max_bytes:
                raise CorruptSnapshotError(
                    f"object {name} of {info.size} bytes, over the {self.max_bytes} limit"
                )
            result = await self._engine.objects.get(name)
        except NotFoundError:
            _log.warning("cluster_snapshot_object_missing", partition=partition, name=name)
            return None
        return bytes(result.data or b"")

    async def discard(self, partition: int) -> None:
        """Delete an unreadable snapshot (unless another gateway replaced it meanwhile), so the
        next owner starts cold at once instead of reading it again."""
        from nats.js.errors import APIError

        revision = self._revisions.pop(partition, None)
        try:
            await self._engine.kv.delete(f"snap.{partition}", last=revision)
        except APIError as exc:
            if exc.err_code not in WRONG_LAST_SEQUENCE:  # else replaced meanwhile: kept
                raise


def _pointer(value: bytes, partition: int) -> tuple[str, int | None]:
    """``snap.<p>``'s pointer to an object: (name, sequence it covers if said)."""
    try:
        document = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise CorruptSnapshotError(f"snap.{partition} pointer is not JSON: {exc}") from exc
    name = document.get("object") if isinstance(document, dict) else None
    own = f"part-{partition}"
    if not isinstance(name, str) or not (name == own or name.startswith(own + "-")):
        raise CorruptSnapshotError(f"snap.{partition} points at {name!r}, not a {own} object")
    sequence = document.get("sequence")
    if isinstance(sequence, bool) or not isinstance(sequence, int | None):
        raise CorruptSnapshotError(f"snap.{partition} pointer's sequence {sequence!r}")
    return name, sequence


async def replay(
    engine: Engine,
    partition: int,
    *,
    after_sequence: int | None,
    span_s: float,
) -> AsyncIterator[list[StreamMessage]]:
    """The partition's readings after ``after_sequence`` (without one: stored in the last
    ``span_s`` seconds by the server's clock), in stream order, up to the end of the stream as
    it is now, in batches."""
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    config = engine.subjects.config
    if after_sequence is not None:
        start: dict[str, Any] = {
            "deliver_policy": DeliverPolicy.BY_START_SEQUENCE,
            "opt_start_seq": after_sequence + 1,
        }
    else:
        now, _ = await stream_now(engine, config.readings_stream)
        start = {
            "deliver_policy": DeliverPolicy.BY_START_TIME,
            "opt_start_time": datetime.datetime.fromtimestamp(now - span_s, datetime.UTC),
        }
    consumer = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        inactive_threshold=30.0,
        mem_storage=True,
        num_replicas=1,
        **start,
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
