"""The gateway's logging pointed at a file for the length of a demo, then put back.

A demo runs in the caller's process (tests call it so): left configured, structlog would keep
writing to the demo's log file after it is closed, and every later log line in the process
would raise ``ValueError: I/O operation on closed file``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TextIO

import structlog

from tesla_gateway.daemon.logging import configure_logging

__all__ = ["logging_to"]


@contextlib.contextmanager
def logging_to(stream: TextIO) -> Iterator[None]:
    """JSON log lines of warnings and above to ``stream`` inside the block; the process's
    structlog and root-logger set-up as before it afterwards."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, root_level = list(root.handlers), root.level
    configure_logging("json", "warning", stream=stream)
    # A logger first used inside the block must not keep this set-up for good (the daemon
    # caches each logger's first configuration; here that would outlive the block).
    structlog.configure(cache_logger_on_first_use=False)
    try:
        yield
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(root_level)
