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
  and never exceeds the car's capacity. Where the charger can discharge the car (V2G), ``y`` per
  step up to its discharge power feeds the building and takes ``y / (discharge efficiency *
  sqrt(EV battery efficiency))`` from the car, ``x`` and ``y`` share the step, and the car stays
  between its depth-of-discharge floor and its capacity at every step of the session;
- objective: ``sum carbon[t] imp[t]`` (plus a tie-break of one millionth on imports and on V2G).

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
from trainer.ev_service import ChargingPath

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


def _full_power_kwh(path: ChargingPath, energy: float, steps: int) -> tuple[float, ...]:
    """The baseline's grid kWh per step of a session: full power from arrival, in CityLearn's physics."""
    drawn = []
    for _ in range(steps):
        stored, grid = path.step(energy, 1.0)
        drawn.append(grid)
        energy = path.carried_over(stored)
    return tuple(drawn)


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
            path = ChargingPath.of(charger, battery)  # CityLearn's physics; the LP takes each curve's best point
            best_battery = math.sqrt(max(path.power_efficiency.y))
            charger_eff = max(path.charger_curve.y) if path.charger_curve else path.charger_efficiency
            stored_per_grid = charger_eff * best_battery
            battery_kwh = path.nominal_power_kw * max(path.capacity_power.y) * hours
            max_grid = min(path.max_power_kw * hours, battery_kwh / charger_eff)
            session_steps = tuple(range(start, t))
            initial = float(battery.soc[0]) if start == 0 else _arrival_soc(sim, start, float(battery.initial_soc))
            arrival_kwh = max(initial, path.min_soc) * capacity  # CityLearn's energy_init is floored there
            required = float(sim.electric_vehicle_required_soc_departure[start])
            room = max(capacity - arrival_kwh, 0.0)
            reachable = min(len(session_steps) * max_grid * stored_per_grid, room)
            need = min(max((required + margin_soc) * capacity - arrival_kwh, 0.0), reachable)
            if left[t - 1] != 0:  # the period ends before the car leaves: nothing is owed yet
                need = 0.0
            feed = fed_per_stored = 0.0
            if path.max_discharge_kw > 0:
                discharge_eff = max(path.discharge_curve.y) if path.discharge_curve else path.charger_efficiency
                fed_per_stored = discharge_eff * best_battery
                feed = min(path.max_discharge_kw * hours, battery_kwh * discharge_eff)
            out.append(EvSession(b, charger.charger_id, session_steps, max_grid, stored_per_grid, need, room,
                                 path.max_power_kw, feed, fed_per_stored or 1.0,
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


class _Program:
    """The linear program as sparse rows: ``A_ub x <= b_ub``, ``A_eq x = b_eq``, bounds, costs."""

    def __init__(self, n: int) -> None:
        self.cost = np.zeros(n)
        self.lower, self.upper = np.zeros(n), np.full(n, np.inf)
        self.ub: tuple[list[int], list[int], list[float], list[float]] = ([], [], [], [])
        self.eq: tuple[list[int], list[int], list[float], list[float]] = ([], [], [], [])

    @staticmethod
    def _add(rows: tuple[list[int], list[int], list[float], list[float]], entries: list[tuple[int, float]],
             rhs: float) -> None:
        row = len(rows[3])
        for col, val in entries:
            rows[0].append(row)
            rows[1].append(col)
            rows[2].append(val)
        rows[3].append(rhs)

    def at_most(self, entries: list[tuple[int, float]], rhs: float) -> None:
        self._add(self.ub, entries, rhs)

    def equal(self, entries: list[tuple[int, float]], rhs: float) -> None:
        self._add(self.eq, entries, rhs)

    def solve(self) -> np.ndarray:
        from scipy import sparse  # lazy: half a second to import, only the optimum needs it
        from scipy.optimize import linprog

        n = len(self.cost)

        def matrix(rows: tuple[list[int], list[int], list[float], list[float]]) -> Any:
            return sparse.csr_matrix((rows[2], (rows[0], rows[1])), shape=(len(rows[3]), n)) if rows[3] else None

        result = linprog(self.cost, A_ub=matrix(self.ub), b_ub=np.asarray(self.ub[3]) if self.ub[3] else None,
                         A_eq=matrix(self.eq), b_eq=np.asarray(self.eq[3]) if self.eq[3] else None,
                         bounds=np.column_stack([self.lower, self.upper]), method="highs")
        if result.status != 0:
            raise OptimumUnavailable(f"the linear program could not be solved: {result.message}")
        return result.x

    @property
    def constraints(self) -> int:
        return len(self.ub[3]) + len(self.eq[3])


def _add_battery(lp: _Program, battery: BatteryModel, charge: np.ndarray, discharge: np.ndarray,
                 energy: np.ndarray) -> None:
    """Power shared by both directions, energy bounds, dynamics, no free energy at the end."""
    root = math.sqrt(battery.efficiency)
    lp.upper[charge] = lp.upper[discharge] = battery.max_kwh_per_step
    lp.lower[energy], lp.upper[energy] = battery.min_kwh, battery.capacity_kwh
    for t in range(len(charge)):
        lp.at_most([(charge[t], 1.0), (discharge[t], 1.0)], battery.max_kwh_per_step)
        entries = [(energy[t], 1.0), (charge[t], -root), (discharge[t], 1.0 / root)]
        if t > 0:
            entries.append((energy[t - 1], -(1.0 - battery.loss_per_step)))
        lp.equal(entries, battery.initial_kwh if t == 0 else 0.0)
    lp.at_most([(energy[-1], -1.0)], -min(battery.initial_kwh, battery.capacity_kwh))


def _add_car(lp: _Program, session: EvSession, cols: np.ndarray, feeds: np.ndarray | None) -> None:
    """Served by departure, never overfilled; with V2G, within the floor and the capacity at every step."""
    lp.upper[cols] = session.max_grid_kwh_per_step
    stored = [(int(c), session.stored_per_grid_kwh) for c in cols]
    taken: list[tuple[int, float]] = []
    if feeds is not None:
        lp.upper[feeds] = session.max_feed_kwh_per_step
        lp.cost[feeds] = TIE_BREAK  # feeding a building that imports nothing is no gain
        taken = [(int(f), -1.0 / session.fed_per_stored_kwh) for f in feeds]
    lp.at_most([(c, -v) for c, v in stored + taken], -session.need_kwh)
    if feeds is None:  # charging only: the energy only grows, so its last step bounds them all
        lp.at_most(stored, session.room_kwh)
        return
    for k in range(len(cols)):
        so_far = stored[:k + 1] + taken[:k + 1]
        lp.at_most(so_far, session.room_kwh)
        lp.at_most([(c, -v) for c, v in so_far], session.reserve_kwh)
        # charging and discharging share the step
        lp.at_most([(int(cols[k]), 1.0 / session.max_grid_kwh_per_step),
                    (int(feeds[k]), 1.0 / session.max_feed_kwh_per_step)], 1.0)


def solve(model: SiteModel) -> Solution:
    """Minimise the period's CO2 (HiGHS via scipy's linprog)."""
    started = time.perf_counter()
    T = model.steps
    # Variable layout: imp[T], then per battery (in[T], out[T], E[T]), then one x per session step, then
    # one y per step of each session whose charger can discharge (V2G).
    imp = np.arange(T)
    bat = [(T + 3 * T * k + np.arange(T), T + 3 * T * k + T + np.arange(T), T + 3 * T * k + 2 * T + np.arange(T))
           for k in range(len(model.batteries))]
    offset = T + 3 * T * len(model.batteries)
    ev_index: list[np.ndarray] = []
    for session in model.sessions:
        ev_index.append(offset + np.arange(len(session.steps)))
        offset += len(session.steps)
    feed_index: list[np.ndarray | None] = []
    for session in model.sessions:
        feeds = session.max_feed_kwh_per_step > 0
        feed_index.append(offset + np.arange(len(session.steps)) if feeds else None)
        offset += len(session.steps) if feeds else 0
    lp = _Program(offset)
    lp.cost[imp] = model.carbon + TIE_BREAK

    # Import: -imp[t] + sum(in - out) + sum(x - y) <= -fixed[t]
    site: list[list[tuple[int, float]]] = [[(int(imp[t]), -1.0)] for t in range(T)]
    for charge, discharge, _ in bat:
        for t in range(T):
            site[t] += [(int(charge[t]), 1.0), (int(discharge[t]), -1.0)]
    for cols, feeds, session in zip(ev_index, feed_index, model.sessions):
        for k, t in enumerate(session.steps):
            site[t].append((int(cols[k]), 1.0))
            if feeds is not None:
                site[t].append((int(feeds[k]), -1.0))
    for t in range(T):
        lp.at_most(site[t], -model.fixed_net_kwh[t])
    for (charge, discharge, energy), battery in zip(bat, model.batteries):
        _add_battery(lp, battery, charge, discharge, energy)
    for cols, feeds, session in zip(ev_index, feed_index, model.sessions):
        _add_car(lp, session, cols, feeds)

    x = lp.solve()
    net = model.fixed_net_kwh.copy()
    battery_actions = {}
    for (charge, discharge, _), battery in zip(bat, model.batteries):
        flow = x[charge] - x[discharge]
        net += flow
        # CityLearn turns a battery action into energy by its nominal power.
        battery_actions[battery.building] = flow / (battery.nominal_power_kw * model.hours)
    ev_actions: dict[str, np.ndarray] = {}
    for cols, feeds, session in zip(ev_index, feed_index, model.sessions):
        series = ev_actions.setdefault(session.charger, np.zeros(T))
        grid = x[cols].copy()
        series[list(session.steps)] = grid / (session.charger_power_kw * model.hours)
        if feeds is not None:  # a discharge is a negative action on the discharge power's scale
            grid -= x[feeds]
            series[list(session.steps)] -= x[feeds] / (session.discharge_power_kw * model.hours)
        net[list(session.steps)] += grid
    return Solution(model.co2_kg(net), net, battery_actions, ev_actions, time.perf_counter() - started, offset,
                    lp.constraints)


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
