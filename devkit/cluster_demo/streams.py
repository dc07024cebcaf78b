"""Reading the cluster's streams from outside the gateways: what the demo's verdict and the bench
count (the stream's content is the truth, not what a gateway says it published)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["StoredMessage", "no_stale_pulls", "read_stream", "sensor_partitions"]

_BATCH = 1000
_READ_ATTEMPTS = 10
_READ_PAUSE_S = 0.5


@dataclass(frozen=True, slots=True)
class StoredMessage:
    subject: str
    msg_id: str  # Nats-Msg-Id, "" when the publisher set none (MQTT)
    document: dict[str, Any]
    stored_at: float  # Unix s


def read_stream(servers: Sequence[str], stream: str) -> list[StoredMessage]:
    """Every message of ``stream`` in stream order (an ephemeral consumer, then gone).

    An R3 stream whose leader is being elected, a server slow under load or one that just died
    answers with "no responders", not at all, or refuses the connection for a moment (seen in
    the demo's test before any gateway stopped): the whole read is asked again, a few times,
    before it fails.
    """
    import nats.errors

    for _ in range(_READ_ATTEMPTS - 1):
        try:
            return asyncio.run(_read(servers, stream))
        except (nats.errors.Error, TimeoutError):
            time.sleep(_READ_PAUSE_S)
    return asyncio.run(_read(servers, stream))


async def _read(servers: Sequence[str], stream: str) -> list[StoredMessage]:
    import nats

    client = await nats.connect(servers=list(servers), connect_timeout=5)
    js = client.jetstream(timeout=10)
    found: list[StoredMessage] = []
    try:
        total = (await js.stream_info(stream)).state.messages
        if total == 0:
            return found
        subscription = await js.pull_subscribe(">", stream=stream)
        while len(found) < total:
            for message in await subscription.fetch(_BATCH, timeout=5):
                headers = message.headers or {}
                found.append(
                    StoredMessage(
                        message.subject,
                        headers.get("Nats-Msg-Id", ""),
                        json.loads(message.data),
                        message.metadata.timestamp.timestamp(),
                    )
                )
                await message.ack()
        await subscription.unsubscribe()
    finally:
        await client.close()
    return found


def sensor_partitions(servers: Sequence[str], stream: str = "TESLA_READINGS") -> dict[str, int]:
    """Which partition the server's transform put each sensor in (from the stored subjects
    ``<prefix>.part.<p>.<sensor>``)."""

    async def run() -> dict[str, int]:
        import nats

        client = await nats.connect(servers=list(servers), connect_timeout=5)
        found: dict[str, int] = {}
        try:
            info = await client.jetstream(timeout=10).stream_info(stream, subjects_filter=">")
            for subject in info.state.subjects or {}:
                head, sensor = subject.rsplit(".", 1)
                found[sensor] = int(head.rsplit(".", 1)[1])
        finally:
            await client.close()
        return found

    return asyncio.run(run())


def no_stale_pulls(servers: Sequence[str], partitions: int, stream: str = "TESLA_READINGS") -> bool:
    """Each partition's consumer holds at most one waiting pull: its owner's.

    Right after a rebalance a consumer was seen with two waiting pulls: the old owner's last
    pull, cancelled but kept by a server with a leaf-node listener until its expiry. A reading
    published then went into it, pinned the partition to it, and the partition stalled until
    the pin TTL (2 of 6 partitions for 4.5 s). A gateway now waits its last pull out before it
    gives a partition back (docs/deployment.md, "Handover and the last pull"), so this should
    hold at once; runs that feed as soon as placement settles still wait for it, as a guard.
    """

    async def run() -> bool:
        import nats

        client = await nats.connect(servers=list(servers), connect_timeout=5)
        js = client.jetstream(timeout=10)
        try:
            for partition in range(partitions):
                info = await js.consumer_info(stream, f"part-{partition}")
                if (info.num_waiting or 0) > 1:
                    return False
            return True
        finally:
            await client.close()

    return asyncio.run(run())
