"""The built-in site: shape, physics, EV sessions, determinism, and CityLearn's energy balance."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from trainer.config.loading import load_config
from trainer.env.citylearn import make_citylearn_env
from trainer.site.scenario import build_site
from trainer.site.series import EV_CONNECTED, HOURS_PER_YEAR


def test_every_series_has_8760_rows_and_no_nan(site_schema):
    folder = site_schema.parent
    schema = json.loads(site_schema.read_text())
    files = ["Building_1.csv", "weather.csv", "carbon_intensity.csv", "pricing.csv",
             *[c["charger_simulation"] for c in schema["buildings"]["Building_1"]["chargers"].values()]]
    for name in files:
        frame = pd.read_csv(folder / name)
        assert len(frame) == HOURS_PER_YEAR, name
    building = pd.read_csv(folder / "Building_1.csv")
    for column in ("month", "hour", "day_type", "non_shiftable_load", "solar_generation"):
        assert not building[column].isna().any(), column
    assert not pd.read_csv(folder / "weather.csv").isna().any().any()
    assert building["hour"].between(1, 24).all() and building["day_type"].between(1, 7).all()


def test_pv_is_physical(site_schema, default_cfg):
    building = pd.read_csv(site_schema.parent / "Building_1.csv")
    pv = building["solar_generation"].to_numpy()  # W AC per kWp
    assert pv.min() >= 0 and pv.max() <= 1000
    night = building["hour"].isin([1, 2, 3, 23, 24])
    assert pv[night.to_numpy()].max() == 0
    yield_kwh_per_kwp = pv.sum() / 1000
    assert 1200 < yield_kwh_per_kwp < 1900  # Sacramento, 20 degree tilt, 14% losses
    summer, winter = building["month"].isin([6, 7]), building["month"].isin([12, 1])
    assert pv[summer.to_numpy()].mean() > 2 * pv[winter.to_numpy()].mean()


def test_carbon_and_tariff_follow_their_config(site_schema, default_cfg):
    carbon = pd.read_csv(site_schema.parent / "carbon_intensity.csv")["carbon_intensity"].to_numpy()
    assert carbon.mean() == pytest.approx(default_cfg.scenario.carbon_mean_kg_per_kwh, abs=1e-3)
    hours = pd.read_csv(site_schema.parent / "Building_1.csv")["hour"].to_numpy()
    evening, midday = carbon[hours == 20].mean(), carbon[hours == 13].mean()
    assert evening > 1.3 * midday  # the duck curve: dirtier after sunset than at solar noon
    price = pd.read_csv(site_schema.parent / "pricing.csv")["electricity_pricing"].to_numpy()
    assert set(np.unique(price)) == {0.30, 0.45, 0.55}
    assert price[hours == 18].min() >= 0.45 and price[hours == 3].max() == 0.30


def test_every_ev_session_is_feasible_at_full_power(site_schema, default_cfg):
    s = default_cfg.scenario
    for name in ("charger_1_1", "charger_1_4"):
        frame = pd.read_csv(site_schema.parent / f"{name}.csv")
        connected = frame["electric_vehicle_charger_state"].to_numpy() == EV_CONNECTED
        starts = np.flatnonzero(connected & ~np.roll(connected, 1))
        assert len(starts) > 200, name  # commuters on most weekdays; the van every night
        for start in starts:
            arrival_soc = frame["electric_vehicle_estimated_soc_arrival"].iloc[start - 1] / 100
            hours = frame["electric_vehicle_departure_time"].iloc[start] + 1
            reachable = arrival_soc + hours * s.charger_kw * s.charger_efficiency / s.ev_battery_kwh
            assert reachable >= s.ev_departure_soc, (name, start)


def test_same_config_gives_same_bytes_and_seed_changes_them(tmp_path, default_cfg):
    first = build_site(default_cfg.scenario, tmp_path / "a").parent
    second = build_site(default_cfg.scenario, tmp_path / "b").parent
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    other = load_config(overrides=["scenario.seed=7"]).scenario
    third = build_site(other, tmp_path / "c").parent
    assert (third / "weather.csv").read_bytes() != (first / "weather.csv").read_bytes()


def test_citylearn_energy_balance_holds(built_in, default_cfg):
    """net = load - PV + battery + EV charging, for arbitrary actions."""
    env = make_citylearn_env(default_cfg, built_in, "eval", seed=0, eval_days=3)
    env.reset()
    rng = np.random.default_rng(0)
    steps = 60
    for _ in range(steps):
        env.step([rng.uniform(-1, 1, env.action_space[0].shape).astype(np.float32)])
    b = env.buildings[0]
    net = np.asarray(b.net_electricity_consumption[:steps])
    parts = (np.asarray(b.energy_simulation.non_shiftable_load[:steps]) + np.asarray(b.solar_generation[:steps])
             + np.asarray(b.electrical_storage.electricity_consumption[:steps])
             + sum(np.asarray(c.electricity_consumption[:steps]) for c in b.electric_vehicle_chargers))
    np.testing.assert_allclose(net, parts, atol=1e-4)
    assert np.abs(np.asarray(b.electrical_storage.electricity_consumption[:steps])).max() > 1  # the battery did act
