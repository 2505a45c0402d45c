"""The schedule's state machine on fake stages: no training, a fake clock."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest

from trainer.base.durations import parse_duration, resolve_finish_by
from trainer.base.errors import UsageError
from trainer.night.budget import SAFETY, StageSpec, allocate, forecast, timeline
from trainer.night.state import JUDGING_SPREAD, Night, StageEvent, StageJob, StageOutcome, drive, plan
from trainer.run.folder import RunDir
from trainer.run.schedule_file import DONE, FAILED, PENDING, RUNNING, SKIPPED, ScheduleState, StageRecord
from trainer.site import SCHEMA, Site

START = datetime(2026, 11, 22, 22, 0, 0)
# Targets far beyond an hour's training, so timed runs end by their slots.
STAGES = [("baseline", "eval", 0), ("rbc", "eval", 0), ("sac", "train", 100_000), ("ppo", "train", 500_000),
          ("a2c", "train", 500_000), ("report", "report", 0)]
SPEEDS = {"sac": 10.0, "ppo": 100.0, "a2c": 100.0}
WEIGHTS = {"sac": 2.0, "ppo": 1.0, "a2c": 1.0}
EVAL_S, REPORT_S = 60.0, 30.0


class Interrupt(Exception):
    pass


SPECS = {name: StageSpec(name, "train", EVAL_S, WEIGHTS[name], target, SPEEDS[name]) if kind == "train" else
         StageSpec(name, kind, REPORT_S if kind == "report" else EVAL_S) for name, kind, target in STAGES}


class FakeExecutor:
    """A backend whose stages take exactly their estimated time on a fake clock, one after another."""

    parallel = False

    def __init__(self, clock, interrupt_at: str | None = None, fail: str | None = None, speed_factor: float = 1.0,
                 judging_factor: float | None = None, judged_share: float | None = None):
        self.clock = clock
        self.interrupt_at = interrupt_at
        self.fail = fail
        self.speed_factor = speed_factor
        # An agent's evaluation takes this share of its estimate, and its metrics say how long it learnt (None: they
        # do not, and the night measures no pace on it).
        self.judging_factor = judging_factor
        # Of its estimate, what the agent's final judging took (its metrics' judged_s; None: they do not say).
        self.judged_share = judged_share
        self.calls: list[tuple] = []
        self.jobs: list[StageJob] = []
        self.pending: StageJob | None = None

    def has_room(self):
        return self.pending is None

    def submit(self, job, night):
        self.pending = job

    def wait(self):
        job, self.pending = self.pending, None
        self.jobs.append(job)
        if job.kind == "eval":
            self.calls.append(("eval", job.name))
        else:
            limit, _ = job.slot(self.clock().timestamp())  # the driver skipped it if there was no time
            self.calls.append(("train", job.name, job.target, limit, job.resume))
        if job.name == self.interrupt_at:
            self.clock.advance(5)
            raise Interrupt(job.name)
        if job.name == self.fail:
            return [StageEvent(job, StageOutcome(error=f"RuntimeError: {job.name} exploded\nsecond line"))]
        if job.kind == "eval":
            self.clock.advance(EVAL_S)
            return [StageEvent(job, StageOutcome(metrics={"co2_kg_per_year": 100.0}))]
        speed = SPEEDS[job.name] * self.speed_factor
        seconds = job.target / speed if limit is None else min(job.target / speed, limit)
        if limit is not None and job.past_target > job.target:  # a night's last stage learns on past its target,
            # to its slot's end less what the time left's evaluations take
            seconds = min(max(seconds, limit - job.spare_s), job.past_target / speed, limit)
        learnt = {} if self.judging_factor is None else {"train_wall_s": seconds, "warm_start_s": 0.0}
        if self.judged_share is not None:
            learnt["judged_s"] = self.judged_share * EVAL_S
        self.clock.advance(seconds + EVAL_S * (self.judging_factor or 1.0))
        return [StageEvent(job, StageOutcome(metrics={"timesteps": int(seconds * speed), **learnt,
                                                      "checkpoint": f"{job.name}/checkpoints/x"}))]

    def report(self):
        self.calls.append(("report",))
        self.clock.advance(REPORT_S)


class Clock:
    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def new_state(tmp_path, deadline: datetime | None, clock: Clock, runner=None) -> ScheduleState:
    state = ScheduleState.new(tmp_path / "schedule.json", STAGES, clock(), deadline)
    plan(state, SPECS, clock())
    state.save()
    return state


def with_warm_starts(setup_s: float, steps_per_s: float | None = None) -> dict[str, StageSpec]:
    """SPECS with a warm start of ``setup_s`` before each training stage (and every agent at ``steps_per_s``)."""
    return {name: replace(spec, setup_s=setup_s, steps_per_s=steps_per_s or spec.steps_per_s)
            if spec.kind == "train" else spec for name, spec in SPECS.items()}


def one_night(tmp_path, specs: dict[str, StageSpec], runner, clock: Clock, deadline: datetime) -> Night:
    """A night of STAGES planned from ``specs`` and driven on ``runner`` to its end."""
    state = ScheduleState.new(tmp_path / "schedule.json", STAGES, clock(), deadline)
    plan(state, specs, clock())
    night = Night(SimpleNamespace(run=RunDir(tmp_path), site=Site(SCHEMA, tmp_path / "schema.json", None, {})),
                  state, specs, report=runner.report)
    drive([night], runner, clock)
    return night


def run(state: ScheduleState, executor: FakeExecutor, clock: Clock) -> ScheduleState:
    """The night's driver on the fake backend: the stages, then the report."""
    folder = state.path.parent
    ctx = SimpleNamespace(run=RunDir(folder), site=Site(SCHEMA, folder / "schema.json", None, {}))
    drive([Night(ctx, state, SPECS, report=executor.report)], executor, clock)
    return state


# ------------------------------------------------------------------ time math


@pytest.mark.parametrize(
    "text, seconds", [("10h", 36000), ("90m", 5400), ("1h30m", 5400), ("8m", 480), ("45s", 45), ("2.5h", 9000)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "ten hours", "0h", "-5m"])
