"""Members that disagree on what the cluster shares, against a real nats-server (issue 29,
round 2: subject_mismatch.py, window_mismatch.py, config_mismatch.py:
an attacker's reproduction scripts, not shipped).

Before: a gateway with another ``readings_subject`` rewrote every partition consumer's filter
(the last to start won; every period missing, no error); gateways with other model windows or
another ``pin_ttl_s`` joined; a takeover from a snapshot whose model window differs skipped the
slot silently and counted the takeover warm. The windows' owner is a real
:class:`WindowStore` behind the few methods the daemon's ticker lends the member (no models).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from devkit.nats_servers import NatsServer
from tesla_gateway.cluster import window_parts
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.engine import connect
from tesla_gateway.cluster.errors import SettingsMismatchError
from tesla_gateway.cluster.member import ClusterMember
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.windows.ring import ModelWindows
from tests.cluster.owners import make_member, member_config, stats_of, until

_WAIT_S = 30.0  # an upper bound on slow CI, never a timing assertion


def _geometry(window: int = 4, period: int = 60) -> WindowGeometry:
    return WindowGeometry(window, period, ("pm10",), GapPolicy(max_interpolated_periods=2))


def _config(url: str, **overrides: Any) -> ClusterConfig:
    return member_config(url, **({"partitions": 2} | overrides))


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _refused(member: ClusterMember) -> SettingsMismatchError:
    """The member's run ends with the refusal (or the test fails: it joined)."""
    task = asyncio.create_task(member.run())
    done, _ = await asyncio.wait({task}, timeout=_WAIT_S)
    if not done:
        await _stop(task)
        raise AssertionError(f"{member.gateway_id} joined the cluster: {stats_of(member)}")
    error = task.exception()
    assert isinstance(error, SettingsMismatchError), repr(error)
    return error


def test_another_readings_subject_is_refused_and_the_consumers_keep_their_filter(
    nats_server: NatsServer,
) -> None:
    """subject_mismatch_probe.py: the second gateway's CONSUMER.CREATE rewrote the filters."""

    async def run() -> None:
        first = await connect(_config(nats_server.url), "first")
        try:
            with pytest.raises(SettingsMismatchError, match=r"readings_subject.*'sensors'"):
                await connect(_config(nats_server.url, readings_subject="other"), "second")
            for partition in range(2):
                info = await first.js.consumer_info("TESLA_READINGS", f"part-{partition}")
                assert info.config.filter_subject == f"sensors.part.{partition}.*"
        finally:
            await first.close()

    asyncio.run(run())


def test_a_partition_consumer_with_another_filter_is_refused_not_rewritten(
    nats_server: NatsServer,
) -> None:
    """The consumer's side alone: whatever made ``part-0`` filter another partition, a
    gateway refuses to start (naming the filter it found) instead of updating it."""

    async def run() -> None:
        config = _config(nats_server.url)
        first = await connect(config, "first")
        try:
            await first.request("$JS.API.CONSUMER.DELETE.TESLA_READINGS.part-0", {})
            body = {
                "stream_name": "TESLA_READINGS",
                "config": {  # the gateway's settings but the filter, as old code rewrote
                    "durable_name": "part-0",
                    "filter_subject": "sensors.part.1.*",
                    "deliver_policy": "all",
                    "ack_policy": "explicit",
                    "max_waiting": 64,
                    "priority_groups": ["owners"],
                    "priority_policy": "pinned_client",
                    "priority_timeout": config.pin_ttl_ns,
                },
            }
            await first.request("$JS.API.CONSUMER.CREATE.TESLA_READINGS.part-0", body)
            with pytest.raises(SettingsMismatchError, match=r"part-0.*sensors\.part\.1\.\*"):
                await connect(config, "second")
            info = await first.js.consumer_info("TESLA_READINGS", "part-0")
            assert info.config.filter_subject == "sensors.part.1.*"  # untouched
        finally:
            await first.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"geometry": _geometry(window=6)}, r"models\.pm10\.window_length: 6 here, 4"),
        ({"geometry": _geometry(period=120)}, r"models\.pm10\.period_seconds: 120 here, 60"),
        ({"pin_ttl_s": 4.0}, r"pin_ttl_s: 4\.0 here, 1\.0"),
    ],
    ids=["window", "period", "pin-ttl"],
)
def test_a_member_with_other_shared_settings_is_refused(
    nats_server: NatsServer, change: dict[str, Any], named: str
) -> None:
    """window_mismatch.py / config_mismatch.py: both were accepted."""
    geometry = change.pop("geometry", _geometry())

    async def run() -> None:
        first = make_member(_config(nats_server.url), "g0", _geometry())
        task = asyncio.create_task(first.run())
        try:
            await until(task, lambda: len(stats_of(first)["partitions"]) == 2, "g0 owning all")
            error = await _refused(make_member(_config(nats_server.url, **change), "g1", geometry))
            assert "stop every gateway" in str(error)
            assert len(stats_of(first)["partitions"]) == 2 and not task.done()
        finally:
            await _stop(task)

    asyncio.run(run())


