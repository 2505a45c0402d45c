"""A day-ahead planner: the optimum's linear program over the next 24 hours on a forecast, solved again every hour.

The optimum knows the whole year; a controller knows the present. The planner sits between them as a
reference a user could run: at each step it sees what CityLearn shows now (the battery's energy, each
connected car's energy, required energy and departure, the site's load, solar and carbon intensity of
this hour) and forecasts the hours to come as the mean of other years of the same site plus this
hour's deviation from that mean, fading as the other years' own hour-to-hour persistence (an AR(1)
forecast around a climatology). It applies the first hour of the plan and plans again. Cars that
have not arrived yet are unknown to it; a car connected whose departure the charger does not read yet (the official
datasets read it in a stay's last hours) is planned to leave after the charger's usual stay, learnt from the part of
the data a run learns from (trainer.shipped.program's :class:`Stays`). With a perfect forecast instead the same
planner reaches ~99.6 % of the optimum's cut on the built-in site, so what it loses is the forecast
(docs/agent-quality.md). Of the plans of least CO2 on its forecast it takes the one that stores soonest
(``solve(store_early=True)``): the sunny afternoon or clean night a forecast waits for may not come, and a battery
or car filled at the first free hour has lost nothing if it does (docs/agent-quality.md, "A planner that stores
early": 1.8 points of the optimum's cut on the built-in site's year held out, more on the official EV buildings).
The decision itself (the window's program, its first hour) is trainer.shipped.program's :func:`decide`, which a
planner's export runs at a site on the readings instead of CityLearn's objects (docs/export.md).

On the built-in site the other years are its own draws (``Site.draw``'s seeds, the warm start's
demonstration years). A dataset a user brings has one period (its other years are its own days resampled, no
forecast of what it has not seen): there the
forecast (:class:`ProfileForecast`) is learnt as the planner goes, from the hours it has already
seen of the period, as the mean by hour of the day of each building's net load and of the carbon
intensity, weighted to the recent days, with the persistence of each deviation from it measured on
those same hours. It never reads an hour after the present. Without a year of the site to learn from
it is a weaker reference there than on the built-in site (docs/agent-quality.md).
"""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from trainer.base import logs
from trainer.base.files import cache_root, write_bytes_atomic
from trainer.base.source import program_digest
from trainer.config.sections import Config, ScenarioConfig
from trainer.env.citylearn import ActionScale, action_layout, make_sb3_env
from trainer.env.ev_guard import CONNECTED, charging_path
from trainer.references.optimum_model import EV_ACTION_PREFIX, OptimumUnavailable, SiteModel, site_model
from trainer.shipped.controller import FORECAST_DECAY, HourlyForecast, hour_slots
from trainer.shipped.program import (
    HORIZON_STEPS,
    CarNow,
    Stay,
    Stays,
    car_due,
    decide,
    learn_stays,
    window_battery,
)
from trainer.site import BUILT_IN, Site
from trainer.site.scenario import DRAW_SEED_OFFSET, build_site

FORECAST_FORMAT = 1  # bump when Forecast or the way its draws are read changes
FORECAST_YEARS = 3  # the other draws whose mean is the forecast
PROFILE_DECAY = FORECAST_DECAY  # a learnt forecast's weight on an hour seen a step ago (the shipped controller's)


@dataclass(frozen=True)
class Forecast:
    """The mean year of other draws of the site, and how long a deviation from it lasts (hour to hour)."""

    fixed_net_kwh: np.ndarray
    carbon: np.ndarray
    fixed_persistence: float
    carbon_persistence: float

    @property
    def steps(self) -> int:
        return len(self.carbon)

    @classmethod
    def of_years(cls, years: list[SiteModel]) -> Forecast:
        steps = min(m.steps for m in years)
        fixed = np.stack([m.fixed_net_kwh[:, :steps] for m in years])  # (years, buildings, steps)
        carbon = np.stack([m.carbon[:steps] for m in years])
        return cls(fixed.mean(axis=0), carbon.mean(axis=0), _persistence(fixed), _persistence(carbon))

    def ahead(self, t: int, steps: int, fixed_now: np.ndarray, carbon_now: float) -> tuple[np.ndarray, np.ndarray]:
        """The next ``steps`` hours from ``t`` (each building's fixed net, and carbon), the first of them seen now."""
        fade = np.arange(steps)
        end = t + steps
        mean = np.atleast_2d(self.fixed_net_kwh)
        now = np.asarray(fixed_now, dtype=float).reshape(-1, 1)
        fixed = mean[:, t:end] + (now - mean[:, t:t + 1]) * self.fixed_persistence ** fade
        carbon = self.carbon[t:end] + (carbon_now - self.carbon[t]) * self.carbon_persistence ** fade
        return fixed, carbon


