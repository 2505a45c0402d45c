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
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from trainer.config import ScenarioConfig
from trainer.files import refuse_links_out

HOURS_PER_YEAR = 8760
BUILDING = "Building_1"
SCHEMA_FILE = "schema.json"

# Mean daily clearness (actual / clear-sky irradiance) by month for California's
# Central Valley: foggy, rainy winters and nearly cloudless summers.
MONTHLY_CLEARNESS = (0.55, 0.64, 0.72, 0.82, 0.88, 0.93, 0.95, 0.94, 0.92, 0.85, 0.68, 0.55)
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

# Charger states in CityLearn's charger simulation files.
EV_CONNECTED, EV_INCOMING, EV_AWAY = 1, 2, 3


@dataclass(frozen=True)
class SiteSeries:
    """The hourly series of one generated year (all numpy arrays of length 8760)."""

    local_time: pd.DatetimeIndex
    temperature_c: np.ndarray
    relative_humidity_pct: np.ndarray
    ghi_w_m2: np.ndarray
    dni_w_m2: np.ndarray
    dhi_w_m2: np.ndarray
    pv_ac_w_per_kwp: np.ndarray
    load_kwh: np.ndarray
    carbon_kg_per_kwh: np.ndarray
    price_per_kwh: np.ndarray
    chargers: dict[str, pd.DataFrame]


def _standard_offset_hours(timezone: str, year: int) -> float:
    """The site's standard-time UTC offset (simulation clocks do not jump at DST)."""
    offset = datetime(year, 1, 15, tzinfo=ZoneInfo(timezone)).utcoffset()
    assert offset is not None  # a ZoneInfo always has one
    return offset.total_seconds() / 3600


def _hourly_index(cfg: ScenarioConfig) -> pd.DatetimeIndex:
    """8760 hour-starts of the year in local standard time, Feb 29 dropped."""
    index = pd.date_range(f"{cfg.year}-01-01", periods=HOURS_PER_YEAR + 24, freq="h")
    index = index[~((index.month == 2) & (index.day == 29))]
    return index[:HOURS_PER_YEAR]


def _ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """A unit-variance AR(1) series: persistence without long memory."""
    noise = rng.standard_normal(n)
    out = np.empty(n)
    out[0] = noise[0]
    scale = math.sqrt(1 - phi * phi)
    for i in range(1, n):
        out[i] = phi * out[i - 1] + scale * noise[i]
    return out


def _bump(hour: np.ndarray, centre: float, width: float) -> np.ndarray:
    return np.exp(-0.5 * ((hour - centre) / width) ** 2)