def test_settings_change_once_no_member_runs_and_versions_never_count(
    nats_server: NatsServer,
) -> None:
    """Stopped all, a gateway with a new pin TTL starts and records it; a model's version is no
    shared setting (an OTA rollout has two at once)."""
    from tesla_gateway.cluster.agreement import SETTINGS_KEY, shared_settings

    settings = shared_settings(_config(nats_server.url), {"pm10": _geometry()})
    assert "version" not in json.dumps(settings)

    async def run() -> None:
        first = make_member(_config(nats_server.url), "g0", _geometry())
        task = asyncio.create_task(first.run())
        await until(task, lambda: stats_of(first)["partitions"], "g0 owning")
        await _stop(task)  # a clean leave: no member left
        second = make_member(_config(nats_server.url, pin_ttl_s=2.0), "g1", _geometry())
        task = asyncio.create_task(second.run())
        try:
            await until(task, lambda: len(stats_of(second)["partitions"]) == 2, "g1 owning all")
            engine = await connect(_config(nats_server.url, pin_ttl_s=2.0), "reader")
            try:
                recorded = json.loads((await engine.kv.get(SETTINGS_KEY)).value or b"")
                assert recorded["pin_ttl_s"] == 2.0
            finally:
                await engine.close()
        finally:
            await _stop(task)

    asyncio.run(run())


def _snapshot(geometry: WindowGeometry, sequence: int) -> bytes:
    windows = ModelWindows(geometry)
    for minute in range(6):
        reading = Reading("s0", 6000.0 + minute * 60 + 5, {"pm10": float(minute)})
        windows.add(reading, arrival=0.0)
    state = windows.export_state()
    return window_parts.encode(window_parts.PartitionSnapshot(sequence, {"pm10": state}))


def test_a_snapshot_of_another_window_is_a_cold_takeover(nats_server: NatsServer) -> None:
    """window_mismatch.py's takeover: the slot was skipped and the takeover counted warm (its
    windows started empty, after the snapshot's sequence: periods missing)."""
    config = _config(nats_server.url, partitions=1)

    async def run() -> None:
        engine = await connect(config, "planter")
        try:
            await engine.kv.put("snap.0", _snapshot(_geometry(window=4), 7))
        finally:
            await engine.close()
        member = make_member(config, "g6", _geometry(window=6))
        task = asyncio.create_task(member.run())
        try:
            await until(task, lambda: stats_of(member)["acquired"] >= 1, "partition 0 taken")
            stats = stats_of(member)
            assert (stats["warm_takeovers"], stats["cold_takeovers"]) == (0, 1)
            assert stats["mismatched_snapshots"] == 1
        finally:
            await _stop(task)

    asyncio.run(run())


def test_a_member_whose_record_another_gateway_replaced_is_refused_at_the_next_beat(
    nats_server: NatsServer,
) -> None:
    """Two gateways replacing the record at one instant: the one whose settings are gone
    stops at its next heartbeat's check."""
    from tesla_gateway.cluster.agreement import SETTINGS_KEY, Agreement, shared_settings

    config = _config(nats_server.url)
    settings = shared_settings(config, {"pm10": _geometry()})

    async def others() -> list[str]:
        return ["g0", "g1"]

    async def run() -> None:
        engine = await connect(config, "agreement")
        try:
            agreement = Agreement(engine, "g0", settings, others)
            await agreement.join()
            await agreement.verify()  # the record is still this member's
            replaced = {**settings, "partitions": settings["partitions"] + 1}
            await engine.kv.put(SETTINGS_KEY, json.dumps(replaced, sort_keys=True).encode())
            with pytest.raises(SettingsMismatchError, match="partitions"):
                await agreement.verify()
        finally:
            await engine.close()

    asyncio.run(run())