def test_bad_duration_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--budget expects a duration like 10h"):
        parse_duration(text)


@pytest.mark.parametrize("now, text, expected", [
    (datetime(2026, 11, 22, 22, 0), "07:00", datetime(2026, 11, 23, 7, 0)),   # across midnight
    (datetime(2026, 11, 22, 6, 0), "07:00", datetime(2026, 11, 22, 7, 0)),    # later today
    (datetime(2026, 11, 22, 7, 0), "07:00", datetime(2026, 11, 23, 7, 0)),    # now is already past
    (datetime(2026, 12, 31, 23, 50), "00:30", datetime(2027, 1, 1, 0, 30)),   # across the year
])
def test_finish_by_means_the_next_such_time(now, text, expected):
    assert resolve_finish_by(text, now) == expected


@pytest.mark.parametrize("text", ["7", "24:00", "07:60", "seven"])
def test_bad_finish_by_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--finish-by expects a local time HH:MM"):
        resolve_finish_by(text, START)


# ------------------------------------------------------------------ allocation


def specs(**targets):
    return [StageSpec(a, "train", 0.0, WEIGHTS[a], t, SPEEDS[a]) for a, t in targets.items()]


def test_budget_is_split_by_weight_when_every_target_is_out_of_reach():
    assert allocate(specs(sac=10**9, ppo=10**9, a2c=10**9), 4000) == [2000, 1000, 1000]


def test_a_stage_that_needs_less_gives_the_rest_to_the_others():
    # ppo needs 500 s of its 1000 s share: the 500 s left go to sac and a2c by weight (2:1).
    alloc = allocate(specs(sac=10**9, ppo=50_000, a2c=10**9), 4000)
    assert alloc == pytest.approx([2000 + 500 * 2 / 3, 500, 1000 + 500 / 3])


def test_fixed_costs_come_off_the_top():
    stages = [StageSpec("baseline", "eval", 600), *specs(sac=10**9)]
    assert allocate(stages, 3600) == [0.0, 3000.0]


def test_without_a_budget_each_stage_gets_what_its_target_needs():
    assert allocate(specs(sac=1000, ppo=5000), None) == [100.0, 50.0]


# ------------------------------------------------------------------ the state machine


def test_untimed_schedule_runs_every_stage_to_its_target(tmp_path):
    clock = Clock(START)
    runner = FakeExecutor(clock)
    state = run(new_state(tmp_path, None, clock, runner), runner, clock)
    assert [s.status for s in state.stages] == [DONE] * 6
    assert [s.timesteps_done for s in state.stages[2:5]] == [100_000, 500_000, 500_000]
    assert all(c[3] is None for c in runner.calls if c[0] == "train")  # no time limits


def test_timed_schedule_ends_by_the_deadline_and_stages_end_on_time(tmp_path):
    clock = Clock(START)
    deadline = START + timedelta(hours=1)
    runner = FakeExecutor(clock)
    state = run(new_state(tmp_path, deadline, clock, runner), runner, clock)
    assert [s.status for s in state.stages] == [DONE] * 6
    assert clock() <= deadline
    # 3600 s - 5 evaluations x 60 s - 30 s report = 3270 s of training, split 2:1:1.
    limits = [c[3] for c in runner.calls if c[0] == "train"]
    assert limits[0] == pytest.approx(3270 / 2, abs=0.1)
    sac = state.stages[2]
    assert sac.timesteps_done == int(limits[0] * SPEEDS["sac"])  # ended by its slot, short of its target


def test_a_warm_start_runs_inside_its_stage_s_slot_and_later_ones_keep_theirs(tmp_path):
    setup = 120.0  # each training stage's warm start, before it trains

    class WarmStarting(FakeExecutor):
        def wait(self):
            job = self.pending
            if job.kind == "train":  # the warm start takes its time out of the stage's own limit
                limit, _ = job.slot(self.clock().timestamp())
                self.calls.append(("train", job.name, job.target, limit, job.resume))
                self.pending = None
                self.clock.advance(setup)
                seconds = min(job.target / SPEEDS[job.name], limit - setup)
                self.clock.advance(seconds + EVAL_S)
                return [StageEvent(job, StageOutcome(metrics={"timesteps": int(seconds * SPEEDS[job.name]),
                                                              "checkpoint": f"{job.name}/checkpoints/x"}))]
            return super().wait()

    clock = Clock(START)
    deadline = START + timedelta(hours=1)
    runner = WarmStarting(clock)
    state = one_night(tmp_path, with_warm_starts(setup), runner, clock, deadline).state
    assert [s.status for s in state.stages] == [DONE] * 6 and clock() <= deadline
    # 3600 s - 5 evaluations x 60 s - 30 s report - 3 warm starts x 120 s = 2910 s of training, split 2:1:1;
    # sac's slot holds its own warm start and its training, and leaves ppo's and a2c's warm starts to them.
    limits = [c[3] for c in runner.calls if c[0] == "train"]
    assert limits[0] == pytest.approx(setup + 2910 / 2, abs=0.1)
    assert state.stages[2].timesteps_done == int(2910 / 2 * SPEEDS["sac"])


class WarmStarting(FakeExecutor):
    """Training stages with a warm start of ``setup`` seconds (stopped at its part of the slot), then learning at
    ``speed`` steps/s to the target or the slot's end."""

    def __init__(self, clock, setup: float, speed: float):
        super().__init__(clock)
        self.setup, self.speed, self.warm_starts = setup, speed, []

    def wait(self):
        job = self.pending
        if job.kind != "train":
            return super().wait()
        limit, skipped = job.slot(self.clock().timestamp())
        assert skipped is None, skipped
        self.calls.append(("train", job.name, job.target, limit, job.resume))
        self.pending = None
        warm = min(self.setup, job.warm_start_s(limit))  # it stops at its part of the slot
        self.warm_starts.append(warm)
        seconds = min(job.target / self.speed, limit - warm)
        self.clock.advance(warm + seconds + EVAL_S)
        return [StageEvent(job, StageOutcome(metrics={"timesteps": round(seconds * self.speed),
                                                      "checkpoint": f"{job.name}/checkpoints/x"}))]


