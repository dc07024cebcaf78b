"""The contract between a model and its windows: N, the period, the channels, the gap rule.

Channels are read from readings, except the hour of the day
(:mod:`tesla_gateway.contract.time_of_day`), which the windows derive from each period's start.

The calibrator reads it from the manifest; the window store, the state files and the ticker
shape their windows by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tesla_gateway.contract.manifest import Manifest
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.contract.time_of_day import HOUR_CHANNELS, is_hour_channel
from tesla_gateway.errors import GatewayError

__all__ = ["WindowGeometry", "WindowGeometryError"]


class WindowGeometryError(GatewayError):
    """A window geometry no window can have (N, the period or the channels empty)."""


@dataclass(frozen=True, slots=True)
class WindowGeometry:
    """What a model needs from its windows: N, the period, the channels and the gap rule."""

    window_length: int
    period_seconds: int
    channels: tuple[str, ...]
    gap_policy: GapPolicy

    def __post_init__(self) -> None:
        if self.window_length < 1 or self.period_seconds < 1 or not self.channels:
            raise WindowGeometryError(f"invalid window geometry {self}")
        if is_hour_channel(self.channels[0]):
            raise WindowGeometryError(f"the first channel must be a reading, got {self.channels}")
        hours = [name for name in self.channels if is_hour_channel(name)]
        if hours and sorted(hours) != sorted(HOUR_CHANNELS):
            raise WindowGeometryError(
                f"a model reads both hour channels {HOUR_CHANNELS} or neither, got {self.channels}"
            )

    @property
    def read_channels(self) -> tuple[str, ...]:
        """The channels readings bring, in the model's order (the hour channels are derived)."""
        return tuple(name for name in self.channels if not is_hour_channel(name))

    @property
    def hour_positions(self) -> tuple[int, int] | None:
        """Where ``hour_sin`` and ``hour_cos`` sit in the model's input, if it reads the hour."""
        if HOUR_CHANNELS[0] not in self.channels:
            return None
        return self.channels.index(HOUR_CHANNELS[0]), self.channels.index(HOUR_CHANNELS[1])

    def same_ring(self, other: WindowGeometry) -> bool:
        """Whether windows of ``other`` store exactly what these do (they differ at most in
        the derived hour channels), so a model change between them keeps every window."""
        return (
            self.window_length == other.window_length
            and self.period_seconds == other.period_seconds
            and self.read_channels == other.read_channels
            and self.gap_policy == other.gap_policy
        )

    @property
    def read_positions(self) -> tuple[int, ...]:
        """Where each of :attr:`read_channels` sits in the model's input."""
        return tuple(i for i, name in enumerate(self.channels) if not is_hour_channel(name))

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> WindowGeometry:
        return cls(
            window_length=manifest.window_length,
            period_seconds=manifest.period_seconds,
            channels=manifest.channel_names,
            gap_policy=manifest.gap_policy,
        )
