"""The OTA path's exceptions: one root, subclasses by cause, each with a reason code for status.

A rejected release must reach the operator, so every :class:`ReleaseRejectedError` carries a
short ``reason`` (published in the per-node and per-gateway status) and a message that says what
to do about it.
"""

from __future__ import annotations

from typing import ClassVar

from tesla_gateway.errors import GatewayError

__all__ = [
    "BadSignatureError",
    "DowngradeError",
    "GoldenMismatchError",
    "ImplausibleReleaseError",
    "IncompatibleReleaseError",
    "MalformedReleaseError",
    "OtaError",
    "OtaFrameError",
    "ReleaseInstallError",
    "ReleaseRejectedError",
    "ShaMismatchError",
    "SizeMismatchError",
    "UnknownKeyError",
    "UnloadableReleaseError",
    "WrongTargetError",
]


class OtaError(GatewayError):
    """Root of everything the OTA path raises deliberately."""


class ReleaseRejectedError(OtaError):
    """A release that must not be installed; ``reason`` is the short code shown in status."""

    reason: ClassVar[str] = "rejected"


class MalformedReleaseError(ReleaseRejectedError):
    """release.json or a bundled file is missing, unreadable or not in the release format."""

    reason = "malformed"


class UnknownKeyError(ReleaseRejectedError):
    """The release names a signing key other than the one this device trusts."""

    reason = "unknown key"


class BadSignatureError(ReleaseRejectedError):
    """The signature does not verify: the metadata was altered or signed with another key."""

    reason = "bad signature"


class ShaMismatchError(ReleaseRejectedError):
    """A file's sha256 differs from the signed metadata (corrupt or tampered)."""

    reason = "sha256 mismatch"


class SizeMismatchError(ReleaseRejectedError):
    """A file's size differs from the signed metadata (truncated or padded)."""

    reason = "size mismatch"


class DowngradeError(ReleaseRejectedError):
    """The release is not newer than the running model and downgrades were not allowed."""

    reason = "downgrade"


class WrongTargetError(ReleaseRejectedError):
    """A node release offered to a gateway, or the other way round."""

    reason = "wrong target"


class IncompatibleReleaseError(ReleaseRejectedError):
    """A valid release for a model this device does not serve (other feature or geometry)."""

    reason = "incompatible"


class UnloadableReleaseError(ReleaseRejectedError):
    """A signed release whose model the Calibrator refuses (graph does not fit its manifest,
    test invoke fails): it is never made current."""

    reason = "unloadable"


class GoldenMismatchError(ReleaseRejectedError):
    """The staged model does not reproduce the golden windows signed into its release."""

    reason = "golden mismatch"


class ImplausibleReleaseError(ReleaseRejectedError):
    """The staged model's outputs on its reference windows are no concentration (below zero
    beyond their interval, or far above the training range): signed, loadable, and wrong."""

    reason = "implausible"


class ReleaseInstallError(OtaError):
    """A verified release could not be written into the model directory (disk, permissions)."""


class OtaFrameError(OtaError):
    """An ``O`` line does not follow docs/ota-protocol.md; ``code`` is the status to answer."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
