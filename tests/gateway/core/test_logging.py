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
