"""Releases this gateway refused lately, each remembered for the topic it came on.

A release is retained on the broker, so it is delivered again at every reconnect; one already
refused is then skipped quietly (no second staging and load, no second log line or status).
The memory is keyed by the target of the topic (``gateway`` or ``node``) and the sha256 of the
payload, with the reason kept beside it: the same bytes are refused on one topic and right on
the other (a gateway release pushed to a node topic is refused as ``wrong target``, then
installs from the gateway topic), so a refusal on one target never silences the other.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

__all__ = ["RefusalMemory"]

DEFAULT_SIZE: Final = 64  # refused releases remembered, the least recently seen forgotten first


class RefusalMemory:
    """A bounded memory of (target, sha256) -> the reason the release was refused."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self._size = size
        self._refused: OrderedDict[tuple[str, bytes], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._refused)

    def recall(self, target: str, digest: bytes) -> str | None:
        """The reason these bytes were refused on this target, or None if they were not."""
        reason = self._refused.get((target, digest))
        if reason is not None:
            self._refused.move_to_end((target, digest))  # still being redelivered: keep it
        return reason

    def remember(self, target: str, digest: bytes, reason: str) -> None:
        self._refused[(target, digest)] = reason
        self._refused.move_to_end((target, digest))
        while len(self._refused) > self._size:
            self._refused.popitem(last=False)
