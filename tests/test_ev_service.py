"""EV service: the physics the guard predicts is CityLearn's, and the guard serves every reachable car."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainer.base.errors import ConfigError
from trainer.config.loading import load_config
from trainer.env.citylearn import ActionScale, CentralAgentArrays, make_citylearn_env, make_sb3_env
from trainer.env.ev_guard import connected_sessions
from trainer.judge.metrics import run_episode
from trainer.references.controllers import RuleBasedController, UncontrolledBaseline
from trainer.site import Site

from .conftest import random_ev_curves


@pytest.mark.parametrize("v2g", [False, True], ids=["charging", "v2g"])
def test_predicted_charging_is_what_citylearn_stores(site_schema, v2g_schema, tmp_path, default_cfg, v2g):
    schema = random_ev_curves(v2g_schema if v2g else site_schema, tmp_path)
    env = make_citylearn_env(default_cfg, Site.load(schema), "eval", 0, eval_days=21)
    env.reset()
    curve = np.asarray(env.electric_vehicles[0].battery.power_efficiency_curve)[1]
    assert curve.max() - curve.min() > 0.01  # really a curve, so the prediction has something to get right
    rng = np.random.default_rng(1)
    chargers = len(env.buildings[0].electric_vehicle_chargers)
    checked, discharged, worst = 0, 0, 0.0
    for _ in range(21 * 24 - 1):
        t = env.time_step
        native = np.concatenate([[rng.uniform(-1, 1)], rng.uniform(-1 if v2g else 0, 1, chargers)])
        predicted = {i: (s.charger.connected_electric_vehicle, s.path.stored_after(s.energy_init, native[i + 1]),
                         s.energy_init) for i, s in enumerate(connected_sessions(env)[0]) if s is not None}
        env.step([native])
        for ev, stored, before in predicted.values():
            worst = max(worst, abs(float(ev.battery.soc[t]) * float(ev.battery.capacity) - stored))
            checked += 1
            discharged += stored < before - 0.5
    assert checked > 200
    assert worst < 1e-4  # kWh
    assert (discharged > 50) == v2g  # V2G's discharges were predicted too


@pytest.mark.parametrize("site", ["builtin", "random-curves", "v2g-random-curves"])
def test_a_random_policy_behind_the_guard_meets_every_departure(site_schema, v2g_schema, tmp_path, default_cfg,
                                                                site):
    # one folder each: the two copies share a file name
    schema = {"builtin": site_schema, "random-curves": random_ev_curves(site_schema, tmp_path / "built-in"),
              "v2g-random-curves": random_ev_curves(v2g_schema, tmp_path / "v2g")}[site]
    env = make_sb3_env(default_cfg, Site.load(schema), "eval", 0, eval_days=28)
    rng = np.random.default_rng(0)

    class RandomPolicy:  # on V2G sites, half its EV actions discharge the car
        def act(self, obs, _env):
            return rng.uniform(-1, 1, size=env.action_space.shape).astype(np.float32)

    metrics = run_episode(RandomPolicy(), env)
    assert metrics["ev_departures"] > 40
    assert metrics["ev_departure_soc_met_pct"] == 100.0
    assert metrics["ev_unmet_kwh"] == 0.0
    assert env.env.guard.interventions > 0  # it had work to do


@pytest.mark.parametrize("site, stop_at_target", [("charge-only", True), ("charge-only", False), ("v2g", True)])
def test_cars_charged_at_full_power_leave_at_their_target_and_no_fuller(built_in, v2g_schema, site, stop_at_target):
    cfg = load_config(overrides=[f"ev.stop_at_target={str(stop_at_target).lower()}"])
    # a V2G car filled past its target is discharged into the site before it leaves: it too leaves at its target
    env = make_sb3_env(cfg, built_in if site == "charge-only" else Site.load(v2g_schema), "eval", 0, eval_days=14)
    left: list[tuple[float, float, float]] = []  # (state of charge at departure, target, capacity kWh)

    class FullPowerWatchingDepartures:
        leaving: list = []  # (car, target) leaving after this step

        def act(self, obs, citylearn_env):
            t = citylearn_env.time_step
            left.extend((float(car.battery.soc[t - 1]), target, float(car.battery.capacity))
                        for car, target in self.leaving)
            chargers = [c for b in citylearn_env.buildings for c in b.electric_vehicle_chargers or []]
            self.leaving = [(c.connected_electric_vehicle,
                             float(c.charger_simulation.electric_vehicle_required_soc_departure[t]))
                            for c in chargers if c.connected_electric_vehicle is not None
                            and c.charger_simulation.electric_vehicle_charger_state[t] == 1
                            and c.charger_simulation.electric_vehicle_departure_time[t] == 0]
            return np.ones(env.action_space.shape, dtype=np.float32)

    metrics = run_episode(FullPowerWatchingDepartures(), env)
    assert metrics["ev_departure_soc_met_pct"] == 100.0 and len(left) > 10
    above = [soc - target for soc, target, _ in left]
    if stop_at_target:  # each car leaves with its target and the margin, what full power till then would pass
        assert max(above) <= cfg.ev.margin_soc + 1e-4 and env.env.guard.lowered > 0
    else:
        assert max(above) > 0.1 and env.env.guard.lowered == 0
    # What the cars took away beyond their targets, as results.json counts it: those leaving after the episode's
    # last action (one a charger at most) are counted there and not seen here.
    excess = sum(max(soc - target, 0.0) * capacity for soc, target, capacity in left)
    chargers = sum(len(b.electric_vehicle_chargers or []) for b in env.unwrapped.buildings)
    unseen = chargers * max(capacity for *_, capacity in left)
    assert excess - 1e-6 <= metrics["ev_excess_kwh"] <= excess + unseen
    margin_kwh = sum((cfg.ev.margin_soc + 1e-4) * capacity for *_, capacity in left)
    assert (excess <= margin_kwh) == stop_at_target


def test_the_uncontrolled_baseline_runs_unguarded(built_in, default_cfg):
    env = make_sb3_env(default_cfg, built_in, "eval", 0, eval_days=7)
    assert default_cfg.ev.stop_at_target
    run_episode(UncontrolledBaseline(), env)
    assert env.env.guard.lowered == 0 and env.env.guard.interventions == 0  # its cars filled at full power
    run_episode(RuleBasedController(), env)
    assert env.env.guard.lowered > 0  # the guard is back for every other controller


def test_without_the_guard_a_car_that_is_never_charged_is_stranded(built_in):
    cfg = load_config(overrides=["ev.guard=false"])
    env = make_sb3_env(cfg, built_in, "eval", 0, eval_days=7)

    class NeverCharge:
        def act(self, obs, citylearn_env):
            scale = ActionScale.of(citylearn_env)
            return scale.to_agent(np.zeros_like(scale.low))

    metrics = run_episode(NeverCharge(), env)
    assert metrics["ev_departure_soc_met_pct"] == 0.0
    assert metrics["ev_unmet_kwh"] > 100


def test_an_agents_zero_is_half_power_and_the_battery_keeps_its_range(built_in, default_cfg):
    env = CentralAgentArrays(make_citylearn_env(default_cfg, built_in, "eval", 0, eval_days=2))
    assert env.action_space.low.tolist() == [-1.0] * 5 and env.action_space.high.tolist() == [1.0] * 5
    assert env.scale.to_native(np.zeros(5)).tolist() == [0.0, 0.5, 0.5, 0.5, 0.5]
    assert env.scale.to_native(-np.ones(5)).tolist() == [-1.0, 0.0, 0.0, 0.0, 0.0]
    native = np.array([-0.3, 0.0, 0.25, 1.0, 0.7])
    assert env.scale.to_native(env.scale.to_agent(native)) == pytest.approx(native, abs=1e-6)


def test_carbon_ahead_observations_are_the_datasets_own_values(built_in):
    cfg = load_config(overrides=["observations.carbon_ahead_hours=[1,6,24]"])
    env = make_sb3_env(cfg, built_in, "eval", 0, eval_days=3)
    plain = make_sb3_env(load_config(), built_in, "eval", 0, eval_days=3)
    assert env.observation_space.shape[0] == plain.observation_space.shape[0] + 3
    obs, _ = env.reset()
    carbon = np.asarray(env.unwrapped.buildings[0].carbon_intensity.carbon_intensity, dtype=float)
    for _ in range(30):
        obs, *_ = env.step(np.zeros(5, dtype=np.float32))
    t = env.unwrapped.time_step
    lows, highs = env.unwrapped.buildings[0].periodic_normalized_observation_space_limits
    low, high = lows["carbon_intensity"], highs["carbon_intensity"]
    expected = (carbon[[t + 1, t + 6, min(t + 24, len(carbon) - 1)]] - low) / (high - low)
    assert obs[-3:] == pytest.approx(expected, rel=1e-5)
    assert env.observation_space.contains(obs)


def test_load_look_back_is_the_meter_s_past_and_a_site_without_a_load_reading_is_refused(built_in, site_schema,
                                                                                            tmp_path):
    cfg = load_config(overrides=["observations.load_ago_hours=[2,24]"])
    env = make_sb3_env(cfg, built_in, "eval", 0, eval_days=3)
    plain = make_sb3_env(load_config(), built_in, "eval", 0, eval_days=3)
    assert env.observation_space.shape[0] == plain.observation_space.shape[0] + 2
    obs, _ = env.reset()
    building = env.unwrapped.buildings[0]
    load = np.asarray(building.energy_simulation.non_shiftable_load, dtype=float)
    lows, highs = building.periodic_normalized_observation_space_limits
    low, high = lows["non_shiftable_load"], highs["non_shiftable_load"]
    assert obs[-2:] == pytest.approx((load[[0, 0]] - low) / (high - low), rel=1e-5)  # no past yet: the first hour
    for _ in range(30):
        obs, *_ = env.step(np.zeros(5, dtype=np.float32))
    t = env.unwrapped.time_step
    assert env.env.raw[-2:] == pytest.approx(load[[t - 2, t - 24]])
    assert obs[-2:] == pytest.approx((load[[t - 2, t - 24]] - low) / (high - low), rel=1e-5)
    assert env.env.plan.names[-2:] == ["non_shiftable_load_ago_2h", "non_shiftable_load_ago_24h"]

    schema = json.loads(site_schema.read_text())
    schema["observations"]["non_shiftable_load"]["active"] = False
    bare = tmp_path / "schema.json"
    bare.write_text(json.dumps({**schema, "root_directory": str(site_schema.parent)}))
    with pytest.raises(ConfigError, match="load_ago_hours needs the site to observe 'non_shiftable_load'"):
        make_sb3_env(cfg, Site.load(bare), "eval", 0, eval_days=3).reset()
