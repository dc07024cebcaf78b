"""The publish package's error types, one per cause, under the gateway's root."""

from __future__ import annotations

from tesla_gateway.errors import GatewayError

__all__ = ["OutboxError", "PublisherError"]


class PublisherError(GatewayError):
    """Something cannot be queued: a reading or document without a valid topic (a bug
    upstream), or a publisher already closed."""


class OutboxError(GatewayError):
    """The outbox database cannot be opened or written (disk full, permissions)."""