def test_warm_starts_longer_than_the_night_shrink_in_proportion_and_no_agent_is_skipped(tmp_path):
    """Warm starts of 1,500 s each (a busy machine's pace) and the least learning each agent keeps (20,000 steps:
    200 s at 100 steps/s) do not fit in the hour: each training stage gets the time beside the evaluations in
    proportion to its warm start and learning, stops its warm start where it would leave less than that learning,
    and learns. Before, sac's slot kept nothing for itself (the later stages' warm starts and learning took 3,610 s
    of the 3,480 left) and it was skipped."""
    clock = Clock(START)
    deadline = START + timedelta(hours=1)
    runner = WarmStarting(clock, 1500.0, 100.0)
    state = one_night(tmp_path, with_warm_starts(1500.0, 100.0), runner, clock, deadline).state
    assert [s.status for s in state.stages] == [DONE] * 6 and clock() <= deadline
    # 3,480 s left after the references, 210 s of them evaluations and the report: three agents needing 1,700 s
    # each share 3,270 s, so 1,090 s each (a2c takes what is left: the same).
    limits = [c[3] for c in runner.calls if c[0] == "train"]
    assert limits == pytest.approx([1090, 1090, 1090], abs=0.2)
    assert runner.warm_starts == pytest.approx([890, 890, 890], abs=0.2)  # each stops 200 s before its slot's end
    assert [s.timesteps_done for s in state.stages[2:5]] == [20_000, 20_000, 20_000]


def test_the_plan_of_a_short_night_is_what_the_driver_then_does(tmp_path):
    """The plan (`trainer plan`'s and the night's first screen, schedule.json's planned times) forecasts what the
    driver does with a night its warm starts outlast: each warm start cut to its part of the slot, each agent
    learning its 20,000 steps, the night ending by its deadline. The plan of every stage whole said 0 steps for
    each agent of a 20-minute built-in night the driver then trained."""
    specs = with_warm_starts(1500.0, 100.0)
    planned = forecast([specs[name] for name, _, _ in STAGES], START, 3600.0)
    clock = Clock(START)
    runner = WarmStarting(clock, 1500.0, 100.0)
    state = one_night(tmp_path, specs, runner, clock, START + timedelta(hours=1)).state
    trained = [p for p in planned if p.target_steps]
    assert [p.setup_s for p in trained] == pytest.approx(runner.warm_starts, abs=0.2)
    assert [p.setup_s + p.train_s for p in trained] == pytest.approx([c[3] for c in runner.calls if c[0] == "train"],
                                                                      abs=0.2)
    assert [p.planned_steps for p in trained] == [s.timesteps_done for s in state.stages[2:5]] == [20_000] * 3
    assert [p.planned_setup_s for p in trained] == [1500.0] * 3 and not any(p.skipped or p.lean for p in planned)
    assert planned[-1].end == clock() <= START + timedelta(hours=1)


def test_the_plan_of_a_night_short_of_its_evaluations_goes_lean_as_the_driver_does():
    """Evaluations as planned outlast the hour (1,200 s each): the plan leans (each agent confirms on the training
    simulator in 200 s) as the driver does, rather than plan 0 steps for every agent."""
    specs = {name: StageSpec(spec.name, spec.kind, 1200.0, spec.weight, spec.target_steps, spec.steps_per_s,
                             lean_fixed_s=200.0) if spec.kind == "train" else spec for name, spec in SPECS.items()}
    whole = timeline([specs[name] for name, _, _ in STAGES], START, 3600.0)  # every stage as planned, not leaned
    planned = forecast([specs[name] for name, _, _ in STAGES], START, 3600.0)
    assert [p.planned_steps for p in whole if p.target_steps] == [0, 0, 0]
    assert all(p.lean for p in planned if p.target_steps)
    assert [p.train_s for p in planned if p.target_steps] == pytest.approx([2850 / 2, 2850 / 4, 2850 / 4], abs=1)


def test_a_plan_with_no_time_for_an_agent_says_it_is_skipped():
    """The driver skips a stage with no time left for training; the plan says so rather than plan it 0 steps, and
    gives the last agent the evaluations the skipped ones do not run (2 x 60 s: 12,000 steps at 100 steps/s)."""
    planned = forecast([SPECS[name] for name, _, _ in STAGES], START, 2 * EVAL_S + 3 * EVAL_S + REPORT_S)
    assert [p.skipped for p in planned] == [False, False, True, True, False, False]
    assert planned[2].notes == ["no time left for training: 0 s in the plan (~0 steps) before the deadline"]
    assert planned[4].planned_steps == 12_000 and planned[-1].end == START + timedelta(seconds=330)


def test_the_pace_scales_a_stage_s_lean_evaluation_as_its_full_one():
    """A night short of time plans its stages' lean evaluations: at twice the estimates' pace those take twice theirs
    too (the lean figure had stayed at the calibration's, so a busy night's slots overran)."""
    from trainer.night.state import Pace

    pace = Pace()
    pace.add(100.0, 200.0)
    spec = replace(SPECS["sac"], setup_s=30.0, lean_fixed_s=20.0)
    paced = pace.of(spec)
    assert (paced.fixed_s, paced.setup_s, paced.steps_per_s) == (2 * EVAL_S, 60.0, SPEEDS["sac"] / 2)
    assert paced.leaned().fixed_s == 40.0
    assert pace.of(SPECS["sac"]).lean_fixed_s is None  # a stage with no leaner evaluation has none at any pace


