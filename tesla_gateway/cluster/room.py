"""Whether this gateway's windows can hold a partition it is about to take (``[sensors]
max_sensors``, the memory bound), and what it does when they cannot: it does not take it.

A survivor of a failover that took every partition went past its cap: the snapshot's windows
were installed whatever their number, then the readings of the sensors admission had no room
for were acknowledged and rejected (gone). Refusing the partition before its first pull keeps
them in the stream instead, unacknowledged, for a gateway with room (a restarted one, a new
one) to take it warm from the last owner's snapshot and replay what came since: nothing
accepted is lost within ``retention_s``. A NAK per reading would keep them too, but a partition
whose pending NAKs reach the consumer's ``max_ack_pending`` stalls for every sensor in it, and a
flood of new ids would do that on purpose. A refused partition is not asked for again before
a back-off, and the warning (naming ``max_sensors``) is said at most once a minute. A new
sensor id appearing in a partition already held, once the cap is reached, is refused and
counted as on one gateway (``unknown_sensor``): that is the flood defence the cap exists for.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

__all__ = ["NoRoomError", "Room"]

_log = structlog.get_logger(__name__)
_BACKOFF_S = 60.0  # a refused partition is not asked for again before this
_LOG_EVERY_S = 60.0


class NoRoomError(Exception):
    """The partition's sensors do not fit in this gateway's windows: give it back untouched."""


class Room:
    """The partitions this gateway refused for want of room, and the rate of saying so."""

    def __init__(
        self, max_sensors: int | None, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_sensors = max_sensors
        self._monotonic = monotonic
        self._until: dict[int, float] = {}  # partition -> when it may be asked for again
        self._logged_at = -float("inf")
        self._suppressed = 0
        self.refused = 0

    def check(self, partition: int, held: int, incoming: int) -> None:
        """:class:`NoRoomError` when ``incoming`` sensors (a snapshot's; 0 for a cold start,
        refused only by a gateway already full) do not fit beside the ``held`` ones."""
        cap = self.max_sensors
        if cap is None or (held + incoming <= cap if incoming else held < cap):
            return
        self.refused += 1
        now = self._monotonic()
        self._until[partition] = now + _BACKOFF_S
        if now - self._logged_at < _LOG_EVERY_S:
            self._suppressed += 1
        else:
            _log.warning(
                "cluster_partition_refused_full",
                partition=partition,
                sensors_held=held,
                sensors_in_partition=incoming,
                max_sensors=cap,
                suppressed=self._suppressed,
                action=(
                    "not taken: its readings wait in the stream for a gateway with room; "
                    "raise [sensors] max_sensors or add a gateway"
                ),
            )
            self._logged_at, self._suppressed = now, 0
        raise NoRoomError(f"partition {partition}: {held} + {incoming} sensors > {cap}")

    def waiting(self, partition: int) -> bool:
        """Refused lately: not asked for again yet."""
        until = self._until.get(partition)
        if until is None:
            return False
        if self._monotonic() >= until:
            del self._until[partition]
            return False
        return True
