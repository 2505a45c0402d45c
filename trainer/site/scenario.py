"""The built-in site: a deterministic CityLearn 3.0.2 dataset from the `scenario` config.

One building, one year at hourly steps: a commercial load with cooling, rooftop PV
computed with pvlib from synthetic but physically consistent weather, a battery,
EV chargers with commuter and overnight-fleet sessions, an hourly grid carbon
intensity with California's "duck curve" shape, and a time-of-use tariff.

Everything is drawn from one seeded generator in a fixed order and written with
fixed float formats, so the same config gives the same bytes. docs/scenario.md
describes the site and its uncontrolled CO2.
"""

from __future__ import annotations

import json
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from trainer.base.files import refuse_links_out
from trainer.config.sections import ScenarioConfig
from trainer.site.series import (
    HOURS_PER_YEAR,
    charger_names,
    generate_series,
)

BUILDING = "Building_1"
SCHEMA_FILE = "schema.json"
# Forecast horizons (hours) of CityLearn's *_predicted_1/2/3 columns: perfect forecasts.
FORECAST_HOURS = (6, 12, 24)

# Observations the agents see. Generic ones plus the EV ones CityLearn expands per charger.
ACTIVE_OBSERVATIONS = (
    "month", "day_type", "hour",
    "outdoor_dry_bulb_temperature", "outdoor_dry_bulb_temperature_predicted_1",
    "diffuse_solar_irradiance", "diffuse_solar_irradiance_predicted_1",
    "direct_solar_irradiance", "direct_solar_irradiance_predicted_1",
    "carbon_intensity", "non_shiftable_load", "solar_generation",
    "electrical_storage_soc", "net_electricity_consumption",
    "electricity_pricing", "electricity_pricing_predicted_1", "electricity_pricing_predicted_2",
    "electric_vehicle_charger_connected_state",
    "connected_electric_vehicle_at_charger_battery_capacity",
    "connected_electric_vehicle_at_charger_departure_time",
    "connected_electric_vehicle_at_charger_required_soc_departure",
    "connected_electric_vehicle_at_charger_soc",
    "electric_vehicle_charger_incoming_state",
    "incoming_electric_vehicle_at_charger_estimated_arrival_time",
)
INACTIVE_OBSERVATIONS = (
    "daylight_savings_status", "outdoor_relative_humidity", "indoor_dry_bulb_temperature",
    "average_unmet_cooling_setpoint_difference", "indoor_relative_humidity",
    "cooling_storage_soc", "heating_storage_soc", "dhw_storage_soc", "power_outage",
    "hvac_mode", "comfort_band",
)

