"""`trainer plan`: measured speeds, a cached calibration, and configs that cannot fit."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainer.base.beside import in_turn
from trainer.cli.main import cli
from trainer.sim.simulators import VECTOR, Simulator
from trainer.site import Site, SiteKind

from .conftest import own_cache, variant


def plan(tmp_path, *args: str):
    return CliRunner().invoke(cli, ["plan", "--device", "cpu", "--set", f"output.root={tmp_path}",
                                    "--set", "schedule.eval_days=2", *args])


def _a_year_of_one_site(tmp_path) -> Site:
    """A dataset of one period, a year long: only its schema, all the plan reads."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"simulation_start_time_step": 0, "simulation_end_time_step": 8759}))
    return Site.load(schema)


def test_plan_calls_out_sac_with_1024_updates_per_step(tmp_path, monkeypatch):
    cache = own_cache(tmp_path, monkeypatch)  # the calibration is kept in the user's cache, not the outputs
    result = plan(tmp_path, "--budget", "10h", "--agents", "sac",
                  "--set", "sac.gradient_steps=2048", "--set", "sac.train_freq=2")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    stage = next(row for row in lines if " sac " in row)
    assert "train " in stage and "/150,000 steps" in stage
    # On a loaded machine the plan may also say SAC's warm start is cut short: that note may come first.
    notes = [row for row in lines if row.strip().startswith("! sac:")]
    note = next(row for row in notes if "gradient updates" in row)
    assert "gradient_steps=2048 / train_freq=2 = 1024 gradient updates per environment step" in note
    assert "with gradient_steps=1, train_freq=1 it would do" in note
    cached = list((cache / "pvbess-trainer" / "calibration").glob("*.json"))
    assert not (tmp_path / ".calibration").exists()
    assert len(cached) == 1
    speeds = json.loads(cached[0].read_text())
    assert speeds["update_s"]["sac"] > 0 and speeds["train_steps_per_s"]["sac"] < speeds["env_steps_per_s"]["sac"] / 100


def test_second_plan_uses_the_cached_calibration(tmp_path, monkeypatch):
    cache_root = own_cache(tmp_path, monkeypatch)
    monkeypatch.setattr("trainer.night.calibrate.others_load", lambda: 0.0)  # a quiet machine, whatever runs beside
    many = ("--set", "a2c.timesteps=100000000")
    first = plan(tmp_path, "--budget", "30m", "--agents", "a2c", *many)
    assert first.exit_code == 0, first.output
    # After the references, the warm start's nine years of demonstrations and its imitation, A2C's evaluations and
    # the report, under 25 minutes are left (on a loaded 2-core machine, 15 minutes left none): 100 million steps
    # would need over 65,000 steps/s (A2C does 13,000-30,000 on the training simulator on 2 cores).
    assert "of its 100,001,792 timesteps" in first.output
    cache = next((cache_root / "pvbess-trainer" / "calibration").glob("*.json"))
    speeds = json.loads(cache.read_text())
    # A2C alone tonight, taught by SAC's members: the calibration times SAC's imitation too.
    assert set(speeds["imitation_update_s"]) == {"a2c", "sac"} and speeds["imitation_update_s"]["sac"] > 0
    speeds["train_steps_per_s"]["a2c"] = 1e6  # a planted figure: only the cache can supply it
    cache.write_text(json.dumps(speeds))
    # An hour: at the planted speed A2C's 100 million steps take 100 s, whatever the warm start's nine years took to
    # calibrate on a loaded machine (one CI run left it 96 s of a 30-minute night).
    second = plan(tmp_path, "--budget", "1h", "--agents", "a2c", *many)
    assert second.exit_code == 0, second.output
    # 100 million steps in whole rollouts of 2,048, the number A2C trains (and the table will say)
    # (a note on a2c's warm start may still come where the calibration ran on a loaded machine)
    # (the night's last stage, it then learns on past them in the time left: schedule.last_stage_past_target)
    assert "train 100,001,792, on to ~" in second.output
    assert "of its 100,001,792 timesteps" not in second.output
    assert "! speeds measured while" not in second.output
    # Measured while other work ran: a plan from it says so while the machine is still busy ...
    speeds["busy_cores"] = 1.7
    cache.write_text(json.dumps(speeds))
    monkeypatch.setattr("trainer.night.calibrate.others_load", lambda: 1.2)
    busy = plan(tmp_path, "--budget", "1h", "--agents", "a2c", *many)
    assert "! speeds measured while other work kept ~1.7 cores busy" in busy.output
    assert "train 100,001,792, on to ~" in busy.output  # the cache still served it
    # ... and once the machine is quiet, the next plan measures again (the planted figure is gone).
    monkeypatch.setattr("trainer.night.calibrate.others_load", lambda: 0.0)
    quiet = plan(tmp_path, "--budget", "30m", "--agents", "a2c", *many)
    assert "the machine is quiet now: measuring again" in quiet.output
    assert "! speeds measured while" not in quiet.output and "of its 100,001,792 timesteps" in quiet.output


def test_budget_and_finish_by_together_exit_2(tmp_path):
    result = plan(tmp_path, "--budget", "1h", "--finish-by", "07:00")
    assert result.exit_code == 2
    assert result.output.strip().endswith("error: pass either --budget or --finish-by, not both")


def test_bad_budget_exits_2(tmp_path):
    result = plan(tmp_path, "--budget", "tonight")
    assert result.exit_code == 2
    assert "error: --budget expects a duration like 10h, 90m or 1h30m, got 'tonight'" in result.output


