"""The site as the optimum's linear program sees it, read from a CityLearn environment.

Per building: its fixed load net of PV, its battery (best-case efficiency and power, losses, floor
and capacity), and each car's charging session at each charger (arrival, departure, the energy it
must store, what full power can reach, V2G's discharge limits); the carbon intensity of each step.
Whatever the program does not model is refused with :class:`OptimumUnavailable` and the reason.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainer.env.ev_guard import charging_path
from trainer.shipped.controller import ChargingPath, Curve
from trainer.shipped.program import (
    BatteryModel,
    EvSession,
    OptimumUnavailable,
    SiteModel,
    power_lines,
    session_limits,
)

__all__ = ["BatteryModel", "EvSession", "OptimumUnavailable", "SiteModel", "power_lines", "session_limits",
           "site_model"]

SUPPORTED_ACTIONS = ("electrical_storage",)
EV_ACTION_PREFIX = "electric_vehicle_storage_"


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


def _valid_soc(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def arrival_soc(sim: Any, start: int) -> float | None:
    """The state of charge CityLearn forces on a car that connects at ``start`` (its arrival rule), or None where
    it forces none (the car keeps what it has)."""
    current = getattr(sim, "electric_vehicle_current_soc", None)
    if current is not None and start < len(current) and _valid_soc(current[start]) is not None:
        return _valid_soc(current[start])
    states = sim.electric_vehicle_charger_state
    index = start - 1 if start > 0 and states[start - 1] in (2, 3) else start
    return _valid_soc(sim.electric_vehicle_estimated_soc_arrival[index])


def _new_session(sim: Any, t: int) -> bool:
    """Whether the car connected at ``t`` starts a new session where it was connected at ``t - 1`` too: CityLearn's
    rule (a changed session id, else a departure countdown that restarts after reaching 1 or less)."""
    ids = getattr(sim, "electric_vehicle_session_id", None)
    if ids is not None and t < len(ids) and isinstance(ids[t], str) and ids[t].strip() not in ("", "nan"):
        before = ids[t - 1]
        return isinstance(before, str) and before.strip() not in ("", "nan") and before != ids[t]
    left = sim.electric_vehicle_departure_time
    before, now = float(left[t - 1]), float(left[t])
    return math.isfinite(before) and math.isfinite(now) and before <= 1 and now > before


def connections(sim: Any, steps: int) -> list[tuple[str, int, int, float | None]]:
    """(car, first step, end step, state of charge forced on arrival or None) of each charging session in the
    first ``steps`` steps, as CityLearn plugs cars in: a session goes on while the same car stays connected and
    no new arrival resets its state of charge."""
    state = np.asarray(sim.electric_vehicle_charger_state[:steps], dtype=float)
    out: list[list[Any]] = []
    for t in range(steps):
        car = sim.electric_vehicle_id[t]
        if state[t] != 1 or not isinstance(car, str) or car.strip() in ("", "nan"):
            continue
        going_on = bool(out) and out[-1][2] == t and out[-1][0] == car
        soc = arrival_soc(sim, t) if not going_on or _new_session(sim, t) else None
        if going_on and soc is None:
            out[-1][2] = t + 1
        else:
            out.append([car, t, t + 1, soc])
    return [tuple(row) for row in out]


def _full_power_kwh(path: ChargingPath, energy: float, steps: int) -> tuple[float, ...]:
    """The baseline's grid kWh per step of a session: full power from arrival, in CityLearn's physics."""
    drawn = []
    for _ in range(steps):
        stored, grid = path.step(energy, 1.0)
        drawn.append(grid)
        energy = path.carried_over(stored)
    return tuple(drawn)


def _session(b: int, charger: Any, ev: Any, span: tuple[int, int, float | None], hours: float, margin_soc: float
             ) -> EvSession:
    """One car's stay at a charger (``span``: first step, end step, the state of charge forced on arrival)."""
    start, end, soc = span
    sim = charger.charger_simulation
    battery = ev.battery
    capacity = float(battery.capacity)
    path = charging_path(charger, battery)  # CityLearn's physics; the LP takes each curve's best point
    max_grid, stored_per_grid, feed, fed_per_stored = session_limits(path, hours)
    steps = tuple(range(start, end))
    initial = float(battery.soc[0]) if start == 0 else (float(battery.initial_soc) if soc is None else soc)
    arrival_kwh = max(initial, path.min_soc) * capacity  # CityLearn's energy_init is floored there
    room = max(capacity - arrival_kwh, 0.0)
    left = np.asarray(sim.electric_vehicle_departure_time[start:end], dtype=float)
    required = np.asarray(sim.electric_vehicle_required_soc_departure[start:end], dtype=float)

    def need(k: int) -> float:
        """What it must have stored by the end of its k-th step: its goal, or what full power can reach by then in
        CityLearn's physics (a hair under: the guard serves the rest)."""
        reachable = min(0.999 * (path.reachable(arrival_kwh, k + 1) - arrival_kwh),
                        (k + 1) * max_grid * stored_per_grid, room)
        return min(max((float(required[k]) + margin_soc) * capacity - arrival_kwh, 0.0), max(reachable, 0.0))

    # The metrics judge a departure where the countdown reads 0; a session still connected at the period's end, or
    # one whose file never flags its departure, owes nothing yet.
    flagged = [k for k in range(len(steps)) if left[k] == 0]
    last = len(steps) - 1
    return EvSession(b, charger.charger_id, steps, max_grid, stored_per_grid, need(last) if last in flagged else 0.0,
                     room, path.max_power_kw, feed, fed_per_stored, max(arrival_kwh - path.min_soc * capacity, 0.0),
                     path.max_discharge_kw, _full_power_kwh(path, arrival_kwh, len(steps)),
                     tuple((k, need(k)) for k in flagged if k != last), path, arrival_kwh)


