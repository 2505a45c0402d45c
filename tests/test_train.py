"""A tiny training run per agent writes a loadable model and finite results."""

from __future__ import annotations

import json
import math
import shlex
import sys

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from trainer.base.source import source_record
from trainer.cli.main import cli
from trainer.config.loading import load_config
from trainer.judge.metrics import METRIC_KEYS
from trainer.learn.agents import fit_rollout
from trainer.learn.model_file import load_model
from trainer.site import Site

from .conftest import tiny_overrides


def sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


@pytest.mark.parametrize("agent, steps", [("sac", 200), ("ppo", 256), ("a2c", 200)])
def test_tiny_training_run(agent, steps, tmp_path, site_schema, monkeypatch):
    out = tmp_path / agent
    args = ["train", agent, "--timesteps", str(steps), "--out", str(out), "--schema", str(site_schema), "--device",
            "cpu", *sets(*tiny_overrides())]
    monkeypatch.setattr(sys, "argv", ["trainer", *args])  # what the console script would see
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert list(results) == ["baseline", agent]
    for name, metrics in results.items():
        assert set(METRIC_KEYS) <= set(metrics), name
        for key in ("co2_kg", "co2_kg_per_year", "cost", "grid_import_kwh", "peak_kw", "pv_self_consumption_pct"):
            assert math.isfinite(metrics[key]), (name, key)
    assert results["baseline"]["co2_vs_baseline_pct"] == 0.0
    assert results[agent]["timesteps"] == steps
    assert results[agent]["steps_per_s"] > 0
    model = load_model(load_config([out / "config.yaml"]), agent, out / agent / "model.zip")
    action, _ = model.predict(np.zeros(model.observation_space.shape, dtype=np.float32), deterministic=True)
    assert action.shape == model.action_space.shape
    progress = pd.read_csv(out / agent / "progress.csv")
    assert progress["time/total_timesteps"].max() <= steps
    checkpoints = sorted(p.name for p in (out / agent / "checkpoints").iterdir())
    assert checkpoints[-1] == f"step_{steps:010d}"  # the final one, complete with its manifest
    assert (out / agent / "checkpoints" / checkpoints[-1] / "manifest.json").is_file()
    assert "baseline" in result.output and agent in result.output  # the table is printed
    assert (out / "config.yaml").is_file()
    assert (out / "command.txt").read_text() == shlex.join(["trainer", *args]) + "\n"  # repeatable as written
    versions = json.loads((out / "versions.json").read_text())
    assert versions["trainer"] == source_record()  # which source produced it


def test_ppo_rollout_is_shortened_to_fit_a_short_run():
    params = {"n_steps": 2048, "batch_size": 64}
    # whole minibatches: the largest divisor of the shortened rollout up to the configured batch
    assert fit_rollout(params, 600) == {"n_steps": 600, "batch_size": 60}
    assert fit_rollout(params, 100) == {"n_steps": 100, "batch_size": 50}
    assert fit_rollout({"n_steps": 2048, "batch_size": 256}, 1000) == {"n_steps": 1000, "batch_size": 250}
    assert fit_rollout({"n_steps": 32, "batch_size": 256}, 640, n_envs=64) == {"n_steps": 10, "batch_size": 160}
    assert fit_rollout(params, 5000) is params


