"""``schedule.json``: a night's stages as a file, each with its kind, status, times, results and error.

At the base of the package: the night (``trainer.night.state``) changes it, and the session (is a run
folder begun?) and the report (the night's timeline) read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainer.base.files import FIXES, DamagedFile, read_typed, write_json_atomic


class StageKind(StrEnum):
    EVAL = "eval"      # evaluate a reference
    TRAIN = "train"    # train an agent, then evaluate it
    REPORT = "report"  # write the morning report


class Status(StrEnum):
    PENDING = "pending"
    RUNNING = "running"    # also a stage a stop signal interrupted: --resume continues it
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"    # no time left in the night for it


PENDING, RUNNING, DONE, FAILED, SKIPPED = Status
FINISHED = (DONE, FAILED, SKIPPED)


@dataclass
class StageRecord:
    name: str
    kind: StageKind
    status: Status = Status.PENDING
    planned_start: str | None = None
    planned_end: str | None = None
    actual_start: str | None = None
    actual_end: str | None = None
    timesteps_target: int = 0
    timesteps_done: int = 0
    time_limit_s: float | None = None
    checkpoint: str | None = None
    results: dict[str, Any] | None = None
    error: str | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)  # on Ray: each try's node, pid and start
    # Each stretch of time it ran, [start, end]: several once --resume continued it, so the hours a stopped night
    # waited are not counted as the stage's; end None while it runs (or once a killed run left it open).
    spans: list[list[str | None]] = field(default_factory=list)

    def begin_span(self, now: datetime) -> None:
        self.spans.append([now.isoformat(timespec="seconds"), None])

    def end_span(self, at: datetime) -> None:
        """Close the open stretch at ``at``, never before it began."""
        if self.spans and self.spans[-1][1] is None:
            begun = datetime.fromisoformat(str(self.spans[-1][0]))
            self.spans[-1][1] = max(at, begun).isoformat(timespec="seconds")

    def stretches(self) -> list[tuple[str, str | None]]:
        """When it ran; a schedule.json written before spans has its start and end alone."""
        if self.spans:
            return [(str(start), end) for start, end in self.spans]
        return [(self.actual_start, self.actual_end)] if self.actual_start else []

    def seconds(self) -> float | None:
        """How long it ran (its stretches together); None before it ends."""
        stretches = self.stretches()
        if not stretches or any(end is None for _, end in stretches):
            return None
        return sum((datetime.fromisoformat(str(end)) - datetime.fromisoformat(start)).total_seconds()
                   for start, end in stretches)


@dataclass
class TimeLeft:
    start: str
    end: str
    warm_starts_evaluated: list[str]  # the agents whose warm start a short night had left unevaluated


@dataclass
class ScheduleState:
    path: Path
    created_at: str
    deadline: str | None
    budget_s: float | None
    stages: list[StageRecord]  # required: a night without its stages' record must not pass for a finished one
    # The time a timed night's stages left before the report, where it was spent (trainer.night.state
    # ._spend_time_left); the timeline draws it.
    time_left: TimeLeft | None = None

    def save(self) -> None:
        write_json_atomic(self.path, self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        """``schedule.json``'s content."""
        return {k: v for k, v in asdict(self).items() if k != "path"}

    @classmethod
    def load(cls, path: Path) -> ScheduleState:
        state = read_typed(path, cls, extra={"path": path})
        if not state.stages:  # every night has at least its report: an empty list is a damaged file
            raise DamagedFile(f"{path} is damaged: stages is empty; {FIXES.get(path.name, 'delete it')}")
        return state

    @classmethod
    def new(
        cls, path: Path, names: list[tuple[str, StageKind, int]], now: datetime, deadline: datetime | None
    ) -> ScheduleState:
        budget = (deadline - now).total_seconds() if deadline else None
        stages = [StageRecord(name, StageKind(kind), timesteps_target=target) for name, kind, target in names]
        return cls(
            path,
            now.isoformat(timespec="seconds"),
            deadline.isoformat(timespec="seconds") if deadline else None,
            budget,
            stages,
        )

    def deadline_dt(self) -> datetime | None:
        return datetime.fromisoformat(self.deadline) if self.deadline else None

    def failed(self) -> list[StageRecord]:
        return [s for s in self.stages if s.status == FAILED]