class ProfileForecast(HourlyForecast):
    """A forecast learnt from the hours seen so far (see the module's doc; the maths is the shipped controller's
    :class:`HourlyForecast`, which the agents read on a dataset too), over a period whose hours of the day are
    ``hour``."""

    def __init__(self, hour: np.ndarray, buildings: int) -> None:
        super().__init__(buildings, PROFILE_DECAY)
        self.slot = hour_slots(hour)
        self.seen = 0  # the hours observed, in order

    @property
    def steps(self) -> int:
        return len(self.slot)

    def learn_from(self, hour: np.ndarray, fixed_net_kwh: np.ndarray, carbon: np.ndarray) -> ProfileForecast:
        """Learn first from the hours of another period, in order (the part of the data a run learns from, before the
        part it is judged on): the forecast then starts from what the site was, not from nothing."""
        self.learn(hour_slots(hour), fixed_net_kwh, carbon)
        return self

    def ahead(self, t: int, steps: int, fixed_now: np.ndarray, carbon_now: float  # type: ignore[override]
              ) -> tuple[np.ndarray, np.ndarray]:
        """The next ``steps`` hours from ``t``, the first the one observed now (learnt from, after it is forecast)."""
        fixed_now = np.asarray(fixed_now, dtype=float)
        fixed, carbon = super().ahead(self.slot[t:t + steps], fixed_now, carbon_now)
        if t == self.seen:
            self.observe(int(self.slot[t]), fixed_now, carbon_now)
            self.seen = t + 1
        return fixed, carbon


def _persistence(years: np.ndarray) -> float:
    """Lag-one autocorrelation of each year's deviation from the mean year (per building), averaged; 0 where it is
    undefined."""
    deviation = (years - years.mean(axis=0)).reshape(-1, years.shape[-1])
    values = [np.corrcoef(d[:-1], d[1:])[0, 1] for d in deviation if d[:-1].std() > 0 and d[1:].std() > 0]
    return float(np.clip(np.mean(values), 0.0, 1.0)) if values else 0.0


