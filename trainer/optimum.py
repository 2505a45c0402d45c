"""The physical limit: a perfect-foresight linear program of the site, solved with HiGHS.

Knowing the whole evaluation period in advance (load, PV, carbon intensity, every car's arrival,
departure and target), what is the least grid CO2 the site's battery and EV chargers can reach
while every reachable departure is met? No controller can do better, so it is the yardstick
for the agents: ``co2_share_of_optimum_pct`` is an agent's CO2 cut as a share of this one.

The model, per step ``t`` (kWh per step; all CityLearn's physics that is linear is kept):

- site import ``imp[t] >= sum over buildings of (fixed load - PV + battery in - battery out +
  EV charging)``, ``imp >= 0``; exports are worth nothing, as in the product's metrics;
- each battery: ``E[t] = (1 - loss) E[t-1] + sqrt(eta) in[t] - out[t] / sqrt(eta)``, with
  ``in + out <= P h``, ``E`` between the depth-of-discharge floor and the capacity, and the period
  ending with at least the energy it began with (no free energy);
- each car's session at a charger: grid energy ``x`` per connected step up to the charger's power;
  what it stores, ``x * charger efficiency * sqrt(EV battery efficiency)``, summed over the session,
  reaches the required state of charge (plus the guard's margin) where full power can reach it,
  and never exceeds the car's capacity;
- objective: ``sum carbon[t] imp[t]`` (plus a tie-break of one millionth on imports).

CityLearn's non-convex details are relaxed to their best case, so the LP is a bound: efficiency
curves at their highest point, capacity-power curves at their highest, capacity fade ignored. On
the built-in site the curves are flat (trainer.scenario pins them), so only fade differs. The
dispatch is then replayed through CityLearn (:class:`OptimumReplay`): that is what a controller
with perfect foresight really reaches.

Buildings with thermal storage or heat pumps driven by the controller, or with dynamic (thermal
model) simulation, are outside the model: :class:`OptimumUnavailable` says which and why.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer.env import ActionScale, action_slices

TIE_BREAK = 1e-6
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


@dataclass(frozen=True)
class EvSession:
    building: int
    charger: str
    steps: tuple[int, ...]
    max_grid_kwh_per_step: float
    stored_per_grid_kwh: float
    need_kwh: float
    room_kwh: float
    charger_power_kw: float


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
            left = session.room_kwh
            for t in session.steps:
                if left <= 1e-9:
                    break
                grid = min(session.max_grid_kwh_per_step, left / session.stored_per_grid_kwh)
                net[t] += grid
                left -= grid * session.stored_per_grid_kwh
        return net


@dataclass
class Solution:
    """The LP's optimum and the dispatch that reaches it (native CityLearn actions per step)."""

    co2_kg: float
    net_kwh: np.ndarray
    battery_actions: dict[int, np.ndarray]
    ev_actions: dict[str, np.ndarray]
    solve_s: float
    variables: int
    constraints: int


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
            charger_eff = (
                max(np.asarray(charger.charge_efficiency_curve)[1])
                if charger.charge_efficiency_curve is not None
                else float(charger.efficiency)
            )
            stored_per_grid = charger_eff * math.sqrt(max(np.asarray(battery.power_efficiency_curve)[1]))
            battery_kwh = float(battery.nominal_power) * max(np.asarray(battery.capacity_power_curve)[1]) * hours
            max_grid = min(float(charger.max_charging_power) * hours, battery_kwh / charger_eff)
            session_steps = tuple(range(start, t))
            initial = float(battery.soc[0]) if start == 0 else _arrival_soc(sim, start, float(battery.initial_soc))
            required = float(sim.electric_vehicle_required_soc_departure[start])
            room = max(capacity - initial * capacity, 0.0)
            reachable = min(len(session_steps) * max_grid * stored_per_grid, room)
            need = min(max((required + margin_soc) * capacity - initial * capacity, 0.0), reachable)
            if left[t - 1] != 0:  # the period ends before the car leaves: nothing is owed yet
                need = 0.0
            out.append(EvSession(b, charger.charger_id, session_steps, max_grid, stored_per_grid, need, room,
                                 float(charger.max_charging_power)))
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