def test_evaluate_reproduces_a_runs_results(tmp_path, site_schema):
    out = tmp_path / "run"
    trained = CliRunner().invoke(
        cli,
        ["train", "ppo", "--timesteps", "128", "--out", str(out), "--schema", str(site_schema), "--device", "cpu",
         *sets(*tiny_overrides())],
    )
    assert trained.exit_code == 0, trained.output
    before = json.loads((out / "results.json").read_text())
    (out / "ppo" / "warm_start.zip").write_bytes((out / "ppo" / "model.zip").read_bytes())
    result = CliRunner().invoke(cli, ["evaluate", str(out)])
    assert result.exit_code == 0, result.output
    after = json.loads((out / "results.json").read_text())
    assert list(after) == ["baseline", "rbc", "optimum", "planner", "ppo"]  # the other references are added
    for agent in ("baseline", "ppo"):
        assert after[agent]["co2_kg"] == before[agent]["co2_kg"]  # deterministic, bit for bit
    assert after["ppo"]["timesteps"] == 128  # the training record is kept, every key of it
    assert set(before["ppo"]) <= set(after["ppo"])
    assert after["ppo"]["warm_start"]["co2_kg"] == after["ppo"]["co2_kg"]  # its warm start evaluated again
    assert json.loads((out / "ppo" / "metrics.json").read_text())["warm_start"] == after["ppo"]["warm_start"]

    # --unseen-year: the same controllers over a year of the site no stage saw, results.json untouched
    kept = (out / "results.json").read_bytes()
    unseen = CliRunner().invoke(cli, ["evaluate", str(out), "--unseen-year"])
    assert unseen.exit_code == 0, unseen.output
    assert (out / "results.json").read_bytes() == kept
    site = json.loads((out / "unseen-year" / "site" / "schema.json").read_text())
    assert site["pvbess_site"]["seed"] == load_config().scenario.seed + 3000
    year = json.loads((out / "unseen-year" / "results.json").read_text())
    assert list(year) == ["baseline", "rbc", "optimum", "planner", "ppo", "ppo warm start"]
    # The part the run held out (results.json's figures), not the year it learnt from (its in-sample figures)
    assert year["ppo"]["co2_kg"] == after["ppo"]["co2_kg"]
    assert year["ppo"]["co2_kg"] != after["ppo"]["in_sample"]["co2_kg"]  # another year's weather, load and cars
    assert year["ppo warm start"]["co2_kg"] == year["ppo"]["co2_kg"]  # the same policy, evaluated alike
    assert year["baseline"]["co2_share_of_optimum_pct"] == 0
    assert year["optimum"]["co2_share_of_optimum_pct"] == pytest.approx(100, abs=1)  # its dispatch, replayed
    assert "unseen-year/results.json" in unseen.output and "ppo warm start" in unseen.output
    # The run's report gains the year, with the figures just written (trainer train writes none: it says how).
    assert f"a report with this year: trainer report {out}" in unseen.output
    assert CliRunner().invoke(cli, ["report", str(out)]).exit_code == 0
    unseen = CliRunner().invoke(cli, ["evaluate", str(out), "--unseen-year"])
    assert f"report updated: {out / 'report.md'}" in unseen.output
    section = (out / "report.md").read_text().split("## A year no stage saw")[1]
    assert f"| ppo warm start | {year['ppo warm start']['co2_kg_per_year']:,.0f} |" in section
    assert "older than the model" not in section  # they judge the policy ppo deploys


def test_unseen_year_needs_a_part_held_out(tmp_path, site_schema, default_cfg):
    from trainer.base.errors import UsageError
    from trainer.night.stages import evaluate_unseen_year
    from trainer.run.folder import RunContext, RunDir

    from .conftest import variant

    dataset = variant(site_schema, tmp_path / "dataset", edit=lambda data: data.pop("pvbess_site"))
    ctx = RunContext(default_cfg, RunDir(tmp_path / "run"), Site.load(dataset), "cpu")
    with pytest.raises(UsageError, match="held nothing of .* out \\(holdout.share 0\\): --unseen-year needs a part"):
        evaluate_unseen_year(ctx, {})
    assert not (tmp_path / "run" / "unseen-year" / "results.json").exists()


