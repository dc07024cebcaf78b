"""A partition handed over before anything was read from it (a gateway joining right after the
start), with readings published the moment the old owner lets go, against a real nats-server
that accepts leaf nodes (the hub of the edge layout; a server with gateways behaves alike).

Before (issue 29): the old owner cancelled its puller; its last pull, naming no pin (no message
had come yet), stayed at the server until its expiry, since a server with a leaf-node listener
counts a pull younger than 2 s as wanted though its inbox is gone. The first reading went into
that pull: the server pinned the partition to it and delivered the reading there over and over
(tens of thousands of deliveries in its last second), and the new owner, pulling without a pin,
got nothing until the pin TTL. Now a partition given back waits its last pull out (inbox open),
so every reading is delivered once, to a gateway that takes it; and a partition lost to another
gateway refuses what its last pull brings and gives up the pin that pull took.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devkit.nats_servers import NatsServer
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.engine import Engine, connect
from tesla_gateway.cluster.member import ClusterMember
from tesla_gateway.cluster.puller import PartitionPuller
from tests.cluster.owners import make_member, until

pytest.importorskip("nats")

PARTITIONS = 4
SENSORS = [f"h{index}" for index in range(16)]  # every partition gets some
HANDOVERS = 2  # a joining gateway twice (each a chance for an orphaned pull)
FEED_S = 1.5  # readings from the moment the first partition is handed over
WAIT_S = 60.0  # an upper bound on slow CI, never a timing assertion


async def _consumers(engine: Engine) -> list[tuple[int, int, int]]:
    """Each partition consumer's (deliveries so far, not yet delivered, not yet acknowledged)."""
    found = []
    for partition in range(PARTITIONS):
        info = await engine.js.consumer_info(
            engine.subjects.config.readings_stream, engine.subjects.consumer(partition)
        )
        found.append((info.delivered.consumer_seq, info.num_pending or 0, info.num_ack_pending))
    return found


