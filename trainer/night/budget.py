"""Budgets, deadlines and the split of a night's time between stages (pure functions)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from trainer.errors import UsageError

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


class StageKind(StrEnum):
    EVAL = "eval"      # evaluate a reference
    TRAIN = "train"    # train an agent, then evaluate it
    REPORT = "report"  # write the morning report


@dataclass(frozen=True)
class StageSpec:
    """What the planner knows of one stage."""

    name: str
    kind: StageKind
    fixed_s: float                  # evaluation (after training, for train stages) or report time
    weight: float = 0.0             # share of the training time
    target_steps: int = 0
    steps_per_s: float = 0.0        # measured training speed

    @property
    def needed_train_s(self) -> float:
        if self.kind != StageKind.TRAIN or self.target_steps <= 0:
            return 0.0
        return self.target_steps / self.steps_per_s if self.steps_per_s > 0 else float("inf")


def allocate(stages: list[StageSpec], available_s: float | None) -> list[float]:
    """Training seconds for each stage.

    Without a budget each stage gets what its target needs. With one, the time left after
    every stage's fixed cost is shared by weight; a stage whose share exceeds what its target
    needs gets only that, and the rest is shared again among the others (water-filling).
    """
    needs = [s.needed_train_s for s in stages]
    if available_s is None:
        return needs
    alloc = [0.0] * len(stages)
    remaining = max(available_s - sum(s.fixed_s for s in stages), 0.0)
    active = [i for i, s in enumerate(stages) if s.kind == StageKind.TRAIN and needs[i] > 0]
    while active and remaining > 0:
        total_weight = sum(stages[i].weight for i in active)
        if total_weight <= 0:
            break
        share = {i: remaining * stages[i].weight / total_weight for i in active}
        capped = [i for i in active if needs[i] <= share[i]]
        if not capped:
            for i in active:
                alloc[i] = share[i]
            break
        for i in capped:
            alloc[i] = needs[i]
            remaining -= needs[i]
            active.remove(i)
    return alloc


@dataclass
class PlannedStage:
    name: str
    start: datetime
    end: datetime
    train_s: float
    planned_steps: int
    target_steps: int
    notes: list[str] = field(default_factory=list)


def timeline(stages: list[StageSpec], start: datetime, available_s: float | None) -> list[PlannedStage]:
    """When each stage would start and end if it ran as estimated from ``start``."""
    alloc = allocate(stages, available_s)
    out, clock = [], start
    for spec, train_s in zip(stages, alloc):
        duration = (train_s if train_s != float("inf") else 0.0) + spec.fixed_s
        steps = (
            spec.target_steps
            if spec.kind == StageKind.TRAIN and train_s >= spec.needed_train_s
            else int(train_s * spec.steps_per_s)
        )
        out.append(
            PlannedStage(spec.name, clock, clock + timedelta(seconds=duration), train_s, steps, spec.target_steps)
        )
        clock = clock + timedelta(seconds=duration)
    return out
