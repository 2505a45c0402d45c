"""`trainer night`: the night, from the plan to the report.

Prepares a night (calibration, the plan, ``schedule.json``) and runs it on a backend of
``trainer.night.backends``: the schedule's driver (``state.drive``) owns every stage's life,
the backend only places the stages' jobs (here one after another, on Ray side by side).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from trainer.base import logs
from trainer.base.errors import NothingTrained, TrainerError
from trainer.config.sections import Config
from trainer.judge.report import write_report
from trainer.night.backends import backend
from trainer.night.budget import StageKind, StageSpec
from trainer.night.calibrate import Speeds, calibrate
from trainer.night.plan import build_plan, fit_ensemble, left_out, refit_ensemble, render, stage_specs
from trainer.night.stages import evaluate_left_warm_starts, left_warm_starts_s, record_results
from trainer.night.state import Night, drive, plan
from trainer.references.roster import REFERENCES
from trainer.run.folder import RunContext, RunDir
from trainer.run.schedule_file import DONE, FINISHED, SKIPPED, ScheduleState
from trainer.run.session import with_fitted_warm_start


def prepare(ctx: RunContext, agents: list[str], targets: dict[str, int], deadline: datetime | None,
            resume: bool, force: bool = False, one_process: bool = True) -> Night:
    """Calibrate, (re)plan and return the night with the plan's text (its first screen); ``one_process``: the
    backend's (backends.py)."""
    speeds = calibrate(ctx.cfg, ctx.site, ctx.device, agents)
    now = datetime.now()  # after calibrating: the plan starts when the first stage can
    resumed = ScheduleState.load(ctx.run.schedule) if resume and ctx.run.schedule.is_file() else None
    if resumed is not None:
        deadline = resumed.deadline_dt()  # the same deadline as the night began with
    configured = ctx.cfg
    ctx, fitted = _fit_warm_start(ctx, speeds, agents, targets, deadline, now, one_process)
    specs = stage_specs(ctx.cfg, ctx.site, speeds, agents, targets, one_process)
    refit = None
    # A night that left the ensemble (or some of its years) out is asked again before each warm start until it takes
    # it, at its pace then, for the agents left (one process: on Ray the stages start side by side, each reading the
    # config the night began with).
    if resumed is None and deadline is not None and one_process and left_out(ctx.cfg, configured, ctx.site):
        def refit(left_s: float, pace: float, fitting: list[str]) -> tuple[Config, dict[str, StageSpec], str] | None:
            return refit_ensemble(configured, ctx.site, speeds, agents, targets, left_s, pace, current=ctx.cfg,
                                  fitting=fitting)
    if resumed is not None:
        state = resumed
        logs.get().info("schedule resumed", deadline=state.deadline,
                        remaining=[s.name for s in state.stages if s.status not in FINISHED])
    else:
        stages = [*[(r, StageKind.EVAL, 0) for r in REFERENCES], *[(a, StageKind.TRAIN, targets[a]) for a in agents],
                  ("report", StageKind.REPORT, 0)]
        state = ScheduleState.new(ctx.run.schedule, stages, now, deadline)
    plan(state, specs, now)
    state.save()
    remaining = [s.name for s in state.stages if s.status not in FINISHED]
    planned, notes = build_plan(ctx.cfg, ctx.site, speeds, [a for a in agents if a in remaining], targets, now,
                                deadline, one_process)
    text = render([p for p in planned if p.name in remaining], deadline, [*fitted, *notes], speeds)
    return Night(ctx, state, specs, force, text, keep=lambda name, metrics: record_results(ctx.run, {name: metrics}),
                 report=lambda: write_report(ctx.run), refit=refit, spare=evaluate_left_warm_starts,
                 spare_s=left_warm_starts_s, past_target=ctx.cfg.schedule.last_stage_past_target)


def _fit_warm_start(ctx: RunContext, speeds: Speeds, agents: list[str], targets: dict[str, int],
                    deadline: datetime | None, now: datetime, one_process: bool) -> tuple[RunContext, list[str]]:
    """The run with the warm start's ensemble the night's time affords (plan.fit_ensemble), written to its
    config.yaml (a resumed night and Ray's workers read it from there), and the plan's note of it."""
    available = (deadline - now).total_seconds() if deadline else None
    fitted, why = fit_ensemble(ctx.cfg, ctx.site, speeds, agents, available, one_process, targets)
    if why is None:
        return ctx, []
    logs.get().info(f"warm start: {why}")
    return with_fitted_warm_start(ctx, fitted), [f"warm start: {why}"]


def run_night(ctx: RunContext, agents: list[str], targets: dict[str, int], deadline: datetime | None, resume: bool,
              force: bool, say: Callable[[str], None], backend_name: str = "local",
              backend_options: dict[str, Any] | None = None) -> ScheduleState:
    """Plan the night, say the plan, run every stage not finished yet; a stop signal propagates."""
    chosen = backend(backend_name)
    night = prepare(ctx, agents, targets, deadline, resume, force, chosen.one_process)
    say(night.plan_text + "\n")
    with chosen.open([night], backend_options or {}, say) as executor:
        drive([night], executor)
    return night.state


def untrained(state: ScheduleState) -> list[str]:
    """One line for each training stage that did not train: skipped for lack of time, or ended with 0 steps."""
    lines = []
    for stage in state.stages:
        if stage.kind != StageKind.TRAIN:
            continue
        if stage.status == SKIPPED:
            lines.append(f"{stage.name}: skipped ({stage.error})")
        elif stage.status == DONE and stage.timesteps_done <= 0:
            lines.append(f"{stage.name}: trained 0 steps; it deploys its warm start, untrained")
    return lines


def raise_for_failures(state: ScheduleState, run: RunDir) -> None:
    """After the night: its failed stages as one error (the others finished and are in the report)."""
    failed = state.failed()
    if failed:
        failures = "; ".join(f"{s.name} ({s.error})" for s in failed)
        raise TrainerError(f"{len(failed)} stage(s) failed: {failures}; the others finished, see {run.report}")
    trained = [s for s in state.stages if s.kind == StageKind.TRAIN and s.status == DONE and s.timesteps_done > 0]
    if any(s.kind == StageKind.TRAIN for s in state.stages) and not trained:
        raise NothingTrained(f"the night trained no agent (every training stage was skipped or trained 0 steps); "
                             f"give it a longer --budget, or fewer --agents; the references are in {run.report}")
