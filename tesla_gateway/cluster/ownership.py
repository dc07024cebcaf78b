"""Which partitions this gateway asks for, and the leases that say it holds them.

The engine does the coordinating: a lease is a KV key ``lease.<p>`` created with a per-key TTL
(only one create can win) and renewed by compare-and-set on its revision; a member is a key
``member.<gateway>`` with the same TTL. A dead gateway's keys vanish by themselves. The only
rule of ours is :func:`plan`: with G members alive, nobody holds more than ceil(P/G) partitions,
so a gateway over its share releases the extra and one under it takes free ones.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tesla_gateway.cluster.engine import WRONG_LAST_SEQUENCE, Engine, transient
from tesla_gateway.cluster.errors import DuplicateGatewayError

__all__ = ["Leases", "Plan", "plan"]


@dataclass(frozen=True, slots=True)
class Plan:
    """Partitions to ask for and to give back, each in the order to do it."""

    acquire: tuple[int, ...]
    release: tuple[int, ...]


def plan(
    me: str, members: Sequence[str], holders: Mapping[int, str | None], partitions: int
) -> Plan:
    """This member's moves toward a placement where nobody has more than ceil(P/G) and, once no
    partition is free, nobody fewer than floor(P/G).

    Free partitions are tried from an offset that differs per member, so that members starting
    together mostly ask for different ones; a lost race costs one KV request. When a member
    starves with nothing free, only the richest member (the first by name) gives one back per
    heartbeat, so a join moves as few partitions as it can.
    """
    alive = sorted(set(members) | {me})
    share = math.ceil(partitions / len(alive))
    floor = partitions // len(alive)
    mine = sorted(p for p, holder in holders.items() if holder == me)
    if len(mine) > share:
        return Plan(acquire=(), release=tuple(mine[share:]))
    free = [p for p in range(partitions) if holders.get(p) is None]
    if free:
        offset = alive.index(me) * partitions // len(alive)
        free.sort(key=lambda p: (p - offset) % partitions)
        return Plan(acquire=tuple(free[: share - len(mine)]), release=())
    counts = dict.fromkeys(alive, 0)
    for holder in holders.values():
        if holder in counts:
            counts[holder] += 1
    richest = max(counts.values())
    first_richest = min(m for m, count in counts.items() if count == richest)
    if min(counts.values()) < floor and len(mine) > floor and me == first_richest:
        return Plan(acquire=(), release=(mine[-1],))
    return Plan(acquire=(), release=())


class Leases:
    """This gateway's member key and partition leases in the cluster's KV bucket."""

    def __init__(self, engine: Engine, me: str, ttl_s: float) -> None:
        self._engine = engine
        self.me = me
        self._ttl_s = ttl_s
        self._revisions: dict[int, int] = {}  # partition -> revision of our lease

    @property
    def held(self) -> list[int]:
        return sorted(self._revisions)

    async def _publish(self, key: str, value: bytes, last: int | None) -> int:
        headers = {} if last is None else {"Nats-Expected-Last-Subject-Sequence": str(last)}
        ack = await self._engine.js.publish(
            f"$KV.{self._engine.subjects.config.bucket}.{key}",
            value,
            headers=headers,
            msg_ttl=self._ttl_s,
        )
        return int(ack.seq)

    async def heartbeat(self) -> None:
        """Say this member is alive (its key expires ``ttl`` after the last heartbeat)."""
        await self._publish(f"member.{self.me}", self.me.encode(), None)

    async def refuse_a_twin(self) -> None:
        """Before the first heartbeat: :class:`DuplicateGatewayError` if a live gateway has this
        id (its member key is renewed within a TTL), as both would count its partitions as
        theirs and one would sit idle, saying nothing. A key left by this gateway's own
        previous run (a crash, a quick restart) is not renewed, and is no twin."""
        from nats.js.errors import KeyNotFoundError

        key = f"member.{self.me}"
        seen: int | None = None
        deadline = time.monotonic() + self._ttl_s
        while time.monotonic() < deadline:
            try:
                entry = await self._engine.kv.get(key)
            except KeyNotFoundError:
                return
            if not entry.value:
                return
            if seen is not None and entry.revision != seen:
                raise DuplicateGatewayError(
                    f"another gateway with gateway_id {self.me!r} is alive in the cluster (its "
                    f"key {key} in bucket {self._engine.subjects.config.bucket} is being "
                    "renewed): give each gateway its own gateway_id"
                )
            seen = entry.revision
            await asyncio.sleep(self._ttl_s / 10)

    async def members(self) -> list[str]:
        """The members whose key is alive (the bucket's subjects, then each key's value: a
        member that left has a delete marker)."""
        from nats.js.errors import KeyNotFoundError

        bucket = self._engine.subjects.config.bucket
        info = await self._engine.js.stream_info(
            f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.member.*"
        )
        alive: list[str] = []
        for subject in info.state.subjects or {}:
            key = subject.removeprefix(f"$KV.{bucket}.")
            try:
                entry = await self._engine.kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                alive.append(key.removeprefix("member."))
        return sorted(alive)

    async def holders(self, partitions: int) -> dict[int, str | None]:
        """Who holds each partition's lease now (None: nobody)."""
        from nats.js.errors import KeyNotFoundError

        found: dict[int, str | None] = {}
        for partition in range(partitions):
            try:
                entry = await self._engine.kv.get(f"lease.{partition}")
            except KeyNotFoundError:
                found[partition] = None
                continue
            found[partition] = entry.value.decode() if entry.value else None
        return found

    async def acquire(self, partition: int) -> bool:
        """Create the lease; False when another gateway holds it."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        key = f"lease.{partition}"
        last = 0
        try:
            entry = await self._engine.kv.get(key)
        except KeyNotFoundError as absent:  # never made, expired, or released (a delete)
            if absent.entry is not None:
                last = int(absent.entry.revision or 0)
        else:
            if entry.value:
                return False
            last = int(entry.revision or 0)
        try:
            self._revisions[partition] = await self._publish(key, self.me.encode(), last)
        except KeyWrongLastSequenceError:
            return False
        except transient() as exc:  # the CAS refusal arrives as an APIError (code 10071)
            if getattr(exc, "err_code", None) in WRONG_LAST_SEQUENCE:
                return False
            raise
        return True

    async def renew(self) -> list[int]:
        """Renew every lease by compare-and-set; the partitions whose lease was lost.

        A partition's own task may release its lease while a renewal is on the wire (it lost
        its pin): the renewal is then refused (the release came first) or lands after it, and
        the lease it made is given back at once. Neither counts as lost: it was let go.
        """
        lost: list[int] = []
        for partition, revision in list(self._revisions.items()):
            if self._revisions.get(partition) != revision:
                continue  # released, or taken anew, since this round began
            try:
                renewed = await self._publish(f"lease.{partition}", self.me.encode(), revision)
            except transient() as exc:
                if getattr(exc, "err_code", None) not in WRONG_LAST_SEQUENCE:
                    raise
                if self._revisions.get(partition) == revision:
                    del self._revisions[partition]
                    lost.append(partition)
                continue
            if self._revisions.get(partition) == revision:
                self._revisions[partition] = renewed
            elif partition not in self._revisions:  # released meanwhile: give this one back
                await self._delete_lease(partition, renewed)
        return lost

    async def release(self, partition: int) -> None:
        """Delete our lease (only if it is still ours) so another member may take it now."""
        revision = self._revisions.pop(partition, None)
        if revision is None:
            return
        await self._delete_lease(partition, revision)

    async def _delete_lease(self, partition: int, revision: int) -> None:
        """Delete the lease if ``revision`` is still its last (a refusal: it is not ours)."""
        try:
            await self._engine.kv.delete(f"lease.{partition}", last=revision)
        except transient() as exc:
            if getattr(exc, "err_code", None) not in WRONG_LAST_SEQUENCE:
                raise

    async def leave(self) -> None:
        """Release every lease and the member key (a clean shutdown)."""
        for partition in list(self._revisions):
            await self.release(partition)
        await self._engine.kv.delete(f"member.{self.me}")
