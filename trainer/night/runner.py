"""`trainer night`: the night, from the plan to the report, in this process.

Wires the schedule's state machine (``state``) to the real stages (``stages``), the measured
plan (``calibrate``, ``plan``) and the report. :class:`LocalRunner` is the first implementation
of the state machine's :class:`~trainer.night.state.StageRunner`, the "run these stages" seam:
another backend runs the same stages elsewhere by implementing the same four methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainer import logs
from trainer.device import agent_device
from trainer.errors import TrainerError
from trainer.files import write_json_atomic
from trainer.learn.recovery import TrainingInterrupted
from trainer.night import ray_runner
from trainer.night.budget import StageKind, StageSpec
from trainer.night.calibrate import calibrate
from trainer.night.plan import build_plan, render, stage_specs
from trainer.night.stages import evaluate_reference, record_results, train_agent
from trainer.night.state import FINISHED, ScheduleState, StageRecord, plan, run
from trainer.references import REFERENCES
from trainer.report import write_report
from trainer.run_dir import RunDir
from trainer.session import RunContext
from trainer.signals import Stopped


class LocalRunner:
    """The schedule's stages, run one after another in this process."""

    def __init__(self, ctx: RunContext, specs: dict[str, StageSpec], force: bool):
        self.ctx = ctx
        self.specs = specs
        self.force = force

    def spec(self, record: StageRecord) -> StageSpec:
        return self.specs[record.name]

    def _doing(self, stage: str, device: str) -> None:
        """Tell the GPU monitor (a separate process) what runs now, so it warns about an idle GPU only when a
        stage uses it."""
        write_json_atomic(self.ctx.run.activity, {"stage": stage, "device": device})

    def run_eval(self, name: str) -> dict[str, Any]:
        self._doing(name, "cpu")
        metrics = evaluate_reference(self.ctx, name)
        record_results(self.ctx.run, {name: metrics})
        return metrics

    def run_train(self, agent: str, target: int, time_limit_s: float | None, resume: bool) -> dict[str, Any]:
        self._doing(agent, agent_device(self.ctx.cfg, agent))
        resumable = resume and self.ctx.run.agent(agent).checkpoints.is_dir()
        metrics = train_agent(self.ctx, agent, target, resume=resumable, force=self.force, time_limit_s=time_limit_s)
        record_results(self.ctx.run, {agent: metrics})
        return metrics

    def run_report(self) -> dict[str, Any]:
        self._doing("report", "cpu")
        return {"report": str(write_report(self.ctx.run))}


@dataclass(frozen=True)
class Night:
    """The night to run: its stages' state, what the planner knows of each, and the plan's text."""

    state: ScheduleState
    specs: dict[str, StageSpec]
    plan_text: str


def prepare(ctx: RunContext, agents: list[str], targets: dict[str, int], deadline: datetime | None,
            resume: bool) -> Night:
    """Calibrate, (re)plan and return the state with the plan's text (the night's first screen)."""
    speeds = calibrate(ctx.cfg, ctx.schema, ctx.device, agents)
    now = datetime.now()  # after calibrating: the plan starts when the first stage can
    specs = stage_specs(ctx.cfg, ctx.schema, speeds, agents, targets)
    if resume and ctx.run.schedule.is_file():
        state = ScheduleState.load(ctx.run.schedule)
        deadline = state.deadline_dt()  # the same deadline as the night began with
        logs.get().info("schedule resumed", deadline=state.deadline,
                        remaining=[s.name for s in state.stages if s.status not in FINISHED])
    else:
        stages = [*[(r, StageKind.EVAL, 0) for r in REFERENCES], *[(a, StageKind.TRAIN, targets[a]) for a in agents],
                  ("report", StageKind.REPORT, 0)]
        state = ScheduleState.new(ctx.run.schedule, stages, now, deadline)
    plan(state, LocalRunner(ctx, specs, False), now)
    state.save()
    remaining = [s.name for s in state.stages if s.status not in FINISHED]
    planned, notes = build_plan(ctx.cfg, ctx.schema, speeds, [a for a in agents if a in remaining], targets, now,
                                deadline)
    return Night(state, specs, render([p for p in planned if p.name in remaining], deadline, notes, speeds))


def run_night(ctx: RunContext, agents: list[str], targets: dict[str, int], deadline: datetime | None, resume: bool,
              force: bool, say: Callable[[str], None], backend: str = "local",
              address: str | None = None) -> ScheduleState:
    """Plan the night, say the plan, run every stage not finished yet; a stop signal propagates."""
    night = prepare(ctx, agents, targets, deadline, resume)
    say(night.plan_text + "\n")
    if backend == "ray":
        with ray_runner.ray_session(address, shared=ctx.run.root) as ray:
            nights = [ray_runner.Night(ctx, night.state, night.specs)]
            sizes = ray_runner.observation_action_sizes(ctx.cfg, ctx.schema)
            return ray_runner.RayNights(ray, nights, force, sizes, say).run()[0]
    return run(night.state, LocalRunner(ctx, night.specs, force), datetime.now,
               interrupt_types=(TrainingInterrupted, Stopped))


def raise_for_failures(state: ScheduleState, run: RunDir) -> None:
    """After the night: its failed stages as one error (the others finished and are in the report)."""
    failed = state.failed()
    if failed:
        failures = "; ".join(f"{s.name} ({s.error})" for s in failed)
        raise TrainerError(f"{len(failed)} stage(s) failed: {failures}; the others finished, see {run.report}")