def test_a_machine_slower_than_calibrated_is_followed_and_the_night_still_ends_by_its_deadline(tmp_path):
    """Other work started after the calibration: every evaluation takes twice its estimate. The night measures that
    pace on its references and plans the rest at it, so the training slots shrink and it ends by its deadline (the
    plan as calibrated would overrun by every later stage's extra minute)."""
    class Busy(FakeExecutor):
        def wait(self):
            job = self.pending
            if job.kind == "eval":
                self.pending = None
                self.calls.append(("eval", job.name))
                self.clock.advance(2 * EVAL_S)
                return [StageEvent(job, StageOutcome(metrics={"co2_kg_per_year": 100.0}))]
            self.pending = None
            limit, _ = job.slot(self.clock().timestamp())
            self.calls.append(("train", job.name, job.target, limit, job.resume))
            self.clock.advance(limit + 2 * EVAL_S)
            return [StageEvent(job, StageOutcome(metrics={"timesteps": int(limit * SPEEDS[job.name]),
                                                          "train_wall_s": limit, "warm_start_s": 0.0}))]

        def report(self):
            self.calls.append(("report",))
            self.clock.advance(2 * REPORT_S)

    clock = Clock(START)
    deadline = START + timedelta(hours=1)
    runner = Busy(clock)
    state = new_state(tmp_path, deadline, clock, runner)
    folder = state.path.parent
    ctx = SimpleNamespace(run=RunDir(folder), site=Site(SCHEMA, folder / "schema.json", None, {}))
    night = Night(ctx, state, SPECS, report=runner.report)
    drive([night], runner, clock)
    assert night.pace.factor == pytest.approx(2.0)
    assert [s.status for s in state.stages] == [DONE] * 6
    # What is left after the references (3600 - 2 x 120 s) less the later evaluations and report at their pace
    # (3 x 120 + 60 s) is the training, shared 2:1:1 at half the calibrated speed.
    limits = [c[3] for c in runner.calls if c[0] == "train"]
    assert limits == pytest.approx([(3600 - 240 - 420) / 2, (3600 - 240 - 420) / 4, (3600 - 240 - 420) / 4], abs=1)
    assert clock() <= deadline
    # The schedule's plan of the stages left follows the pace: a2c was planned to end its evaluation by the report.
    assert state.stages[-1].planned_end <= deadline.isoformat()


def test_a_machine_faster_than_calibrated_gives_the_later_stages_the_padding_and_no_more(tmp_path):
    """A calibration made beside work that has since stopped: the references take half their estimate. The rest is
    planned at the pace floored at the estimates unpadded (MIN_PACE = 1 / SAFETY), so sac's slot grows by the
    padding of what is planned after it, and the night still ends by its deadline."""
    from trainer.night.state import MIN_PACE

    class Quiet(FakeExecutor):
        def wait(self):
            job = self.pending
            self.pending = None
            if job.kind == "eval":
                self.calls.append(("eval", job.name))
                self.clock.advance(EVAL_S / 2)
                return [StageEvent(job, StageOutcome(metrics={"co2_kg_per_year": 100.0}))]
            limit, _ = job.slot(self.clock().timestamp())
            self.calls.append(("train", job.name, job.target, limit, job.resume))
            self.clock.advance(limit + EVAL_S)
            return [StageEvent(job, StageOutcome(metrics={"timesteps": int(limit * SPEEDS[job.name]),
                                                          "train_wall_s": limit, "warm_start_s": 0.0}))]

    clock = Clock(START)
    deadline = START + timedelta(hours=1)
    runner = Quiet(clock)
    state = new_state(tmp_path, deadline, clock, runner)
    night = Night(SimpleNamespace(run=RunDir(tmp_path), site=Site(SCHEMA, tmp_path / "schema.json", None, {})),
                  state, SPECS, report=runner.report)
    drive([night], runner, clock)
    assert night.pace.factor == pytest.approx(MIN_PACE) and MIN_PACE == pytest.approx(1 / 1.15)
    # 3,540 s left after the references (2 x 30 s); the three agents' evaluations and the report planned at the pace:
    # sac's half of the training is larger than at the calibrated pace (3,540 - 210) / 2.
    sac_limit = [c[3] for c in runner.calls if c[0] == "train"][0]
    assert sac_limit == pytest.approx((3540 - 210 * MIN_PACE) / 2, abs=1) and sac_limit > (3540 - 210) / 2
    assert [s.status for s in state.stages] == [DONE] * 6
    # Here the agents' evaluations take their whole padded estimate, not the references' pace: the night ends late by
    # less than that padding (3 x 60 s x (1 - MIN_PACE) = 23 s; 11.7 s), inside the 2 % of the budget (72 s) that
    # docs/schedule.md allows.
    late = (clock() - deadline).total_seconds()
    assert 0 < late < 3 * EVAL_S * (1 - MIN_PACE) < 0.02 * 3600


