"""`trainer schedule`: the night, from the plan to the report.

Wires the schedule's state machine (trainer.schedule) to the real stages (trainer.stages),
the measured plan (trainer.plan) and the report (trainer.report).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from trainer import logs
from trainer.config import REFERENCES
from trainer.plan import Speeds, build_plan, calibrate, render, stage_specs
from trainer.report import write_report
from trainer.schedule import ScheduleState, StageRecord, plan, run
from trainer.stages import RunContext, evaluate_reference, record_results, train_agent
from trainer.timing import StageSpec


class LiveRunner:
    """The schedule's stages, for real."""

    def __init__(self, ctx: RunContext, specs: dict[str, StageSpec], force: bool):
        self.ctx = ctx
        self.specs = specs
        self.force = force

    def spec(self, record: StageRecord) -> StageSpec:
        return self.specs[record.name]

    def run_eval(self, name: str) -> dict[str, Any]:
        metrics = evaluate_reference(self.ctx, name)
        record_results(self.ctx.run, {name: metrics})
        return metrics

    def run_train(self, agent: str, target: int, time_limit_s: float | None, resume: bool) -> dict[str, Any]:
        resumable = resume and self.ctx.run.agent(agent).checkpoints.is_dir()
        metrics = train_agent(self.ctx, agent, target, resume=resumable, force=self.force, time_limit_s=time_limit_s)
        record_results(self.ctx.run, {agent: metrics})
        return metrics

    def run_report(self) -> dict[str, Any]:
        return {"report": str(write_report(self.ctx.run))}


def prepare(ctx: RunContext, agents: list[str], targets: dict[str, int], deadline: datetime | None,
            resume: bool) -> tuple[ScheduleState, dict[str, StageSpec], Speeds, str]:
    """Calibrate, (re)plan and return the state with the plan's text (the night's first screen)."""
    speeds = calibrate(ctx.cfg, ctx.schema, ctx.device, agents)
    now = datetime.now()  # after calibrating: the plan starts when the first stage can
    specs = stage_specs(ctx.cfg, ctx.schema, speeds, agents, targets)
    if resume and ctx.run.schedule.is_file():
        state = ScheduleState.load(ctx.run.schedule)
        deadline = state.deadline_dt()  # the same deadline as the night began with
        logs.get().info("schedule resumed", deadline=state.deadline,
                        remaining=[s.name for s in state.stages if s.status not in ("done", "failed", "skipped")])
    else:
        stages = [*[(r, "eval", 0) for r in REFERENCES], *[(a, "train", targets[a]) for a in agents],
                  ("report", "report", 0)]
        state = ScheduleState.new(ctx.run.schedule, stages, now, deadline)
    plan(state, LiveRunner(ctx, specs, False), now)
    state.save()
    remaining = [s.name for s in state.stages if s.status not in ("done", "failed", "skipped")]
    open_agents = [a for a in agents if a in remaining]
    planned, notes = build_plan(ctx.cfg, ctx.schema, speeds, open_agents, targets, now, deadline)
    planned = [p for p in planned if p.name in remaining]
    return state, specs, speeds, render(planned, deadline, notes, speeds)


def run_night(ctx: RunContext, state: ScheduleState, specs: dict[str, StageSpec], force: bool) -> ScheduleState:
    from trainer.training import TrainingInterrupted

    return run(state, LiveRunner(ctx, specs, force), datetime.now, interrupt_types=(TrainingInterrupted,))
