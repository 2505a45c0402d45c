"""The night as a state machine: baseline → rbc → each agent → report, on any backend.

``schedule.json`` in the run folder records every stage (status, planned and actual start
and end, timesteps, checkpoint, results, error) and is rewritten atomically at every change.
:func:`drive` is the only owner of a stage's life; a backend (``trainer.night.backends``) only
places :class:`StageJob` s and reports :class:`StageOutcome` s. Each stage's time is re-planned
from the real clock when it starts, so time a stage does not use goes to the stages after it. A
stage that fails is marked failed and the night goes on; a stop signal leaves the interrupted
stage ``running`` for ``--resume`` to continue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainer.base import logs
from trainer.night.budget import (
    LEARNING_KEPT_STEPS,
    SAFETY,
    StageSpec,
    forecast,
    kept_after_s,
    reserve_s,
    short_of_time,
    slot_s,
    warm_start_cap_s,
)
from trainer.run.schedule_file import (
    DONE,
    FAILED,
    FINISHED,
    RUNNING,
    SKIPPED,
    ScheduleState,
    StageKind,
    StageRecord,
    Status,
    TimeLeft,
)
from trainer.run.session import with_fitted_warm_start
from trainer.site import Site

if TYPE_CHECKING:
    from trainer.config.sections import Config
    from trainer.run.folder import RunContext


# What schedule.json keeps of a finished stage's results (results.json has them all).
RESULT_KEYS = ("co2_kg_per_year", "co2_vs_baseline_pct", "timesteps", "steps_per_s")


@dataclass(frozen=True)
class StageJob:
    """One stage as a backend places it: what a process needs to run it, wherever and whenever it starts."""

    run: str                      # the run folder
    site: Site                    # the dataset
    name: str
    kind: StageKind
    target: int = 0               # training steps
    resume: bool = False          # an interrupted stage goes on from its checkpoint
    force: bool = False           # resume despite a changed config
    deadline: float | None = None  # the night's deadline (POSIX seconds); None: untimed
    reserve_s: float = 0.0        # of the time left, what the stage leaves for its evaluation and the stages after
    steps_per_s: float = 0.0      # the planner's training speed
    setup_s: float = 0.0          # the planner's estimate of its warm start, inside its slot
    lean: bool = False            # the night is short of time: the stage confirms its pick on the training simulator
    later: tuple[str, ...] = ()   # an untimed night's training stages after it, in this process: their students beside
    # Short of this many steps at its slot's end (budget.LEARNING_KEPT_STEPS, at most its target), a stage learns on
    # to them while the night keeps kept_after_s for the stages after it (budget.kept_after_s); 0: none.
    floor_steps: int = 0
    kept_after_s: float = 0.0
    # A flat curve ends the stage (train.patience), its time going to the stages after it; False for a timed
    # night's last training stage run one after another, whose time nothing after it could use: a busy 20-minute
    # night on the official Building_10 ended 267 s before its deadline, every agent's curve flat.
    flat_ends: bool = True
    # That last stage learns on past its target to its slot's end, to this many steps at most (0: it stops at its
    # target): schedule.last_stage_past_target. Busy 20-minute nights ended 75-200 s early, A2C at its target.
    past_target: int = 0
    # Past its target it stops this long before its slot's end: what the time left's evaluations would take
    # (trainer.night.stages.left_warm_starts_s). Not taken from the slot itself, which its target keeps whole: a
    # busy 20-minute night that held it there left A2C 0 s and skipped it (2026-12-02).
    spare_s: float = 0.0

    def slot(self, now: float) -> tuple[float | None, str | None]:
        """Starting at ``now``: (the training stage's time limit in seconds, or None untimed; why it is skipped
        instead, or None). The one rule for a stage the night has no time left for (budget.slot_s)."""
        if self.kind != StageKind.TRAIN or self.deadline is None:
            return None, None
        limit, skipped = slot_s(self.target, self.steps_per_s, self.deadline - now - self.reserve_s)
        return (None, skipped) if skipped is not None else (limit, None)

    def floor(self, now: float) -> tuple[int, float] | None:
        """Starting at ``now``: (the least steps the stage learns, the seconds it may learn past its slot's end for
        them at most), or None where it keeps no floor (untimed, or stages side by side)."""
        if self.deadline is None or self.floor_steps <= 0:
            return None
        return self.floor_steps, max(self.deadline - now - self.kept_after_s, 0.0)

    def warm_start_s(self, limit: float | None) -> float | None:
        """Of a slot of ``limit`` seconds, the most its warm start may take (None: untimed; budget.warm_start_cap_s)."""
        if limit is None or self.steps_per_s <= 0:
            return None
        return warm_start_cap_s(limit, self.setup_s, self.target, self.steps_per_s)


@dataclass(frozen=True)
class StageOutcome:
    """How a stage ended where it ran: done with its metrics, skipped, failed or stopped."""

    metrics: dict[str, Any] | None = None  # done
    skipped: str | None = None             # why there was no time for it
    error: str | None = None               # failed: one line
    stopped: str | None = None             # a stop signal: it stays running, for --resume
    time_limit_s: float | None = None


@dataclass(frozen=True)
class StageEvent:
    """News of a submitted stage: its outcome, or (still running) the attempts a backend has made of it."""

    job: StageJob
    outcome: StageOutcome | None = None
    attempts: tuple[dict[str, Any], ...] = ()


class Executor(Protocol):
    """Where a night's stages run (a backend): it places jobs; :func:`drive` owns every stage's life."""

    parallel: bool  # stages side by side: each keeps only its own evaluation and the report in reserve

    def has_room(self) -> bool: ...
    def submit(self, job: StageJob, night: Night) -> None: ...
    def wait(self) -> list[StageEvent]: ...  # the next events; may raise a stop, leaving its stages running


def _nothing(*args: Any) -> None:
    return None


# A stage's fixed costs (its evaluations, a reference's solve) shorter than this say little of the machine's pace:
# a reused reference is planned at a second and takes a few.
PACE_FROM_S = 10.0
MAX_PACE = 4.0
# A later agent's final judging is planned at no less than the longest before it times this: one night's judgings
# (the same CityLearn drives for every agent) differ by up to 1.51x (ten 20-minute nights on the EV buildings,
# 2026-12-03: 14-29 s), so SAFETY's 1.15 let Building_10's A2C judge 28.7 s where 21.8 were kept, 6 s past the deadline.
JUDGING_SPREAD = 1.6
# A night whose stages ran faster than planned plans the rest at their pace down to the estimates unpadded (SAFETY):
# a busy 20-minute night calibrated beside other work (2026-12-01) ran its references in 0.78 of their plan and
# the agents' evaluations in 0.6, and ended 3.8 minutes early with SAC's warm start cut to 103 of its 400 epochs.
MIN_PACE = 1 / SAFETY
# The agents' own evaluations (each stage's after its slot) are planned from CityLearn's calibrated rate and each
# policy's calls, and took 0.35-0.42 of that in a busy 20-minute night on the built-in site (2026-12-02: SAC's 106 s
# of 251, PPO's 78 of 220), which ended 135 s early with its last stage learning to its slot's end and its evaluation
# taking 58 of the 187 s kept for it. A later agent's is planned at what the earlier agents' took, padded (SAFETY),
# down to this share of its estimate.
MIN_JUDGING_PACE = 0.25
PACE_WORTH_SAYING = 0.1  # a change of the pace by this much is logged with the night's new end


@dataclass
class Pace:
    """How much longer than planned the night's stages take: other work started since the calibration (or a cached
    calibration of a quiet hour) slows every evaluation and warm start; a calibration made beside work that has
    since stopped makes them faster. Never below MIN_PACE: stages that went fast give the stages after them the
    estimates' padding, not more."""

    planned_s: float = 0.0
    taken_s: float = 0.0
    said: float = 1.0  # the factor last logged
    floor: float = MIN_PACE

    def add(self, planned_s: float, taken_s: float) -> None:
        if planned_s >= PACE_FROM_S and taken_s > 0:
            self.planned_s += planned_s
            self.taken_s += taken_s

    @property
    def factor(self) -> float:
        return 1.0 if self.planned_s <= 0 else min(max(self.taken_s / self.planned_s, self.floor), MAX_PACE)

    def of(self, spec: StageSpec) -> StageSpec:
        """``spec`` at this pace: its evaluation and warm start longer, its training slower."""
        factor = self.factor
        if factor == 1.0:
            return spec
        return replace(spec, fixed_s=spec.fixed_s * factor, setup_s=spec.setup_s * factor,
                       steps_per_s=spec.steps_per_s / factor,
                       lean_fixed_s=None if spec.lean_fixed_s is None else spec.lean_fixed_s * factor)


