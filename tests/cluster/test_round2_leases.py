"""The bucket's coordination keys as an attacker may leave them, against a real nats-server
(attacker round 2, issue 29).

Before: two non-UTF-8 bytes in ``lease.<p>`` (one MQTT publish on an open listener) stopped
every gateway, restart after restart; a member key without TTL (``member.ghost``) was counted
forever, so its share of the partitions stayed unowned; a gateway id with a dot made a member key
two tokens deep that no member listing found, so a second gateway sat idle. Now a key that is
not what a gateway writes, or that no gateway has renewed within a TTL by the server's clock, is
counted, logged once and ignored, a lease of it taken over by compare-and-set, a member key of
it deleted; and cluster mode refuses a dotted ``gateway_id`` at config validation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.js.errors import KeyNotFoundError

from devkit.nats_servers import NatsServer
from tesla_gateway.cluster.engine import Engine, connect
from tesla_gateway.cluster.errors import ClusterRefusedError
from tesla_gateway.cluster.ownership import Leases
from tesla_gateway.errors import ConfigError
from tests.cluster.owners import make_member, member_config, until

pytest.importorskip("nats")

_TTL_S = 1.0  # the tests' pin TTL: a key unrenewed for longer is stale
_STALE_WAIT_S = 2.0 * _TTL_S  # long enough for any key written before to be stale


async def _put(engine: Engine, key: str, value: bytes) -> None:
    """A key as a hand-made or MQTT-published value is: no TTL, no compare-and-set."""
    await engine.kv.put(key, value)


async def _value(engine: Engine, key: str) -> bytes | None:
    try:
        return (await engine.kv.get(key)).value
    except KeyNotFoundError:
        return None


def _owns(member: object, partitions: int) -> bool:
    owned = member.stats()["partitions"]  # type: ignore[attr-defined]
    return all(owned.get(str(p), {}).get("ready") for p in range(partitions))


def test_a_lease_of_bad_bytes_is_taken_over_by_a_gateway_and_its_restart(
    nats_server: NatsServer,
) -> None:
    """The crash: ``lease.0`` = b'\\xff\\xfe' raised UnicodeDecodeError out of the heartbeat."""
    config = member_config(nats_server.url, partitions=2)

    async def run() -> None:
        engine = await connect(config, "attacker")
        try:
            for attempt in range(2):  # a first run, then a restart meeting the bytes again
                await _put(engine, "lease.0", b"\xff\xfe")
                await _put(engine, "lease.1", b"g0\x00" + b"x" * 200)  # no gateway's id
                member = make_member(config)
                task = asyncio.create_task(member.run())
                await until(task, lambda m=member: _owns(m, 2), f"both partitions ({attempt})")
                assert await _value(engine, "lease.0") == b"g0"
                assert await _value(engine, "lease.1") == b"g0"
                assert member.stats()["bad_keys"] == 2
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        finally:
            await engine.close()

    asyncio.run(run())


def test_a_bad_or_stale_lease_is_free_and_taken_only_by_compare_and_set(
    nats_server: NatsServer,
) -> None:
    config = member_config(nats_server.url, partitions=1)

    async def run() -> None:
        engine = await connect(config, "attacker")
        try:
            leases = Leases(engine, "g0", ttl_s=_TTL_S)
            await _put(engine, "lease.0", b"\xff\xfe")
            assert await leases.holders(1) == {0: None}
            assert await leases.holders(1) == {0: None}
            assert leases.bad_keys == 1  # the same bad value is counted (and logged) once
            # Another gateway takes it between this one's look and its take: refused.
            await engine.js.publish(f"$KV.{config.bucket}.lease.0", b"g1", msg_ttl=30.0)
            assert not await leases.acquire(0)
            assert await _value(engine, "lease.0") == b"g1"

            # A gateway's id without TTL, never renewed: held while fresh, then stale.
            await _put(engine, "lease.0", b"ghost")
            assert await leases.holders(1) == {0: "ghost"}
            assert not await leases.acquire(0)
            await asyncio.sleep(_STALE_WAIT_S)
            assert await leases.holders(1) == {0: None}
            assert await leases.acquire(0)
            assert await _value(engine, "lease.0") == b"g0"
            assert leases.bad_keys == 2
            assert await leases.renew() == []  # an ordinary lease of ours from here on
        finally:
            await engine.close()

    asyncio.run(run())


def test_a_member_key_without_ttl_counts_only_while_fresh_and_is_deleted(
    nats_server: NatsServer,
) -> None:
    config = member_config(nats_server.url, partitions=2)

    async def run() -> None:
        engine = await connect(config, "attacker")
        try:
            leases = Leases(engine, "g0", ttl_s=_TTL_S)
            await _put(engine, "member.ghost", b"ghost")
            await _put(engine, "member.g7", b"\xff\xfe")  # not the id its key names
            await leases.heartbeat()
            assert await leases.members() == ["g0", "ghost"]  # as a member just started
            assert await _value(engine, "member.g7") is None  # garbage: deleted at once
            await asyncio.sleep(_STALE_WAIT_S)
            await leases.heartbeat()
            assert await leases.members() == ["g0"]
            assert await _value(engine, "member.ghost") is None
            assert await _value(engine, "member.g0") == b"g0"
            assert leases.bad_keys == 2
        finally:
            await engine.close()

    asyncio.run(run())


def test_a_member_key_without_ttl_leaves_no_partition_unowned(nats_server: NatsServer) -> None:
    """ghost_member6.py: the ghost counted, g0's share was ceil(2/2) = 1, partition 1 unowned."""
    config = member_config(nats_server.url, partitions=2)

    async def run() -> None:
        engine = await connect(config, "attacker")
        member = make_member(config)
        task: asyncio.Task[None] | None = None
        try:
            await _put(engine, "member.ghost", b"ghost")
            task = asyncio.create_task(member.run())
            await until(task, lambda: _owns(member, 2), "both partitions owned by g0")
            assert member.stats()["members"] == ["g0"]
        finally:
            if task is not None:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            await engine.close()

    asyncio.run(run())


def _gateway_config(tmp_path: Path, gateway_id: str, cluster: bool) -> Path:
    path = tmp_path / "gateway.toml"
    section = '[cluster]\nservers = ["nats://127.0.0.1:4222"]\n' if cluster else ""
    path.write_text(
        f'gateway_id = "{gateway_id}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[[models]]\nfeature = "pm10"\nmodel_dir = "{tmp_path / "model"}"\n{section}',
        encoding="utf-8",
    )
    return path


def test_cluster_mode_refuses_a_gateway_id_of_more_than_one_token(tmp_path: Path) -> None:
    """dotted_gateway_id.py: 'site.a' and 'site.b' joined, listed no member, one sat idle."""
    from tesla_gateway.daemon.config import load_config

    for bad in ("site.a", "a.b.c"):
        with pytest.raises(ConfigError, match=r"gateway_id = .*: cluster mode needs .*no '\.'"):
            load_config(_gateway_config(tmp_path, bad, cluster=True))
    assert load_config(_gateway_config(tmp_path, "site-a_1", cluster=True)).cluster is not None
    assert load_config(_gateway_config(tmp_path, "site.a", cluster=False)).cluster is None
    with pytest.raises(ClusterRefusedError, match="gateway_id"):
        Leases(None, "site.a", ttl_s=_TTL_S)  # type: ignore[arg-type]
