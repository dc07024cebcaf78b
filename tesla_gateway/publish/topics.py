"""The topic scheme under one prefix (docs/mqtt.md); every topic the gateway publishes on."""

from __future__ import annotations

from typing import Literal

from tesla_gateway.contract.readings import SENSOR_ID_PATTERN
from tesla_gateway.publish.errors import PublisherError

__all__ = ["DocumentKind", "TopicScheme"]

DocumentKind = Literal["health", "drift"]


class TopicScheme:
    """``<prefix>/status``, ``/stats``, ``/<sensor>/<feature>[/health|/drift]``,
    ``/<sensor>/availability``, ``/_batch/<feature>``; ids are checked, so a topic never holds
    a wildcard or a level."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    @property
    def status(self) -> str:
        return f"{self.prefix}/status"

    @property
    def stats(self) -> str:
        return f"{self.prefix}/stats"

    def state(self, sensor_id: str, feature: str) -> str:
        """``<prefix>/<sensor>/<feature>``: a calibrated reading (ids checked by the caller)."""
        return f"{self.prefix}/{sensor_id}/{feature}"

    def check_ids(self, sensor_id: str, feature: str) -> None:
        if not SENSOR_ID_PATTERN.fullmatch(sensor_id) or not SENSOR_ID_PATTERN.fullmatch(feature):
            raise PublisherError(f"sensor {sensor_id!r} / feature {feature!r} cannot be a topic")

    def sensor(self, sensor_id: str, feature: str, kind: DocumentKind) -> str:
        """``<prefix>/<sensor>/<feature>/health`` or ``.../drift``."""
        self.check_ids(sensor_id, feature)
        return f"{self.state(sensor_id, feature)}/{kind}"

    def availability(self, sensor_id: str) -> str:
        """``<prefix>/<sensor>/availability``: ``online`` while it reports, else ``offline``.

        A sensor level, not a feature: ``availability`` is never a feature name."""
        return f"{self.prefix}/{sensor_id}/availability"

    def batch(self, feature: str) -> str:
        """``<prefix>/_batch/<feature>``: a sensor id cannot start with '_', so no clash."""
        return f"{self.prefix}/_batch/{feature}"