def generate_series(cfg: ScenarioConfig) -> SiteSeries:
    """Draw the year. The order of random draws is part of the output's identity."""
    import pvlib  # heavy import, only needed here

    rng = np.random.default_rng(cfg.seed)
    index = _hourly_index(cfg)
    offset = _standard_offset_hours(cfg.timezone, cfg.year)
    fixed_tz = f"Etc/GMT{-int(offset):+d}" if offset == int(offset) else "UTC"
    # Irradiance is evaluated at the middle of each hour.
    mid = (index + pd.Timedelta(minutes=30)).tz_localize(fixed_tz)
    hour = index.hour.to_numpy() + 0.5
    doy = index.dayofyear.to_numpy()
    n_days = HOURS_PER_YEAR // 24
    day_of_hour = np.arange(HOURS_PER_YEAR) // 24

    site = pvlib.location.Location(cfg.latitude, cfg.longitude, tz=fixed_tz, altitude=cfg.altitude_m)
    solpos = site.get_solarposition(mid)
    clearsky = site.get_clearsky(mid, model="ineichen", solar_position=solpos)

    # Clouds: a persistent daily clearness around the monthly mean, plus hourly noise.
    month_of_day = index.month.to_numpy()[::24] - 1
    mean_k = np.array(MONTHLY_CLEARNESS)[month_of_day]
    daily_k = np.clip(mean_k + (0.6 * (1 - mean_k) + 0.03) * _ar1(rng, n_days, 0.6), 0.08, 1.0)
    hourly_k = np.clip(daily_k[day_of_hour] + 0.05 * rng.standard_normal(HOURS_PER_YEAR), 0.05, 1.0)
    ghi = clearsky["ghi"].to_numpy() * hourly_k
    decomposed = pvlib.irradiance.erbs(ghi, solpos["zenith"].to_numpy(), doy)
    dni = np.nan_to_num(np.asarray(decomposed["dni"], dtype=float))
    dhi = np.nan_to_num(np.asarray(decomposed["dhi"], dtype=float))

    # Temperature: seasonal mean, a diurnal swing damped by clouds, persistent anomalies.
    seasonal = 16.5 - 8.5 * np.cos(2 * np.pi * (doy - 20) / 365)
    swing = (5.0 + 4.0 * (seasonal - 8.0) / 17.0) * (0.4 + 0.6 * daily_k[day_of_hour])
    diurnal = np.cos(2 * np.pi * (hour - 15.0) / 24)
    anomaly = np.repeat(2.0 * _ar1(rng, n_days, 0.8), 24)
    temperature = seasonal + swing * diurnal + anomaly + 0.4 * rng.standard_normal(HOURS_PER_YEAR)
    # Humidity from a seasonal dew point (Magnus formula), so it falls as the day warms.
    dew_point = np.minimum(
        8.0 - 4.0 * np.cos(2 * np.pi * (doy - 200) / 365) + rng.normal(0, 1.5, HOURS_PER_YEAR), temperature
    )
    magnus = lambda t: np.exp(17.625 * t / (243.04 + t))  # noqa: E731
    humidity = np.clip(100 * magnus(dew_point) / magnus(temperature), 5, 100)

    # PV: plane-of-array irradiance → cell temperature → PVWatts DC and AC, per kWp.
    poa = pvlib.irradiance.get_total_irradiance(
        cfg.pv_tilt_deg, cfg.pv_azimuth_deg,
        solpos["apparent_zenith"], solpos["azimuth"],
        pd.Series(dni, index=mid), pd.Series(ghi, index=mid), pd.Series(dhi, index=mid),
        dni_extra=pvlib.irradiance.get_extra_radiation(mid), model="haydavies",
    )
    poa_global = np.nan_to_num(poa["poa_global"].to_numpy())
    cell_temp = pvlib.temperature.faiman(poa_global, temperature, wind_speed=2.0)
    dc = pvlib.pvsystem.pvwatts_dc(poa_global, cell_temp, 1000.0, -0.0037)
    dc = np.asarray(dc) * (1 - cfg.pv_system_losses_pct / 100)
    ac = np.clip(np.nan_to_num(np.asarray(pvlib.inverter.pvwatts(dc, 1000.0 / 1.1, eta_inv_nom=0.96))), 0, None)

    # Building: base load, weekday occupancy, cooling above 22 C while occupied.
    weekday = index.dayofweek.to_numpy() < 5
    occupancy = np.clip((hour - 6.0) / 2.0, 0, 1) * np.clip((20.0 - hour) / 2.0, 0, 1) * weekday
    cooling = cfg.cooling_kw_per_degc * np.clip(temperature - 22.0, 0, None) * (0.3 + 0.7 * occupancy)
    load = cfg.building_base_kw + cfg.building_occupied_kw * occupancy + cooling
    load = np.clip(load * (1 + 0.05 * rng.standard_normal(HOURS_PER_YEAR)), 0.1, None)

    # Grid carbon: evening ramp, morning shoulder, and a midday dip as regional solar rises.
    regional_solar = clearsky["ghi"].to_numpy() * daily_k[day_of_hour] / 1000.0
    carbon = (1.0 + 0.30 * _bump(hour, 19.5, 2.0) + 0.08 * _bump(hour, 7.0, 1.5) - 0.45 * regional_solar)
    carbon *= 1 + 0.08 * np.cos(2 * np.pi * (doy - 15) / 365)
    carbon = np.clip(carbon * (1 + 0.03 * rng.standard_normal(HOURS_PER_YEAR)), 0.2, None)
    carbon *= cfg.carbon_mean_kg_per_kwh / carbon.mean()

    # Time-of-use tariff: 16:00-21:00 peak, higher in June-September.
    month = index.month.to_numpy()
    peak_price = np.where((month >= 6) & (month <= 9), cfg.tariff_summer_peak_per_kwh, cfg.tariff_peak_per_kwh)
    in_peak = (index.hour.to_numpy() >= 16) & (index.hour.to_numpy() < 21)
    price = np.where(in_peak, peak_price, cfg.tariff_offpeak_per_kwh)

    chargers = {name: frame for name, frame in _charger_sessions(cfg, index, rng)}
    return SiteSeries(index, temperature, humidity, ghi, dni, dhi, ac, load, carbon, price, chargers)


