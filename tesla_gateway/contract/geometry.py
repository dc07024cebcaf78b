"""The contract between a model and its windows: N, the period, the channels, the gap rule.

The calibrator reads it from the manifest; the window store, the state files and the ticker
shape their windows by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tesla_gateway.contract.manifest import Manifest
from tesla_gateway.contract.series import GapPolicy
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

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> WindowGeometry:
        return cls(
            window_length=manifest.window_length,
            period_seconds=manifest.period_seconds,
            channels=manifest.channel_names,
            gap_policy=manifest.gap_policy,
        )