class DayAheadPlanner:
    """Plans the next :data:`HORIZON_STEPS` on a forecast and applies the first step (see the module's doc)."""

    name = "planner"

    def __init__(self, model: SiteModel, forecast: Forecast | ProfileForecast, margin_soc: float,
                 stays: dict[str, Stays] | None = None) -> None:
        # The period's model supplies the equipment's constants and, at step t, only that step's load, solar
        # and carbon intensity (what CityLearn observes now); the hours after t come from the forecast.
        self.model, self.forecast, self.margin_soc = model, forecast, margin_soc
        # By charger: how long its cars stayed in the part learnt from, for a car whose departure is not known yet
        # (none: such a car is unknown to the planner until its departure reads), and the car connected now.
        self.stays = stays or {}
        self._stay: dict[str, Stay] = {}
        self._read_at = -1  # the step the chargers were last read at
        self.idle_steps = 0  # steps whose window had no feasible plan (the battery and chargers left idle)
        self._on: Any = None  # the environment the action layout and scale were read from (they do not change)
        self._layout: list[tuple[int, str]] = []
        self._scale: ActionScale | None = None

    def act(self, obs: np.ndarray, env: Any) -> np.ndarray:
        t = min(env.time_step, self.model.steps - 1)
        steps = min(HORIZON_STEPS, self.model.steps - t, self.forecast.steps - t)
        fixed, carbon = self.forecast.ahead(t, steps, self.model.fixed_net_kwh[:, t], self.model.carbon[t])
        # The period being judged ends with the last window: its plan returns the battery to the period's start.
        ending = t + steps >= self.model.steps
        batteries = [window_battery(b, float(env.buildings[b.building].electrical_storage.energy_init), steps,
                                    b.initial_kwh if ending else None) for b in self.model.batteries]
        try:
            battery, car = decide(fixed, carbon, self.model.hours, batteries, self._cars(env, t), self.margin_soc)
        except OptimumUnavailable:  # a state the window cannot recover from in its hours: idle, the guard serves cars
            self.idle_steps += 1
            battery, car = {}, {}
        if self._on is not env:
            self._on, self._layout, self._scale = env, action_layout(env), ActionScale.of(env)
        native = [battery.get(b, 0.0) if name == "electrical_storage"
                  else car.get(name[len(EV_ACTION_PREFIX):], 0.0) if name.startswith(EV_ACTION_PREFIX) else 0.0
                  for b, name in self._layout]
        return self._scale.to_agent(native)  # type: ignore[union-attr]

    def _cars(self, env: Any, t: int) -> list[CarNow]:
        """The cars connected now whose departure is known, as CityLearn's objects hold them, and those whose
        departure is not known yet as the chargers' stays estimate it (the readings an exported planner reads:
        connected, departure, required charge, the hour)."""
        if t < self._read_at or t == 0:  # a new episode: no car has arrived yet
            self._stay, self._read_at = {}, -1
        read = t != self._read_at
        self._read_at = t
        hour = int(env.buildings[0].energy_simulation.hour[t])
        cars = []
        for b, building in enumerate(env.buildings):
            for charger in building.electric_vehicle_chargers or []:
                sim = charger.charger_simulation
                ev = charger.connected_electric_vehicle
                state = sim.electric_vehicle_charger_state
                connected = ev is not None and t < len(state) and state[t] == CONNECTED
                departure = float(sim.electric_vehicle_departure_time[t]) if t < len(state) else -1.0
                stay = self._stay.setdefault(charger.charger_id, Stay())
                if read:
                    stay.read(hour, connected, departure)
                if not connected:
                    continue
                due = car_due(float(sim.electric_vehicle_required_soc_departure[t]), departure, stay,
                              self.stays.get(charger.charger_id))
                if due is None:
                    continue
                battery = ev.battery
                cars.append(CarNow(b, charger.charger_id, charging_path(charger, battery), float(battery.energy_init),
                                   due[0] * float(battery.capacity), due[1]))
        return cars


def charger_stays(env: Any) -> dict[str, Stays]:
    """Each charger's :class:`Stays` over the period of ``env`` (a reset CityLearnEnv): the readings of every hour
    as CityLearn shows them (its departure and required-charge countdowns, the hour of the day)."""
    steps = env.time_steps
    hour = np.asarray(env.buildings[0].energy_simulation.hour[:steps])
    out = {}
    for building in env.buildings:
        for charger in building.electric_vehicle_chargers or []:
            sim = charger.charger_simulation
            learnt = learn_stays(hour, np.asarray(sim.electric_vehicle_charger_state[:steps]) == CONNECTED,
                                 np.asarray(sim.electric_vehicle_departure_time[:steps], dtype=float),
                                 np.asarray(sim.electric_vehicle_required_soc_departure[:steps], dtype=float))
            if learnt is not None:
                out[charger.charger_id] = learnt
    return out


@lru_cache(maxsize=4)
def _forecast(site_json: str, cfg_json: str, steps: int) -> Forecast:
    """The mean of :data:`FORECAST_YEARS` other draws of the site (cached: every evaluation of a night asks), kept on
    disk by the site's scenario, the length and the product's source: the draws are data (their loads, PV and carbon
    depend on nothing else in the config), and building them took 4-5 s of every night's planner on 2 cores."""
    key = json.dumps([FORECAST_FORMAT, FORECAST_YEARS, DRAW_SEED_OFFSET, steps, program_digest(), site_json])
    path = cache_root() / "planner" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz"
    try:
        with np.load(path, allow_pickle=False) as data:
            return Forecast(data["fixed_net_kwh"], data["carbon"], float(data["fixed_persistence"]),
                            float(data["carbon_persistence"]))
    except (OSError, ValueError, KeyError):  # not kept yet, or damaged: drawn again and replaced
        pass
    forecast = _drawn_forecast(site_json, cfg_json, steps)
    buffer = io.BytesIO()
    np.savez(buffer, **asdict(forecast))
    try:
        write_bytes_atomic(path, buffer.getvalue())
    except OSError as exc:  # a full or read-only cache costs the next night the draws, nothing more
        logs.get().warning("the planner's forecast not kept for later nights", path=str(path), reason=str(exc))
    return forecast