def _sessions(env: Any, b: int, building: Any, steps: int, margin_soc: float) -> list[EvSession]:
    evs = {ev.name: ev for ev in env.electric_vehicles or []}
    hours = env.seconds_per_time_step / 3600
    return [_session(b, charger, evs[car], (start, end, soc), hours, margin_soc)
            for charger in building.electric_vehicle_chargers or []
            for car, start, end, soc in connections(charger.charger_simulation, steps) if car in evs]


def battery_path(storage: Any) -> ChargingPath:
    """A building's battery as the numbers of a charging path with a lossless charger of its nominal power both
    ways: ``ChargingPath.step`` with action a is then ``Battery.charge`` of a x nominal power x hours."""
    nominal = float(storage.nominal_power)
    return ChargingPath(
        max_power_kw=nominal, min_power_kw=0.0, charger_efficiency=1.0, charger_curve=None,
        capacity_kwh=float(storage.capacity), degraded_capacity_kwh=float(storage.degraded_capacity),
        nominal_power_kw=nominal, power_efficiency=Curve.of(storage.power_efficiency_curve),
        capacity_power=Curve.of(storage.capacity_power_curve), loss_per_step=float(storage.loss_coefficient),
        min_soc=float(np.clip(1.0 - storage.depth_of_discharge, 0.0, 1.0)),
        hours=float(storage.seconds_per_time_step) / 3600.0, max_discharge_kw=nominal)


def site_model(env: Any, margin_soc: float) -> SiteModel:
    """Read the evaluation period from a freshly reset CityLearnEnv."""
    reason = _unsupported(env)
    if reason:
        raise OptimumUnavailable(reason)
    steps = env.time_steps - 1  # CityLearn ends a T-step episode after T - 1 steps
    hours = env.seconds_per_time_step / 3600
    fixed = np.zeros((len(env.buildings), steps))
    batteries, sessions = [], []
    for b, building in enumerate(env.buildings):
        sim = building.energy_simulation
        fixed[b] += np.asarray(sim.non_shiftable_load[:steps], dtype=float)
        if building.pv is not None:
            fixed[b] -= np.asarray(
                building.pv.get_generation(np.asarray(sim.solar_generation[:steps], dtype=float)), dtype=float
            )
        storage = building.electrical_storage
        if (
            storage is not None
            and float(storage.capacity or 0.0) > 0
            and "electrical_storage" in building.active_actions
        ):
            power_fraction = max(np.asarray(storage.capacity_power_curve)[1])
            path = battery_path(storage)
            batteries.append(BatteryModel(
                building=b, capacity_kwh=float(storage.capacity),
                max_kwh_per_step=float(storage.nominal_power) * power_fraction * hours,
                efficiency=float(max(np.asarray(storage.power_efficiency_curve)[1])),
                loss_per_step=float(storage.loss_coefficient),
                min_kwh=float(np.clip(1.0 - storage.depth_of_discharge, 0.0, 1.0)) * float(storage.capacity),
                initial_kwh=float(storage.soc[0]) * float(storage.capacity),
                nominal_power_kw=float(storage.nominal_power), path=path,
                power_lines=power_lines(path.capacity_power, float(storage.nominal_power) * hours,
                                        float(storage.capacity), float(storage.loss_coefficient))))
        sessions += _sessions(env, b, building, steps, margin_soc)
    carbon = np.asarray(env.buildings[0].carbon_intensity.carbon_intensity[:steps], dtype=float)
    return SiteModel(steps, hours, carbon, fixed, batteries, sessions)