def test_the_ensemble_left_out_is_asked_again_before_each_warm_start_until_it_is_taken(tmp_path):
    """A night whose first plan left the warm start's ensemble out asks again when each training stage starts, with
    the seconds left, the pace its stages showed and the agents still to train: where it now fits, that stage and
    every later one (and a resume: config.yaml) run it, planned with its warm starts, and it is not asked again;
    where it still does not fit, nothing changes."""
    from trainer.config.loading import load_config
    from trainer.run.folder import RunContext

    asked = []
    with_ensemble = with_warm_starts(300.0)

    def refit(left_s, pace, fitting):
        asked.append((round(left_s), pace, fitting))
        # Fitted from the night's config, which its site settled (a dataset's: SAC at 64x64).
        return load_config().on_site(one_period=True), with_ensemble, "the mean of 10 imitations: ..."

    clock = Clock(START)
    deadline = START + timedelta(hours=1)
    runner = FakeExecutor(clock)
    state = new_state(tmp_path, deadline, clock, runner)
    run_dir = RunDir(tmp_path)
    single = load_config(overrides=["warm_start.ensemble=1"]).on_site(one_period=True)  # as the night's site did
    ctx = RunContext(single, run_dir, Site(SCHEMA, tmp_path / "schema.json", None, {}), "cpu")
    night = Night(ctx, state, SPECS, report=runner.report, refit=refit)
    drive([night], runner, clock)
    assert asked == [(3600 - 2 * EVAL_S, 1.0, ["sac", "ppo", "a2c"])]  # after the two references, before sac: taken
    assert night.refit is None and night.specs is with_ensemble and night.ctx.cfg.warm_start.ensemble == 10
    assert load_config([run_dir.config]).warm_start.ensemble == 10  # what a resume reads
    # Every agent's job carried its warm start as planned with the ensemble.
    assert [c[1] for c in runner.calls if c[0] == "train"] == ["sac", "ppo", "a2c"]

    def night_asking(folder, taken_before: str | None) -> tuple[Night, list[list[str]]]:
        """A night in ``folder`` driven to its end whose ensemble fits once ``taken_before``'s stage starts (None:
        never); the agents it was asked for, each time."""
        folder.mkdir()
        clock = Clock(START)
        runner = FakeExecutor(clock)
        state = new_state(folder, deadline, clock, runner)
        ctx = RunContext(single, RunDir(folder), Site(SCHEMA, folder / "schema.json", None, {}), "cpu")
        fittings = []

        def refit(left_s, pace, fitting):
            fittings.append(fitting)
            return (load_config().on_site(one_period=True), with_ensemble,
                    "the mean of 10 imitations: ...") if fitting[0] == taken_before \
                else None

        night = Night(ctx, state, SPECS, report=runner.report, refit=refit)
        drive([night], runner, clock)
        return night, fittings

    # Where it still does not fit: nothing changes.
    night, fittings = night_asking(tmp_path / "later", None)
    assert fittings == [["sac", "ppo", "a2c"], ["ppo", "a2c"], ["a2c"]]  # before each stage, with the agents left
    assert night.ctx.cfg is single and night.specs is SPECS
    assert not RunDir(tmp_path / "later").config.exists()

    # Taken before a later stage (an earlier one's curve went flat and left it time): that stage on run it.
    night, fittings = night_asking(tmp_path / "third", "ppo")
    assert fittings == [["sac", "ppo", "a2c"], ["ppo", "a2c"]] and night.refit is None
    assert night.specs is with_ensemble and load_config([RunDir(tmp_path / "third").config]).warm_start.ensemble == 10


def test_a_night_short_of_time_goes_lean_rather_than_skip_an_agent(tmp_path):
    """Where the agents' evaluations as planned (the pick confirmed over held-out years in CityLearn) and the least
    learning each keeps outlast the night, the agents left confirm on the training simulator: each trains, none is
    skipped, and the night ends by its deadline."""
    full, lean = 900.0, 200.0
    specs = {name: StageSpec(spec.name, spec.kind, full, spec.weight, spec.target_steps, spec.steps_per_s,
                             lean_fixed_s=lean) if spec.kind == "train" else spec for name, spec in SPECS.items()}

    class Leaning(FakeExecutor):
        def wait(self):
            job = self.pending
            if job.kind != "train":
                return super().wait()
            self.pending = None
            limit, skipped = job.slot(self.clock().timestamp())
            assert skipped is None
            self.calls.append(("train", job.name, job.target, limit, job.lean))
            self.clock.advance(limit + (lean if job.lean else full))
            return [StageEvent(job, StageOutcome(metrics={"timesteps": int(limit * SPEEDS[job.name]),
                                                          "train_wall_s": limit, "warm_start_s": 0.0}))]

    clock = Clock(START)
    deadline = START + timedelta(hours=1)
    runner = Leaning(clock)
    night = one_night(tmp_path, specs, runner, clock, deadline)
    state = night.state
    trained = [c for c in runner.calls if c[0] == "train"]
    assert night.lean and [c[4] for c in trained] == [True, True, True]
    # By its deadline, to the stages' whole seconds (the pace they give, 0.999, plans a2c's 200 s at 199.8).
    assert [s.status for s in state.stages] == [DONE] * 6 and clock() <= deadline + timedelta(seconds=1)
    # 3600 s less two references, three lean evaluations and the report: 2,850 s of training, shared 2:1:1.
    assert [c[3] for c in trained] == pytest.approx([2850 / 2, 2850 / 4, 2850 / 4], abs=1)


def test_unused_time_goes_to_the_stages_after(tmp_path):
    clock = Clock(START)
    runner = FakeExecutor(clock, speed_factor=4.0)  # sac reaches its target in a quarter of the planned time
    state = new_state(tmp_path, START + timedelta(hours=2), clock, runner)
    run(state, runner, clock)
    train = [c for c in runner.calls if c[0] == "train"]
    sac_limit, ppo_limit = train[0][3], train[1][3]
    used_by_sac = 100_000 / (SPEEDS["sac"] * 4)
    planned_ppo = (7200 - 5 * EVAL_S - REPORT_S) / 4
    assert used_by_sac < sac_limit
    assert ppo_limit > planned_ppo  # ppo got part of what sac left


@pytest.mark.parametrize("deadline, parallel, last_learns_on", [(START + timedelta(hours=2), False, True),
                                                                (None, False, False),
                                                                (START + timedelta(hours=2), True, False)])
def test_a_timed_night_s_last_stage_learns_through_a_flat_curve(tmp_path, deadline, parallel, last_learns_on):
    """A flat curve ends a stage (train.patience) so that the stages after it get its time: one process with a
    deadline lets its last training stage learn on, as nothing after it could use the time; an untimed night, or
    stages side by side on Ray (each in a slot of its own), keep the rule for every stage."""
    clock = Clock(START)
    runner = FakeExecutor(clock)
    runner.parallel = parallel
    run(new_state(tmp_path, deadline, clock, runner), runner, clock)
    flat_ends = {job.name: job.flat_ends for job in runner.jobs if job.kind == "train"}
    assert flat_ends == {"sac": True, "ppo": True, "a2c": not last_learns_on}


@pytest.mark.parametrize("deadline, parallel, stretch, learns_on", [(START + timedelta(hours=2), False, 8.0, True),
                                                                  (None, False, 8.0, False),
                                                                  (START + timedelta(hours=2), True, 8.0, False),
                                                                  (START + timedelta(hours=2), False, 1.0, False)])
