"""The day-ahead planner: causal (the hours after now come from the forecast alone), serves every car, cuts
CO2 between the uncontrolled site and the optimum, and is skipped with its reason where it has no other years."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.env.citylearn import make_sb3_env
from trainer.judge.metrics import run_episode
from trainer.references.controllers import UncontrolledBaseline
from trainer.references.optimum import OptimumReplay, solve
from trainer.references.optimum_model import SiteModel
from trainer.references.planner import HORIZON_STEPS, DayAheadPlanner, Forecast, PlannerUnavailable, day_ahead_planner
from trainer.site import Site


def test_the_forecast_starts_at_what_is_seen_and_fades_to_the_mean_year():
    years = [SiteModel(4, 1.0, np.array(c, float), np.array(f, float))
             for f, c in (([1, 2, 3, 4], [0.2, 0.2, 0.3, 0.3]), ([3, 4, 5, 6], [0.4, 0.4, 0.5, 0.5]))]
    forecast = Forecast.of_years(years)
    assert np.allclose(forecast.fixed_net_kwh, [2, 3, 4, 5]) and np.allclose(forecast.carbon, [0.3, 0.3, 0.4, 0.4])
    fixed, carbon = forecast.ahead(1, 3, fixed_now=7.0, carbon_now=0.3)
    assert fixed[0] == 7.0 and carbon[0] == 0.3  # the present hour is observed, not forecast
    # what is seen now (7 against the mean year's 3) fades by the years' own persistence, hour by hour
    assert np.allclose(fixed - forecast.fixed_net_kwh[1:4], 4 * forecast.fixed_persistence ** np.arange(3))


def _planner_and_env(cfg, schema, days):
    env = make_sb3_env(cfg, Site.load(schema), "eval", 0, eval_days=days)
    env.reset()
    planner = day_ahead_planner(cfg, env.unwrapped)
    return planner, env, planner.model


def test_the_planner_reads_no_hour_after_the_present(default_cfg, site_schema):
    planner, env, model = _planner_and_env(default_cfg, site_schema, 3)
    obs, _ = env.reset()
    for _ in range(30):  # into the first afternoon, cars connected
        obs, *_ = env.step(planner.act(obs, env.unwrapped))
    t = env.unwrapped.time_step
    future = SiteModel(model.steps, model.hours, model.carbon.copy(), model.fixed_net_kwh.copy(), model.batteries,
                       model.sessions)
    future.carbon[t + 1:] *= 5.0  # a different future that nobody could have seen
    future.fixed_net_kwh[t + 1:] -= 20.0
    blind = DayAheadPlanner(future, planner.forecast, planner.margin_soc)
    assert np.array_equal(planner.act(obs, env.unwrapped), blind.act(obs, env.unwrapped))
    env.close()


def test_the_planner_serves_every_car_and_cuts_co2_no_further_than_the_optimum(default_cfg, site_schema, built_in):
    planner, env, model = _planner_and_env(default_cfg, site_schema, 4)
    result = run_episode(planner, env)
    baseline = run_episode(UncontrolledBaseline(), make_sb3_env(default_cfg, built_in, "eval", 0, eval_days=4))
    optimum = run_episode(OptimumReplay(solve(model)), make_sb3_env(default_cfg, built_in, "eval", 0, eval_days=4))
    assert result["ev_departure_soc_met_pct"] == 100.0
    assert optimum["co2_kg"] * 0.999 <= result["co2_kg"] < baseline["co2_kg"]
    assert HORIZON_STEPS == 24


def test_the_planner_is_skipped_with_its_reason_on_a_dataset_without_other_years(tmp_path, official_schema,
                                                                                  default_cfg):
    env = make_sb3_env(default_cfg, Site.load(official_schema), "eval", 0, eval_days=1)
    env.reset()
    with pytest.raises(PlannerUnavailable, match="other years of the built-in site; this dataset has none"):
        day_ahead_planner(default_cfg, env.unwrapped)
    env.close()
    out = tmp_path / "b"
    result = CliRunner().invoke(cli, ["baseline", "--schema", str(official_schema), "--out", str(out),
                                      "--set", "schedule.eval_days=1"])
    assert result.exit_code == 0, result.output
    planner = json.loads((out / "results.json").read_text())["planner"]
    assert planner["co2_kg"] is None and "other years of the built-in site" in planner["skipped"]


def test_a_window_without_a_feasible_plan_leaves_the_battery_idle_and_the_guard_serves_the_cars(default_cfg,
                                                                                               site_schema,
                                                                                               monkeypatch):
    from trainer.references import planner as planner_module
    from trainer.references.optimum_model import OptimumUnavailable

    planner, env, _ = _planner_and_env(default_cfg, site_schema, 2)

    def infeasible(model):
        raise OptimumUnavailable("the linear program could not be solved: The problem is infeasible.")

    monkeypatch.setattr(planner_module, "solve", infeasible)
    result = run_episode(planner, env)
    assert planner.idle_steps == result["eval_timesteps"] and result["ev_departure_soc_met_pct"] == 100.0