def _with_forecasts(columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """Add CityLearn's *_predicted_1/2/3 columns as perfect forecasts at FORECAST_HOURS."""
    out: dict[str, np.ndarray] = dict(columns)
    for name, values in columns.items():
        for k, horizon in enumerate(FORECAST_HOURS, start=1):
            out[f"{name}_predicted_{k}"] = np.roll(values, -horizon)
    return pd.DataFrame(out)


def _pinned_battery(efficiency: float) -> dict:
    """A battery whose efficiency and power limit do not depend on power or SoC.

    Where a schema leaves these curves out, CityLearn 3.0.2 draws random ones (efficiency down to
    0.82 near zero power, charge power 0.2 x nominal near full): the site would not be the one
    docs/scenario.md describes, and the optimum's linear program could not model it exactly.
    """
    return {
        "efficiency": efficiency,
        "power_efficiency_curve": [[0.0, efficiency], [1.0, efficiency]],
        "capacity_power_curve": [[0.0, 1.0], [1.0, 1.0]],
        "loss_coefficient": 0.0,
    }


def _building(cfg: ScenarioConfig) -> dict:
    """The one building: its files, PV, battery and chargers."""
    building = {
        "include": True,
        "energy_simulation": f"{BUILDING}.csv",
        "weather": "weather.csv",
        "carbon_intensity": "carbon_intensity.csv",
        "pricing": "pricing.csv",
        "inactive_observations": [],
        "inactive_actions": [],
        "pv": {"type": "citylearn.energy_model.PV", "autosize": False, "attributes": {"nominal_power": cfg.pv_kwp}},
        "electrical_storage": {
            "type": "citylearn.energy_model.Battery",
            "autosize": False,
            "attributes": {
                "capacity": cfg.battery_kwh,
                "nominal_power": cfg.battery_kw,
                # CityLearn applies the square root of the efficiency on the way in and again on the way out.
                **_pinned_battery(cfg.battery_efficiency),
                "capacity_loss_coefficient": 1e-05,
                "initial_soc": 0.5,
            },
        },
    }
    if cfg.ev_chargers:
        building["chargers"] = {
            name: {
                "type": "citylearn.electric_vehicle_charger.Charger",
                "charger_simulation": f"{name}.csv",
                "autosize": False,
                "noise_std": 0.0,
                "attributes": {
                    "nominal_power": cfg.charger_kw,
                    "efficiency": cfg.charger_efficiency,
                    "charger_type": 0,
                    "max_charging_power": cfg.charger_kw,
                    "min_charging_power": 0.0,
                    "max_discharging_power": cfg.charger_discharge_kw,
                    "min_discharging_power": 0.0,
                },
            }
            for name in charger_names(cfg)
        }
    return building


def _cars(cfg: ScenarioConfig) -> dict:
    """The cars that visit the chargers (electric_vehicles_def), batteries pinned as the site's."""
    return {
        f"EV_{i + 1}": {
            "include": True,
            "battery": {
                "type": "citylearn.energy_model.Battery",
                "autosize": False,
                "attributes": {
                    "capacity": cfg.ev_battery_kwh,
                    "nominal_power": cfg.charger_kw,
                    **_pinned_battery(cfg.ev_battery_efficiency),
                    "initial_soc": 0.5,
                    "depth_of_discharge": 0.95,
                },
            },
        }
        for i in range(cfg.ev_chargers)
    }


def _schema(cfg: ScenarioConfig) -> dict:
    observations = {name: {"active": True, "shared_in_central_agent": True} for name in ACTIVE_OBSERVATIONS}
    observations.update({name: {"active": False, "shared_in_central_agent": True} for name in INACTIVE_OBSERVATIONS})
    for name in ("non_shiftable_load", "solar_generation", "electrical_storage_soc", "net_electricity_consumption"):
        observations[name]["shared_in_central_agent"] = False
    schema = {
        "random_seed": cfg.seed,
        "root_directory": None,
        "central_agent": True,
        "simulation_start_time_step": 0,
        "simulation_end_time_step": HOURS_PER_YEAR - 1,
        "episode_time_steps": None,
        "rolling_episode_split": False,
        "random_episode_split": False,
        "seconds_per_time_step": 3600,
        "observations": observations,
        "actions": {
            "cooling_storage": {"active": False},
            "heating_storage": {"active": False},
            "dhw_storage": {"active": False},
            "electrical_storage": {"active": True},
            "electric_vehicle_storage": {"active": cfg.ev_chargers > 0},
        },
        "agent": {"type": "citylearn.agents.base.BaselineAgent", "attributes": {}},
        "reward_function": {"type": "citylearn.reward_function.RewardFunction", "attributes": {}},
        "buildings": {BUILDING: _building(cfg)},
        "pvbess_site": cfg.model_dump(mode="json"),
    }
    if cfg.ev_chargers:
        schema["electric_vehicles_def"] = _cars(cfg)
    return schema


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    frame.to_csv(path, index=False, float_format="%.4f", lineterminator="\n")


def build_site(cfg: ScenarioConfig, out_dir: Path) -> Path:
    """Write the dataset into ``out_dir`` and return its schema.json path."""
    refuse_links_out(out_dir, "the dataset folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    series = generate_series(cfg)
    index = series.local_time
    tz = ZoneInfo(cfg.timezone)
    dst = np.array([bool(t.to_pydatetime().replace(tzinfo=tz).dst()) for t in index[::24]]).repeat(24).astype(int)
    blank = np.full(HOURS_PER_YEAR, np.nan)
    zeros = np.zeros(HOURS_PER_YEAR)
    building = pd.DataFrame({
        "month": index.month,
        # CityLearn's hours run 1..24 (hour ending); day_type 1 = Monday .. 7 = Sunday.
        "hour": index.hour + 1,
        "day_type": index.dayofweek + 1,
        "daylight_savings_status": dst,
        "indoor_dry_bulb_temperature": blank,
        "average_unmet_cooling_setpoint_difference": blank,
        "indoor_relative_humidity": blank,
        "non_shiftable_load": series.load_kwh,
        "dhw_demand": zeros,
        "cooling_demand": zeros,
        "heating_demand": zeros,
        "solar_generation": series.pv_ac_w_per_kwp,
    })
    _write_csv(building, out_dir / f"{BUILDING}.csv")
    _write_csv(_with_forecasts({
        "outdoor_dry_bulb_temperature": series.temperature_c,
        "outdoor_relative_humidity": series.relative_humidity_pct,
        "diffuse_solar_irradiance": series.dhi_w_m2,
        "direct_solar_irradiance": series.dni_w_m2,
    }), out_dir / "weather.csv")
    _write_csv(pd.DataFrame({"carbon_intensity": series.carbon_kg_per_kwh}), out_dir / "carbon_intensity.csv")
    _write_csv(_with_forecasts({"electricity_pricing": series.price_per_kwh}), out_dir / "pricing.csv")
    for name, frame in series.chargers.items():
        _write_csv(frame, out_dir / f"{name}.csv")
    schema_path = out_dir / SCHEMA_FILE
    schema_path.write_text(json.dumps(_schema(cfg), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return schema_path


# The built-in site's other years by their offset from scenario.seed: each use has its own, none sees another's.
VALIDATION_SEED_OFFSET = 1000  # the selection's validation window and held-out year (<run>/validation-site/)
SECOND_HELD_OUT_SEED_OFFSET = 1001  # the selection's second held-out year (<run>/validation-site-2/)
HELD_OUT_YEARS = 2  # the two above: what the selection confirms a pick over and chooses a warm start by
DRAW_SEED_OFFSET = 2000  # + k: the years whose optimum the warm start imitates too (<run>/demonstration-sites/)
UNSEEN_YEAR_SEED_OFFSET = 3000  # trainer evaluate --unseen-year (<run>/unseen-year/): used by nothing else
