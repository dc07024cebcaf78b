"""``with`` for the harnesses that start and stop a child process (the broker, the daemon)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any, Self

__all__ = ["StartStop"]


class StartStop(ABC):
    """``with`` starts (unless started already) and always stops, whatever happened inside."""

    @abstractmethod
    def start(self) -> Any:
        """Start; a no-op when already running."""

    @abstractmethod
    def stop(self) -> Any:
        """Stop; a no-op when not running."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
