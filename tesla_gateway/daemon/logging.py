"""structlog, configured once at start: JSON lines in production, readable on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

__all__ = ["LogFormat", "LogLevel", "configure_logging"]

LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]


def configure_logging(
    log_format: LogFormat = "auto", level: LogLevel = "info", stream: TextIO | None = None
) -> None:
    """Route structlog (and the stdlib loggers of libraries) to ``stream`` (stderr).

    ``auto`` picks console output on a TTY and JSON otherwise (systemd's journal, files). A
    library's stdlib record is rendered by the same processors, so in JSON mode it is one JSON
    line too (a traceback becomes its ``exception`` field), never raw text in the journal.
    """
    out = stream if stream is not None else sys.stderr
    use_console = log_format == "console" or (log_format == "auto" and out.isatty())
    numeric = logging.getLevelNamesMapping()[level.upper()]
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor
    if use_console:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    else:
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))
