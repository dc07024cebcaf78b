"""One exception root for the gateway and its contract, with subclasses by cause.

Callers catch ``GatewayError`` to handle anything the gateway raises on purpose; each subclass
names what went wrong so the operator knows which part to fix.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "GatewayError",
    "ManifestError",
    "ModelIntegrityError",
    "ModelLoadError",
    "SeriesError",
]


class GatewayError(Exception):
    """Root of every error the gateway raises deliberately."""


class ConfigError(GatewayError):
    """The configuration file or environment is invalid; the message names the key."""


class ManifestError(GatewayError):
    """A model directory's manifest is missing, unreadable or does not match the schema."""


class ModelIntegrityError(GatewayError):
    """A model file is missing or its sha256 differs from the manifest (corrupt or tampered)."""


class ModelLoadError(GatewayError):
    """A model file could not be loaded or failed its test invoke."""


class SeriesError(GatewayError):
    """Input to the time-grid or gap-policy functions violates their preconditions."""