# The seconds left, the pace and the agents still to train -> the config with the ensemble, the specs with it and
# why; None: it still does not fit.
Refit = Callable[[float, float, list[str]], "tuple[Config, dict[str, StageSpec], str] | None"]


@dataclass
class Night:
    """One run folder's night: its stages' state, what the planner knows of each, and what it keeps."""

    ctx: RunContext                                  # its config, run folder and dataset
    state: ScheduleState
    specs: dict[str, StageSpec]                      # as planned from the calibration
    force: bool = False
    plan_text: str = ""
    keep: Callable[[str, dict[str, Any]], Any] = _nothing  # a finished stage's metrics into results.json: all of it
    report: Callable[[], Any] = _nothing                   # report.md, once every other stage has finished
    # What a timed night does in the time its stages left before the report (its run, the POSIX second to stop by):
    # the warm starts it left unevaluated for lack of time (trainer.night.stages.evaluate_left_warm_starts), whose
    # agents it returns.
    spare: Callable[[RunContext, float], list[str] | None] = _nothing
    # What that would take (its run; whether the stage about to start leaves its own warm start too), kept from a
    # last stage learning on past its target (trainer.night.stages.left_warm_starts_s).
    spare_s: Callable[[RunContext, bool], float] = lambda ctx, own: 0.0
    # A timed night's last training stage learns on past its target to its slot's end, to this many times its target
    # (schedule.last_stage_past_target; 1: it stops at its target).
    past_target: float = 1.0
    pace: Pace = field(default_factory=Pace)
    # The agents' evaluations alone, against their estimates: a later agent's is planned at it where that is less.
    judging: Pace = field(default_factory=lambda: Pace(floor=MIN_JUDGING_PACE))
    # The longest an agent's final judging in CityLearn took so far (its metrics' judged_s): a later agent's evaluation
    # is planned at no less, padded. Judging costs about the same whatever the agent; planned at the earlier agents'
    # pace alone, a busy 20-minute night's A2C kept ~10 s for a judging that took 17, and the night ended 3 s late.
    judged_s: float = 0.0
    lean: bool = False  # short of time: the stages left confirm their picks on the training simulator
    # The ensemble its first plan left out, asked again before the first warm start (trainer.night.plan.refit_ensemble:
    # the seconds left and the pace -> the config with it, the specs with it and why; None: still one imitation).
    refit: Refit | None = None

    def spec(self, name: str) -> StageSpec:
        """What the planner knows of stage ``name`` now: as calibrated, at the pace the night's stages have shown,
        lean where the night is short of time."""
        planned = self.specs[name].leaned() if self.lean else self.specs[name]
        spec = self.pace.of(self.specs[name])
        spec = spec.leaned() if self.lean else spec
        if spec.kind == StageKind.TRAIN:  # as the agents' evaluations have gone, at least one judging as it went
            fixed_s = spec.fixed_s
            if self.judging.planned_s > 0:
                fixed_s = min(fixed_s, planned.fixed_s * self.judging.factor * SAFETY)
            spec = replace(spec, fixed_s=max(fixed_s, self.judged_s * JUDGING_SPREAD))
        return spec

    def paced_specs(self) -> dict[str, StageSpec]:
        return {name: self.spec(name) for name in self.specs}