async def _settled(engine: Engine) -> None:
    """Until every reading was delivered and acknowledged (after a stall too: no timing here)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        found = await _consumers(engine)
        if not any(pending or unacked for _, pending, unacked in found):
            return
        assert time.monotonic() < deadline, f"readings still unacknowledged: {found}"
        await asyncio.sleep(0.05)


async def _feed(engine: Engine, period_start: float, published: int) -> int:
    """Readings for every sensor every 50 ms for :data:`FEED_S`; how many the stream stored in
    all. Every one falls in the same period, which no reading closes (no ticker here: a closed
    period would wait for it and hold up every snapshot)."""
    ends = time.monotonic() + FEED_S
    while time.monotonic() < ends:
        stamp = period_start + 1.0 + published * 0.001
        for sensor in SENSORS:
            payload = json.dumps({"ts": stamp, "pm10": 10.0}).encode()
            await engine.js.publish(engine.subjects.reading(sensor), payload)
            published += 1
        await asyncio.sleep(0.05)
    return published


def _ready(member: ClusterMember) -> int:
    partitions = member.stats()["partitions"]
    assert isinstance(partitions, dict)
    return sum(1 for info in partitions.values() if info["ready"])


@dataclass
class _Result:
    published: int = 0
    consumers: list[tuple[int, int, int]] = field(default_factory=list)
    settle_s: list[float] = field(default_factory=list)


async def _scenario(url: str) -> _Result:
    config = ClusterConfig(
        servers=[url],
        partitions=PARTITIONS,
        replicas=1,
        pin_ttl_s=5.0,
        snapshot_interval_s=3600.0,  # snapshots only when partitions are handed over
    )
    engine = await connect(config, "feeder")
    first = make_member(config, "g1")
    first_task = asyncio.create_task(first.run())
    result = _Result()
    period_start = time.time() // 60 * 60 - 60  # the period before this one: never closed
    try:
        await until(first_task, lambda: _ready(first) == PARTITIONS, "g1 owning every partition")
        for _ in range(HANDOVERS):
            released = first.counters.released
            second = make_member(config, "g2")
            second_task = asyncio.create_task(second.run())
            try:
                await until(
                    first_task, lambda n=released: first.counters.released > n, "g1 handing over"
                )
                result.published = await _feed(engine, period_start, result.published)
                fed_at = time.monotonic()
                await until(second_task, lambda g=second: _ready(g) == PARTITIONS // 2, "g2's half")
                await _settled(engine)
                result.settle_s.append(time.monotonic() - fed_at)
            finally:
                second_task.cancel()  # g2 leaves: g1 takes everything back, pulling with no pin
                await asyncio.gather(second_task, return_exceptions=True)
            await until(first_task, lambda: _ready(first) == PARTITIONS, "g1 taking all back")
        result.consumers = await _consumers(engine)
    finally:
        first_task.cancel()
        await asyncio.gather(first_task, return_exceptions=True)
        await engine.close()
    return result


def test_readings_right_after_a_handover_are_delivered_once(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "nats", leaf_listen=True) as server:
        result = asyncio.run(_scenario(server.url))
    per_partition = [delivered for delivered, _, _ in result.consumers]
    print(
        f"published {result.published}, deliveries {sum(per_partition)} (per partition "
        f"{per_partition}); all acknowledged {[round(s, 2) for s in result.settle_s]} s after "
        "each feed ended"
    )
    # Each reading delivered once, to a gateway that acknowledged it: none went into a pull
    # nobody reads (each such delivery counts, and the reading is delivered again).
    assert sum(per_partition) == result.published


@dataclass
class _Lost:
    old_owner: list[int] = field(default_factory=list)
    new_owner: list[int] = field(default_factory=list)
    old_pin: str | None = None  # the pin the refused reading gave the old owner's pull
    pin_after_old: str | None = None  # the consumer's pin once that pull was over
    new_pin: str | None = None
    consumer: tuple[int, int, int] = (0, 0, 0)


async def _pinned(engine: Engine) -> str | None:
    info = await engine.request("$JS.API.CONSUMER.INFO.TESLA_READINGS.part-0", {})
    groups = info.get("priority_groups") or [{}]
    pin = groups[0].get("pinned_client_id")
    return str(pin) if pin else None


async def _lost_scenario(url: str) -> _Lost:
    config = ClusterConfig(servers=[url], partitions=1, replicas=1, pin_ttl_s=5.0)
    engine = await connect(config, "pullers")
    found = _Lost()

    async def waiting(count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while (await engine.js.consumer_info("TESLA_READINGS", "part-0")).num_waiting != count:
            assert time.monotonic() < deadline, f"no {count} waiting pulls"
            await asyncio.sleep(0.01)

    try:
        old = PartitionPuller(
            engine,
            0,
            lambda batch: found.old_owner.extend(m.sequence for m in batch),
            expires_s=3.0,
        )
        old_task = asyncio.create_task(old.run())
        await waiting(1)
        old.stop(refuse=True)  # lost: another gateway holds the lease now
        new = PartitionPuller(
            engine, 0, lambda batch: found.new_owner.extend(m.sequence for m in batch)
        )
        new_task = asyncio.create_task(new.run())
        await waiting(2)
        await engine.js.publish(engine.subjects.reading("s1"), b'{"ts": 1.0, "pm10": 1}')
        async with asyncio.timeout(WAIT_S):
            await old_task  # its last pull over (and, said the server, unpinned)
        found.old_pin, found.pin_after_old = old.pin_id, await _pinned(engine)
        deadline = time.monotonic() + WAIT_S
        while not found.new_owner:
            assert time.monotonic() < deadline, "the new owner never got the reading"
            await asyncio.sleep(0.05)
        new_task.cancel()
        await asyncio.gather(new_task, return_exceptions=True)
        found.new_pin = new.pin_id
        info = await engine.js.consumer_info("TESLA_READINGS", "part-0")
        found.consumer = (info.delivered.consumer_seq, info.num_pending or 0, info.num_ack_pending)
        return found
    finally:
        await engine.close()


def test_a_lost_partitions_last_pull_refuses_and_gives_its_pin_up(tmp_path: Path) -> None:
    """The old owner's last pull (no pin yet) takes the reading: it NAKs it for later and,
    once that pull is over, unpins, so the new owner gets it: twice delivered, no more."""
    with NatsServer(tmp_path / "nats", leaf_listen=True) as server:
        found = asyncio.run(_lost_scenario(server.url))
    assert found.old_owner == []
    assert found.old_pin is not None  # the reading did go into the old owner's pull
    assert found.pin_after_old in (None, found.new_pin)  # given up, not held for the pin TTL
    assert found.new_owner == [1] and found.new_pin is not None
    assert found.consumer == (2, 0, 0)  # once refused, once taken and acknowledged
