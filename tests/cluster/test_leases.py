"""Lease renewal racing a release, against a real nats-server. A partition's task releases its
lease (it lost its pin) while the heartbeat's renewal is on the wire. Before, the renewal's
refusal raised KeyError and stopped the daemon (seen when a server paused for seconds), and a
renewal landing after the release left the lease held with nobody pulling it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from devkit.nats_servers import NatsServer
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.engine import connect
from tesla_gateway.cluster.ownership import Leases

pytest.importorskip("nats")

Publish = Callable[[str, bytes, "int | None"], Awaitable[int]]
Outcome = tuple[list[int], dict[int, str | None], list[int]]  # lost, holders, held


async def _race(
    url: str, release_first: bool
) -> tuple[list[int], dict[int, str | None], list[int]]:
    config = ClusterConfig(servers=[url], partitions=2, replicas=1, pin_ttl_s=30.0)
    engine = await connect(config, "leases-test")
    try:
        leases = Leases(engine, "g0", ttl_s=30.0)
        assert await leases.acquire(0) and await leases.acquire(1)
        on_the_wire: Publish = leases._publish

        async def racing(key: str, value: bytes, last: int | None) -> int:
            if key != "lease.0":
                return await on_the_wire(key, value, last)
            if release_first:  # the release reaches the server first: the renewal is refused
                await leases.release(0)
                return await on_the_wire(key, value, last)
            renewed = await on_the_wire(key, value, last)  # the renewal lands first
            await leases.release(0)  # ... and the release, with the revision it knew, is refused
            return renewed

        leases._publish = racing  # type: ignore[method-assign]
        lost = await leases.renew()
        return lost, await leases.holders(2), leases.held
    finally:
        await engine.close()


@pytest.mark.parametrize("release_first", [True, False], ids=["release-first", "renewal-first"])
def test_a_lease_released_during_its_renewal_is_free_and_not_lost(
    nats_server: NatsServer, release_first: bool
) -> None:
    lost, holders, held = asyncio.run(_race(nats_server.url, release_first))
    assert lost == []  # let go by its own task, not taken by another member
    assert held == [1]
    assert holders == {0: None, 1: "g0"}  # free for any member at once; the other renewed


def test_a_lease_released_while_a_lost_answer_renewal_is_read_back_is_given_back(
    nats_server: NatsServer,
) -> None:
    """A renewal stored whose answer was lost makes the next one refused; the refusal reads the
    key back and finds our later revision. If the partition's task released the lease while
    that read was on the wire (its delete named the older revision, refused), the later
    revision was kept by nobody: the partition stayed ours, unpulled, for up to a TTL."""

    async def run() -> tuple[list[int], dict[int, str | None], list[int]]:
        config = ClusterConfig(servers=[nats_server.url], partitions=1, replicas=1, pin_ttl_s=30.0)
        engine = await connect(config, "leases-test")
        try:
            leases = Leases(engine, "g0", ttl_s=30.0)
            assert await leases.acquire(0)
            on_the_wire: Publish = leases._publish

            async def answer_lost(key: str, value: bytes, last: int | None) -> int:
                await on_the_wire(key, value, last)  # stored; its answer never came ...
                return await on_the_wire(key, value, last)  # ... so the next one is refused

            read_back = leases._own_later_renewal

            async def released_meanwhile(partition: int, revision: int) -> int | None:
                await leases.release(partition)
                return await read_back(partition, revision)

            leases._publish = answer_lost  # type: ignore[method-assign]
            leases._own_later_renewal = released_meanwhile  # type: ignore[method-assign]
            lost = await leases.renew()
            return lost, await leases.holders(1), leases.held
        finally:
            await engine.close()

    lost, holders, held = asyncio.run(run())
    assert (lost, held) == ([], [])
    assert holders == {0: None}  # free for any member at once
