"""Ctrl+C and `docker stop`: the first SIGINT/SIGTERM asks the stage to save and stop;
a second SIGINT aborts at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from trainer import logs


class StopRequest:
    """Set by the signal handler, read by the training loop at its next step."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGINT)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "SIGINT"


STOP = StopRequest()


def _handler(signum, frame) -> None:
    if STOP.requested:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl+C: abort now
        return
    STOP.signum = signum
    logs.get().warning("stop requested", signal=signal.Signals(signum).name,
                       action="saving a checkpoint, then stopping (Ctrl+C again aborts at once)")


@contextmanager
def handle_stop_signals() -> Iterator[StopRequest]:
    """Install the handlers for the duration of a run (main thread only)."""
    STOP.signum = None
    if threading.current_thread() is not threading.main_thread():
        yield STOP
        return
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield STOP
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
