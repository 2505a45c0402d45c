"""Durations and clock times as users type them (--budget 10h, --finish-by 07:00), and the night's deadline.

At the base of the package: the config validates its budget and finish_by keys with these parsers,
the session turns the options into a deadline, the night plans up to it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from trainer.base.errors import UsageError

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$", re.I)
_CLOCK = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*$")


MAX_BUDGET_S = 366 * 86400


def parse_duration(text: str, option: str = "--budget") -> float:
    """'10h', '90m', '1h30m', '45s', '8m' → seconds; ``option`` names what the user typed in the error."""
    match = _DURATION.match(text or "")
    if not match or not any(match.groups()):
        raise UsageError(f"{option} expects a duration like 10h, 90m or 1h30m, got {text!r}")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise UsageError(f"{option} expects a duration like 10h, 90m or 1h30m, got {text!r} (it must be positive)")
    if total > MAX_BUDGET_S:  # beyond any night, and past year 9999 Python's dates overflow
        raise UsageError(f"{option} expects a duration of at most {MAX_BUDGET_S // 86400:.0f} days, got {text!r}; "
                         "a longer run is a training length: set timesteps instead")
    return total


def parse_clock(text: str, option: str, example: str = "07:00") -> tuple[int, int]:
    """'07:00' → (7, 0); ``option`` and ``example`` name what the user typed in the error."""
    match = _CLOCK.match(text or "")
    if not match or int(match.group(1)) > 23 or int(match.group(2)) > 59:
        raise UsageError(f"{option} expects a local time HH:MM such as {example}, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def resolve_finish_by(text: str, now: datetime) -> datetime:
    """'07:00' → the next 07:00 in local time after ``now`` (a time already past means tomorrow)."""
    hour, minute = parse_clock(text, "--finish-by")
    target = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if target <= now:
        target += timedelta(days=1)
    return target


def deadline(budget: str | None, finish_by: str | None, now: datetime) -> datetime | None:
    """The night's deadline from a budget or a finish-by time; None = untimed."""
    if budget and finish_by:
        raise UsageError("pass either --budget or --finish-by, not both")
    if budget:
        return now + timedelta(seconds=parse_duration(budget))
    if finish_by:
        return resolve_finish_by(finish_by, now)
    return None


@dataclass
class TimeBox:
    """Where a piece of work must stop (``time.monotonic()`` seconds; None: it runs to its end), and whether it
    did: what it ended with is then its best so far, not the whole, and is not kept as the whole
    (trainer.learn.warm_start: an imitation cut at its stage's slot is not saved for a night's other stages)."""

    until: float | None = None
    reached: bool = False

    @classmethod
    def of(cls, seconds: float | None) -> TimeBox:
        """A box ending ``seconds`` from now (None: unbounded)."""
        return cls(None if seconds is None else time.monotonic() + max(seconds, 0.0))

    def passed(self) -> bool:
        if self.until is not None and time.monotonic() >= self.until:
            self.reached = True
        return self.reached

    def left_s(self) -> float | None:
        return None if self.until is None else max(self.until - time.monotonic(), 0.0)

    def part(self, share: float) -> TimeBox:
        """A box for the first ``share`` of what is left of this one (unbounded where this one is)."""
        left = self.left_s()
        return TimeBox() if left is None else TimeBox.of(left * share)
