"""A failover past ``[sensors] max_sensors``, against a real nats-server (issue 29, round 2:
capacity_failover.py and big_partition.py:
an attacker's reproduction scripts, not shipped).

Before: the survivor took every partition, installed their windows whatever their number, then
acknowledged and rejected (``unknown_sensor``) the readings of the sensors admission had no room
for: gone, also once a gateway with room came back; and the status counted every id decoded
(100,008) where the windows held 10,000. The windows' owner is a real :class:`WindowStore`
behind the methods the daemon's ticker lends the member, fed through the daemon's real
:class:`SensorAdmission` (no models).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest

from devkit.nats_servers import NatsServer
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.engine import Engine, connect
from tesla_gateway.cluster.member import ClusterMember
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.ingest.admission import SensorAdmission
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.ingest.sensor_policy import SensorPolicy
from tests.cluster.owners import StoreOwner

_GEOMETRY = WindowGeometry(4, 60, ("pm10",), GapPolicy(max_interpolated_periods=2))
_WAIT_S = 30.0  # an upper bound on slow CI, never a timing assertion


class _Gateway(StoreOwner):
    """A member over a real window store behind the daemon's admission (``max_sensors``)."""

    def __init__(self, config: ClusterConfig, gateway_id: str, max_sensors: int) -> None:
        super().__init__(_GEOMETRY)
        self.admission = SensorAdmission(
            SensorPolicy(max_sensors=max_sensors), self, RejectCounter()
        )
        self.ingested: Counter[str] = Counter()
        self.member = ClusterMember(
            config,
            gateway_id=gateway_id,
            ticker=self,
            tick_lock=asyncio.Lock(),
            ingest=self.ingest,
            on_dropped=self.admission.forget,
            rejects=RejectCounter(),
            max_sensors=max_sensors,
        )
        self.task: asyncio.Task[None] | None = None

    def ingest(self, reading: Reading) -> bool:  # the daemon's _ingest, without models
        if not self.admission.admit(reading):
            return False
        self.store.add(reading, arrival=time.time())
        self.ingested[reading.sensor_id] += 1
        return True

    def windows(self) -> set[str]:
        return {s for _, windows in self.store.items() for s in windows.sensor_ids}

    def start(self) -> None:
        self.task = asyncio.create_task(self.member.run())

    def stats(self) -> dict[str, Any]:
        return self.member.stats()

    async def until(self, condition: Any, what: str) -> None:
        assert self.task is not None
        deadline = time.monotonic() + _WAIT_S
        while not condition():
            if self.task.done():
                self.task.result()
                raise AssertionError(f"{self.member.gateway_id} stopped before {what}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.stats()}"
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def _config(url: str) -> ClusterConfig:
    return ClusterConfig(
        servers=[url], partitions=2, replicas=1, pin_ttl_s=1.0, snapshot_interval_s=3600.0
    )


_START = (time.time() // 60 - 30) * 60  # half an hour ago: readings nobody calls future


async def _publish(engine: Engine, sensors: Iterable[str], minute: int) -> None:
    for sensor in sensors:
        document = {"ts": _START + minute * 60 + 5, "pm10": 10.0 + minute}
        await engine.js.publish(f"sensors.{sensor}.raw", json.dumps(document).encode())


async def _partition_of(engine: Engine, sensors: list[str]) -> dict[str, int]:
    """Where the stream's partition transform puts each sensor (the server's hash of the id),
    read off a scratch stream of the same transform, so the readings stream stays empty."""
    await engine.request(
        "$JS.API.STREAM.CREATE.PROBE",
        {
            "name": "PROBE",
            "subjects": ["probe.*.raw"],
            "subject_transform": {
                "src": "probe.*.raw",
                "dest": "probe.part.{{partition(2,1)}}.{{wildcard(1)}}",
            },
            "storage": "memory",
        },
    )
    for sensor in sensors:
        await engine.js.publish(f"probe.{sensor}.raw", b"{}")
    info = await engine.js.stream_info("PROBE", subjects_filter="probe.part.>")
    found = {}
    for subject in info.state.subjects or {}:
        _, _, partition, sensor = subject.split(".")
        found[sensor] = int(partition)
    assert set(found) == set(sensors)
    return found


def test_a_survivor_does_not_take_what_it_cannot_hold_and_nothing_is_lost(
    nats_server: NatsServer,
) -> None:
    config = _config(nats_server.url)

    async def run() -> None:
        engine = await connect(config, "nodes")
        try:
            ids = [f"s{i:02d}" for i in range(16)]
            where = await _partition_of(engine, ids)
            chosen = [s for p in (0, 1) for s in [s for s in ids if where[s] == p][:3]]
            # g0 (room for 10) holds both partitions, 3 sensors each, and leaves with
            # their snapshots
            g0 = _Gateway(config, "g0", max_sensors=10)
            g0.start()
            await _publish(engine, chosen, 1)
            await g0.until(lambda: g0.windows() >= set(chosen), "g0 holding all six")
            await g0.stop()

            # the survivor has room for 4: it takes one partition and leaves the other
            g1 = _Gateway(config, "g1", max_sensors=4)
            g1.start()
            await g1.until(lambda: g1.stats()["refused_full"] >= 1, "a partition refused")
            await _publish(engine, chosen, 2)
            held = [int(p) for p in g1.stats()["partitions"]]
            assert len(held) == 1
            mine = {s for s in chosen if where[s] == held[0]}
            await g1.until(lambda: all(g1.ingested[s] >= 1 for s in mine), "g1's readings")
            assert len(g1.windows()) <= 4 and g1.admission.stats.rejected_full == 0
            assert g1.stats()["partitions"][str(held[0])]["sensors"] == 3

            # a gateway with room takes the other, warm, with what waited in the stream
            g2 = _Gateway(config, "g2", max_sensors=10)
            g2.start()
            other = set(chosen) - mine
            await g2.until(lambda: all(g2.ingested[s] >= 1 for s in other), "the waiting readings")
            assert g2.stats()["warm_takeovers"] == 1
            assert g2.windows() == other
            await g2.stop()
            await g1.stop()
        finally:
            await engine.close()

    asyncio.run(run())


def test_the_status_counts_the_sensors_the_windows_hold(nats_server: NatsServer) -> None:
    """big_partition.py: the ids admission refused (a flood past the cap) were counted too."""
    config = _config(nats_server.url)

    async def run() -> None:
        engine = await connect(config, "nodes")
        gateway = _Gateway(config, "g0", max_sensors=3)
        gateway.start()
        try:
            await gateway.until(lambda: len(gateway.stats()["partitions"]) == 2, "both owned")
            await _publish(engine, [f"f{i:03d}" for i in range(40)], 0)
            await gateway.until(
                lambda: gateway.member.traffic.decoded >= 40, "every reading decoded"
            )
            counted = sum(p["sensors"] for p in gateway.stats()["partitions"].values())
            assert counted == len(gateway.windows()) == 3
            assert gateway.admission.stats.rejected_full == 37  # refused and counted
        finally:
            await gateway.stop()
            await engine.close()

    asyncio.run(run())
