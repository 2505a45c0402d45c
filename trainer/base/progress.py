"""Live progress for training and evaluation: a bar on a terminal, plain lines on a pipe or in a log.

Both say the same facts: done / total, rate, and the ETA as a clock time. On a pipe (under the
launchers, in cron, in a container) a line is logged every ``every`` of the total and at least
every ``every_s`` seconds, so a person watching the launcher sees it move.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from trainer.base import logs


class Progress:
    """Progress of one task (``training sac``, ``evaluation of rbc``) counted in ``unit``s."""

    def __init__(self, event: str, total: int, unit: str = "step", initial: int = 0, every: float | None = 0.1,
                 every_s: float = 60.0, **fields: Any):
        """``every``: a line each such share of ``total`` (None: only every ``every_s`` seconds, for a task that is
        usually short: quiet when it is, heard from when the machine makes it long)."""
        self.event, self.total, self.unit, self.fields = event, total, unit, fields
        self.every_n = max(int(total * every), 1) if every is not None else total + 1
        self.every_s = every_s
        self.start, self.start_n, self.done = time.monotonic(), initial, initial
        self._next_n, self._next_t = initial + self.every_n, self.start + every_s
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm  # lazy: only a terminal shows a bar

            self._bar = tqdm(total=total, initial=initial, desc=event, unit=unit, dynamic_ncols=True, leave=False,
                             file=sys.stderr)

    def update(self, done: int) -> None:
        self.done = done
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        now = time.monotonic()
        if done >= self._next_n or now >= self._next_t:
            self._next_n = (done // self.every_n + 1) * self.every_n
            self._next_t = now + self.every_s
            self._say()

    def rate(self) -> float | None:
        elapsed = time.monotonic() - self.start
        return (self.done - self.start_n) / elapsed if elapsed > 0 and self.done > self.start_n else None

    def eta(self) -> datetime | None:
        rate = self.rate()
        return datetime.now() + timedelta(seconds=(self.total - self.done) / rate) if rate else None

    def _say(self) -> None:
        rate, eta = self.rate(), self.eta()
        # With a live bar the line goes to the JSON log only; on a pipe it is the live status.
        emit = logs.get().debug if self._bar is not None else logs.get().info
        shown = None if not rate else f"{rate:,.0f}/s" if rate >= 10 else f"{rate:.2g}/s"  # an epoch a few seconds
        emit(self.event, done=f"{self.done:,}/{self.total:,} {self.unit}s", rate=shown,
             eta=f"{eta:%H:%M:%S}" if eta else None, **self.fields)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@contextmanager
def live_console() -> Iterator[None]:
    """On a terminal, log lines are written above the progress bars instead of into them."""
    if not sys.stderr.isatty():
        yield
        return
    from tqdm.contrib.logging import logging_redirect_tqdm  # lazy: only a terminal needs it

    with logging_redirect_tqdm(loggers=[logging.getLogger()]):
        yield