def plan(state: ScheduleState, specs: dict[str, StageSpec], now: datetime) -> None:
    """(Re)write planned start and end of every stage not finished yet, from ``now``."""
    open_stages = [s for s in state.stages if s.status not in FINISHED]
    deadline = state.deadline_dt()
    remaining = (deadline - now).total_seconds() if deadline else None
    for record, planned in zip(open_stages, forecast([specs[s.name] for s in open_stages], now, remaining)):
        record.planned_start = planned.start.isoformat(timespec="seconds")
        record.planned_end = planned.end.isoformat(timespec="seconds")


def drive(nights: list[Night], executor: Executor, clock: Callable[[], datetime] = datetime.now) -> None:
    """Run every stage not finished yet of every night on ``executor``, in order, then each night's report.

    The only place a stage's status changes: started (``running``), skipped for lack of time, done with its
    results, failed with its error line (the night goes on), stopped (left ``running`` for --resume). A stop
    signal the executor raises propagates, the running stages left as they are.
    """
    queue = [(night, record) for night in nights for record in night.state.stages
             if record.status not in FINISHED and record.kind != StageKind.REPORT]
    running: dict[StageJob, tuple[Night, StageRecord]] = {}
    try:
        while queue or running:
            while queue and executor.has_room():
                night, record = queue.pop(0)
                job = _start(night, record, executor.parallel, clock)
                if job is not None:
                    running[job] = (night, record)
                    executor.submit(job, night)
            for event in executor.wait() if running else ():
                night, record = running[event.job]
                if event.attempts:
                    _note_attempts(record, event.attempts)
                if event.outcome is not None:
                    del running[event.job]
                    _end(night, record, event.outcome, clock)
                night.state.save()
    except BaseException:  # a stop signal: the interrupted stages' stretches end now, --resume begins new ones
        for night, record in running.values():
            record.end_span(clock())
            night.state.save()
        raise
    for night in nights:
        if not executor.parallel:
            _spend_time_left(night, clock)
        _report(night, clock)


