"""A demo run in the test process leaves its logging behind it (devkit/log_capture.py)."""

from __future__ import annotations

import io
import logging

import structlog
import structlog.testing

from devkit.log_capture import logging_to


def test_loggers_used_inside_the_block_log_as_before_after_it() -> None:
    log = structlog.get_logger("tests.log_capture")
    handlers = list(logging.getLogger().handlers)
    stream = io.StringIO()
    with logging_to(stream):
        log.warning("inside", n=1)
        log.info("below_the_level")
    stream.close()  # as the demo's log file is closed when it ends
    assert logging.getLogger().handlers == handlers
    with structlog.testing.capture_logs() as logs:
        log.info("after", n=2)  # neither the closed file nor the block's level filter
    assert [(entry["event"], entry["log_level"]) for entry in logs] == [("after", "info")]
