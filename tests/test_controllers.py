"""The two references, over four weeks of the built-in site."""

from __future__ import annotations

import pytest

from trainer.controllers import RuleBasedController, UncontrolledBaseline
from trainer.env import make_sb3_env
from trainer.metrics import compare_to_baseline, run_episode


@pytest.fixture(scope="module")
def four_weeks(site_schema, default_cfg):
    results = {}
    for controller in (UncontrolledBaseline(), RuleBasedController()):
        env = make_sb3_env(default_cfg, site_schema, "eval", seed=0, eval_days=28)
        results[controller.name] = run_episode(controller, env)
    compare_to_baseline(results)
    return results


def test_uncontrolled_baseline_meets_every_ev_target(four_weeks):
    base = four_weeks["baseline"]
    assert base["ev_departures"] > 40
    assert base["ev_departure_soc_met_pct"] == 100.0
    assert base["eval_timesteps"] == 28 * 24 - 1


def test_rbc_meets_every_ev_target_with_less_co2(four_weeks):
    rbc = four_weeks["rbc"]
    assert rbc["ev_departure_soc_met_pct"] == 100.0
    assert rbc["co2_vs_baseline_pct"] < -1.0
    assert rbc["pv_self_consumption_pct"] >= four_weeks["baseline"]["pv_self_consumption_pct"]


def test_metrics_are_consistent(four_weeks):
    for metrics in four_weeks.values():
        assert metrics["grid_import_kwh"] > 0
        assert metrics["peak_kw"] <= metrics["grid_import_kwh"]
        assert 0 <= metrics["pv_self_consumption_pct"] <= 100
        assert metrics["co2_kg_per_year"] == pytest.approx(metrics["co2_kg"] * 8760 / metrics["eval_timesteps"])
        assert metrics["citylearn_kpis"]["carbon_emissions_total"] is not None
