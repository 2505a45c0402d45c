"""Logging: structlog JSON lines in the run folder, and a readable console on stderr."""

from __future__ import annotations

import logging
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

_SHARED = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
]


def _timestamp_with_offset(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """The log file's time: local, with its UTC offset, so a night read elsewhere still says when."""
    event["timestamp"] = datetime.now().astimezone().isoformat(timespec="milliseconds")
    return event


def _no_traceback(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """Tracebacks go to the log file; the console shows them only with --debug."""
    event.pop("exc_info", None)
    event.pop("exception", None)
    return event


def _console_fields(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """The console's time: HH:MM:SS; the logger's name is for the file."""
    event.pop("logger", None)
    event["timestamp"] = datetime.now().strftime("%H:%M:%S")
    return event


def _product_debug_only(record: logging.LogRecord) -> bool:
    """The file keeps the product's debug lines, and the libraries' from INFO up: at DEBUG they wrote a pair of
    lines for every lock taken (filelock: most of a tune's log) and three for every process that imported pydot."""
    return record.levelno >= logging.INFO or record.name == "trainer" or record.name.startswith("trainer.")


def configure(log_file: Path | None = None, verbose: bool = False) -> None:
    """(Re)configure logging; call again with the run folder's log file once it exists."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_pvbess", False):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(logging.DEBUG)
    # A full disk or a closed stream must not turn a log line into a crash ("--- Logging error ---").
    logging.raiseExceptions = False

    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.DEBUG if verbose else logging.INFO)
    console.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, _console_fields,
                    *([] if verbose else [_no_traceback]),
                    structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty(), pad_event=24)],
    ))
    console._pvbess = True  # type: ignore[attr-defined]
    root.addHandler(console)

    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(log_file, encoding="utf-8")
        file_handler.setLevel(logging.DEBUG)
        file_handler.setFormatter(structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, _timestamp_with_offset,
                        structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        ))
        file_handler.addFilter(_product_debug_only)
        file_handler._pvbess = True  # type: ignore[attr-defined]
        root.addHandler(file_handler)

    # Third-party chatter (CityLearn logs a warning per environment) stays out of the console.
    for noisy in ("citylearn", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.ERROR)

    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def get(name: str = "trainer"):
    return structlog.get_logger(name)