def _note_attempts(record: StageRecord, attempts: tuple[dict[str, Any], ...]) -> None:
    """A backend's attempts (Ray): the stage began when its first worker did, not when it was queued."""
    record.attempts = list(attempts)
    record.actual_start = attempts[0].get("started") or record.actual_start
    if record.spans and record.spans[-1][1] is None:
        begun = str(record.spans[-1][0])
        record.spans[-1][0] = min((a["started"] for a in attempts if (a.get("started") or "") >= begun), default=begun)


def _later(state: ScheduleState, record: StageRecord, parallel: bool) -> tuple[str, ...]:
    """The training stages after ``record`` an untimed night runs one after another: their warm starts may be
    prepared beside its own (trainer.learn.warm_start.students). None on a parallel backend (each stage is its own
    worker) or with a deadline (a student cut at its slot's end is not kept)."""
    if parallel or state.deadline is not None:
        return ()
    after = state.stages[state.stages.index(record) + 1:]
    return tuple(s.name for s in after if s.kind == StageKind.TRAIN and s.status not in FINISHED)


def _start(night: Night, record: StageRecord, parallel: bool, clock: Callable[[], datetime]) -> StageJob | None:
    """Mark ``record`` running and make its job; None when it is skipped for lack of time instead."""
    state, now = night.state, clock()
    deadline = state.deadline_dt()
    resume = record.status == RUNNING
    if night.refit is not None and record.kind == StageKind.TRAIN and deadline is not None and not parallel:
        fitting = [s.name for s in state.stages[state.stages.index(record):]
                   if s.kind == StageKind.TRAIN and s.status not in FINISHED]
        _refit_warm_start(night, (deadline - now).total_seconds(), fitting)
    spec = night.spec(record.name)
    reserve, floor_steps, kept_after, flat_ends, past_target, spare = spec.fixed_s, 0, 0.0, True, 0, 0.0
    if deadline is not None and parallel:  # side by side: its own evaluation and the report
        reserve += sum(night.spec(s.name).fixed_s for s in state.stages if s.kind == StageKind.REPORT)
    elif deadline is not None:  # one after another: what the stages after it are planned to take
        later = [s for s in state.stages[state.stages.index(record):] if s.status not in FINISHED]
        left = (deadline - now).total_seconds()
        if not night.lean and short_of_time([night.spec(s.name) for s in later], left):
            night.lean = True
            logs.get().warning("the night is short of time: the agents left confirm their picks on the training "
                               "simulator, not in CityLearn (every reported figure is still CityLearn's)",
                               left_s=round(left), pace=f"{night.pace.factor:.2f}x")
        spec = night.spec(record.name)
        reserve = reserve_s([night.spec(s.name) for s in later], left)
        # The slot leaves its least learning at the plan's speed; a machine slower than planned then gave a busy
        # 20-minute night's PPO 16,384 steps: it learns on to them, from what the stages after can spare.
        floor_steps = min(LEARNING_KEPT_STEPS, record.timesteps_target) if record.kind == StageKind.TRAIN else 0
        kept_after = kept_after_s([night.spec(s.name) for s in later])
        flat_ends = any(s.kind == StageKind.TRAIN for s in later[1:])
        stretched = int(record.timesteps_target * night.past_target)
        if not flat_ends and record.kind == StageKind.TRAIN and stretched > record.timesteps_target:
            past_target = stretched
            # The time left's evaluations are not its to learn on in; its own warm start, where it leaves it, only
            # when judging it is not free (A2C's are PPO's imitation weights, judged once).
            spare = night.spare_s(night.ctx, night.lean and not spec.shares_warm_start)
    job = StageJob(str(night.ctx.run.root), night.ctx.site, record.name, record.kind,
                   record.timesteps_target, resume, night.force, deadline.timestamp() if deadline else None,
                   reserve, spec.steps_per_s, spec.setup_s, night.lean, _later(state, record, parallel),
                   floor_steps, kept_after, flat_ends, past_target, spare)
    if not parallel:  # it starts now: the slot is known
        record.time_limit_s, skipped = job.slot(now.timestamp())
        if skipped is not None:
            _end(night, record, StageOutcome(skipped=skipped), clock)
            return None
    record.status = RUNNING
    record.actual_start = record.actual_start if resume and record.actual_start else now.isoformat(timespec="seconds")
    if resume:  # a killed run left its stretch open: it ended with the stage's last write (none: it is not counted)
        record.end_span(min(_last_write(night.ctx.run.agent(record.name).root) or datetime.min, now))
    record.begin_span(now)
    state.save()
    index = state.stages.index(record)
    # The night's live status: which stage of how many, and when this stage and the night should end.
    logs.get().info("stage started", stage=record.name, of=f"{index + 1}/{len(state.stages)}", kind=str(record.kind),
                    resume=resume, time_limit_s=record.time_limit_s, ends=_clock(record.planned_end),
                    night_ends=_clock(state.stages[-1].planned_end), run=night.ctx.run.root.name)
    return job


