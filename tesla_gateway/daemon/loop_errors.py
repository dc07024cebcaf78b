"""The event loop's exception handler: running out of file descriptors is a warning, not a flood.

When the process reaches its descriptor limit, asyncio's accept loop reports every failed
``accept()`` ("socket.accept() out of system resource") with a traceback, retrying each second
for each listening socket: a hundred thousand lines that are not JSON, while nothing is wrong
but the limit. Those reports (EMFILE, ENFILE, ENOBUFS, ENOMEM: the errors asyncio itself treats
as a resource shortage) become one ``fd_shortage`` warning per interval, with how many were
folded into it and how close the process is to its limit. Every other report goes to asyncio's
default handler (the ``asyncio`` logger, rendered as JSON by tesla_gateway/daemon/logging.py).
"""

from __future__ import annotations

import asyncio
import errno
import resource
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import structlog

__all__ = ["LoopErrorReporter", "reporting_loop_errors"]

_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_WARN_INTERVAL_S = 60.0
_FD_DIR = Path("/proc/self/fd")

_T = TypeVar("_T")


class LoopErrorReporter:
    """A ``loop.set_exception_handler`` target: shortages counted, logged once per interval."""

    def __init__(
        self,
        *,
        interval_s: float = _WARN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._log = structlog.get_logger(__name__)
        self.shortages = 0
        self._unreported = 0
        self._next_warning_at: float | None = None

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _SHORTAGE:
            self._shortage(exc, str(context.get("message", "")))
        else:
            loop.default_exception_handler(context)

    def _shortage(self, exc: OSError, message: str) -> None:
        self.shortages += 1
        self._unreported += 1
        now = self._clock()
        if self._next_warning_at is not None and now < self._next_warning_at:
            return
        self._next_warning_at = now + self._interval_s
        soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self._log.warning(
            "fd_shortage",
            what=message,
            error=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
            occurrences=self._unreported,
            total=self.shortages,
            open_fds=_open_fds(),
            fd_limit=soft_limit,
            next_report_in_s=self._interval_s,
        )
        self._unreported = 0


def _open_fds() -> int | None:
    """Descriptors open now, or None when even listing them needs one more than is left."""
    try:
        return sum(1 for _ in _FD_DIR.iterdir())
    except OSError:
        return None


async def reporting_loop_errors(main: Coroutine[Any, Any, _T]) -> _T:
    """Await ``main`` with a :class:`LoopErrorReporter` on the running loop (``asyncio.run``)."""
    asyncio.get_running_loop().set_exception_handler(LoopErrorReporter())
    return await main