def solve(model: SiteModel) -> Solution:
    """Minimise the period's CO2 (HiGHS via scipy's linprog)."""
    started = time.perf_counter()
    T = model.steps
    n_bat = len(model.batteries)
    # Variable layout: imp[T], then per battery (in[T], out[T], E[T]), then one x per session step.
    imp = np.arange(T)
    bat = [(T + 3 * T * k + np.arange(T), T + 3 * T * k + T + np.arange(T), T + 3 * T * k + 2 * T + np.arange(T))
           for k in range(n_bat)]
    ev_start = T + 3 * T * n_bat
    ev_index, offset = [], ev_start
    for session in model.sessions:
        ev_index.append(offset + np.arange(len(session.steps)))
        offset += len(session.steps)
    n = offset

    cost = np.zeros(n)
    cost[imp] = model.carbon + TIE_BREAK
    lower, upper = np.zeros(n), np.full(n, np.inf)
    ub_rows, ub_cols, ub_vals, ub_rhs = [], [], [], []
    eq_rows, eq_cols, eq_vals, eq_rhs = [], [], [], []

    def add(rows, cols, vals, row, entries):
        for col, val in entries:
            rows.append(row)
            cols.append(col)
            vals.append(val)

    # Import: -imp[t] + sum(in - out) + sum(x) <= -fixed[t]
    row = 0
    for t in range(T):
        add(ub_rows, ub_cols, ub_vals, row, [(imp[t], -1.0)])
        ub_rhs.append(-model.fixed_net_kwh[t])
        row += 1
    for charge, discharge, _ in bat:
        ub_rows += list(range(T)) * 2
        ub_cols += list(charge) + list(discharge)
        ub_vals += [1.0] * T + [-1.0] * T
    for cols, session in zip(ev_index, model.sessions):
        ub_rows += list(session.steps)
        ub_cols += list(cols)
        ub_vals += [1.0] * len(cols)
        upper[cols] = session.max_grid_kwh_per_step
    # Batteries: power shared by both directions, energy bounds, dynamics, no free energy at the end.
    eq = 0
    for (charge, discharge, energy), battery in zip(bat, model.batteries):
        root = math.sqrt(battery.efficiency)
        upper[charge] = upper[discharge] = battery.max_kwh_per_step
        lower[energy], upper[energy] = battery.min_kwh, battery.capacity_kwh
        for t in range(T):
            add(ub_rows, ub_cols, ub_vals, row, [(charge[t], 1.0), (discharge[t], 1.0)])
            ub_rhs.append(battery.max_kwh_per_step)
            row += 1
            entries = [(energy[t], 1.0), (charge[t], -root), (discharge[t], 1.0 / root)]
            if t > 0:
                entries.append((energy[t - 1], -(1.0 - battery.loss_per_step)))
            add(eq_rows, eq_cols, eq_vals, eq, entries)
            eq_rhs.append(battery.initial_kwh if t == 0 else 0.0)
            eq += 1
        add(ub_rows, ub_cols, ub_vals, row, [(energy[T - 1], -1.0)])
        ub_rhs.append(-min(battery.initial_kwh, battery.capacity_kwh))
        row += 1
    # Cars: served, never overfilled.
    for cols, session in zip(ev_index, model.sessions):
        add(ub_rows, ub_cols, ub_vals, row, [(c, -session.stored_per_grid_kwh) for c in cols])
        ub_rhs.append(-session.need_kwh)
        row += 1
        add(ub_rows, ub_cols, ub_vals, row, [(c, session.stored_per_grid_kwh) for c in cols])
        ub_rhs.append(session.room_kwh)
        row += 1

    from scipy import sparse  # lazy: half a second to import, only the optimum needs it
    from scipy.optimize import linprog

    a_ub = sparse.csr_matrix((ub_vals, (ub_rows, ub_cols)), shape=(row, n))
    a_eq = sparse.csr_matrix((eq_vals, (eq_rows, eq_cols)), shape=(eq, n)) if eq else None
    result = linprog(cost, A_ub=a_ub, b_ub=np.asarray(ub_rhs), A_eq=a_eq, b_eq=np.asarray(eq_rhs) if eq else None,
                     bounds=np.column_stack([lower, upper]), method="highs")
    if result.status != 0:
        raise OptimumUnavailable(f"the linear program could not be solved: {result.message}")
    x = result.x
    net = model.fixed_net_kwh.copy()
    battery_actions = {}
    for (charge, discharge, _), battery in zip(bat, model.batteries):
        flow = x[charge] - x[discharge]
        net += flow
        # CityLearn turns a battery action into energy by its nominal power.
        battery_actions[battery.building] = flow / (battery.nominal_power_kw * model.hours)
    ev_actions: dict[str, np.ndarray] = {}
    for cols, session in zip(ev_index, model.sessions):
        series = ev_actions.setdefault(session.charger, np.zeros(T))
        series[list(session.steps)] = x[cols] / (session.charger_power_kw * model.hours)
        net[list(session.steps)] += x[cols]
    return Solution(model.co2_kg(net), net, battery_actions, ev_actions, time.perf_counter() - started, n, row + eq)


class OptimumReplay:
    """The LP's dispatch, step by step, as a controller (what perfect foresight reaches in CityLearn)."""

    name = "optimum"

    def __init__(self, solution: Solution) -> None:
        self.solution = solution

    def act(self, obs: np.ndarray, env: Any) -> np.ndarray:
        t = env.time_step
        native: list[float] = []
        for (_, names), b in zip(action_slices(env), range(len(env.buildings))):
            for name in names:
                if name == "electrical_storage" and b in self.solution.battery_actions:
                    series = self.solution.battery_actions[b]
                elif name.startswith(EV_ACTION_PREFIX):
                    series = self.solution.ev_actions.get(name[len(EV_ACTION_PREFIX):])
                else:
                    series = None
                native.append(float(np.clip(series[t], -1.0, 1.0)) if series is not None and t < len(series) else 0.0)
        return ActionScale.of(env).to_agent(native)
