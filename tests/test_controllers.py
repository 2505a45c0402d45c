"""The rule-based references, over weeks of the built-in site."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.env.citylearn import ActionScale, make_sb3_env
from trainer.judge.metrics import compare_to_baseline, run_episode
from trainer.references.controllers import RuleBasedController, UncontrolledBaseline


@pytest.fixture(scope="module")
def four_weeks(built_in, default_cfg):
    results = {}
    for controller in (UncontrolledBaseline(), RuleBasedController()):
        env = make_sb3_env(default_cfg, built_in, "eval", seed=0, eval_days=28)
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


def test_rbc_sends_pv_surplus_to_the_battery_at_the_power_it_means(built_in, default_cfg):
    """CityLearn 3.0.2 scales the battery action by nominal power: 20 kW of surplus is 20/50 = 0.4."""
    env = make_sb3_env(default_cfg, built_in, "eval", seed=0, eval_days=28)
    citylearn_env = env.unwrapped
    obs, _ = env.reset()
    rbc = RuleBasedController()
    building = citylearn_env.buildings[0]
    battery = building.electrical_storage
    charger_kw = [c.max_charging_power for c in building.electric_vehicle_chargers]
    checked, done = 0, False
    while checked < 5 and not done:
        t = citylearn_env.time_step
        sim = building.energy_simulation
        surplus = float(building.pv.get_generation(sim.solar_generation[t])) - float(sim.non_shiftable_load[t])
        action = rbc.act(obs, citylearn_env)
        native = ActionScale.of(citylearn_env).to_native(action)
        # PV surplus goes to the cars first, the rest to the battery.
        left = surplus - sum(a * kw for a, kw in zip(native[1:], charger_kw))
        before = battery.energy_init
        obs, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
        if left > 1.0 and battery.soc[t] < 0.99:
            assert native[0] == pytest.approx(min(left / battery.nominal_power, 1.0), abs=1e-5)
            stored = float(battery.soc[t]) * battery.capacity - before
            assert stored == pytest.approx(native[0] * battery.nominal_power * battery.round_trip_efficiency, rel=1e-3)
            checked += 1
    assert checked == 5, "not enough hours with PV surplus left for the battery"


def test_a_short_evaluation_repeats_its_window_and_normalises_as_the_whole_period(built_in, default_cfg):
    week = make_sb3_env(default_cfg, built_in, "eval", seed=0, eval_days=7)
    first, again = (run_episode(UncontrolledBaseline(), week) for _ in range(2))
    assert first["eval_timesteps"] == again["eval_timesteps"] == 7 * 24 - 1
    assert first["co2_kg"] == again["co2_kg"]  # the learning curve's environment is reset for every point
    year = make_sb3_env(default_cfg, built_in, "eval", seed=0)
    year.reset()
    week_limits = week.unwrapped.buildings[0].periodic_normalized_observation_space_limits
    np.testing.assert_equal(week_limits, year.unwrapped.buildings[0].periodic_normalized_observation_space_limits)


def test_an_episode_ends_as_a_time_limit_not_a_terminal_state(built_in, default_cfg):
    # The site goes on after the window: SB3 bootstraps a truncated end from the last observation,
    # where a terminal one would tell the learner that nothing stored pays after it.
    env = make_sb3_env(default_cfg, built_in, "eval", seed=0, eval_days=1)
    env.reset()
    endings = []
    for _ in range(48):
        _, _, terminated, truncated, _ = env.step(np.zeros(env.action_space.shape))
        endings.append((terminated, truncated))
        if terminated or truncated:
            break
    assert endings[-1] == (False, True) and not any(t for t, _ in endings)


@pytest.mark.parametrize("agent", ["sac", "ppo", "a2c"])
def test_a_policy_acts_as_its_predict_without_predict_s_cost(agent, built_in, tiny_cfg):
    """Actor(policy) gives ``predict(obs, deterministic=True)``'s action, for one observation and a batch, inside the
    action box and at its edges, the policy put in evaluation mode once (predict switches it on every call); a box
    other than [-1, 1] goes through predict itself."""
    import gymnasium
    import torch

    from trainer.learn.agents import build_model
    from trainer.references.controllers import Actor

    env = make_sb3_env(tiny_cfg, built_in, "train", seed=0)
    model = build_model(tiny_cfg, agent, env, "cpu", 0, 1000)
    batch = np.random.default_rng(0).uniform(-2.0, 2.0, (64, *model.observation_space.shape)).astype(np.float32)
    switched = []
    model.policy.set_training_mode = switched.append  # how often the mode is switched (predict: every call)
    act = Actor(model.policy)
    inside = model.predict(batch, deterministic=True)[0]
    assert np.abs(inside).max() < 0.99
    np.testing.assert_allclose(act(batch), inside, atol=1e-6)
    with torch.no_grad():  # the mean action pushed past the box: predict clips it (SAC's tanh meets it)
        (model.policy.action_net if hasattr(model.policy, "action_net") else model.policy.actor.mu).bias.add_(20.0)
    edge = model.predict(batch, deterministic=True)[0]
    assert np.abs(edge).min() == pytest.approx(1.0)
    np.testing.assert_allclose(act(batch), edge, atol=1e-6)
    assert act(batch[0]).shape == model.action_space.shape
    np.testing.assert_allclose(act(batch[0]), model.predict(batch[0], deterministic=True)[0], atol=1e-6)
    assert switched.count(False) == 1 + 3  # once by the Actor for its four calls; predict's own once each
    wider = Actor(model.policy)
    wider.direct = False  # as for a box other than [-1, 1]
    model.policy.action_space = gymnasium.spaces.Box(-2.0, 2.0, model.action_space.shape, np.float32)
    np.testing.assert_array_equal(wider(batch), model.policy.predict(batch, deterministic=True)[0])