def charger_names(cfg: ScenarioConfig) -> list[str]:
    return [f"charger_1_{i + 1}" for i in range(cfg.ev_chargers)]


def _charger_sessions(cfg: ScenarioConfig, index: pd.DatetimeIndex, rng: np.random.Generator):
    """Yield (charger name, simulation frame): commuters by day, a fleet van overnight on the last."""
    n = HOURS_PER_YEAR
    weekday = index.dayofweek.to_numpy()[::24] < 5
    for c, name in enumerate(charger_names(cfg)):
        fleet = cfg.ev_chargers >= 2 and c == cfg.ev_chargers - 1
        sessions: list[tuple[int, int, float]] = []  # (arrival step, departure step, arrival SoC)
        for day in range(n // 24):
            if fleet:
                arrive = day * 24 + int(np.clip(round(rng.normal(18.0, 0.7)), 16, 21))
                leave = (day + 1) * 24 + int(np.clip(round(rng.normal(6.5, 0.5)), 5, 8))
                soc = rng.uniform(0.15, 0.40)
            else:
                present = rng.uniform() < (0.9 if weekday[day] else 0.2)
                a_mean, l_mean = (8.0, 17.0) if weekday[day] else (10.5, 14.5)
                arrive = day * 24 + int(np.clip(round(rng.normal(a_mean, 0.7)), 6, 11))
                leave = day * 24 + int(np.clip(round(rng.normal(l_mean, 1.0)), 13, 20))
                soc = rng.uniform(0.25, 0.55)
                if not present:
                    continue
            # Every target must be reachable at full power, so the uncontrolled baseline meets
            # all of them and agents are judged on how, not whether, they charge.
            hours_needed = math.ceil((cfg.ev_departure_soc - soc) * cfg.ev_battery_kwh / stored_kw_per_charger(cfg))
            leave = max(leave, arrive + hours_needed + 1)
            if sessions and arrive <= sessions[-1][1] + 2:  # keep a gap for the incoming rows
                continue
            if leave >= n:
                continue
            sessions.append((arrive, leave, soc))

        state = np.full(n, EV_AWAY)
        departure = np.full(n, np.nan)
        required = np.full(n, np.nan)
        arrival = np.full(n, np.nan)
        arrival_soc = np.full(n, np.nan)
        for arrive, leave, soc in sessions:
            steps = np.arange(arrive, leave)
            state[steps] = EV_CONNECTED
            departure[steps] = leave - 1 - steps
            required[steps] = 100 * cfg.ev_departure_soc
            for k in (1, 2):  # announced two hours ahead
                if arrive - k >= 0 and state[arrive - k] == EV_AWAY:
                    state[arrive - k] = EV_INCOMING
                    arrival[arrive - k] = k - 1
                    arrival_soc[arrive - k] = 100 * soc
        ev_id = np.where(state == EV_AWAY, "", f"EV_{c + 1}")
        yield name, pd.DataFrame({
            "electric_vehicle_charger_state": state,
            "electric_vehicle_id": ev_id,
            "electric_vehicle_departure_time": departure,
            "electric_vehicle_required_soc_departure": required,
            "electric_vehicle_estimated_arrival_time": arrival,
            "electric_vehicle_estimated_soc_arrival": arrival_soc,
        })


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


def stored_kw_per_charger(cfg: ScenarioConfig) -> float:
    """kW that reach a car's battery while its charger runs at full power."""
    return cfg.charger_kw * cfg.charger_efficiency * math.sqrt(cfg.ev_battery_efficiency)


def _schema(cfg: ScenarioConfig) -> dict:
    observations = {name: {"active": True, "shared_in_central_agent": True} for name in ACTIVE_OBSERVATIONS}
    observations.update({name: {"active": False, "shared_in_central_agent": True} for name in INACTIVE_OBSERVATIONS})
    for name in ("non_shiftable_load", "solar_generation", "electrical_storage_soc", "net_electricity_consumption"):
        observations[name]["shared_in_central_agent"] = False
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
        "buildings": {BUILDING: building},
        "pvbess_site": cfg.model_dump(mode="json"),
    }
    if cfg.ev_chargers:
        schema["electric_vehicles_def"] = {
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