def _drawn_forecast(site_json: str, cfg_json: str, steps: int) -> Forecast:
    cfg = Config.model_validate_json(cfg_json)
    try:
        site = ScenarioConfig.model_validate(json.loads(site_json))
    except ValueError:  # a site an older version built, with keys since retired (as trainer.site.Site.load)
        site = cfg.scenario
    years = []
    with tempfile.TemporaryDirectory(prefix="pvbess-planner-") as folder:
        for k in range(FORECAST_YEARS):
            drawn = site.model_copy(update={"seed": site.seed + DRAW_SEED_OFFSET + k})
            year = Site.load(build_site(drawn, Path(folder) / f"draw-{k + 1}"), BUILT_IN, fallback=drawn)
            env = make_sb3_env(cfg, year, "eval", 0, eval_days=max(1, -(-steps // 24)))
            try:
                env.reset()
                years.append(site_model(env.unwrapped, cfg.ev.margin_soc))
            finally:
                env.close()
    return Forecast.of_years(years)


# What the planner's forecast is learnt from (its results' ``forecast``): on a dataset the readings it has seen, which a
# site has too, so it can be exported; on the built-in site other draws of the site's climate, which a site has not.
FORECAST_OF_READINGS = "the readings so far"
FORECAST_OF_DRAWS = "other years of the site"


def forecast_source(planner: DayAheadPlanner) -> str:
    return FORECAST_OF_READINGS if isinstance(planner.forecast, ProfileForecast) else FORECAST_OF_DRAWS


# What a run's results record of the planner they evaluated (``version``): bump where what it decides changes. An
# export proves the planner of this version against the night's figures, so a night of an earlier one is evaluated
# again first. 2: cars whose departure is not read yet are planned for with the stays learnt before, and the hour it
# sends keeps a charger's minimum power.
PLANNER_VERSION = 2


def planner_exports(planner: dict[str, Any]) -> bool:
    """Whether the planner a run evaluated (its entry in results.json) can be exported: this version's, forecasting
    from the readings (an entry from before either was recorded is taken as not)."""
    return planner.get("forecast") == FORECAST_OF_READINGS and planner.get("version") == PLANNER_VERSION


def day_ahead_planner(cfg: Config, env: Any, history: Callable[[], Any] | None = None) -> DayAheadPlanner:
    """The planner for the period of ``env`` (a reset CityLearnEnv): on the built-in site its forecast is other
    years of the site; on any other dataset it is learnt from the hours already seen, those of ``history`` first (it
    opens an evaluation environment of the part of the data a run learnt from, where ``env`` is the part held out).
    OptimumUnavailable where the site holds what the program does not model."""
    model = site_model(env, cfg.ev.margin_soc)
    schema = env.schema if isinstance(env.schema, dict) else {}
    scenario = schema.get("pvbess_site")
    if scenario is None:
        hours = np.asarray(env.buildings[0].energy_simulation.hour[:model.steps])
        forecast: Forecast | ProfileForecast = ProfileForecast(hours, model.buildings)
        stays: dict[str, Stays] = {}
        if history is not None:
            opened = history()
            try:
                opened.reset()
                before = opened.unwrapped
                past = site_model(before, cfg.ev.margin_soc)
                forecast.learn_from(np.asarray(before.buildings[0].energy_simulation.hour[:past.steps]),
                                    past.fixed_net_kwh, past.carbon)
                stays = charger_stays(before)
            finally:
                opened.close()
    else:
        forecast = _forecast(json.dumps(scenario, sort_keys=True), cfg.model_dump_json(), model.steps + HORIZON_STEPS)
        stays = {}  # the built-in site's chargers read every car's departure from its arrival
    return DayAheadPlanner(model, forecast, cfg.ev.margin_soc, stays)
