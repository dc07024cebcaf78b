"""Why cluster mode cannot run: the server, the streams or the bucket said no."""

from __future__ import annotations

from tesla_gateway.errors import GatewayError

__all__ = ["ClusterError", "ServerTooOldError"]


class ClusterError(GatewayError):
    """A JetStream request of cluster mode failed; the message says which and why."""


class ServerTooOldError(ClusterError):
    """The NATS server predates JetStream API level 1 (2.11): no pinned consumers, no key TTL."""