def test_a_timed_night_s_last_stage_learns_on_past_its_target_to_its_slot_s_end(tmp_path, deadline, parallel,
                                                                                 stretch, learns_on):
    """Every agent reaches its target in a quarter of its plan: one process with a deadline lets its last training
    stage learn on past its target (schedule.last_stage_past_target) to its slot's end, which keeps what the
    warm starts left unevaluated would take in the time left, so the night ends that long before its deadline, not
    hours early. Untimed, side by side, or at 1: it stops at its target."""
    clock = Clock(START)
    runner = FakeExecutor(clock, speed_factor=4.0)
    runner.parallel = parallel
    state = new_state(tmp_path, deadline, clock, runner)
    asked = []

    def spare_s(ctx, own):  # the warm starts' evaluations the time left would run
        asked.append(own)
        return 120.0

    ctx = SimpleNamespace(run=RunDir(tmp_path), site=Site(SCHEMA, tmp_path / "schema.json", None, {}))
    drive([Night(ctx, state, SPECS, report=runner.report, spare_s=spare_s, past_target=stretch)], runner, clock)
    past = {job.name: job.past_target for job in runner.jobs if job.kind == "train"}
    assert past == {"sac": 0, "ppo": 0, "a2c": 4_000_000 if learns_on else 0}
    assert asked == ([False] if learns_on else [])
    if learns_on:  # its slot to the deadline less its evaluation, the report and the warm starts' 120 s
        assert clock() == deadline - timedelta(seconds=120)
    elif not parallel and deadline is not None:
        assert clock() < deadline - timedelta(minutes=30)  # at its target: the night ends early


def test_the_time_left_s_evaluations_never_take_the_last_stage_s_slot_to_its_target(tmp_path):
    """What the warm starts left unevaluated would take is kept from the last stage's learning past its target, not
    from its slot: where that is more than the slot (a busy 20-minute night kept 200 s for two warm starts with 200 s
    left, and skipped A2C), it still learns to its target, and stops there."""
    clock = Clock(START)
    runner = FakeExecutor(clock, speed_factor=4.0)
    deadline = START + timedelta(hours=2)
    state = new_state(tmp_path, deadline, clock, runner)
    ctx = SimpleNamespace(run=RunDir(tmp_path), site=Site(SCHEMA, tmp_path / "schema.json", None, {}))
    drive([Night(ctx, state, SPECS, report=runner.report, spare_s=lambda ctx, own: 3 * 3600.0, past_target=8.0)],
          runner, clock)
    a2c = next(job for job in runner.jobs if job.name == "a2c")
    assert (a2c.past_target, a2c.spare_s) == (4_000_000, 3 * 3600.0)
    assert a2c.reserve_s == pytest.approx(EVAL_S + REPORT_S)  # its evaluation and the report's
    record = next(s for s in state.stages if s.name == "a2c")
    assert (record.status, record.timesteps_done) == (DONE, 500_000)
    assert clock() < deadline - timedelta(minutes=30)  # at its target: the evaluations it kept for get their time


@pytest.mark.parametrize("shares, counts_its_own", [(False, True), (True, False)])
def test_a_lean_night_s_last_stage_keeps_its_own_warm_start_s_evaluation_unless_it_is_an_earlier_one_s(
        tmp_path, shares, counts_its_own):
    """A night short of time leaves each warm start unevaluated; its last stage, learning on past its target, keeps
    the time left's evaluation of its own too, unless its warm start is an earlier stage's weights (A2C starts from
    PPO's imitation, judged once in the process): that one costs nothing and is not kept for (a busy 20-minute night
    ended 40 s early on it)."""
    clock = Clock(START)
    runner = FakeExecutor(clock, speed_factor=4.0)
    state = new_state(tmp_path, START + timedelta(hours=2), clock, runner)
    asked = []

    def spare_s(ctx, own):
        asked.append(own)
        return 0.0

    specs = {**SPECS, "a2c": replace(SPECS["a2c"], shares_warm_start=shares)}
    ctx = SimpleNamespace(run=RunDir(tmp_path), site=Site(SCHEMA, tmp_path / "schema.json", None, {}))
    drive([Night(ctx, state, specs, report=runner.report, spare_s=spare_s, past_target=8.0, lean=True)], runner,
          clock)
    assert asked == [counts_its_own]


@pytest.mark.parametrize("judging_factor, a2c_eval_s", [(None, EVAL_S), (1.0, EVAL_S), (0.3, 0.3 * EVAL_S * SAFETY)])
def test_a_later_agent_s_evaluation_is_planned_at_what_the_earlier_agents_took(tmp_path, judging_factor, a2c_eval_s):
    """Every agent's evaluation takes 0.3 of its estimate: from SAC's on, the later agents' are planned at that,
    padded (SAFETY), so the last stage's slot keeps 20.7 s for it, not 60 (a reference's evaluation follows the
    night's pace alone, at least the estimate unpadded). Evaluations as planned (1.0) change nothing; nor does a
    night that has measured none. The night ends by its deadline, within seconds, either way."""
    clock = Clock(START)
    runner = FakeExecutor(clock, judging_factor=judging_factor)
    deadline = START + timedelta(hours=2)
    state = new_state(tmp_path, deadline, clock, runner)
    ctx = SimpleNamespace(run=RunDir(tmp_path), site=Site(SCHEMA, tmp_path / "schema.json", None, {}))
    night = Night(ctx, state, SPECS, report=runner.report)
    drive([night], runner, clock)
    assert [s.status for s in state.stages] == [DONE] * 6
    assert night.spec("a2c").fixed_s == pytest.approx(a2c_eval_s, rel=0.02)  # the stages' times in whole seconds
    assert night.spec("rbc").fixed_s >= EVAL_S / SAFETY - 1e-9
    a2c = next(job for job in runner.jobs if job.name == "a2c")
    assert a2c.reserve_s == pytest.approx(a2c_eval_s + night.spec("report").fixed_s, rel=0.02)
    assert abs((deadline - clock()).total_seconds()) < 5


