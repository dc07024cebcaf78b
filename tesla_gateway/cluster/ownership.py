"""Which partitions this gateway asks for, and the leases that say it holds them.

The engine does the coordinating: a lease is a KV key ``lease.<p>`` created with a per-key TTL
(only one create can win) and renewed by compare-and-set on its revision; a member is a key
``member.<gateway>`` with the same TTL. A dead gateway's keys vanish by themselves. The only
rule of ours is :func:`plan`: with G members alive, nobody holds more than ceil(P/G) partitions,
so a gateway over its share releases the extra and one under it takes free ones.

Anybody who can publish to the bucket can write any key (a hand-made key has no TTL, an MQTT
publish no TTL and any bytes), so a key counts only if it is what a gateway writes and was
stored within a TTL by the server's clock; anything else is counted, logged once and ignored:
a lease of it is free (taken by compare-and-set on its revision), a member key of it deleted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from tesla_gateway.cluster.config import MAX_PIN_TTL_S, SUBJECT_TOKEN, gateway_id_problem
from tesla_gateway.cluster.engine import WRONG_LAST_SEQUENCE, Engine, transient
from tesla_gateway.cluster.errors import ClusterRefusedError, DuplicateGatewayError
from tesla_gateway.cluster.stored import StoredKey, read_key, stream_now

__all__ = ["Leases", "Plan", "plan"]

_log = structlog.get_logger(__name__)


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
        if (problem := gateway_id_problem(me)) is not None:
            raise ClusterRefusedError(problem)
        self._engine = engine
        self.me = me
        self._ttl_s = ttl_s
        self._revisions: dict[int, int] = {}  # partition -> revision of our lease
        self._takeable: dict[int, int] = {}  # partition -> revision of a bad or stale lease
        self._reported: dict[str, int] = {}  # key -> revision of the bad value logged
        self.bad_keys = 0  # bad or stale values met (each key's revision once)

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
        """The members whose key is alive: named by a gateway id, holding that id, and stored
        within a TTL by the server's clock. Any other member key is deleted (by
        compare-and-set: a gateway renewing it meanwhile keeps it)."""
        now, keys = await self._keys("member.*")
        alive: list[str] = []
        for key in keys:
            stored = await read_key(self._engine, key)
            if stored is None or stored.value is None:
                continue  # gone, or left (a delete marker)
            name = key.removeprefix("member.")
            if not SUBJECT_TOKEN.fullmatch(name) or stored.value != name.encode():
                self._report(stored, "not the gateway id its key names")
            elif not self._fresh(stored, now):
                self._report(stored, f"not renewed within {self._ttl_s} s (no TTL?)")
            else:
                alive.append(name)
                continue
            await self._delete(key, stored.revision)
        return sorted(alive)

    async def holders(self, partitions: int) -> dict[int, str | None]:
        """Who holds each partition's lease now (None: nobody, or a bad or stale value, which
        :meth:`acquire` may then take over)."""
        now, keys = await self._keys("lease.*")
        present = set(keys)
        found: dict[int, str | None] = {}
        takeable: dict[int, int] = {}
        for partition in range(partitions):
            key = f"lease.{partition}"
            stored = await read_key(self._engine, key) if key in present else None
            found[partition] = None
            if stored is None or stored.value is None:
                continue
            holder = _holder(stored.value)
            if holder is None:
                self._report(stored, "not a gateway id")
            elif not self._fresh(stored, now):
                self._report(stored, f"not renewed within {self._ttl_s} s (no TTL?)")
            else:
                found[partition] = holder
                continue
            takeable[partition] = stored.revision
        self._takeable = takeable
        return found

    async def acquire(self, partition: int) -> bool:
        """Create the lease, or take over one :meth:`holders` found bad or stale, by
        compare-and-set on the revision read; False when another gateway holds it."""
        from nats.js.errors import KeyWrongLastSequenceError

        key = f"lease.{partition}"
        stored = await read_key(self._engine, key)
        last = 0 if stored is None else stored.revision
        held = stored is not None and stored.value is not None and _holder(stored.value)
        if held and self._takeable.get(partition) != last:  # a fresh lease of a gateway
            return False
        try:
            self._revisions[partition] = await self._publish(key, self.me.encode(), last)
        except KeyWrongLastSequenceError:
            return False
        except transient() as exc:  # the CAS refusal arrives as an APIError (code 10071)
            if getattr(exc, "err_code", None) in WRONG_LAST_SEQUENCE:
                return False
            raise
        self._takeable.pop(partition, None)
        return True

    async def _keys(self, pattern: str) -> tuple[float, list[str]]:
        """The server's time now and the bucket's keys matching ``pattern``."""
        bucket = self._engine.subjects.config.bucket
        now, subjects = await stream_now(self._engine, f"KV_{bucket}", f"$KV.{bucket}.{pattern}")
        return now, [subject.removeprefix(f"$KV.{bucket}.") for subject in subjects]

    def _fresh(self, stored: StoredKey, now: float) -> bool:
        """A key with a TTL up to the largest pin TTL (as every gateway writes them) is the
        server's to expire; one without (hand-made, or an MQTT publish) counts only while
        stored within this gateway's TTL by the server's clock."""
        if stored.ttl_s is not None and 0 < stored.ttl_s <= MAX_PIN_TTL_S:
            return True
        return now - stored.stored_at <= self._ttl_s

    def _report(self, stored: StoredKey, why: str) -> None:
        """Count and log a bad or stale value once (per key and revision)."""
        if self._reported.get(stored.key) == stored.revision:
            return
        self._reported[stored.key] = stored.revision
        self.bad_keys += 1
        _log.warning(
            "cluster_bad_key",
            key=stored.key,
            revision=stored.revision,
            value=repr((stored.value or b"")[:64]),
            why=why,
            action="ignored; a lease of it is taken over, a member key of it deleted",
        )

    async def renew(self) -> list[int]:
        """Renew every lease by compare-and-set; the partitions whose lease was lost.

        A partition's own task may release its lease while a renewal is on the wire (it lost
        its pin): the renewal is then refused (the release came first) or lands after it, and
        the lease it made is given back at once. Neither counts as lost: it was let go. Nor
        does a refusal because an earlier renewal of ours was stored after its request gave up
        (its answer lost with a dying server): that revision is adopted.
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
                later = await self._own_later_renewal(partition, revision)
                if self._revisions.get(partition) != revision:
                    if later is not None and partition not in self._revisions:
                        await self._delete(f"lease.{partition}", later)  # released meanwhile
                    continue  # released, or taken anew, meanwhile
                if later is None:
                    del self._revisions[partition]
                    lost.append(partition)
                else:
                    self._revisions[partition] = later
                continue
            if self._revisions.get(partition) == revision:
                self._revisions[partition] = renewed
            elif partition not in self._revisions:  # released meanwhile: give this one back
                await self._delete(f"lease.{partition}", renewed)
        return lost

    async def _own_later_renewal(self, partition: int, revision: int) -> int | None:
        """The lease's revision if it is still ours, written after ``revision`` (a renewal whose
        answer never came) with a TTL as a gateway writes it; None when another holds it, or
        nobody (it expired)."""
        stored = await read_key(self._engine, f"lease.{partition}")
        if (
            stored is None
            or stored.value != self.me.encode()
            or stored.revision <= revision
            or stored.ttl_s is None
            or not 0 < stored.ttl_s <= MAX_PIN_TTL_S
        ):
            return None
        return stored.revision

    async def release(self, partition: int) -> None:
        """Delete our lease (only if it is still ours) so another member may take it now."""
        revision = self._revisions.pop(partition, None)
        if revision is None:
            return
        await self._delete(f"lease.{partition}", revision)

    async def _delete(self, key: str, revision: int) -> None:
        """Delete the key if ``revision`` is still its last (a refusal: somebody wrote it since).
        A plain publish of the delete marker: nats-py's own refuses keys an MQTT topic made."""
        bucket = self._engine.subjects.config.bucket
        headers = {"KV-Operation": "DEL", "Nats-Expected-Last-Subject-Sequence": str(revision)}
        try:
            await self._engine.js.publish(f"$KV.{bucket}.{key}", b"", headers=headers)
        except transient() as exc:
            if getattr(exc, "err_code", None) not in WRONG_LAST_SEQUENCE:
                raise

    async def leave(self) -> None:
        """Release every lease and the member key (a clean shutdown)."""
        for partition in list(self._revisions):
            await self.release(partition)
        await self._engine.kv.delete(f"member.{self.me}")


def _holder(value: bytes) -> str | None:
    """The gateway id a lease's value names (None: it names none, whatever its bytes are)."""
    text = value.decode("ascii", errors="replace")
    return text if SUBJECT_TOKEN.fullmatch(text) else None
