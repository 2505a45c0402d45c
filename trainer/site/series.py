"""The built-in site's hourly series: weather and PV (pvlib), the building's load, carbon intensity, the
tariff, and each charger's EV sessions, all drawn from one seeded generator in a fixed order.

``trainer.site.scenario`` writes them as a CityLearn dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from trainer.config.sections import ScenarioConfig

HOURS_PER_YEAR = 8760

# Mean daily clearness (actual / clear-sky irradiance) by month for California's
# Central Valley: foggy, rainy winters and nearly cloudless summers.
MONTHLY_CLEARNESS = (0.55, 0.64, 0.72, 0.82, 0.88, 0.93, 0.95, 0.94, 0.92, 0.85, 0.68, 0.55)

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


def _humidity(rng: np.random.Generator, doy: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """Relative humidity from a seasonal dew point (Magnus formula), so it falls as the day warms."""
    dew_point = np.minimum(
        8.0 - 4.0 * np.cos(2 * np.pi * (doy - 200) / 365) + rng.normal(0, 1.5, HOURS_PER_YEAR), temperature
    )
    magnus = lambda t: np.exp(17.625 * t / (243.04 + t))  # noqa: E731
    return np.clip(100 * magnus(dew_point) / magnus(temperature), 5, 100)


def _pv_ac_per_kwp(cfg: ScenarioConfig, solpos: pd.DataFrame, mid: pd.DatetimeIndex, dni: np.ndarray,
                   ghi: np.ndarray, dhi: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """PV: plane-of-array irradiance → cell temperature → PVWatts DC and AC, per kWp."""
    import pvlib  # heavy import, only needed here

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
    return np.clip(np.nan_to_num(np.asarray(pvlib.inverter.pvwatts(dc, 1000.0 / 1.1, eta_inv_nom=0.96))), 0, None)


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
    humidity = _humidity(rng, doy, temperature)
    ac = _pv_ac_per_kwp(cfg, solpos, mid, dni, ghi, dhi, temperature)

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


def stored_kw_per_charger(cfg: ScenarioConfig) -> float:
    """kW that reach a car's battery while its charger runs at full power."""
    return cfg.charger_kw * cfg.charger_efficiency * math.sqrt(cfg.ev_battery_efficiency)
