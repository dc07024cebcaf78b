"""Why cluster mode cannot run: the server, the streams or the bucket said no."""

from __future__ import annotations

from tesla_gateway.errors import GatewayError

__all__ = [
    "ClusterAuthError",
    "ClusterError",
    "ClusterRefusedError",
    "DuplicateGatewayError",
    "PartitionsMismatchError",
    "ServerTooOldError",
    "SettingsMismatchError",
]


class ClusterError(GatewayError):
    """A JetStream request of cluster mode failed; the message says which and why."""


class ClusterRefusedError(GatewayError):
    """Cluster mode cannot run as configured: asking again will not help (never transient)."""


class ClusterAuthError(ClusterRefusedError):
    """The NATS servers refused the gateway's user or password (``[cluster] user``)."""


class ServerTooOldError(ClusterRefusedError):
    """The NATS server predates JetStream API level 1 (2.11): no pinned consumers, no key TTL."""


class PartitionsMismatchError(ClusterRefusedError):
    """The readings stream on the servers has another partition count than ``[cluster]``."""


class DuplicateGatewayError(ClusterRefusedError):
    """Another live gateway of the cluster has this gateway's id."""


class SettingsMismatchError(ClusterRefusedError):
    """This gateway's settings differ from those the cluster runs with (its streams, consumers
    or recorded ``config``): joining would lose periods, so it refuses to start."""
