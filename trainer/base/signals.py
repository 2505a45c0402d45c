"""Ctrl+C and `docker stop`: the first SIGINT/SIGTERM asks the stage to stop at its next safe
point (a training stage saves a checkpoint first); a second SIGINT aborts at once.

Training checks the request at every step; evaluation, calibration, the warm start and worker
start-up call :meth:`StopRequest.check` between steps, so a stop is honoured within seconds
wherever the night is.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from trainer.base import logs
from trainer.base.errors import TrainerError


class Stopped(TrainerError):
    """A stop signal outside training: nothing was being learned, so there is no checkpoint to save."""

    def __init__(self, signal_name: str, exit_code: int, where: str):
        self.exit_code = exit_code
        super().__init__(f"stopped by {signal_name} during {where} (nothing to checkpoint there)")


class StopRequest:
    """Set by the signal handler, read by the training loop at its next step and by :meth:`check`."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.training = False  # a checkpoint will be saved before stopping
        self.interrupting: str | None = None  # raise at once: a long wait with nothing to save (worker start-up)

    def check(self, where: str) -> None:
        """Raise :class:`Stopped` if a stop was requested. Inside training (a learning-curve evaluation)
        it does nothing: the training loop's guard saves a checkpoint and stops at the next step."""
        if self.requested and not self.training:
            raise Stopped(self.name, self.exit_code, where)

    @contextmanager
    def interruptible(self, where: str) -> Iterator[None]:
        """A stop signal raises :class:`Stopped` at once inside this block (it holds nothing to save)."""
        self.check(where)
        self.interrupting = where
        try:
            yield
        finally:
            self.interrupting = None

    @contextmanager
    def while_training(self) -> Iterator[None]:
        self.training = True
        try:
            yield
        finally:
            self.training = False

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
    if STOP.interrupting:
        raise Stopped(STOP.name, STOP.exit_code, STOP.interrupting)
    action = "saving a checkpoint, then stopping" if STOP.training else "stopping; this stage has nothing to checkpoint"
    logs.get().warning("stop requested", signal=signal.Signals(signum).name,
                       action=f"{action} (Ctrl+C again aborts at once)")


@contextmanager
def handle_stop_signals() -> Iterator[StopRequest]:
    """Install the handlers for the duration of a run (main thread only)."""
    STOP.signum, STOP.training, STOP.interrupting = None, False, None
    if threading.current_thread() is not threading.main_thread():
        yield STOP
        return
    # SIGBREAK: what the Windows launcher sends (CTRL_BREAK_EVENT), since SIGINT there would kill at once.
    stops = [signal.SIGINT, signal.SIGTERM, *([signal.SIGBREAK] if hasattr(signal, "SIGBREAK") else [])]
    previous = {s: signal.signal(s, _handler) for s in stops}
    try:
        yield STOP
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
