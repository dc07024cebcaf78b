"""Over-the-air model updates: signed releases, their verification, and the node relay.

The contract is docs/ota-protocol.md and the release format in :mod:`tesla_gateway.ota.release`.
"""

from tesla_gateway.ota.errors import OtaError, ReleaseRejectedError
from tesla_gateway.ota.release import VerifiedRelease, verify_release

__all__ = ["OtaError", "ReleaseRejectedError", "VerifiedRelease", "verify_release"]
