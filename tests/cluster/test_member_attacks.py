"""Cluster members against a real nats-server, under the breaks an attacker found (issue 29).

Before: a corrupt ``snap.<p>`` stopped every gateway taking the partition, restart after
restart; gateways of different partition counts ran side by side leaving partitions unowned; a
gateway resumed past its pin TTL wrote its older snapshot over the new owner's; a second gateway
with a live gateway's id joined and sat idle, saying nothing. The windows' owner here is a real
:class:`WindowStore` behind the few methods the daemon's ticker lends the member (no models).
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import numpy as np
import pytest
from nats.js.errors import KeyNotFoundError, NotFoundError

from devkit.nats_servers import NatsServer
from tesla_gateway.cluster import window_parts
from tesla_gateway.cluster.engine import Engine, connect
from tesla_gateway.cluster.errors import DuplicateGatewayError, PartitionsMismatchError
from tesla_gateway.cluster.member import ClusterMember
from tesla_gateway.cluster.warm import SnapshotStore
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.windows.ring import ModelWindows
from tests.cluster.owners import make_member, member_config, until

_GEOMETRY = WindowGeometry(4, 60, ("pm10",), GapPolicy(max_interpolated_periods=2))


def _stats(member: ClusterMember) -> dict[str, Any]:
    return member.stats()


def _snapshot(sequence: int, sensors: int = 1) -> bytes:
    windows = ModelWindows(_GEOMETRY)
    for minute in range(6):
        for index in range(sensors):
            reading = Reading(f"s{index}", 6000.0 + minute * 60 + 5, {"pm10": float(minute)})
            windows.add(reading, arrival=0.0)
    state = windows.export_state()
    return window_parts.encode(window_parts.PartitionSnapshot(sequence, {"pm10": state}))


def _truncated_npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.zeros(4096, dtype=np.uint8))
    return buffer.getvalue()[:2000]


async def _objects(engine: Engine) -> list[str]:
    """The objects in the snapshot store (nats-py says NotFoundError for none)."""
    try:
        return sorted(info.name for info in await engine.objects.list(ignore_deletes=True))
    except NotFoundError:
        return []


async def _plant(engine: Engine, kind: str) -> None:
    """A corrupt snapshot of partition 0, as ``kind`` says."""
    if kind == "empty-value":
        await engine.kv.put("snap.0", b"")
    elif kind == "object-truncated":
        await engine.objects.put("part-0-g9", _truncated_npz())
        await engine.kv.put("snap.0", json.dumps({"object": "part-0-g9"}).encode())
    elif kind == "pointer-nested":
        await engine.kv.put("snap.0", b"{" + b"[" * 100_000)
    elif kind == "pointer-elsewhere":
        await engine.objects.put("part-5-g9", _snapshot(3))
        await engine.kv.put("snap.0", json.dumps({"object": "part-5-g9"}).encode())
    elif kind == "object-too-large":
        await engine.objects.put("part-0-g9", _snapshot(3, sensors=400))
        await engine.kv.put("snap.0", json.dumps({"object": "part-0-g9"}).encode())
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    ["empty-value", "object-truncated", "pointer-nested", "pointer-elsewhere", "object-too-large"],
)
def test_a_corrupt_snapshot_starts_its_partition_cold_and_is_deleted(
    nats_server: NatsServer, kind: str
) -> None:
    config = member_config(nats_server.url, max_snapshot_bytes=64 * 1024)

    async def run() -> None:
        engine = await connect(config, "attacker")
        try:
            await _plant(engine, kind)
            # Taken cold, the value deleted; then, restarted, warm from the snapshot the
            # first run handed back when it stopped.
            for attempt, (cold, warm, corrupt) in enumerate([(1, 0, 1), (0, 1, 0)]):
                member = make_member(config)
                task = asyncio.create_task(member.run())
                await until(
                    task,
                    lambda m=member: m.stats()["partitions"].get("0", {}).get("ready"),
                    f"partition 0 taken (run {attempt})",
                )
                stats = member.stats()
                assert (stats["cold_takeovers"], stats["warm_takeovers"]) == (cold, warm)
                assert stats["corrupt_snapshots"] == corrupt
                if corrupt:
                    with pytest.raises(KeyNotFoundError):
                        await engine.kv.get("snap.0")
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        finally:
            await engine.close()

    asyncio.run(run())


@pytest.mark.parametrize("kv_limit", [1024, 1 << 20], ids=["object-store", "kv-value"])
def test_a_snapshot_never_replaces_one_covering_a_later_sequence(
    nats_server: NatsServer, kv_limit: int
) -> None:
    """The SIGSTOP break: the old owner resumes and saves its older windows (sequence 213)
    after the new owner saved at 405; before, 405 was lost to 213."""
    config = member_config(nats_server.url, max_kv_value_bytes=kv_limit)
    spilled = kv_limit < len(_snapshot(1))

    async def stored(engine: Engine) -> int:
        blob = await SnapshotStore(engine, "reader").load(0)
        assert blob is not None
        decoded = window_parts.decode(blob, {"pm10": _GEOMETRY}, max_bytes=1 << 20)
        return decoded.sequence

    async def run() -> None:
        engine = await connect(config, "stores")
        try:
            old, new = SnapshotStore(engine, "g-old"), SnapshotStore(engine, "g-new")
            assert await old.load(0) is None
            assert await old.save(0, _snapshot(200), 200)
            assert await old.save(0, _snapshot(213), 213)  # then it is paused
            assert await new.load(0) is not None  # the new owner takes over from 213
            assert await new.save(0, _snapshot(405), 405)
            assert not await old.save(0, _snapshot(300), 300)  # resumed: refused
            assert await stored(engine) == 405
            assert await new.save(0, _snapshot(406), 406)  # the owner is not disturbed
            assert await stored(engine) == 406

            # Resumed before the new owner's first save: the old one's windows are still
            # newer than what the new one loaded, and the new owner's later save wins.
            await new.load(0)
            assert await old.save(0, _snapshot(500), 500)
            assert await new.save(0, _snapshot(610), 610)
            assert await stored(engine) == 610

            # Only the object snap.0 points at is left: each writer's replaced or refused
            # ones are deleted (the store does not fill with every former owner's windows).
            assert await _objects(engine) == (["part-0-g-new"] if spilled else [])
        finally:
            await engine.close()

    asyncio.run(run())


def test_gateways_with_different_partition_counts_are_refused(nats_server: NatsServer) -> None:
    async def run() -> None:
        first = await connect(member_config(nats_server.url, partitions=4), "first")
        await first.close()
        with pytest.raises(PartitionsMismatchError, match=r"has 4 partitions.*partitions = 6"):
            await connect(member_config(nats_server.url, partitions=6), "second")
        again = await connect(member_config(nats_server.url, partitions=4), "same")  # still fine
        await again.close()

    asyncio.run(run())


def test_a_second_gateway_with_a_live_gateways_id_is_refused(nats_server: NatsServer) -> None:
    config = member_config(nats_server.url)

    async def run() -> None:
        first = make_member(config, "twin")
        task = asyncio.create_task(first.run())
        await until(task, lambda: first.stats()["partitions"], "the first gateway's partition")
        with pytest.raises(DuplicateGatewayError, match=r"'twin' is alive"):
            await make_member(config, "twin").run()
        assert not task.done()  # the first one is untouched
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        # A key its own crashed run left (not renewed) is no twin: the restart joins.
        engine = await connect(config, "crashed")
        await engine.js.publish(
            f"$KV.{config.bucket}.member.twin", b"twin", msg_ttl=config.pin_ttl_s
        )
        await engine.close()
        restarted = make_member(config, "twin")
        task = asyncio.create_task(restarted.run())
        await until(task, lambda: restarted.stats()["partitions"], "the restart's partition")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())


def test_an_owner_finding_a_later_snapshot_gives_its_partition_up(
    nats_server: NatsServer,
) -> None:
    """The member's side of the rule: its snapshot round meets a snapshot of a later sequence
    (another gateway owned the partition while this one was frozen): it drops the partition
    instead of writing, and takes it again from that snapshot."""
    config = member_config(nats_server.url, snapshot_interval_s=0.2)

    async def run() -> None:
        engine = await connect(config, "newer-owner")
        member = make_member(config, "frozen")
        task = asyncio.create_task(member.run())
        try:
            await until(task, lambda: _stats(member)["snapshots"] >= 1, "a first snapshot")
            newer = SnapshotStore(engine, "newer")
            await newer.load(0)
            assert await newer.save(0, _snapshot(10**6), 10**6)
            await until(task, lambda: _stats(member)["lost"] >= 1, "the partition given up")
            blob = await SnapshotStore(engine, "reader").load(0)
            assert blob is not None
            assert window_parts.sequence_of(blob, max_bytes=1 << 20) == 10**6
            await until(task, lambda: _stats(member)["warm_takeovers"] >= 1, "taken again")
            assert _stats(member)["partitions"]["0"]["covered"] == 10**6
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await engine.close()

    asyncio.run(run())
