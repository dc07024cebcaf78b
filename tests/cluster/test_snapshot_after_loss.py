"""A snapshot never claims a partition lost while it waited for the tick lock.

Found by looping the stream-leader kill under load: the snapshot loop took its list of
partitions, waited for the tick lock, and meanwhile the partition was lost and its windows
dropped; it then stored a snapshot with no sensor but the partition's sequence, and the next
owner, loading it, replayed only after that sequence: every reading up to there was gone from
the windows (1 period of 3 sensors per caught run, 2 runs in 13).

The race is driven here in-process: the member's snapshot store is a recorder standing in for
the KV bucket (the bucket's own rules are tested against a real nats-server in test_parts.py
and the failover tests); the windows, the lock and the member's code are the real ones.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tesla_gateway.cluster.holdings import Owned
from tesla_gateway.contract.readings import Reading
from tests.cluster.owners import StoreOwner, make_member, member_config


class _RecordingSnapshots:
    """What the member's KV snapshot store is asked to keep."""

    max_bytes = 1 << 24

    def __init__(self) -> None:
        self.saved: list[tuple[int, int]] = []  # (partition, sequence)

    async def save(self, partition: int, blob: bytes, sequence: int) -> bool:
        self.saved.append((partition, sequence))
        return True


def test_a_partition_lost_while_the_snapshot_waits_is_not_snapshotted() -> None:
    async def run() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        member = make_member(member_config("nats://127.0.0.1:1"))
        owner: Any = member._ticker
        assert isinstance(owner, StoreOwner)
        recorder = _RecordingSnapshots()
        member._snapshots = recorder  # type: ignore[assignment]
        now = time.time()
        for sensor in ("a", "b"):
            owner.ingest(Reading(sensor, now - 120.0, {"pm10": 10.0}))
        lost = Owned(covered=41, sensors={"a"}, ready=True)
        kept = Owned(covered=42, sensors={"b"}, ready=True)
        member._owned.update({0: lost, 1: kept})

        async with member._tick_lock:  # a tick in progress: the snapshot waits for it
            saving = asyncio.create_task(member._save({0: lost, 1: kept}))
            await asyncio.sleep(0.05)
            # meanwhile partition 0 is lost: popped, then its windows dropped (as _lose does,
            # the drop itself under the lock, after this tick)
            member._owned.pop(0)
        async with member._tick_lock:
            member._drop_windows(lost.sensors)
        await saving
        after_loss = list(recorder.saved)

        recorder.saved.clear()  # the partition kept is snapshotted as before
        await member._save({1: kept})
        return after_loss, recorder.saved

    after_loss, kept_only = asyncio.run(run())
    assert after_loss == [(1, 42)]  # it was [(0, 41), (1, 42)]: 0's snapshot empty yet at 41
    assert kept_only == [(1, 42)]
