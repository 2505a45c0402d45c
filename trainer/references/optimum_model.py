"""The site as the optimum's linear program sees it, read from a CityLearn environment.

Per building: its fixed load net of PV, its battery (best-case efficiency and power, losses, floor
and capacity), and each car's charging session at each charger (arrival, departure, the energy it
must store, what full power can reach, V2G's discharge limits); the carbon intensity of each step.
Whatever the program does not model is refused with :class:`OptimumUnavailable` and the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer.env.ev_guard import charging_path
from trainer.shipped.controller import ChargingPath

SUPPORTED_ACTIONS = ("electrical_storage",)
EV_ACTION_PREFIX = "electric_vehicle_storage_"


class OptimumUnavailable(Exception):
    """The dataset holds something the linear program does not model (the message says what)."""


@dataclass(frozen=True)
class BatteryModel:
    building: int
    capacity_kwh: float
    max_kwh_per_step: float
    efficiency: float  # round trip; its square root applies each way
    loss_per_step: float
    min_kwh: float
    initial_kwh: float
    nominal_power_kw: float
    final_kwh: float | None = None  # the least it must hold at the end; None: what it held at the start


@dataclass(frozen=True)
class EvSession:
    building: int
    charger: str
    steps: tuple[int, ...]
    max_grid_kwh_per_step: float
    stored_per_grid_kwh: float
    need_kwh: float
    room_kwh: float  # what the car can still take: capacity less its arrival energy
    charger_power_kw: float
    # V2G: grid kWh the charger can feed the building per step (0: it cannot discharge), grid kWh per
    # stored kWh taken, what the car holds above its depth-of-discharge floor on arrival, and the power.
    max_feed_kwh_per_step: float = 0.0
    fed_per_stored_kwh: float = 1.0
    reserve_kwh: float = 0.0
    discharge_power_kw: float = 0.0
    # The baseline's grid kWh per step (full power from arrival) in CityLearn's own physics, curves,
    # standby loss and capacity included; None: the linear model's (hand-built sessions).
    uncontrolled_kwh: tuple[float, ...] | None = None


@dataclass
class SiteModel:
    """The evaluation period as numbers: what the linear program sees."""

    steps: int
    hours: float
    carbon: np.ndarray
    fixed_net_kwh: np.ndarray  # the site's net import with batteries idle and no car charging
    batteries: list[BatteryModel] = field(default_factory=list)
    sessions: list[EvSession] = field(default_factory=list)

    def co2_kg(self, net_kwh: np.ndarray) -> float:
        return float((np.clip(net_kwh, 0.0, None) * self.carbon).sum())

    def uncontrolled_net_kwh(self) -> np.ndarray:
        """Batteries idle; every car charges at full power from arrival until full or gone (the baseline)."""
        net = self.fixed_net_kwh.copy()
        for session in self.sessions:
            if session.uncontrolled_kwh is not None:
                net[list(session.steps)] += session.uncontrolled_kwh
                continue
            left = session.room_kwh
            for t in session.steps:
                if left <= 1e-9:
                    break
                grid = min(session.max_grid_kwh_per_step, left / session.stored_per_grid_kwh)
                net[t] += grid
                left -= grid * session.stored_per_grid_kwh
        return net


def _unsupported(env: Any) -> str | None:
    for building in env.buildings:
        name = building.name
        if type(building).__name__ != "Building":
            return (
                f"{name} is a {type(building).__name__} (a thermal dynamics model), which a linear program cannot hold"
            )
        for storage in ("cooling_storage", "heating_storage", "dhw_storage"):
            device = getattr(building, storage, None)
            if device is not None and float(getattr(device, "capacity", 0.0) or 0.0) > 0:
                return f"{name} has {storage.replace('_', ' ')} (thermal storage is outside the optimum's model)"
        sim = building.energy_simulation
        for demand in ("cooling_demand", "heating_demand", "dhw_demand"):
            values = np.nan_to_num(np.asarray(getattr(sim, demand), dtype=float))
            if np.any(values > 0):
                return (f"{name} has {demand.replace('_', ' ')} served by CityLearn's heat-pump models "
                        "(outside the optimum's model)")
        extra = [
            a for a in building.active_actions if a not in SUPPORTED_ACTIONS and not a.startswith(EV_ACTION_PREFIX)
        ]
        if extra:
            return f"{name} has actions the optimum does not model: {', '.join(extra)}"
    return None


def _arrival_soc(sim: Any, start: int, fallback: float) -> float:
    """The state of charge CityLearn gives a car that plugs in at ``start`` (its arrival rule)."""
    current = getattr(sim, "electric_vehicle_current_soc", None)
    if current is not None and start < len(current) and 0.0 <= float(current[start]) <= 1.0:
        return float(current[start])
    states = sim.electric_vehicle_charger_state
    index = start - 1 if start > 0 and states[start - 1] in (2, 3) else start
    value = float(sim.electric_vehicle_estimated_soc_arrival[index])
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else fallback


def _full_power_kwh(path: ChargingPath, energy: float, steps: int) -> tuple[float, ...]:
    """The baseline's grid kWh per step of a session: full power from arrival, in CityLearn's physics."""
    drawn = []
    for _ in range(steps):
        stored, grid = path.step(energy, 1.0)
        drawn.append(grid)
        energy = path.carried_over(stored)
    return tuple(drawn)


def session_limits(path: ChargingPath, hours: float) -> tuple[float, float, float, float]:
    """A charger and car as the program's limits, each curve at its best point: grid kWh a step can charge, kWh
    stored per grid kWh, grid kWh a step can feed back (V2G; 0 without) and grid kWh fed per stored kWh taken."""
    best_battery = math.sqrt(max(path.power_efficiency.y))
    charger_eff = max(path.charger_curve.y) if path.charger_curve else path.charger_efficiency
    battery_kwh = path.nominal_power_kw * max(path.capacity_power.y) * hours
    max_grid = min(path.max_power_kw * hours, battery_kwh / charger_eff)
    if path.max_discharge_kw <= 0:
        return max_grid, charger_eff * best_battery, 0.0, 1.0
    discharge_eff = max(path.discharge_curve.y) if path.discharge_curve else path.charger_efficiency
    feed = min(path.max_discharge_kw * hours, battery_kwh * discharge_eff)
    return max_grid, charger_eff * best_battery, feed, discharge_eff * best_battery


def _sessions(env: Any, b: int, building: Any, steps: int, margin_soc: float) -> list[EvSession]:
    out = []
    evs = {ev.name: ev for ev in env.electric_vehicles or []}
    hours = env.seconds_per_time_step / 3600
    for charger in building.electric_vehicle_chargers or []:
        sim = charger.charger_simulation
        state = np.asarray(sim.electric_vehicle_charger_state[:steps], dtype=float)
        left = np.asarray(sim.electric_vehicle_departure_time[:steps], dtype=float)
        t = 0
        while t < steps:
            if state[t] != 1:
                t += 1
                continue
            start = t
            while t + 1 < steps and state[t + 1] == 1 and left[t + 1] < left[t]:
                t += 1
            ev = evs.get(str(sim.electric_vehicle_id[start]))
            t += 1
            if ev is None:
                continue
            battery = ev.battery
            capacity = float(battery.capacity)
            path = charging_path(charger, battery)  # CityLearn's physics; the LP takes each curve's best point
            max_grid, stored_per_grid, feed, fed_per_stored = session_limits(path, hours)
            session_steps = tuple(range(start, t))
            initial = float(battery.soc[0]) if start == 0 else _arrival_soc(sim, start, float(battery.initial_soc))
            arrival_kwh = max(initial, path.min_soc) * capacity  # CityLearn's energy_init is floored there
            required = float(sim.electric_vehicle_required_soc_departure[start])
            room = max(capacity - arrival_kwh, 0.0)
            reachable = min(len(session_steps) * max_grid * stored_per_grid, room)
            need = min(max((required + margin_soc) * capacity - arrival_kwh, 0.0), reachable)
            if left[t - 1] != 0:  # the period ends before the car leaves: nothing is owed yet
                need = 0.0
            out.append(EvSession(b, charger.charger_id, session_steps, max_grid, stored_per_grid, need, room,
                                 path.max_power_kw, feed, fed_per_stored,
                                 max(arrival_kwh - path.min_soc * capacity, 0.0), path.max_discharge_kw,
                                 _full_power_kwh(path, arrival_kwh, len(session_steps))))
    return out


def site_model(env: Any, margin_soc: float) -> SiteModel:
    """Read the evaluation period from a freshly reset CityLearnEnv."""
    reason = _unsupported(env)
    if reason:
        raise OptimumUnavailable(reason)
    steps = env.time_steps - 1  # CityLearn ends a T-step episode after T - 1 steps
    hours = env.seconds_per_time_step / 3600
    fixed = np.zeros(steps)
    batteries, sessions = [], []
    for b, building in enumerate(env.buildings):
        sim = building.energy_simulation
        fixed += np.asarray(sim.non_shiftable_load[:steps], dtype=float)
        if building.pv is not None:
            fixed -= np.asarray(
                building.pv.get_generation(np.asarray(sim.solar_generation[:steps], dtype=float)), dtype=float
            )
        storage = building.electrical_storage
        if (
            storage is not None
            and float(storage.capacity or 0.0) > 0
            and "electrical_storage" in building.active_actions
        ):
            power_fraction = max(np.asarray(storage.capacity_power_curve)[1])
            batteries.append(BatteryModel(
                building=b, capacity_kwh=float(storage.capacity),
                max_kwh_per_step=float(storage.nominal_power) * power_fraction * hours,
                efficiency=float(max(np.asarray(storage.power_efficiency_curve)[1])),
                loss_per_step=float(storage.loss_coefficient),
                min_kwh=float(np.clip(1.0 - storage.depth_of_discharge, 0.0, 1.0)) * float(storage.capacity),
                initial_kwh=float(storage.soc[0]) * float(storage.capacity),
                nominal_power_kw=float(storage.nominal_power)))
        sessions += _sessions(env, b, building, steps, margin_soc)
    carbon = np.asarray(env.buildings[0].carbon_intensity.carbon_intensity[:steps], dtype=float)
    return SiteModel(steps, hours, carbon, fixed, batteries, sessions)