def test_learning_curve_evaluations_take_at_most_their_share_of_the_stage():
    from types import SimpleNamespace

    from trainer.config.loading import load_config
    from trainer.learn.callbacks import EvalCurve

    now = [0.0]
    cfg = load_config(overrides=["schedule.curve_every_steps=1000", "schedule.curve_max_share=0.25"])
    curve = EvalCurve(SimpleNamespace(cfg=cfg), "ppo", None, clock=lambda: now[0])
    evaluated = []

    def evaluate():  # a week in CityLearn: one second on this clock
        evaluated.append(curve.num_timesteps)
        now[0] += 1.0

    curve.evaluate = evaluate
    curve.num_timesteps = 0
    curve._on_training_start()
    # a fast learner: 1,000 steps every 0.5 s between rollouts
    for step in range(1000, 20001, 1000):
        curve.num_timesteps = step
        curve._on_rollout_start()
        now[0] += 0.5
    # each 1 s evaluation is followed by at least 3 s of training (a quarter of the time at most)
    assert evaluated == [1000, 7000, 13000, 19000]
    slow = EvalCurve(SimpleNamespace(cfg=cfg), "ppo", None, clock=lambda: now[0])
    slow.evaluate, slow.num_timesteps, done = (lambda: now.__setitem__(0, now[0] + 1.0)), 0, []
    slow._on_training_start()
    for step in range(1000, 5001, 1000):  # a slow learner: 1,000 steps every 10 s, evaluated at each
        slow.num_timesteps = step
        before = now[0]
        slow._on_rollout_start()
        done.append(now[0] > before)
        now[0] += 10.0
    assert all(done)


def test_checkpoints_follow_the_steps_but_never_come_closer_than_the_floor(monkeypatch):
    from types import SimpleNamespace

    from trainer.learn import guard as guard_module
    from trainer.learn.guard import CheckpointGuard

    monkeypatch.setattr(guard_module, "check_finite", lambda model: None)  # no model here, only the clock

    now, saved = [0.0], []
    owner = SimpleNamespace(last_checkpoint_step=0)

    def save(model, boundary):
        saved.append(boundary)
        owner.last_checkpoint_step = boundary

    owner.save_checkpoint = save
    tracker = SimpleNamespace(boundary=lambda model: guard.num_timesteps)
    guard = CheckpointGuard(owner, tracker, every_steps=1000, time_limit_at=None, min_interval_s=10.0,
                            clock=lambda: now[0])
    guard.model = SimpleNamespace()
    guard.num_timesteps = 0
    # the training simulator: 1,000 steps every 0.5 s; a checkpoint at most every 10 s, once 1,000 steps are due
    for step in range(1000, 60001, 1000):
        guard.num_timesteps = step
        guard._on_rollout_start()
        now[0] += 0.5
    assert saved == [21000, 41000]  # 10 s and 20 s after training started
    # CityLearn: 1,000 steps every 12 s, so the steps decide
    saved.clear()
    for step in range(61000, 65001, 1000):
        guard.num_timesteps = step
        guard._on_rollout_start()
        now[0] += 12.0
    assert saved == [61000, 62000, 63000, 64000, 65000]


