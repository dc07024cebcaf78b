"""What the member keeps per partition it holds, its counters, and how a partition's task ends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tesla_gateway.cluster.cancels import cancel
from tesla_gateway.cluster.puller import PartitionPuller
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.state import WindowState
from tesla_gateway.windows.store import WindowStore

__all__ = ["Counters", "Owned", "WindowOwner", "stop_pulling"]

_STOP_WAIT_S = 5.0  # a stopped puller's last pull ends by then (its expiry + 2 s), else cancelled


class WindowOwner(Protocol):
    """What the member needs of the daemon's ticker (the one owner of the windows)."""

    store: WindowStore

    def snapshot(self) -> list[tuple[str, WindowState]]: ...

    def install(self, slot: str, windows: ModelWindows) -> None: ...

    def remove_sensors(self, sensor_ids: Iterable[str]) -> int: ...

    def last_seen(self) -> dict[str, float]: ...


@dataclass(slots=True)
class Owned:
    """A partition this gateway holds: the last stream sequence in its windows, its sensors."""

    covered: int = 0
    sensors: set[str] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    acquired_at: float = 0.0  # Unix s
    ready: bool = False  # replay done, pulling
    puller: PartitionPuller | None = None
    releasing: bool = False  # being given back: its puller's end is no loss
    pinned_elsewhere: bool = False  # a 423: the pin is another gateway's, not to be unpinned


@dataclass(slots=True)
class Counters:
    """What the member did, for the status file and the stats topic."""

    acquired: int = 0
    warm: int = 0
    cold: int = 0
    lost: int = 0
    released: int = 0
    replayed: int = 0
    snapshots: int = 0
    corrupt_snapshots: int = 0  # unreadable ones found in the bucket (deleted, started cold)
    mismatched_snapshots: int = 0  # of another model window: not loaded, started cold
    last_takeover_s: float = 0.0
    errors: int = 0


async def stop_pulling(owned: Owned, *, lost: bool = False) -> None:
    """End a partition's task: a pulling one once its last pull has ended at the server (an
    orphan could take the next owner's pin), refusing what it brings if lost; else at once."""
    owned.releasing = not lost
    if owned.puller is not None and owned.task is not None:
        owned.puller.stop(refuse=lost)
        if lost:
            return
        await asyncio.wait({owned.task}, timeout=_STOP_WAIT_S)
    await cancel(owned.task)  # loading or replaying, or a pull the server never ended