def _refit_warm_start(night: Night, left_s: float, fitting: list[str]) -> None:
    """Before each warm start of the agents ``fitting`` (this stage's and the later ones'): the ensemble the night's
    first plan left out, where the time left at the night's pace now affords it (the references and the
    calibration, both padded, often took less; a flat curve may end a stage minutes early); the config every later
    stage and a resume read (config.yaml) then has it. Asked until it is taken."""
    assert night.refit is not None
    fitted = night.refit(left_s, night.pace.factor, fitting)
    if fitted is None:
        return
    night.refit = None
    cfg, night.specs, why = fitted
    night.ctx = with_fitted_warm_start(night.ctx, cfg)
    logs.get().info(f"warm start, planned again before {fitting[0]}'s stage: {why}", pace=f"{night.pace.factor:.2f}x",
                    left_s=round(left_s))


def _end(night: Night, record: StageRecord, outcome: StageOutcome, clock: Callable[[], datetime]) -> None:
    log = logs.get()
    if outcome.stopped is not None:  # stays running: --resume continues it
        record.end_span(clock())
        log.warning("stage stopped", stage=record.name, detail=outcome.stopped)
        return
    if outcome.time_limit_s is not None:
        record.time_limit_s = outcome.time_limit_s
    if outcome.error is not None:
        _finish(night.state, record, FAILED, clock, error=outcome.error.splitlines()[0][:500])
        log.error("stage failed", stage=record.name, error=record.error)
        return
    if outcome.skipped is not None:
        _finish(night.state, record, SKIPPED, clock, error=outcome.skipped)
        log.warning("stage skipped", stage=record.name, reason=record.error)
        return
    result = outcome.metrics or {}
    record.timesteps_done = int(result.get("timesteps") or 0)
    record.checkpoint = result.get("checkpoint")
    record.status = DONE
    kept = night.keep(record.name, result)
    # Every finished stage's figures as results.json now has them: a reference that finished before the baseline
    # (side by side on Ray) gets its comparison with it once the baseline is in.
    for done in night.state.stages:
        figures = kept.get(done.name) if isinstance(kept, dict) else (result if done is record else None)
        if done.status == DONE and figures is not None:
            done.results = {k: figures.get(k) for k in RESULT_KEYS if k in figures} or None
    _finish(night.state, record, DONE, clock)
    log.info("stage done", stage=record.name, seconds=record.seconds(), run=night.ctx.run.root.name)
    _follow_the_pace(night, record, result, clock)


def _follow_the_pace(night: Night, record: StageRecord, result: dict[str, Any], clock: Callable[[], datetime]) -> None:
    """Measure the machine's pace on what ``record`` took beyond its training, and plan the rest again at it (the
    stages' slots and warm starts follow: ``_start`` reads the paced specs)."""
    spec, taken = night.specs.get(record.name), record.seconds()
    if spec is None or taken is None or result.get("reused_from"):
        return
    spec = spec.leaned() if night.lean else spec  # what it was planned to take as it ran
    if record.kind == StageKind.TRAIN:  # its training ran to its slot: its warm start and evaluations are the news
        night.judged_s = max(night.judged_s, float(result.get("judged_s") or 0.0))
        if result.get("train_wall_s") is None:
            return
        taken -= float(result["train_wall_s"])
        night.judging.add(spec.fixed_s, taken - float(result.get("warm_start_s") or 0.0))
        if not (result.get("warm_start") or {}).get("stopped_at_its_time"):
            night.pace.add(spec.fixed_s + spec.setup_s, taken)
            return _replanned(night, clock)
        taken -= float(result.get("warm_start_s") or 0.0)  # cut at its box: only its evaluations say how fast
    night.pace.add(spec.fixed_s, taken)
    _replanned(night, clock)


