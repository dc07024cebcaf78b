"""A cold takeover's fallback replay by the stream's clock, against a real nats-server (attacker
round 2, issue 29).

Before: without a snapshot the new owner replayed the readings stored since its own clock minus
N + 2 periods; a gateway 2 h ahead replayed none (its sensors re-warmed for N periods) and one
2 h behind replayed 2 h more than the windows hold. Now the start is the server's time minus
N + 2 periods, whatever the gateway's clock says.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from devkit.nats_servers import NatsServer
from tesla_gateway.cluster.engine import Engine, connect
from tesla_gateway.cluster.member import ClusterMember
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.ingest.rejects import RejectCounter
from tests.cluster.owners import StoreOwner, member_config, stats_of, until

pytest.importorskip("nats")

_GEOMETRY = WindowGeometry(2, 1, ("pm10",), GapPolicy(max_interpolated_periods=1))
_SPAN_S = (2 + 2) * 1  # the fallback replay: (N + 2) periods of 1 s
_SENSORS = ("c0", "c1", "c2")


class _ShortOwner(StoreOwner):
    """Windows of 2 periods of 1 s, so N + 2 periods pass within the test."""

    def __init__(self) -> None:
        super().__init__(_GEOMETRY)


async def _feed(engine: Engine, rounds: int) -> int:
    for index in range(rounds):
        for sensor in _SENSORS:
            payload = json.dumps({"ts": time.time(), "pm10": float(index)}).encode()
            await engine.js.publish(engine.subjects.reading(sensor), payload)
    return rounds * len(_SENSORS)


@pytest.mark.parametrize("offset_s", [7200.0, -7200.0], ids=["2h-ahead", "2h-behind"])
def test_a_cold_takeover_replays_the_last_periods_by_the_servers_clock(
    nats_server: NatsServer, offset_s: float
) -> None:
    config = member_config(nats_server.url)

    async def run() -> None:
        engine = await connect(config, "feeder")
        try:
            await _feed(engine, 2)  # older than the span when the member starts
            await asyncio.sleep(_SPAN_S + 2.0)
            recent = await _feed(engine, 4)
            owner = _ShortOwner()
            member = ClusterMember(
                config,
                gateway_id="skewed",
                ticker=owner,
                tick_lock=asyncio.Lock(),
                ingest=owner.ingest,
                on_dropped=lambda sensors: None,
                rejects=RejectCounter(),
                clock=lambda: time.time() + offset_s,
            )
            task = asyncio.create_task(member.run())
            try:
                await until(
                    task,
                    lambda: stats_of(member)["partitions"].get("0", {}).get("ready"),
                    "partition 0 taken",
                )
                stats = stats_of(member)
                assert stats["cold_takeovers"] == 1
                assert stats["replayed"] == recent  # the span's readings, not 0 nor all
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        finally:
            await engine.close()

    asyncio.run(run())
