"""Which readings a sensor's open period already holds, so a redelivered one is not averaged twice.

Per window row: the timestamps averaged into the open period, sorted (a duplicate is found by
bisection), and beside each the bit mask of the channels added at that time. A reading is a
duplicate only when every channel it brings was already added at its timestamp: a node that sends
PM and rh/temp in two messages stamped alike delivers one reading in two parts, and both parts
count. ``array('d')`` holds 60 timestamps in 600 bytes where a set of floats took 3.7 KB (37 MB
for 10,000 sensors at one reading per second and 60 s periods); the masks add a byte each.
"""

from __future__ import annotations

import bisect
from array import array

__all__ = ["ChannelValues", "SeenReadings", "all_channels", "channel_mask"]

_MASK_BITS = 8  # channels told apart (array 'B'); a ninth and later share the last bit
ChannelValues = list[tuple[int, float]]  # (channel index, value) of one reading


_LAST_BIT = 1 << (_MASK_BITS - 1)


def _bit(channel: int) -> int:
    return 1 << channel if channel < _MASK_BITS else _LAST_BIT


def channel_mask(present: ChannelValues) -> int:
    """The bit mask of the channels in ``present``."""
    mask = 0
    for channel, _ in present:
        mask |= 1 << channel if channel < _MASK_BITS else _LAST_BIT
    return mask


def all_channels(count: int) -> int:
    """The mask of channels ``0 .. count - 1``."""
    return (1 << min(count, _MASK_BITS)) - 1


class SeenReadings:
    """Per row, the open period's timestamps and the channels added at each."""

    def __init__(self, channels: int) -> None:
        self._channels = channels
        self._all = all_channels(channels)
        self._times: list[array[float]] = []
        self._masks: list[array[int]] = []

    def add_row(self) -> None:
        self._times.append(array("d"))
        self._masks.append(array("B"))

    def move_last_to(self, row: int) -> None:
        """Drop ``row``; the last row takes its place (as the ring's rows do)."""
        last = len(self._times) - 1
        if row != last:
            self._times[row] = self._times[last]
            self._masks[row] = self._masks[last]
        self._times.pop()
        self._masks.pop()

    def clear(self, row: int) -> None:
        """The row's period closed."""
        del self._times[row][:]
        del self._masks[row][:]

    def shift(self, row: int, seconds: float) -> None:
        """The row's timeline moved (the gateway clock stepped): its timestamps move along."""
        times = self._times[row]
        self._times[row] = array("d", [timestamp + seconds for timestamp in times])

    def unseen(self, row: int, timestamp: float, present: ChannelValues) -> ChannelValues:
        """The part of a reading not yet added at its timestamp (empty: a duplicate), now
        recorded as added. ``present`` names each channel at most once."""
        times = self._times[row]
        if not times or timestamp > times[-1]:  # the usual case: readings arrive in order
            times.append(timestamp)
            # A reading of every channel (``present`` names each once) needs no mask built.
            full = len(present) == self._channels
            self._masks[row].append(self._all if full else channel_mask(present))
            return present
        masks = self._masks[row]
        position = bisect.bisect_left(times, timestamp)
        if position < len(times) and times[position] == timestamp:
            added = masks[position]
            present = [item for item in present if not _bit(item[0]) & added]
            masks[position] = added | channel_mask(present)
            return present
        times.insert(position, timestamp)
        masks.insert(position, channel_mask(present))
        return present

    def export(self) -> list[list[float]]:
        """Every row's timestamps (a snapshot keeps these, not the masks)."""
        return [times.tolist() for times in self._times]

    def restore(self, row: int, timestamps: list[float]) -> None:
        """Restored timestamps count as having brought every channel (the masks are not saved)."""
        times = sorted(set(timestamps))
        self._times[row].extend(times)
        self._masks[row].extend([self._all] * len(times))