@pytest.mark.parametrize("says_judged", [True, False])
def test_a_later_agent_s_evaluation_keeps_at_least_what_an_earlier_agent_s_judging_took(tmp_path, says_judged):
    """A2C's evaluation is planned at half the others' (its warm start is PPO's, judged once), and every agent's
    evaluation, all of it the final judging, takes half its estimate. At the earlier agents' pace alone A2C would keep
    about half its own estimate, padded (a quarter of theirs), for a judging that takes half of theirs, and the night
    would end past its deadline (a busy 20-minute night's A2C ended 3 s late so). With the agents' judged_s the later
    agent keeps at least the longest judging yet, padded, and the night ends by its deadline."""
    clock = Clock(START)
    runner = FakeExecutor(clock, judging_factor=0.5, judged_share=0.5 if says_judged else None)
    deadline = START + timedelta(hours=2)
    state = new_state(tmp_path, deadline, clock, runner)
    ctx = SimpleNamespace(run=RunDir(tmp_path), site=Site(SCHEMA, tmp_path / "schema.json", None, {}))
    specs = {**SPECS, "a2c": replace(SPECS["a2c"], fixed_s=EVAL_S / 2)}
    night = Night(ctx, state, specs, report=runner.report)
    drive([night], runner, clock)
    assert [s.status for s in state.stages] == [DONE] * 6
    ended = (clock() - deadline).total_seconds()
    if says_judged:
        assert night.spec("a2c").fixed_s == pytest.approx(0.5 * EVAL_S * JUDGING_SPREAD, rel=0.02)
        assert -0.5 * EVAL_S * (JUDGING_SPREAD - 1) - 5 < ended <= 0  # early by what the spread kept, no more
    else:  # kept less than its judging takes: late by the difference
        assert night.spec("a2c").fixed_s < 0.5 * EVAL_S
        assert ended > 5


def test_a_resumed_night_whose_last_agent_is_done_lets_the_one_before_learn_on(tmp_path):
    clock = Clock(START)
    runner = FakeExecutor(clock)
    state = new_state(tmp_path, START + timedelta(hours=2), clock, runner)
    next(s for s in state.stages if s.name == "a2c").status = DONE  # a resumed night: it had ended
    run(state, runner, clock)
    assert {job.name: job.flat_ends for job in runner.jobs if job.kind == "train"} == {"sac": True, "ppo": False}


@pytest.mark.parametrize("deadline, parallel, spends", [(START + timedelta(hours=2), False, True),
                                                        (None, False, False),
                                                        (START + timedelta(hours=2), True, False)])
def test_the_time_a_timed_night_s_stages_leave_is_spent_before_the_report(tmp_path, deadline, parallel, spends):
    """Every agent reaches its target long before its slot's end (4x the planned speed): one process with a deadline
    hands the time left before the report's own (its estimate) to ``Night.spare``, then writes the report; an
    untimed night, or stages side by side on Ray, go straight to the report."""
    clock = Clock(START)
    runner = FakeExecutor(clock, speed_factor=1000.0)
    runner.parallel = parallel
    state = new_state(tmp_path, deadline, clock, runner)
    ctx = SimpleNamespace(run=RunDir(tmp_path), site=Site(SCHEMA, tmp_path / "schema.json", None, {}))

    def spare(given, until: float) -> list[str]:
        runner.calls.append(("spare", given is ctx, until, clock().timestamp()))
        clock.advance(100)
        return ["a2c", "ppo"]  # their warm starts evaluated

    drive([Night(ctx, state, SPECS, report=runner.report, spare=spare)], runner, clock)
    assert runner.calls[-1] == ("report",)
    spent = [c for c in runner.calls if c[0] == "spare"]
    if not spends:
        assert spent == [] and ScheduleState.load(state.path).time_left is None
        return
    [(_, same, until, at)] = spent
    assert same and runner.calls[-2][0] == "spare"
    assert until == (deadline - timedelta(seconds=REPORT_S)).timestamp() and at < until - 3600
    assert [s.status for s in state.stages] == [DONE] * len(STAGES)
    report = state.stages[-1]  # planned again after the time spent: it starts when it did
    assert report.planned_start == report.actual_start
    assert datetime.fromisoformat(report.actual_start).timestamp() == at + 100
    # schedule.json says when the time left was spent, and on what (the timeline and the report draw it).
    kept = ScheduleState.load(state.path).time_left
    assert (datetime.fromisoformat(kept.start).timestamp(), datetime.fromisoformat(kept.end).timestamp()) \
        == (at, at + 100)
    assert kept.warm_starts_evaluated == ["a2c", "ppo"]


def test_a_failure_in_the_time_left_costs_the_night_nothing(tmp_path):
    from structlog.testing import capture_logs

    clock = Clock(START)
    runner = FakeExecutor(clock, speed_factor=1000.0)
    state = new_state(tmp_path, START + timedelta(hours=2), clock, runner)
    ctx = SimpleNamespace(run=RunDir(tmp_path), site=Site(SCHEMA, tmp_path / "schema.json", None, {}))

    def spare(given, until: float) -> None:
        raise RuntimeError("CityLearn fell over")

    with capture_logs() as logged:
        drive([Night(ctx, state, SPECS, report=runner.report, spare=spare)], runner, clock)
    assert runner.calls[-1] == ("report",) and state.stages[-1].status == DONE and state.time_left is None
    [warning] = [e for e in logged if e["event"] == "the time left was not used: the report follows"]
    assert warning["error"] == "RuntimeError: CityLearn fell over"


def test_state_is_written_at_every_change(tmp_path):
    clock = Clock(START)
    runner = FakeExecutor(clock, interrupt_at="ppo")
    state = new_state(tmp_path, START + timedelta(hours=1), clock, runner)
    with pytest.raises(Interrupt):
        run(state, runner, clock)
    saved = json.loads((tmp_path / "schedule.json").read_text())
    assert [s["status"] for s in saved["stages"]] == [DONE, DONE, DONE, RUNNING, PENDING, PENDING]
    assert saved["stages"][2]["actual_end"] and saved["stages"][3]["actual_start"]
    assert saved["stages"][4]["planned_start"] is not None


