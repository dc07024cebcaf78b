"""The topic scheme under one prefix (docs/mqtt.md); every topic the gateway publishes on."""

from __future__ import annotations

from typing import Literal

from tesla_gateway.contract.readings import SENSOR_ID_PATTERN
from tesla_gateway.publish.errors import PublisherError

__all__ = ["OWN_PREFIX_PROBLEM", "DocumentKind", "TopicScheme", "shares_levels"]

OWN_PREFIX_PROBLEM = (
    "[publisher] topic_prefix {0!r} is or lies under the cluster's calibrated_topic_prefix "
    "{1!r}: each gateway's status and stats need a prefix of their own (omit topic_prefix for "
    "'tesla/<gateway_id>')"
)

DocumentKind = Literal["health", "drift"]


class TopicScheme:
    """``<prefix>/status``, ``/stats``, ``/<sensor>/<feature>[/health|/drift]``,
    ``/<sensor>/availability``, ``/_batch/<feature>``; ids are checked, so a topic never holds
    a wildcard or a level.

    ``own_prefix`` (cluster mode) takes the gateway's own topics, ``status`` (its last will) and
    ``stats``, out of a prefix the sensors' topics share with other gateways: each gateway
    keeps its own, and one gateway's will never speaks for another."""

    def __init__(self, prefix: str, *, own_prefix: str | None = None) -> None:
        self.prefix = prefix
        self.own_prefix = own_prefix or prefix

    @property
    def status(self) -> str:
        return f"{self.own_prefix}/status"

    @property
    def stats(self) -> str:
        return f"{self.own_prefix}/stats"

    def state(self, sensor_id: str, feature: str) -> str:
        """``<prefix>/<sensor>/<feature>``: a calibrated reading (ids checked by the caller)."""
        return f"{self.prefix}/{sensor_id}/{feature}"

    def check_ids(self, sensor_id: str, feature: str) -> None:
        if not SENSOR_ID_PATTERN.fullmatch(sensor_id) or not SENSOR_ID_PATTERN.fullmatch(feature):
            raise PublisherError(
                f"sensor {sensor_id[:80]!r} / feature {feature[:40]!r} cannot be a topic"
            )

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


def shares_levels(own_prefix: str, shared_prefix: str) -> bool:
    """A gateway's own prefix that is, or lies under, the sensors' shared prefix (cluster mode):
    its status would be a sensor's topic or another gateway's."""
    return own_prefix == shared_prefix or own_prefix.startswith(shared_prefix + "/")
