"""The reward on hand-computed cases."""

from __future__ import annotations

import pytest

from trainer.reward import ChargerSpec, MultiObjectiveReward, SiteScale, ev_shortfall, reward_terms, weighted_reward

SCALE = SiteScale(scale_kw=100.0, carbon_max=0.5, price_max=0.4)


def test_import_terms():
    terms = reward_terms(net_kwh=20.0, carbon=0.25, price=0.30, ev_shortfalls=[], scale=SCALE)
    assert terms["co2"] == pytest.approx(20 * 0.25 / (100 * 0.5))    # 0.1
    assert terms["cost"] == pytest.approx(20 * 0.30 / (100 * 0.4))   # 0.15
    assert terms["grid"] == pytest.approx((20 / 100) ** 2)           # 0.04
    assert terms["solar"] == 0.0
    assert terms["ev"] == 0.0


def test_export_is_penalised_as_unused_solar_only():
    terms = reward_terms(net_kwh=-15.0, carbon=0.25, price=0.30, ev_shortfalls=[], scale=SCALE)
    assert terms == {"co2": 0.0, "cost": 0.0, "ev": 0.0, "grid": 0.0, "solar": pytest.approx(0.15)}


def test_ev_shortfall_is_zero_while_the_target_is_reachable():
    # 60 kWh EV at 30% with 3 steps left (4 of charging) at 11 kW x 0.95: reaches 0.3 + 4*10.45/60 = 0.9967
    assert ev_shortfall(0.3, 0.8, 3, 60.0, 11.0, 0.95) == 0.0


def test_ev_shortfall_counts_what_full_power_cannot_reach():
    # Leaving after this step: at most 10.45/60 = 0.17417 more -> 0.47417; 0.8 - 0.47417 = 0.32583
    assert ev_shortfall(0.3, 0.8, 0, 60.0, 11.0, 0.95) == pytest.approx(0.8 - (0.3 + 10.45 / 60))


def test_weighted_reward_is_the_negative_weighted_sum():
    terms = {"co2": 0.1, "cost": 0.15, "ev": 0.2, "grid": 0.04, "solar": 0.0}
    weights = {"co2": 0.5, "cost": 0.15, "ev": 0.1, "grid": 0.05, "solar": 0.2}
    assert weighted_reward(terms, weights) == pytest.approx(-(0.05 + 0.0225 + 0.02 + 0.002))


def test_citylearn_adapter_reads_observations_and_sums_for_the_central_agent():
    reward = MultiObjectiveReward({"central_agent": True}, co2=1.0, cost=0.0, ev=1.0, grid=0.0, solar=0.0)
    reward.configure([SCALE, SCALE], [[ChargerSpec("c1", 11.0, 0.95)], []])
    at = "connected_electric_vehicle_at_charger_c1"
    first = {"net_electricity_consumption": 20.0, "carbon_intensity": 0.25, "electricity_pricing": 0.3,
             "electric_vehicle_charger_c1_connected_state": 1, f"{at}_soc": 0.3,
             f"{at}_required_soc_departure": 0.8, f"{at}_departure_time": 0, f"{at}_battery_capacity": 60.0}
    second = {"net_electricity_consumption": -5.0, "carbon_intensity": 0.25, "electricity_pricing": 0.3}
    value = reward.calculate([first, second])
    expected_first = -(0.1 + (0.8 - (0.3 + 10.45 / 60)))
    assert value == [pytest.approx(expected_first + 0.0)]
    assert reward.last_terms[1]["solar"] == pytest.approx(0.05)
    assert "net_electricity_consumption" in reward.get_required_observation_names()


def test_disconnected_charger_adds_no_ev_penalty():
    reward = MultiObjectiveReward({"central_agent": False}, co2=0.0, cost=0.0, ev=1.0, grid=0.0, solar=0.0)
    reward.configure([SCALE], [[ChargerSpec("c1", 11.0, 0.95)]])
    obs = {"net_electricity_consumption": 1.0, "electric_vehicle_charger_c1_connected_state": 0}
    assert reward.calculate([obs]) == [0.0]
