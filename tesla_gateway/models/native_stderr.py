"""What native code writes to file descriptor 2, turned into structured log events.

LiteRT/TFLite print ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`` straight to fd 2
from C++ when an interpreter first allocates its tensors; in a daemon logging JSON lines that one
raw line breaks every consumer that parses the journal. Around such calls fd 2 is pointed at a
temporary file (``os.dup2``), then restored, and each captured line is logged as an event. A line
that is already a JSON object (our own log, written by another thread meanwhile) is passed
through unchanged, so nothing is lost or wrapped twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

import structlog

__all__ = ["native_stderr_logged"]

_log = structlog.get_logger(__name__)
_MAX_CAPTURE = 64 * 1024  # bytes re-emitted per capture; native code is not a log channel
_lock = threading.Lock()  # fd 2 is one per process: one capture at a time


@contextlib.contextmanager
def native_stderr_logged(during: str) -> Iterator[None]:
    """Capture fd 2 for the ``with`` block and log each line as ``native_stderr``."""
    with _lock:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no fd 2 at all (closed by whoever started us): nothing to protect
            yield
            return
        with tempfile.TemporaryFile() as capture:
            os.dup2(capture.fileno(), 2)
            try:
                yield
            finally:
                with contextlib.suppress(ValueError, OSError, AttributeError):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                capture.seek(0)
                text = capture.read(_MAX_CAPTURE).decode("utf-8", errors="replace")
    for line in text.splitlines():
        _emit(line, during)


def _emit(line: str, during: str) -> None:
    if not line.strip():
        return
    try:
        is_json_object = isinstance(json.loads(line), dict)
    except ValueError:
        is_json_object = False
    if is_json_object:
        print(line, file=sys.stderr, flush=True)
        return
    level, _, message = line.partition(": ")
    if not message or level not in ("INFO", "WARNING", "ERROR"):
        level, message = "WARNING", line
    log = {"INFO": _log.info, "WARNING": _log.warning, "ERROR": _log.error}[level]
    log("native_stderr", message=message[:500], during=during)