@pytest.mark.parametrize("stage", [name for name, _, _ in STAGES[:-1]])
def test_resume_after_an_interruption_at_each_stage(tmp_path, stage):
    clock = Clock(START)
    deadline = START + timedelta(hours=1)
    first = FakeExecutor(clock, interrupt_at=stage)
    state = new_state(tmp_path, deadline, clock, first)
    with pytest.raises(Interrupt):
        run(state, first, clock)
    finished_before = [s.name for s in state.stages if s.status == DONE]

    clock.advance(60)  # the restart takes a minute
    resumed_state = ScheduleState.load(tmp_path / "schedule.json")
    second = FakeExecutor(clock)
    plan(resumed_state, SPECS, clock())
    run(resumed_state, second, clock)
    assert [s.status for s in resumed_state.stages] == [DONE] * 6
    rerun = [c[1] if len(c) > 1 else "report" for c in second.calls]
    assert not set(finished_before) & set(rerun)  # finished stages are not redone
    assert rerun[0] == stage
    train_call = next((c for c in second.calls if c[0] == "train" and c[1] == stage), None)
    if train_call:
        assert train_call[4] is True  # the interrupted training stage resumes from its checkpoint
    assert clock() <= deadline  # re-planned to the same deadline


def test_a_failed_stage_is_recorded_and_the_night_goes_on(tmp_path):
    clock = Clock(START)
    runner = FakeExecutor(clock, fail="sac")
    state = run(new_state(tmp_path, None, clock, runner), runner, clock)
    assert [s.status for s in state.stages] == [DONE, DONE, FAILED, DONE, DONE, DONE]
    assert state.stages[2].error == "RuntimeError: sac exploded"
    assert [s.name for s in state.failed()] == ["sac"]


def test_a_stage_with_no_time_left_is_skipped(tmp_path):
    clock = Clock(START)
    runner = FakeExecutor(clock)
    # The evaluations and the report take 330 s of the 336: 6 s of training are not worth a model.
    state = new_state(tmp_path, START + timedelta(seconds=336), clock, runner)
    run(state, runner, clock)
    statuses = {s.name: s.status for s in state.stages}
    assert statuses["baseline"] == statuses["rbc"] == statuses["report"] == DONE
    assert SKIPPED in (statuses["sac"], statuses["ppo"], statuses["a2c"])
    skipped = next(s for s in state.stages if s.status == SKIPPED)
    assert skipped.error.startswith("no time left for training")


def test_a_resumed_stage_counts_the_time_it_ran_not_the_hours_the_night_was_stopped(tmp_path):
    clock = Clock(START)
    first = FakeExecutor(clock, interrupt_at="sac")
    state = new_state(tmp_path, None, clock, first)
    with pytest.raises(Interrupt):
        run(state, first, clock)
    stopped = ScheduleState.load(tmp_path / "schedule.json").stages[2]
    assert stopped.status == RUNNING
    began, stopped_at = START + timedelta(seconds=2 * EVAL_S), START + timedelta(seconds=2 * EVAL_S + 5)
    assert stopped.spans == [[began.isoformat(), stopped_at.isoformat()]]

    clock.advance(4 * 3600)  # the night waits four hours for --resume
    resumed = ScheduleState.load(tmp_path / "schedule.json")
    run(resumed, FakeExecutor(clock), clock)
    sac = resumed.stages[2]
    assert len(sac.spans) == 2 and all(end for _, end in sac.spans)
    assert sac.seconds() == 5 + 100_000 / SPEEDS["sac"] + EVAL_S  # the stopped run's 5 s and the resumed run's
    assert sac.actual_start == sac.spans[0][0]  # the first start still says when the stage began
    assert sac.spans[1][0] == (stopped_at + timedelta(hours=4)).isoformat()


def test_a_killed_run_s_stretch_ends_with_the_stage_s_last_write(tmp_path):
    clock = Clock(START)
    state = new_state(tmp_path, None, clock)
    for reference in state.stages[:2]:
        reference.status = DONE
    sac = state.stages[2]
    sac.status, sac.actual_start, sac.spans = RUNNING, START.isoformat(), [[START.isoformat(), None]]  # SIGKILL
    state.save()
    checkpoint = tmp_path / "sac" / "checkpoints" / "sac_1000_steps.zip"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"x")
    last_write = START + timedelta(minutes=7)
    os.utime(checkpoint, (last_write.timestamp(), last_write.timestamp()))

    clock.advance(3600)
    run(state, FakeExecutor(clock), clock)
    assert sac.spans[0] == [START.isoformat(), last_write.isoformat()]
    assert sac.spans[1][0] == (START + timedelta(hours=1)).isoformat()


def test_a_schedule_without_spans_reads_its_start_and_end():
    record = StageRecord("sac", "train", DONE, actual_start=START.isoformat(),
                         actual_end=(START + timedelta(seconds=90)).isoformat())
    assert record.stretches() == [(START.isoformat(), (START + timedelta(seconds=90)).isoformat())]
    assert record.seconds() == 90


def test_a_night_that_trained_nothing_says_so_per_agent_and_exits_3(tmp_path):
    from trainer.base.errors import NothingTrained
    from trainer.night.budget import StageKind
    from trainer.night.runner import raise_for_failures, untrained

    state = ScheduleState.new(tmp_path / "schedule.json", [(n, StageKind(k), t) for n, k, t in STAGES], START, None)
    for stage in state.stages:
        stage.status = DONE
    sac, ppo, a2c = state.stages[2:5]
    sac.status, sac.error = SKIPPED, "no time left for training"
    run = RunDir(tmp_path)
    assert untrained(state) == ["sac: skipped (no time left for training)",
                                "ppo: trained 0 steps; it deploys its warm start, untrained",
                                "a2c: trained 0 steps; it deploys its warm start, untrained"]
    with pytest.raises(NothingTrained, match="the night trained no agent") as raised:
        raise_for_failures(state, run)
    assert raised.value.exit_code == 3
    a2c.timesteps_done = 61_440  # one agent trained: the night did its work, and says what the others did
    raise_for_failures(state, run)
    assert untrained(state)[-1] == "ppo: trained 0 steps; it deploys its warm start, untrained"
