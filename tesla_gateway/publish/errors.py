"""The publisher's one error type."""

from __future__ import annotations

from tesla_gateway.errors import GatewayError

__all__ = ["PublisherError"]


class PublisherError(GatewayError):
    """Something cannot be queued: a reading or document without a valid topic (a bug
    upstream), or a publisher already closed."""