def test_a_stage_short_of_its_least_learning_at_its_slot_s_end_learns_on_to_it_while_the_night_can_spare_it(
        monkeypatch):
    """A busy 20-minute night's PPO, its slot planned for 20,000 steps at the calibrated speed, ran slower and stopped
    at 16,384: short of its floor at the slot's end, a stage learns on, from one rollout's start to the next, until
    the steps kept reach it or the night's later stages need the time."""
    from types import SimpleNamespace

    from trainer.learn import guard as guard_module
    from trainer.learn.guard import CheckpointGuard
    from trainer.learn.state import StopReason

    now = [0.0]
    monkeypatch.setattr(guard_module, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def stage(floor_steps, floor_until, rollouts):
        saved = []
        owner = SimpleNamespace(last_checkpoint_step=0, save_checkpoint=lambda model, boundary: saved.append(boundary))
        guard = CheckpointGuard(owner, SimpleNamespace(), every_steps=10**9, time_limit_at=10.0,
                                floor_steps=floor_steps, floor_until=floor_until)
        guard.model, guard.locals = SimpleNamespace(), {}
        for at, step in rollouts:  # (seconds, the step a rollout starts at)
            now[0], guard.num_timesteps = at, step + 1
            guard.boundary = SimpleNamespace(step=step)
            if not guard._on_step():
                assert guard.stopped_by is StopReason.TIME_UP
                assert guard.learnt_past_slot is (at > 11.0)  # what the log's `learnt_past_it_s` reports
                return step, [b.step for b in saved]
        return None, []

    rollouts = [(8.0, 14_336), (9.9, 16_384), (11.0, 18_432), (12.5, 20_480), (14.0, 22_528)]
    assert stage(0, None, rollouts) == (18_432, [18_432])  # no floor: the slot's end
    assert stage(20_000, 30.0, rollouts) == (20_480, [20_480])  # on to the floor, then stops
    assert stage(20_000, 12.0, rollouts) == (20_480, [20_480])  # at the night's limit: 12.5 s is past it
    assert stage(20_000, 11.5, rollouts[:3] + [(11.6, 20_000 - 1)]) == (19_999, [19_999])  # the limit: it stops short
    assert stage(10_000, 30.0, rollouts) == (18_432, [18_432])  # past its floor already: the slot's end


def test_a_last_stage_learning_on_past_its_target_stops_before_its_slot_s_end_to_leave_the_night_s_evaluations(
        monkeypatch):
    """A night's last stage learning on past its target (StageJob.past_target) stops ``spare_s`` before its slot's
    end once past the target, the time the warm starts left unevaluated need; short of its target it learns to its
    slot's end as any stage does."""
    from types import SimpleNamespace

    from trainer.learn import guard as guard_module
    from trainer.learn.guard import CheckpointGuard
    from trainer.learn.state import StopReason

    now = [0.0]
    monkeypatch.setattr(guard_module, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def stops_at(past_target, steps_by_second, rollout=None):
        owner = SimpleNamespace(last_checkpoint_step=0, save_checkpoint=lambda model, boundary: None)
        guard = CheckpointGuard(owner, SimpleNamespace(), every_steps=10**9, time_limit_at=100.0,
                                past_target=past_target)
        guard.model, guard.locals = SimpleNamespace(), {}
        for at, step in steps_by_second:  # (seconds, the step); a rollout starts at each, or every `rollout` steps
            now[0], guard.num_timesteps = at, step
            guard.boundary = SimpleNamespace(step=step if rollout is None else step // rollout * rollout)
            if not guard._on_step():
                assert guard.stopped_by is StopReason.TIME_UP
                return at, step
        return None

    fast = [(10.0, 1_000), (50.0, 5_000), (70.0, 7_000), (90.0, 9_000), (101.0, 10_100)]
    assert stops_at(None, fast) == (101.0, 10_100)  # no past target: the slot's end
    assert stops_at((1_000, 60.0), fast) == (70.0, 7_000)  # past its target at 10 s: it stops 40 s early
    assert stops_at((8_000, 60.0), fast) == (90.0, 9_000)  # reaches its target late: stops there
    slow = [(50.0, 5_000), (90.0, 9_000), (101.0, 10_100)]
    assert stops_at((20_000, 60.0), slow) == (101.0, 10_100)  # short of its target: its whole slot
    # Its target within the rollout that began at 8,000 (the boundary a stop keeps): that rollout is learnt to its
    # end, so that what it keeps reaches the target.
    within = [(70.0, 8_000), (75.0, 8_600), (80.0, 10_000)]
    assert stops_at((8_500, 60.0), within, rollout=2_000) == (80.0, 10_000)


@pytest.mark.parametrize("optimizer, expected", [("rmsprop", "RMSprop"), ("adam", "Adam")])
def test_a2c_takes_its_configured_optimizer_and_advantage_normalisation(optimizer, expected, built_in):
    from trainer.config.loading import load_config
    from trainer.env.citylearn import make_sb3_env
    from trainer.learn.agents import build_model

    cfg = load_config(overrides=[f"a2c.optimizer={optimizer}", f"a2c.normalize_advantage={optimizer == 'adam'}"])
    model = build_model(cfg, "a2c", make_sb3_env(cfg, built_in, "train", cfg.seed), "cpu", cfg.seed, 1000)
    assert type(model.policy.optimizer).__name__ == expected
    assert model.normalize_advantage == (optimizer == "adam")