def _replanned(night: Night, clock: Callable[[], datetime]) -> None:
    plan(night.state, night.paced_specs(), clock())
    night.state.save()
    pace = night.pace
    later = [s for s in night.state.stages if s.status not in FINISHED]
    upcoming = [f"{s.name} {_clock(s.planned_start)}-{_clock(s.planned_end)}" for s in later]
    if pace.factor >= pace.said + PACE_WORTH_SAYING:
        pace.said = pace.factor
        logs.get().warning("the night's stages take longer than calibrated (the machine is busier): the rest is "
                           "planned again at their pace", pace=f"{pace.factor:.2f}x", next=upcoming)
    elif pace.factor <= pace.said - PACE_WORTH_SAYING:
        pace.said = pace.factor
        logs.get().info("the night's stages take less time than calibrated: the rest is planned again at their "
                        "pace, the estimates' padding given to the stages after", pace=f"{pace.factor:.2f}x",
                        next=upcoming)


def _spend_time_left(night: Night, clock: Callable[[], datetime]) -> None:
    """A timed night whose stages ended before their plan (a flat curve, a target reached, evaluations padded): the
    time left before the report's own goes to what a stage left for lack of time (``Night.spare``). One process only:
    on Ray the report waits for stages still running elsewhere. A failure there costs the comparison, not the night."""
    deadline = night.state.deadline_dt()
    report = next((r for r in night.state.stages if r.kind == StageKind.REPORT), None)
    if deadline is None or report is None or report.status in FINISHED:
        return
    until, started = deadline.timestamp() - night.spec(report.name).fixed_s, clock()
    if until <= started.timestamp():
        return
    try:
        did = night.spare(night.ctx, until)
    except Exception as exc:  # the figures every stage wrote are kept; the report says what stays unevaluated
        logs.get().warning("the time left was not used: the report follows", error=f"{type(exc).__name__}: {exc}")
    else:
        if did:
            night.state.time_left = TimeLeft(started.isoformat(timespec="seconds"),
                                             clock().isoformat(timespec="seconds"), list(did))
    plan(night.state, night.paced_specs(), clock())  # the report from now, as the schedule then says
    night.state.save()


def _report(night: Night, clock: Callable[[], datetime]) -> None:
    """The report stage, in the driver's process once every other stage of the night has finished."""
    record = next((r for r in night.state.stages if r.kind == StageKind.REPORT), None)
    if record is None or record.status in FINISHED:
        return
    record.status, record.actual_start = RUNNING, clock().isoformat(timespec="seconds")
    record.begin_span(clock())
    night.state.save()
    logs.get().info("stage started", stage=record.name, of=f"{len(night.state.stages)}/{len(night.state.stages)}",
                    kind=str(record.kind), resume=False, time_limit_s=None, ends=_clock(record.planned_end),
                    night_ends=_clock(record.planned_end), run=night.ctx.run.root.name)
    try:
        night.report()
    except Exception as exc:  # the report of a finished night must not lose it: said, and failed
        _end(night, record, StageOutcome(error=f"{type(exc).__name__}: {exc}"), clock)
        return
    _finish(night.state, record, DONE, clock)
    logs.get().info("stage done", stage=record.name, seconds=record.seconds(), run=night.ctx.run.root.name)


def _finish(
    state: ScheduleState, record: StageRecord, status: Status, clock: Callable[[], datetime], error: str | None = None
) -> None:
    record.status = status
    record.error = error
    record.actual_end = clock().isoformat(timespec="seconds")
    record.end_span(clock())
    state.save()


def _clock(iso: str | None) -> str | None:
    return f"{datetime.fromisoformat(iso):%H:%M:%S}" if iso else None


def _last_write(folder: Path) -> datetime | None:
    """When anything in a stage's folder was last written (its checkpoints come every 1,000 steps)."""
    times = [path.stat().st_mtime for path in folder.rglob("*") if path.is_file()] if folder.is_dir() else []
    return datetime.fromtimestamp(max(times)) if times else None
