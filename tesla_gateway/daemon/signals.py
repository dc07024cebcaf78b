"""The daemon's signals: SIGTERM and SIGINT take the one shutdown path, SIGHUP asks for a reload.

Handlers go through ``loop.add_signal_handler``, so they run on the loop between tasks and only
set events; they are removed when the run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

__all__ = ["signal_handlers"]

_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def signal_handlers(
    loop: asyncio.AbstractEventLoop,
    *,
    stop: Callable[[str], None],
    reload: Callable[[], None],
) -> Iterator[None]:
    """Route SIGTERM and SIGINT to ``stop`` (with the signal's name), SIGHUP to ``reload``."""
    try:
        loop.add_signal_handler(signal.SIGTERM, stop, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, stop, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, reload)
        yield
    finally:
        for signum in _HANDLED:
            loop.remove_signal_handler(signum)
