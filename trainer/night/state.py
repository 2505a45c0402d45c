"""The night as a state machine: baseline → rbc → each agent → report.

``schedule.json`` in the run folder records every stage (status, planned and actual start
and end, timesteps, checkpoint, results, error) and is rewritten atomically at every change.
Each stage's time is re-planned from the real clock when it starts, so time a stage does
not use goes to the stages after it. A stage that fails is marked failed and the night goes
on; a stop signal leaves the interrupted stage ``running`` for ``--resume`` to continue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from trainer import logs
from trainer.files import read_typed, write_json_atomic
from trainer.night.budget import StageKind, StageSpec, allocate, timeline


class Status(StrEnum):
    PENDING = "pending"
    RUNNING = "running"    # also a stage a stop signal interrupted: --resume continues it
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"    # no time left in the night for it


PENDING, RUNNING, DONE, FAILED, SKIPPED = Status
FINISHED = (DONE, FAILED, SKIPPED)
# A training slot too short to be worth a model: the stage is skipped rather than run for nothing.
MIN_TRAIN_STEPS = 100


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


@dataclass
class ScheduleState:
    path: Path
    created_at: str
    deadline: str | None
    budget_s: float | None
    stages: list[StageRecord] = field(default_factory=list)

    def save(self) -> None:
        write_json_atomic(self.path, self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        """``schedule.json``'s content."""
        return {k: v for k, v in asdict(self).items() if k != "path"}

    @classmethod
    def load(cls, path: Path) -> ScheduleState:
        return read_typed(path, cls, extra={"path": path})

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


class StageRunner(Protocol):
    """What the schedule needs from the world: estimates, and a way to run each kind of stage."""

    def spec(self, record: StageRecord) -> StageSpec: ...
    def run_eval(self, name: str) -> dict[str, Any]: ...
    def run_train(self, agent: str, target: int, time_limit_s: float | None, resume: bool) -> dict[str, Any]: ...
    def run_report(self) -> dict[str, Any]: ...


def plan(state: ScheduleState, runner: StageRunner, now: datetime) -> None:
    """(Re)write planned start and end of every stage not finished yet, from ``now``."""
    open_stages = [s for s in state.stages if s.status not in FINISHED]
    deadline = state.deadline_dt()
    remaining = (deadline - now).total_seconds() if deadline else None
    for record, planned in zip(open_stages, timeline([runner.spec(s) for s in open_stages], now, remaining)):
        record.planned_start = planned.start.isoformat(timespec="seconds")
        record.planned_end = planned.end.isoformat(timespec="seconds")


def run(state: ScheduleState, runner: StageRunner, clock: Callable[[], datetime],
        interrupt_types: tuple[type[BaseException], ...] = ()) -> ScheduleState:
    """Run every stage not finished yet, in order. Exceptions in ``interrupt_types`` propagate
    (the stage stays ``running``); any other failure marks the stage failed and the night goes on."""
    log = logs.get()
    deadline = state.deadline_dt()
    for index, record in enumerate(state.stages):
        if record.status in FINISHED:
            continue
        resume = record.status == RUNNING
        now = clock()
        open_specs = [runner.spec(s) for s in state.stages[index:] if s.status not in FINISHED]
        remaining = (deadline - now).total_seconds() if deadline else None
        alloc = allocate(open_specs, remaining)
        slot = alloc[0]
        if remaining is not None:
            # Time the later stages' plans leave over is this stage's to use if it runs slow.
            slack = remaining - sum(s.fixed_s for s in open_specs) - sum(alloc)
            slot += max(slack, 0.0)
        spec = open_specs[0]
        record.status = RUNNING
        record.actual_start = (
            record.actual_start if resume and record.actual_start else now.isoformat(timespec="seconds")
        )
        record.time_limit_s = None if deadline is None or record.kind != StageKind.TRAIN else round(slot, 1)
        if record.kind == StageKind.TRAIN and deadline is not None and \
                slot * spec.steps_per_s < min(MIN_TRAIN_STEPS, record.timesteps_target):
            _finish(state, record, SKIPPED, clock, error=f"no time left for training: {slot:.0f} s in the plan "
                                                          f"(~{slot * spec.steps_per_s:.0f} steps) before the deadline")
            log.warning("stage skipped", stage=record.name, reason=record.error)
            continue
        state.save()
        # The night's live status: which stage of how many, and when this stage and the night should end.
        log.info("stage started", stage=record.name, of=f"{index + 1}/{len(state.stages)}", kind=str(record.kind),
                 resume=resume, time_limit_s=record.time_limit_s, ends=_clock(record.planned_end),
                 night_ends=_clock(state.stages[-1].planned_end))
        try:
            if record.kind == StageKind.EVAL:
                result = runner.run_eval(record.name)
            elif record.kind == StageKind.TRAIN:
                result = runner.run_train(record.name, record.timesteps_target, record.time_limit_s, resume)
            else:
                result = runner.run_report()
        except interrupt_types:
            raise
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # a failed stage must not end the night
            _finish(state, record, FAILED, clock, error=f"{type(exc).__name__}: {exc}".splitlines()[0][:500])
            log.error("stage failed", stage=record.name, error=record.error)
            continue
        record.timesteps_done = int(result.get("timesteps") or 0)
        record.checkpoint = result.get("checkpoint")
        record.results = {
            k: result.get(k)
            for k in ("co2_kg_per_year", "co2_vs_baseline_pct", "timesteps", "steps_per_s")
            if k in result
        } or None
        _finish(state, record, DONE, clock)
        log.info("stage done", stage=record.name, seconds=_seconds(record))
    return state


def _finish(
    state: ScheduleState, record: StageRecord, status: Status, clock: Callable[[], datetime], error: str | None = None
) -> None:
    record.status = status
    record.error = error
    record.actual_end = clock().isoformat(timespec="seconds")
    state.save()


def _clock(iso: str | None) -> str | None:
    return f"{datetime.fromisoformat(iso):%H:%M:%S}" if iso else None


def _seconds(record: StageRecord) -> float | None:
    if not (record.actual_start and record.actual_end):
        return None
    return (datetime.fromisoformat(record.actual_end) - datetime.fromisoformat(record.actual_start)).total_seconds()