def test_report_refuses_a_folder_without_results(tmp_path):
    result = CliRunner().invoke(cli, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: no results in {tmp_path}: it has no results.json (pass a folder made by trainer train or night)")


def test_the_calibration_follows_the_simulator_agents_train_on(built_in):
    from trainer.config.loading import load_config
    from trainer.night.calibrate import _cache_key

    citylearn = _cache_key(load_config(overrides=["train.simulator=citylearn"]), built_in, "cpu")
    simulated = _cache_key(load_config(), built_in, "cpu")
    assert citylearn != simulated  # speeds measured on one are never used for the other
    assert _cache_key(load_config(overrides=["seed=7"]), built_in, "cpu") == simulated  # each seed trains as fast


def test_calibration_measures_the_environments_the_night_trains_on(built_in, monkeypatch):
    import pytest

    from trainer.config.loading import load_config
    from trainer.night import calibrate

    asked = []

    def factory(simulator, cfg, site, n_envs, subprocesses=False):
        asked.append((simulator.name, n_envs))
        raise RuntimeError("measured")

    monkeypatch.setattr(Simulator, "training_env", factory)
    cfg = load_config()  # auto: the built-in site is one the simulator models
    for measure in (lambda: calibrate._onpolicy_speed(cfg, built_in, "cpu", "ppo", VECTOR),
                    lambda: calibrate._off_policy_speed(cfg, built_in, "sac", "cpu", VECTOR, 16)):
        with pytest.raises(RuntimeError, match="measured"):
            measure()
    assert asked == [("vector", 64), ("vector", 16)]


def test_sac_on_many_sites_is_costed_per_site(built_in, monkeypatch, tmp_path):
    from trainer.config.loading import load_config
    from trainer.night import calibrate

    # 1,000 env steps/s with no updates, 20 ms an update: one update per 16 sites' step.
    monkeypatch.setattr(calibrate, "_off_policy_speed",
                        lambda cfg, schema, agent, device, simulator, n_envs: (1000.0, 0.02))
    monkeypatch.setattr(calibrate, "_eval_speed", lambda cfg, schema: 100.0)
    monkeypatch.setattr(calibrate, "_imitation_speed",
                        lambda cfg, schema, agent, device, simulator: (0.004, 0.002, "p"))
    cfg = load_config(overrides=[f"output.root={tmp_path}"])
    speeds = calibrate.calibrate(cfg, built_in, "cpu", ["sac"], refresh=True)
    assert speeds.imitation_update_s == {"sac": 0.004} and speeds.imitation_policy == {"sac": "p"}  # on by default
    assert speeds.imitation_actor_update_s == {"sac": 0.002}
    assert speeds.train_steps_per_s["sac"] == pytest.approx(1 / (0.02 / 16 + 1 / 1000))
    on_citylearn = calibrate.calibrate(load_config(overrides=[f"output.root={tmp_path}", "train.simulator=citylearn"]),
                                       built_in, "cpu", ["sac"], refresh=True)
    assert on_citylearn.train_steps_per_s["sac"] == pytest.approx(1 / (0.02 + 0.5 / 1000))  # learning while stepping


def test_a_plan_that_ends_well_before_its_deadline_says_the_budget_is_a_cap():
    from datetime import datetime, timedelta

    from trainer.night.budget import PlannedStage
    from trainer.night.plan import render

    start = datetime(2026, 11, 25, 22, 0)
    planned = [PlannedStage("ppo", start, start + timedelta(minutes=30), 1700.0, 2_000_000, 2_000_000),
               PlannedStage("report", start + timedelta(minutes=30), start + timedelta(minutes=31), 0.0, 0, 0)]

    class Speeds:
        machine, measured_at, busy, busier_now = "test box", "today", False, False

    text = render(planned, start + timedelta(hours=8), [], Speeds())
    assert ("the night ends 7.5 h early: the budget is a cap, and the agents' timesteps (ppo.timesteps 2,000,000) "
            "end the night; to use the time, raise them (--set ppo.timesteps=...)") in text
    assert "ends" not in render(planned, start + timedelta(minutes=35), [], Speeds()).split("planned end")[1]


def test_a_short_night_s_plan_says_which_warm_start_stops_early_which_agent_is_skipped_and_that_it_goes_lean():
    from datetime import datetime, timedelta
    from types import SimpleNamespace

    from trainer.config.loading import load_config
    from trainer.night.budget import PlannedStage
    from trainer.night.plan import fit_warnings, render

    start = datetime(2026, 12, 1, 22, 0)
    end = start + timedelta(minutes=20)
    planned = [PlannedStage("sac", start, end, 60.0, 30_000, 150_000, setup_s=300.0, planned_setup_s=900.0, lean=True),
               PlannedStage("ppo", end, end, 0.0, 0, 500_000, ["no time left for training: 3 s in the plan (~9 steps) "
                                                               "before the deadline"], skipped=True, lean=True)]
    speeds = SimpleNamespace(machine="test box", measured_at="today", busy=False, busier_now=False,
                             train_steps_per_s={"sac": 500.0, "ppo": 3000.0}, update_s={})
    notes = fit_warnings(load_config(), speeds, planned)
    assert notes == [
        "the night is short of time: the agents confirm their picks on the training simulator, not in CityLearn "
        "(every reported figure is still CityLearn's)",
        "sac: its warm start stops after ~5.0 of its ~15.0 min with the best it has, to leave learning time",
        "sac: 1 min at ~500 steps/s reaches ~30,000 of its 150,000 timesteps; to finish, set sac.timesteps to 30,000 "
        "or give the night more time",
        "ppo: skipped, no time left for training: 3 s in the plan (~9 steps) before the deadline; give the night more "
        "time, or fewer --agents"]
    text = render(planned, end, notes, speeds)
    assert "ppo      skipped: no time left for training" in text and "train 30,000/150,000 steps" in text


def test_the_plan_counts_each_warm_start_and_the_night_s_demonstrations_once(built_in, tmp_path, monkeypatch):
    import math

    from trainer.config.loading import load_config
    from trainer.night import plan as night_plan
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import (
        CHECKED_EPOCHS_SHARE,
        DEMONSTRATION_SOLVE_S,
        POLICY_CALL_S,
        SAFETY,
        SIM_STEP_SHARE,
        warm_start_s,
    )

    # One core free, whatever this machine's: every year replayed and labelled in the stage's process (two: below).
    monkeypatch.setattr(night_plan, "free_cores", lambda others=None: 1)
    # 400 epochs of 8,759 samples in minibatches of 256; three more years of the built-in site (eight by default,
    # counted below); five SAC members (warm_start.teacher: sac), then each agent's student's 1,200 epochs.
    five = ["warm_start.ensemble=5", "warm_start.student_epochs=1200", "warm_start.member_processes=1",
            "warm_start.extra_draws=3"]
    cfg = load_config(overrides=five)
    assert cfg.warm_start.teacher == "sac"
    speeds = Speeds(eval_steps_per_s=1000.0, train_steps_per_s={}, imitation_update_s={"sac": 0.003, "ppo": 0.001})
    an_epoch = math.ceil(8759 / 256)
    members, student = 5 * 400 * an_epoch, 1200 * an_epoch
    year = 8759 / 1000.0 * SAFETY + DEMONSTRATION_SOLVE_S
    # The members' mean action over the four years, on the training simulator (it steps the built-in site as
    # CityLearn does).
    labels_s = (4 * SIM_STEP_SHARE / 1000.0 + 5 * POLICY_CALL_S) * 8759 * SAFETY
    estimate = warm_start_s(cfg, built_in, speeds, ["sac", "ppo"])
    # SAC imitates the members, labels their mean and fits its student; PPO, after it, its student alone.
    assert estimate["sac"] == pytest.approx((members + student) * 0.003 * SAFETY + 4 * year + labels_s)
    assert estimate["ppo"] == pytest.approx(student * 0.001 * SAFETY)
    # The actor alone timed too (a calibration of this version): the members fit nothing else, the student its
    # critic in its first warm_start.student_critic_epochs (400) only.
    actors = Speeds(eval_steps_per_s=1000.0, train_steps_per_s={}, imitation_update_s={"sac": 0.003, "ppo": 0.001},
                    imitation_actor_update_s={"sac": 0.001, "ppo": 0.0005})
    student_s = {"sac": (400 * 0.003 + 800 * 0.001) * an_epoch, "ppo": (400 * 0.001 + 800 * 0.0005) * an_epoch}
    assert warm_start_s(cfg, built_in, actors, ["sac", "ppo"]) == pytest.approx(
        {"sac": (members * 0.001 + student_s["sac"]) * SAFETY + 4 * year + labels_s, "ppo": student_s["ppo"] * SAFETY})
    # Members that may become a stage's start (warm_start.pick_best) fit their critic too.
    picking = load_config(overrides=[*five, "warm_start.pick_best=true"])
    assert warm_start_s(picking, built_in, actors, ["sac"])["sac"] == pytest.approx(
        (members * 0.003 + student_s["sac"]) * SAFETY + 4 * year + labels_s
        + 6 * 2 * 8759 * POLICY_CALL_S * SAFETY)
    # Members side by side in two processes: three rounds of the five.
    two = load_config(overrides=[*five, "warm_start.member_processes=2"])
    assert warm_start_s(two, built_in, speeds, ["sac"])["sac"] == pytest.approx(
        (3 * 400 * an_epoch + student) * 0.003 * SAFETY + 4 * year + labels_s)
    # PPO first, or alone: it imitates SAC's members at SAC's speed.
    taught_first = members * 0.003 * SAFETY + 4 * year + labels_s
    assert warm_start_s(cfg, built_in, speeds, ["ppo", "sac"]) == pytest.approx(
        {"ppo": student * 0.001 * SAFETY + taught_first, "sac": student * 0.003 * SAFETY})
    # Each agent its own members: PPO's at its own speed, beside SAC's.
    own = load_config(overrides=[*five, "warm_start.teacher=own"])
    assert warm_start_s(own, built_in, speeds, ["sac", "ppo"])["ppo"] == pytest.approx(
        (members + student) * 0.001 * SAFETY + labels_s)
    one = load_config(overrides=["warm_start.ensemble=1", "warm_start.extra_draws=3"])
    single = 400 * an_epoch  # one imitation's minibatches
    assert warm_start_s(one, built_in, speeds, ["ppo"])["ppo"] == pytest.approx(single * 0.001 * SAFETY + 4 * year)
    # warm_start.pick_best: the members and the student, one call each a step over the two held-out years; only an
    # agent whose members are its own policy can start from one of them.
    pick_s = 6 * 2 * 8759 * POLICY_CALL_S * SAFETY
    picks = load_config(overrides=[*five, "warm_start.pick_best=true"])
    assert warm_start_s(picks, built_in, speeds, ["sac", "ppo"]) == pytest.approx(
        {"sac": estimate["sac"] + pick_s, "ppo": estimate["ppo"]})
    # A dataset resamples its own days into as many years; a kind that draws none has its one year; with the warm
    # start off there is nothing to count.
    # Each member of a dataset's imitation also drives its last 28 days at 25, 50, 100, 200 and 400 epochs, and
    # stops after two of them no better than its best: counted at CHECKED_EPOCHS_SHARE of its epochs.
    other = tmp_path / "schema.json"
    other.write_text(json.dumps({"simulation_start_time_step": 0, "simulation_end_time_step": 8759}))
    checks_s = 5 * 5 * 28 * 24 * (1 / 1000.0 + POLICY_CALL_S) * SAFETY
    in_citylearn = 4 * 8759 * (1 - SIM_STEP_SHARE) / 1000.0 * SAFETY  # its labels' four years: not the simulator
    unchecked = (1 - CHECKED_EPOCHS_SHARE) * members * 0.003 * SAFETY
    assert warm_start_s(cfg, Site.load(other), speeds, ["ppo"])["ppo"] == pytest.approx(
        warm_start_s(cfg, built_in, speeds, ["ppo"])["ppo"] + checks_s + in_citylearn - unchecked)
    # With warm_start.members_kept=0.5 its members are ranked by a drive over those 28 days each, and the best half
    # of them (3 of 5) make the mean: two members fewer to call for each label.
    ranked_s = 5 * 28 * 24 * (1 / 1000.0 + POLICY_CALL_S) * SAFETY - 2 * POLICY_CALL_S * 8759 * SAFETY
    halved = load_config(overrides=[*five, "warm_start.members_kept=0.5"])
    assert warm_start_s(halved, Site.load(other), speeds, ["ppo"])["ppo"] == pytest.approx(
        warm_start_s(cfg, Site.load(other), speeds, ["ppo"])["ppo"] + ranked_s)
    # By default (warm_start.extra_draws: auto) the built-in site imitates 8 other years, 5 more, a dataset 16, 13
    # more: each solved and replayed, a dataset's labelled in CityLearn, the built-in site's on the training simulator.
    eight = load_config(overrides=[*five, "warm_start.extra_draws=auto"])
    assert warm_start_s(eight, Site.load(other), speeds, ["ppo"])["ppo"] == pytest.approx(
        warm_start_s(cfg, Site.load(other), speeds, ["ppo"])["ppo"] + 13 * (year + 8759 / 1000.0 * SAFETY))
    assert warm_start_s(eight, built_in, speeds, ["ppo"])["ppo"] == pytest.approx(
        warm_start_s(cfg, built_in, speeds, ["ppo"])["ppo"] + 5 * (year + SIM_STEP_SHARE * 8759 / 1000.0 * SAFETY))
    labels_of_one_year = (1 / 1000.0 + 5 * POLICY_CALL_S) * 8759 * SAFETY
    one_period = Site.load(other, SiteKind("one-period", "a dataset that draws no other year"))
    assert warm_start_s(cfg, one_period, speeds, ["ppo"])["ppo"] == pytest.approx(
        student * 0.001 * SAFETY + CHECKED_EPOCHS_SHARE * members * 0.003 * SAFETY + year + labels_of_one_year
        + checks_s)
    # The one imitation is checked too (the student, fitted to the members' labels, is not).
    assert warm_start_s(one, one_period, speeds, ["ppo"])["ppo"] == pytest.approx(
        CHECKED_EPOCHS_SHARE * single * 0.001 * SAFETY + year + 5 * 28 * 24 * (1 / 1000.0 + POLICY_CALL_S) * SAFETY)
    off = load_config(overrides=["warm_start.epochs=0"])
    assert warm_start_s(off, built_in, speeds, ["sac", "ppo"]) == {}
    # A second core free: the later half of the years replay and run the members' mean beside the stage's process,
    # which waits for its own half (two of the four years; nine of a dataset's seventeen).
    monkeypatch.setattr(night_plan, "free_cores", lambda others=None: 2)
    halves = {"sac": (members + student) * 0.003 * SAFETY + 2 * year
              + (2 * SIM_STEP_SHARE / 1000.0 + 5 * POLICY_CALL_S) * 8759 * SAFETY, "ppo": student * 0.001 * SAFETY}
    assert warm_start_s(cfg, built_in, speeds, ["sac", "ppo"]) == pytest.approx(halves)
    assert warm_start_s(eight, Site.load(other), speeds, ["ppo"])["ppo"] == pytest.approx(
        warm_start_s(cfg, Site.load(other), speeds, ["ppo"])["ppo"] + 7 * (year + 8759 / 1000.0 * SAFETY))
    assert in_turn(17, 5903, 2) == 9 and in_turn(17, 5903, 1) == 17
    assert in_turn(1, 8760, 2) == 1 and in_turn(2, 100, 2) == 2  # too short
    monkeypatch.setattr(night_plan, "free_cores", lambda others=None: 1)
    # A2C starts from PPO's policy: the night fits that student once, whichever comes first.
    shared = Speeds(eval_steps_per_s=1000.0, train_steps_per_s={},
                    imitation_update_s={"sac": 0.003, "ppo": 0.001, "a2c": 0.002},
                    imitation_policy={"sac": "sac 256x256", "ppo": "256x256", "a2c": "256x256"})
    assert warm_start_s(cfg, built_in, shared, ["ppo", "a2c"])["a2c"] == 0.0
    assert warm_start_s(cfg, built_in, shared, ["a2c", "ppo"])["ppo"] == 0.0
    # With their own members too, the second reuses them: they are the same policy's.
    assert warm_start_s(own, built_in, shared, ["ppo", "a2c"])["a2c"] == 0.0
    # On Ray each stage is a process of its own: each computes the demonstrations and the members' labels, and
    # loads the imitations an earlier one kept in the run folder (the members, the student of the same policy).
    apart = warm_start_s(cfg, built_in, shared, ["ppo", "a2c"], one_process=False)
    assert apart == pytest.approx({"ppo": student * 0.001 * SAFETY + taught_first, "a2c": 4 * year + labels_s})
    shared.imitation_policy = {}  # a calibration from before the digests: each fits its student
    assert warm_start_s(cfg, built_in, shared, ["ppo", "a2c"])["a2c"] == pytest.approx(student * 0.002 * SAFETY)


def test_a_trained_stage_counts_its_evaluations_after_training(built_in, tmp_path):
    # The deployed policy and its warm start over the evaluation (the part learnt from and the part held out), and
    # on the built-in site the confirmation of the pick against the warm start over two held-out years (four years,
    # as long as two such evaluations): left out, the last agent of a 20-minute night lost its slot to the overrun;
    # counted twice over, a busy night skipped two agents for evaluations they would not have taken that long.
    from trainer.config.loading import load_config
    from trainer.night.plan import policy_evaluations

    other = tmp_path / "schema.json"
    other.write_text(json.dumps({"simulation_start_time_step": 0, "simulation_end_time_step": 8759}))
    assert policy_evaluations(load_config(), built_in) == 4
    # Confirmed on the simulator: the deployed policy and its warm start. Short of time, the deployed policy alone
    # (the warm start's evaluation, a comparison for the report, is left to `trainer evaluate`).
    assert policy_evaluations(load_config(), built_in, on_simulator=True) == 2
    assert policy_evaluations(load_config(), built_in, lean=True) == 1
    # A dataset of one period confirms on its validation part (28 days, counted apart by stage_specs), not years.
    assert policy_evaluations(load_config(), Site.load(other)) == 2
    one_period = Site.load(other, SiteKind("one-period", "a dataset that draws no other year"))
    assert policy_evaluations(load_config(), one_period) == 2  # no other year to confirm over
    assert policy_evaluations(load_config(overrides=["train.keep_best=false"]), built_in) == 2
    assert policy_evaluations(load_config(overrides=["warm_start.epochs=0"]), built_in) == 1


def test_a_timed_night_runs_the_warm_start_s_ensemble_only_where_it_fits(built_in, tmp_path):
    from trainer.config.loading import load_config
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import ENSEMBLE_SHARE, fit_ensemble, warm_start_s

    cfg = load_config()
    speeds = Speeds(eval_steps_per_s=400.0, train_steps_per_s={}, imitation_update_s={"sac": 0.006, "ppo": 0.002})
    needed = sum(warm_start_s(cfg, built_in, speeds, ["sac", "ppo"]).values())
    # Untimed, or with time to spare: as configured.
    assert fit_ensemble(cfg, built_in, speeds, ["sac", "ppo"], None) == (cfg, None)
    assert fit_ensemble(cfg, built_in, speeds, ["sac", "ppo"], needed / ENSEMBLE_SHARE) == (cfg, None)
    # A 20-minute night: one imitation, of three other years, not eight (more pay only with the ensemble), and the
    # plan says why.
    fitted, why = fit_ensemble(cfg, built_in, speeds, ["sac", "ppo"], 1200.0)
    assert fitted.warm_start.ensemble == 1 and fitted.warm_start.epochs == 400
    assert built_in.demonstration_draws(fitted.warm_start) == 3
    members, minutes = cfg.warm_start.ensemble, round(needed / 60)
    assert why == (f"one imitation over 3 other years, not the mean of {members}: with it the warm starts would take "
                   f"~{minutes} min, over 25% of the night's 20 min (a longer night runs it)")
    # Fewer years asked for are kept as asked.
    two = load_config(overrides=["warm_start.extra_draws=2"])
    fitted, why = fit_ensemble(two, built_in, speeds, ["sac", "ppo"], 1200.0)
    assert (fitted.warm_start.ensemble, fitted.warm_start.extra_draws) == (1, 2)
    assert why.startswith(f"one imitation, not the mean of {members}")
    one = load_config(overrides=["warm_start.ensemble=1"])
    assert fit_ensemble(one, built_in, speeds, ["sac"], 60.0) == (one, None)


@pytest.mark.parametrize("kind, years", [("built-in", "other years"), ("dataset", "resampled years")])
def test_a_night_short_of_time_imitates_fewer_years_before_it_gives_up_the_ensemble(kind, years, request, tmp_path):
    from trainer.config.loading import load_config
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import ENSEMBLE_SHARE, fit_ensemble, warm_start_s

    site = request.getfixturevalue("built_in") if kind == "built-in" else _a_year_of_one_site(tmp_path)
    cfg = load_config(overrides=["warm_start.extra_draws=8"])  # auto's 8 on the built-in site (a dataset's 16: below)
    three = load_config(overrides=["warm_start.extra_draws=3"])
    speeds = Speeds(eval_steps_per_s=400.0, train_steps_per_s={}, imitation_update_s={"sac": 0.006, "ppo": 0.002})
    needed = {n: sum(warm_start_s(c, site, speeds, ["sac", "ppo"]).values()) for n, c in ((8, cfg), (3, three))}
    assert needed[8] > needed[3]
    # Room for the ensemble over three years, not over eight: three years, the ensemble kept, and the plan says so.
    fitted, why = fit_ensemble(cfg, site, speeds, ["sac", "ppo"], needed[3] / ENSEMBLE_SHARE)
    assert (fitted.warm_start.extra_draws, fitted.warm_start.ensemble) == (3, cfg.warm_start.ensemble)
    assert why.startswith(f"3 {years} imitated, not 8, to keep the mean of 10 imitations: with 8 the warm "
                          f"starts would take ~{round(needed[8] / 60)} min")
    # No room for it over three either: one imitation, of three years too (its demonstrations fit its slot).
    fitted, why = fit_ensemble(cfg, site, speeds, ["sac", "ppo"], 0.5 * needed[3] / ENSEMBLE_SHARE)
    assert (fitted.warm_start.extra_draws, fitted.warm_start.ensemble) == (3, 1)
    assert why.startswith(f"one imitation over 3 {years}, not the mean of 10")


def test_the_years_step_down_one_rung_at_a_time_and_the_plan_names_the_years_it_kept(tmp_path):
    """Sixteen years without room: eight where they fit, three where only they do (FEWER_DRAWS), and the reason
    names the years kept, not the first rung tried."""
    from trainer.config.loading import load_config
    from trainer.config.sections import FEWER_DRAWS
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import ENSEMBLE_SHARE, fit_ensemble, warm_start_s

    assert FEWER_DRAWS == (8, 3)
    dataset = _a_year_of_one_site(tmp_path)
    speeds = Speeds(eval_steps_per_s=400.0, train_steps_per_s={}, imitation_update_s={"sac": 0.006, "ppo": 0.002})
    configs = {n: load_config(overrides=[f"warm_start.extra_draws={n}"]) for n in (16, 8, 3)}
    needed = {n: sum(warm_start_s(c, dataset, speeds, ["sac", "ppo"]).values()) for n, c in configs.items()}
    assert needed[16] > needed[8] > needed[3]
    room = {n: needed[n] / ENSEMBLE_SHARE for n in needed}
    assert fit_ensemble(configs[16], dataset, speeds, ["sac", "ppo"], room[16]) == (configs[16], None)
    fitted, why = fit_ensemble(configs[16], dataset, speeds, ["sac", "ppo"], room[8])
    assert (fitted.warm_start.extra_draws, fitted.warm_start.ensemble) == (8, 10)
    assert why.startswith("8 resampled years imitated, not 16, to keep the mean of 10 imitations: with 16")
    fitted, why = fit_ensemble(configs[16], dataset, speeds, ["sac", "ppo"], room[3])
    assert (fitted.warm_start.extra_draws, fitted.warm_start.ensemble) == (3, 10)
    assert why.startswith("3 resampled years imitated, not 16, to keep the mean of 10 imitations: with 16")
    assert "; 3 resampled years imitated, not 8" in why  # each rung's figure, as it was weighed
    fitted, why = fit_ensemble(configs[16], dataset, speeds, ["sac", "ppo"], 0.5 * room[3])
    assert (fitted.warm_start.extra_draws, fitted.warm_start.ensemble) == (3, 1)
    assert why.startswith("one imitation over 3 resampled years, not the mean of 10")


def test_a_timed_night_its_targets_end_early_runs_the_ensemble_in_the_time_they_leave(built_in):
    from trainer.config.loading import load_config
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import (
        ENSEMBLE_SHARE,
        ENSEMBLE_SPARE,
        fit_ensemble,
        human_duration,
        untimed_night_s,
        warm_start_s,
    )

    # Three other years, as a night short of time for eight keeps (the step before: the test above).
    cfg = load_config(overrides=["warm_start.extra_draws=3"])
    agents, targets = ["sac", "ppo"], {"sac": 50_000, "ppo": 125_000}
    speeds = Speeds(eval_steps_per_s=400.0, train_steps_per_s={"sac": 1000.0, "ppo": 5000.0},
                    imitation_update_s={"sac": 0.006, "ppo": 0.002})
    # Each agent owed the share of its target at which a flat curve may end its stage (train.patience, 40 %).
    assert cfg.train.patience == 0.4
    whole = untimed_night_s(cfg, built_in, speeds, agents, {"sac": 20_000, "ppo": 50_000})
    available = whole / ENSEMBLE_SPARE
    # The ensemble takes more than its share of this night, but the night with it gives every agent those steps.
    assert sum(warm_start_s(cfg, built_in, speeds, agents).values()) > ENSEMBLE_SHARE * available
    assert fit_ensemble(cfg, built_in, speeds, agents, available, targets=targets) == (
        cfg, f"the mean of {cfg.warm_start.ensemble} imitations: with it every agent still reaches 40% of its "
             f"timesteps (train.patience) in ~{human_duration(whole)} of the night's {human_duration(available)}")
    # A tenth less time: the agents would not all reach them with it, so one imitation.
    fitted, why = fit_ensemble(cfg, built_in, speeds, agents, 0.9 * available, targets=targets)
    assert fitted.warm_start.ensemble == 1 and why.startswith("one imitation, not the mean of")
    # It says both figures it weighed: the warm starts' share and the whole night with them.
    assert why.endswith(f"over 25% of the night's {human_duration(0.9 * available)}, and the whole night with it "
                        f"~{human_duration(whole)} (a longer night runs it)")
    # Without train.patience every stage runs to its target, and the night owes each its whole target.
    whole = load_config(overrides=["train.patience=0"])
    long_enough = untimed_night_s(whole, built_in, speeds, agents, targets) / ENSEMBLE_SPARE
    assert fit_ensemble(whole, built_in, speeds, agents, long_enough, targets=targets)[0] == whole
    assert fit_ensemble(whole, built_in, speeds, agents, available, targets=targets)[0].warm_start.ensemble == 1


def test_after_the_references_the_ensemble_is_weighed_on_the_stages_left_at_the_night_s_pace(built_in):
    """Asked again before the first warm start (refit_ensemble), the whole night is the agents' stages and the
    report, the references run; the time left counts at the pace the night has shown."""
    from trainer.config.loading import load_config
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import fit_ensemble, human_duration, refit_ensemble, stage_specs, untimed_night_s

    # Three other years, as a night short of time for eight keeps (the step before: the test above).
    cfg = load_config(overrides=["warm_start.extra_draws=3"])
    agents, targets = ["sac", "ppo"], {"sac": 50_000, "ppo": 125_000}
    speeds = Speeds(eval_steps_per_s=400.0, train_steps_per_s={"sac": 1000.0, "ppo": 5000.0},
                    imitation_update_s={"sac": 0.006, "ppo": 0.002})
    owed = {"sac": 20_000, "ppo": 50_000}  # train.patience's 40 %
    agents_only = untimed_night_s(cfg, built_in, speeds, agents, owed, references=False)
    assert agents_only < untimed_night_s(cfg, built_in, speeds, agents, owed)  # the references counted apart
    left = 1.05 * agents_only
    # At the night's start that time would not run it: the references were still to come.
    assert fit_ensemble(cfg, built_in, speeds, agents, left, targets=targets)[0].warm_start.ensemble == 1
    fitted, specs, why = refit_ensemble(cfg, built_in, speeds, agents, targets, left, 1.0)
    assert fitted.warm_start.ensemble == cfg.warm_start.ensemble and why.startswith("the mean of 10 imitations")
    # What it weighs is the time left, and it says so (not "of the night's 20 min").
    assert why.endswith(f"in ~{human_duration(agents_only)} of the {human_duration(left)} left")
    # On a machine faster than calibrated the stages' estimates shrink with the pace; the time left is the clock's.
    why = refit_ensemble(cfg, built_in, speeds, agents, targets, 0.9 * left, 0.9)[2]
    assert why.endswith(f"in ~{human_duration(0.9 * agents_only)} of the {human_duration(0.9 * left)} left")
    assert specs["sac"].setup_s == stage_specs(cfg, built_in, speeds, agents, targets)["sac"].setup_s
    # The same seconds on a machine 20 % slower than calibrated: still one imitation.
    assert refit_ensemble(cfg, built_in, speeds, agents, targets, left, 1.2) is None
    # Asked again before PPO's stage (SAC's curve went flat early): only PPO's stage is weighed, and the specs
    # returned are every agent's, as the night's timeline needs them.
    ppo_only = untimed_night_s(cfg, built_in, speeds, ["ppo"], {"ppo": owed["ppo"]}, references=False)
    assert ppo_only < left and refit_ensemble(cfg, built_in, speeds, agents, targets, ppo_only, 1.0) is None
    fitted, specs, why = refit_ensemble(cfg, built_in, speeds, agents, targets, 1.05 * ppo_only, 1.0,
                                        fitting=["ppo"])
    assert fitted.warm_start.ensemble == cfg.warm_start.ensemble and set(specs) >= {"sac", "ppo", "report"}
    assert specs["ppo"].setup_s == stage_specs(cfg, built_in, speeds, ["ppo"], targets)["ppo"].setup_s


def test_after_the_references_a_dataset_s_night_imitates_the_years_its_first_plan_left_out(tmp_path):
    from trainer.config.loading import load_config
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import ENSEMBLE_SHARE, fit_ensemble, refit_ensemble, stage_specs, warm_start_s

    dataset = _a_year_of_one_site(tmp_path)
    cfg, targets = load_config(), {"sac": 500_000}  # warm_start.extra_draws: auto, 16 resampled years on a dataset
    # Learning too slow for the whole night to fit (ENSEMBLE_SPARE): the warm starts' share decides.
    speeds = Speeds(eval_steps_per_s=400.0, train_steps_per_s={"sac": 50.0}, imitation_update_s={"sac": 0.006})
    room = {n: warm_start_s(load_config(overrides=[f"warm_start.extra_draws={n}"]), dataset, speeds, ["sac"])["sac"]
            / ENSEMBLE_SHARE + 1 for n in (3, 8, 16)}
    current, _ = fit_ensemble(cfg, dataset, speeds, ["sac"], room[3], targets=targets)
    assert current.warm_start.extra_draws == 3  # the first plan's: three years, the ensemble kept
    # The references took less than planned: room for sixteen at the night's pace, and the night takes them.
    fitted, specs, why = refit_ensemble(cfg, dataset, speeds, ["sac"], targets, room[16], 1.0, current=current)
    assert (fitted.warm_start.extra_draws, fitted.warm_start.ensemble) == ("auto", 10)
    assert why.startswith("the mean of 10 imitations over 16 resampled years: the warm starts fit in 25% of")
    # Or the whole night with them fits: said with the years too.
    fast = Speeds(eval_steps_per_s=400.0, train_steps_per_s={"sac": 5000.0}, imitation_update_s={"sac": 0.006})
    whole = refit_ensemble(cfg, dataset, fast, ["sac"], {"sac": 50_000}, 0.9 * room[16], 1.0, current=current)[2]
    assert whole.startswith("the mean of 10 imitations over 16 resampled years: with it every agent still reaches")
    assert specs["sac"].setup_s == stage_specs(cfg, dataset, speeds, ["sac"], targets)["sac"].setup_s > \
        stage_specs(current, dataset, speeds, ["sac"], targets)["sac"].setup_s  # sixteen years' demonstrations
    # Room for three only, as the first plan had: nothing more to run.
    assert refit_ensemble(cfg, dataset, speeds, ["sac"], targets, room[3], 1.0, current=current) is None
    # Room for sixteen at the calibration's speeds is room for eight only at a pace 20 % slower: it takes eight.
    assert room[16] / 1.2 > room[8]
    fitted, _, why = refit_ensemble(cfg, dataset, speeds, ["sac"], targets, room[16], 1.2, current=current)
    assert (fitted.warm_start.extra_draws, fitted.warm_start.ensemble) == (8, 10)
    assert why.startswith("8 resampled years imitated, not 16, to keep the mean of 10 imitations")
    # Room for eight at the calibration's speeds, none at a pace 20 % slower: the first plan stands.
    assert refit_ensemble(cfg, dataset, speeds, ["sac"], targets, room[8], 1.2, current=current) is None
    # A first plan of eight years, later room for three only (before A2C's stage, say): never fewer than the stages
    # before imitated, whose student the later agent shares.
    eight, _ = fit_ensemble(cfg, dataset, speeds, ["sac"], room[8], targets=targets)
    assert eight.warm_start.extra_draws == 8
    assert fit_ensemble(cfg, dataset, speeds, ["sac"], room[3], targets=targets)[0].warm_start.extra_draws == 3
    assert refit_ensemble(cfg, dataset, speeds, ["sac"], targets, room[3], 1.0, current=eight) is None
    assert refit_ensemble(cfg, dataset, speeds, ["sac"], targets, room[8], 1.0, current=eight) is None
    assert refit_ensemble(cfg, dataset, speeds, ["sac"], targets, room[16], 1.0, current=eight)[0].warm_start \
        .extra_draws == "auto"


def test_the_night_runs_and_records_the_ensemble_its_time_affords(built_in, tmp_path):
    from datetime import datetime, timedelta

    from trainer.config.loading import load_config
    from trainer.night.calibrate import Speeds
    from trainer.night.runner import _fit_warm_start
    from trainer.run.folder import RunContext, RunDir

    run = RunDir(tmp_path / "run")
    run.create(load_config(), ["trainer", "night"], "cpu")
    ctx = RunContext(load_config(), run, built_in, "cpu")
    speeds = Speeds(eval_steps_per_s=400.0, train_steps_per_s={"sac": 500.0}, imitation_update_s={"sac": 0.006})
    now = datetime(2026, 11, 26, 22, 0)
    full = {"sac": 500_000}
    fitted, notes = _fit_warm_start(ctx, speeds, ["sac"], full, now + timedelta(minutes=20), now, True)
    assert fitted.cfg.warm_start.ensemble == 1 and notes[0].startswith("warm start: one imitation")
    assert load_config([run.config]).warm_start.ensemble == 1  # what a resume and Ray's workers read
    untimed, notes = _fit_warm_start(ctx, speeds, ["sac"], full, None, now, True)
    assert untimed is ctx and notes == []
    # An untimed run follows its size: 2,000 steps are not worth ten imitations.
    short, notes = _fit_warm_start(ctx, speeds, ["sac"], {"sac": 2_000}, None, now, True)
    assert short.cfg.warm_start.ensemble == 1
    assert notes == ["warm start: one imitation over 3 other years, not the mean of 10: the run trains 2,000 steps, "
                     "under warm_start.ensemble_min_steps (100,000), and the ensemble would take many times its "
                     "learning (a longer run imitates them)"]
    assert load_config([run.config]).warm_start.extra_draws == 3


def test_a_night_that_imitates_fewer_years_records_how_many_for_the_report(tmp_path):
    from datetime import datetime, timedelta

    from trainer.config.loading import load_config
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import ENSEMBLE_SHARE, warm_start_s
    from trainer.night.runner import _fit_warm_start
    from trainer.run.folder import RunContext, RunDir
    from trainer.run.session import record_held_out

    dataset = _a_year_of_one_site(tmp_path)
    cfg = load_config()
    run = RunDir(tmp_path / "run")
    run.create(cfg, ["trainer", "night"], "cpu")
    record_held_out(run, dataset, cfg)
    assert run.varied_years()["years"] == 16  # as the run began: warm_start.extra_draws auto on a dataset
    # Learning too slow for the whole night to fit with sixteen (ENSEMBLE_SPARE): the warm starts' share decides.
    speeds = Speeds(eval_steps_per_s=400.0, train_steps_per_s={"sac": 50.0}, imitation_update_s={"sac": 0.006})
    three = load_config(overrides=["warm_start.extra_draws=3"])
    room_s = warm_start_s(three, dataset, speeds, ["sac"])["sac"] / ENSEMBLE_SHARE + 1
    now = datetime(2026, 12, 2, 22, 0)
    fitted, notes = _fit_warm_start(RunContext(cfg, run, dataset, "cpu"), speeds, ["sac"], {"sac": 500_000},
                                    now + timedelta(seconds=room_s), now, True)
    assert fitted.cfg.warm_start.extra_draws == 3 and notes[0].startswith("warm start: 3 resampled years imitated")
    assert load_config([run.config]).warm_start.extra_draws == 3  # what a resume reads
    assert run.varied_years()["years"] == 3  # what the report says the warm start imitated


def test_the_built_in_site_confirms_on_the_simulator_and_a_shared_warm_start_is_evaluated_once(built_in,
                                                                                                 monkeypatch):
    """The stages' evaluations as the night runs them: on the built-in site the pick's confirmation runs on the
    training simulator (train.choose_on: auto), two years of it side by side; CityLearn's four years with
    train.choose_on: citylearn, the simulator's then only when short of time. A2C starts from PPO's imitation and
    reuses its evaluation."""
    from trainer.config.loading import load_config
    from trainer.night import plan
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import BESIDE_START_S, POLICY_CALL_S, SAFETY, SIM_STEP_SHARE, stage_specs

    monkeypatch.setattr(plan, "free_cores", lambda others=None: 1)  # a core of its own: the years one after another

    speeds = Speeds(eval_steps_per_s=250.0, train_steps_per_s={"sac": 800.0, "ppo": 3000.0, "a2c": 6000.0},
                    imitation_update_s={"sac": 0.003, "ppo": 0.001, "a2c": 0.001},
                    imitation_policy={"sac": "sac 256x256", "ppo": "256x256", "a2c": "256x256"})
    agents, targets = ["sac", "ppo", "a2c"], {"sac": 1000, "ppo": 2048, "a2c": 2048}
    cfg = load_config()
    year = built_in.length - 1
    assert built_in.held_out is None  # judged on its own year alone (a night's holds another year out)
    evaluation = year * (1 / 250.0 + POLICY_CALL_S) * SAFETY
    candidacy = evaluation * 28 * 24 / year  # the last policy on the validation window
    # Two years, the window's 10 best (train.shortlist) and the warm start side by side: a step of the simulator, a
    # call of each.
    def confirmed_with(policies: int) -> float:
        return 2 * built_in.length * (SIM_STEP_SHARE / 250.0 + policies * POLICY_CALL_S) * SAFETY

    confirmed = confirmed_with(11)
    specs = stage_specs(cfg, built_in, speeds, agents, targets)
    assert specs["sac"].fixed_s == pytest.approx(2 * evaluation + confirmed + candidacy)
    # Short of time: the deployed policy's evaluation, not its warm start's (left to `trainer evaluate`), and the
    # window's pick judged alone with its warm start.
    assert specs["sac"].lean_fixed_s == pytest.approx(evaluation + confirmed_with(2) + candidacy)
    assert specs["ppo"].fixed_s == specs["sac"].fixed_s
    assert specs["a2c"].fixed_s == pytest.approx(specs["ppo"].fixed_s - evaluation)
    assert [specs[agent].shares_warm_start for agent in agents] == [False, False, True]  # the time left's too
    # Its warm start's evaluation is PPO's: leaner only by the shortlist, as SAC's and PPO's lean stages are.
    assert specs["a2c"].lean_fixed_s == pytest.approx(specs["sac"].lean_fixed_s)
    in_citylearn = stage_specs(load_config(overrides=["train.choose_on=citylearn"]), built_in, speeds, agents,
                               targets)
    assert in_citylearn["sac"].fixed_s == pytest.approx(4 * evaluation + candidacy)
    assert in_citylearn["sac"].lean_fixed_s == pytest.approx(specs["sac"].lean_fixed_s)
    # In processes of their own (Ray), each stage evaluates its warm start.
    apart = stage_specs(cfg, built_in, speeds, agents, targets, one_process=False)
    assert apart["a2c"].fixed_s == apart["ppo"].fixed_s
    # A free core: the second year in a process beside the first (its imports counted), as long as one year.
    monkeypatch.setattr(plan, "free_cores", lambda others=None: 2)
    beside = stage_specs(cfg, built_in, speeds, agents, targets)
    one_year = confirmed / 2 + BESIDE_START_S * SAFETY
    assert beside["sac"].fixed_s == pytest.approx(2 * evaluation + one_year + candidacy)
    assert beside["sac"].lean_fixed_s == pytest.approx(evaluation + confirmed_with(2) / 2 + BESIDE_START_S * SAFETY
                                                       + candidacy)


def test_a_dataset_of_one_period_is_planned_to_confirm_its_pick_on_its_validation_part(site_schema, tmp_path):
    """A dataset of one period confirms a pick over its validation part (28 days, the pick and its warm start in
    CityLearn), not over two years as long as the evaluation: so counted, the plan gave each agent of a quiet night on
    the official Building_10 69 s of evaluations where they took 10-27 s."""
    from trainer.config.loading import load_config
    from trainer.learn.warm_start.validation import VALIDATION_DAYS, validation_part
    from trainer.night.calibrate import Speeds
    from trainer.night.plan import POLICY_CALL_S, SAFETY, stage_specs

    # The built-in site's files given as a user's dataset: one period, its last 28 days its validation part.
    one_period = Site.load(variant(site_schema, tmp_path, lambda data: data.pop("pvbess_site")))
    check = validation_part(one_period)
    assert check is not None and check.length == VALIDATION_DAYS * 24
    speeds = Speeds(eval_steps_per_s=250.0, train_steps_per_s={"sac": 800.0, "ppo": 3000.0, "a2c": 6000.0},
                    imitation_update_s={"sac": 0.003, "ppo": 0.001, "a2c": 0.001},
                    imitation_policy={"sac": "sac 256x256", "ppo": "256x256", "a2c": "256x256"})
    step = (1 / 250.0 + POLICY_CALL_S) * SAFETY
    year = one_period.length - 1
    evaluation, candidacy = year * step, 28 * 24 * step
    specs = stage_specs(load_config(), one_period, speeds, ["sac"], {"sac": 1000})
    # The deployed policy and its warm start over the evaluation; the pick and its warm start over the 28 days.
    assert specs["sac"].fixed_s == pytest.approx(2 * evaluation + 2 * check.length * step + candidacy)


class _Ticks:
    """time.perf_counter as a clock the test moves: each call reads it, ``step`` advances it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_stall_of_a_busy_machine_does_not_pass_for_its_imitation_pace(monkeypatch):
    """Each minibatch 10 ms, one timing of the three stalled 0.5 s: the median of the three, not the stall."""
    from types import SimpleNamespace

    import numpy as np

    from trainer.learn.warm_start import cloning

    ticks, stalls = _Ticks(), iter([0.0, 0.0, 0.5, 0.0])  # the warm-up, then three timings

    def imitate(model, demos, epochs, lr, batch_size, seed, critic_epochs=None):
        ticks.now += len(demos.observations) // batch_size * 0.010 + next(stalls)

    monkeypatch.setattr(cloning, "imitate", imitate)
    monkeypatch.setattr(cloning.time, "perf_counter", ticks)
    model = SimpleNamespace(observation_space=np.zeros(5), action_space=np.zeros(2))
    assert cloning.imitation_update_s(model, 64, updates=10, repeats=3) == pytest.approx(0.010)


def test_one_stall_of_a_busy_machine_does_not_pass_for_citylearn_s_pace(monkeypatch, tiny_cfg, built_in):
    """CityLearn's steps timed in three parts, a step 1 ms, one part stalled 2 s: the rate is the median part's."""
    import numpy as np

    from trainer.night import calibrate

    ticks = _Ticks()

    class Env:
        unwrapped = None
        steps = 0

        def reset(self):
            return np.zeros(3), {}

        def step(self, action):
            self.steps += 1
            ticks.now += 0.001 + (2.0 if self.steps == 150 else 0.0)
            return np.zeros(3), 0.0, False, False, {}

        def close(self):
            pass

    monkeypatch.setattr(calibrate, "make_sb3_env", lambda *a, **k: Env())
    monkeypatch.setattr(calibrate.UncontrolledBaseline, "act", lambda self, obs, env: np.zeros(1))
    monkeypatch.setattr(calibrate.time, "perf_counter", ticks)
    assert calibrate._eval_speed(tiny_cfg, built_in) == pytest.approx(1000.0)
