"""structlog set-up: JSON lines off a terminal, constant event names with key-value context."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from tesla_gateway.daemon.logging import configure_logging


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_when_not_a_terminal() -> None:
    stream = io.StringIO()
    configure_logging("auto", "info", stream=stream)
    log = structlog.get_logger("test")
    log.info("model_loaded", feature="pm10", version=2)
    log.debug("hidden_below_level")
    [line] = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["event"] == "model_loaded"
    assert (record["feature"], record["version"], record["level"]) == ("pm10", 2, "info")
    assert record["timestamp"].endswith("Z")


def test_console_format_is_readable() -> None:
    stream = io.StringIO()
    configure_logging("console", "debug", stream=stream)
    structlog.get_logger("test").debug("tick_done", published=3)
    text = stream.getvalue()
    assert "tick_done" in text and "published=3" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_a_library_record_is_one_json_line_with_its_traceback() -> None:
    """asyncio's and aiohttp's stdlib records reach the journal as JSON too (issue 26 item 12)."""
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        logging.getLogger("asyncio").exception("socket.accept() out of system resource")
    logging.getLogger("aiohttp.server").warning("%d connections", 3)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (first["event"], first["level"], first["logger"]) == (
        "socket.accept() out of system resource",
        "error",
        "asyncio",
    )
    assert first["exception"].startswith("Traceback (most recent call last):")
    assert "Too many open files" in first["exception"]
    assert (second["event"], second["level"], second["logger"]) == (
        "3 connections",
        "warning",
        "aiohttp.server",
    )
