"""Logging: structlog JSON lines in the run folder, and a readable console on stderr."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import structlog

_SHARED = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=False),
]


def configure(log_file: Path | None = None, verbose: bool = False) -> None:
    """(Re)configure logging; call again with the run folder's log file once it exists."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_pvbess", False):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(logging.DEBUG)

    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.DEBUG if verbose else logging.INFO)
    console.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty(), pad_event=28)],
    ))
    console._pvbess = True  # type: ignore[attr-defined]
    root.addHandler(console)

    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(log_file, encoding="utf-8")
        file_handler.setLevel(logging.DEBUG)
        file_handler.setFormatter(structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                        structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        ))
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
