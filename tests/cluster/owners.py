"""What an in-process cluster test needs around a ``ClusterMember``: its ticker (the part of the
daemon's ticker a member works with: snapshot, install, forget, last seen) over a real window
store, so the member's snapshots and takeovers run on the windows the daemon uses; a member
built on one, its config, and a wait that reports the member's own failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.member import ClusterMember
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.state import WindowState
from tesla_gateway.windows.store import WindowStore

# Windows of 4 one-minute periods: small enough to fill within a test.
GEOMETRY = WindowGeometry(4, 60, ("pm10",), GapPolicy(max_interpolated_periods=2))
WAIT_S = 30.0  # an upper bound on slow CI, never a timing assertion


class StoreOwner:
    """The ticker's side of a member, over one ``pm10`` slot of ``geometry``."""

    def __init__(self, geometry: WindowGeometry = GEOMETRY) -> None:
        self.store = WindowStore()
        self.store.ensure("pm10", geometry)

    def snapshot(self) -> list[tuple[str, WindowState]]:
        return [(slot, windows.export_state()) for slot, windows in self.store.items()]

    def install(self, slot: str, windows: ModelWindows) -> None:
        self.store.install(slot, windows)

    def remove_sensors(self, sensor_ids: Iterable[str]) -> int:
        return self.store.remove_sensors(sensor_ids)

    def last_seen(self) -> dict[str, float]:
        return self.store.last_seen()

    def ingest(self, reading: Reading) -> bool | None:
        """The daemon's ingest without models or admission: into the windows, as it arrives
        (None: no admission said no)."""
        self.store.add(reading, arrival=time.time())
        return None


def stats_of(member: Any) -> dict[str, Any]:
    """A member's (or its traffic's) stats document, typed for reading nested fields."""
    document: dict[str, Any] = member.stats()
    return document


def member_config(url: str, **overrides: Any) -> ClusterConfig:
    """One partition on one server, a 1 s pin TTL, snapshots only when a test says."""
    settings: dict[str, Any] = {
        "servers": [url],
        "partitions": 1,
        "replicas": 1,
        "pin_ttl_s": 1.0,
        "snapshot_interval_s": 3600.0,
    }
    return ClusterConfig(**(settings | overrides))


def make_member(
    config: ClusterConfig, gateway_id: str = "g0", geometry: WindowGeometry = GEOMETRY
) -> ClusterMember:
    owner = StoreOwner(geometry)
    return ClusterMember(
        config,
        gateway_id=gateway_id,
        ticker=owner,
        tick_lock=asyncio.Lock(),
        ingest=owner.ingest,
        on_dropped=lambda sensors: None,
        rejects=RejectCounter(),
    )


async def until(task: asyncio.Task[None], condition: Any, what: str) -> None:
    """Wait for ``condition()``; the member's task ending first is the failure it raised."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if task.done():
            task.result()
            raise AssertionError(f"the member stopped before {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
