"""The physical limit: a perfect-foresight linear program of the site, solved with HiGHS.

Knowing the whole evaluation period in advance (load, PV, carbon intensity, every car's arrival,
departure and target), what is the least grid CO2 the site's battery and EV chargers can reach
while every reachable departure is met? No controller can do better, so it is the yardstick
for the agents: ``co2_share_of_optimum_pct`` is an agent's CO2 cut as a share of this one.

The model, per step ``t`` (kWh per step; all CityLearn's physics that is linear is kept):

- each building's import ``imp[b, t] >= fixed load - PV + battery in - battery out + EV charging``,
  ``imp >= 0``: every building has its own meter and exports are worth nothing, as CityLearn counts
  emissions and the product's metrics do (one building's surplus does not cover another's load);
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
the built-in site the curves are flat (trainer.site.scenario pins them), so only fade differs. The
dispatch is then replayed through CityLearn (:class:`OptimumReplay`): that is what a controller
with perfect foresight really reaches.

Buildings with thermal storage or heat pumps driven by the controller, or with dynamic (thermal
model) simulation, are outside the model: :class:`OptimumUnavailable` says which and why.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.env.citylearn import ActionScale, action_layout
from trainer.references.optimum_model import (
    EV_ACTION_PREFIX,
    BatteryModel,
    EvSession,
    OptimumUnavailable,
    SiteModel,
    power_lines,
)
from trainer.shipped.controller import ChargingPath, minimum_action

TIE_BREAK = 1e-6
# kg a kWh held in a battery or a car for a step earns a plan that stores early (``solve(store_early=True)``): among
# plans of equal CO2 (the surplus of noon stored at 9:00 or at 14:00, exports being worth nothing; a car charged at
# 1:00 or at 4:00 of a night as clean) the one that stores first. Small enough to change no plan's CO2 (Building_5's
# optimum over August-April: 571.199 kg either way).
STORE_EARLY = 1e-6


@dataclass
class Solution:
    """The LP's optimum and the dispatch that reaches it (native CityLearn actions per step)."""

    co2_kg: float
    net_kwh: np.ndarray  # (buildings, steps)
    battery_actions: dict[int, np.ndarray]
    ev_actions: dict[str, np.ndarray]
    solve_s: float
    variables: int
    constraints: int
    short_kwh: float = 0.0  # what the plan leaves cars short of their needs (0 wherever the physics reaches them)


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
    """Power shared by both directions (and by the state of charge, where the curve is known), energy bounds,
    dynamics, no free energy at the end."""
    root = math.sqrt(battery.efficiency)
    T = len(charge)
    into = np.full(T, root) if battery.charge_root is None else battery.charge_root
    out_of = np.full(T, root) if battery.discharge_root is None else battery.discharge_root
    kept = 1.0 - battery.loss_per_step
    lp.upper[charge] = lp.upper[discharge] = battery.max_kwh_per_step
    lp.lower[energy], lp.upper[energy] = battery.min_kwh, battery.capacity_kwh
    for t in range(T):
        lp.at_most([(charge[t], 1.0), (discharge[t], 1.0)], battery.max_kwh_per_step)
        for intercept, slope in battery.power_lines:  # CityLearn's limit at the state of charge the step starts with
            if t == 0:
                lp.at_most([(charge[t], 1.0), (discharge[t], 1.0)], intercept + slope * battery.initial_kwh)
            else:
                lp.at_most([(charge[t], 1.0), (discharge[t], 1.0), (energy[t - 1], -slope)], intercept)
        entries = [(energy[t], 1.0), (charge[t], -float(into[t])), (discharge[t], 1.0 / max(float(out_of[t]), 1e-9))]
        if t > 0:
            entries.append((energy[t - 1], -kept))
        lp.equal(entries, battery.initial_kwh if t == 0 else 0.0)
    final = battery.initial_kwh if battery.final_kwh is None else battery.final_kwh
    lp.at_most([(energy[-1], -1.0)], -min(final, battery.capacity_kwh))


def _add_car(lp: _Program, session: EvSession, cols: np.ndarray, feeds: np.ndarray | None, gain: np.ndarray,
             short: int, penalty: float) -> None:
    """Served by each departure, never overfilled, never below its floor; its power within what the car's
    capacity-power curve allows at the energy it holds (exact where the curve is concave, as CityLearn's are).
    ``gain[k]``: the kWh it holds after step k above what it arrived with; ``short``: the kWh it may end short of a
    departure's need at ``penalty`` kg each, so that a need the physics cannot reach never leaves the program without
    a plan (it costs more than any CO2 a shortfall could save)."""
    lp.upper[cols] = session.max_grid_kwh_per_step
    if session.max_grid_steps is not None:
        lp.upper[cols] = np.minimum(lp.upper[cols], session.max_grid_steps)
    if session.min_grid_steps is not None:
        lp.lower[cols] = np.minimum(session.min_grid_steps, lp.upper[cols])
    per_grid = session.stored_per_grid_steps or (session.stored_per_grid_kwh,) * len(cols)
    per_fed = session.fed_per_stored_steps or (session.fed_per_stored_kwh,) * len(cols)
    lp.upper[gain] = session.room_kwh
    lp.lower[gain] = -session.reserve_kwh if feeds is not None else 0.0
    lp.cost[short] = penalty
    # each departure: its energy by then; the last, at least what it came with (the site borrows, never keeps)
    for k, need in (*[(k, n) for k, n in session.interim_needs if n > 0], (len(cols) - 1, session.need_kwh)):
        lp.at_most([(int(gain[k]), -1.0), (short, -1.0)], -need)
    if feeds is not None:
        lp.upper[feeds] = session.max_feed_kwh_per_step
        if session.max_feed_steps is not None:
            lp.upper[feeds] = np.minimum(lp.upper[feeds], session.max_feed_steps)
        if session.min_feed_steps is not None:
            lp.lower[feeds] = np.minimum(session.min_feed_steps, lp.upper[feeds])
        lp.cost[feeds] = TIE_BREAK  # feeding a building that imports nothing is no gain
    path = session.path
    lines = () if path is None else power_lines(path.capacity_power, path.nominal_power_kw * path.hours,
                                                path.capacity_kwh, 0.0)
    # What the car's battery is asked per grid kWh (CityLearn limits that): the charger's efficiency charging, its
    # inverse feeding the building.
    root = math.sqrt(max(path.power_efficiency.y)) if path else 1.0
    for k in range(len(cols)):
        entries = [(int(gain[k]), 1.0), (int(cols[k]), -float(per_grid[k]))]
        if feeds is not None:
            entries.append((int(feeds[k]), 1.0 / max(float(per_fed[k]), 1e-9)))
        if k > 0:
            entries.append((int(gain[k - 1]), -1.0))
        lp.equal(entries, 0.0)
        power = [(int(cols[k]), float(per_grid[k]) / root)]
        if feeds is not None:
            # charging and discharging share the step
            lp.at_most([(int(cols[k]), 1.0 / session.max_grid_kwh_per_step),
                        (int(feeds[k]), 1.0 / session.max_feed_kwh_per_step)], 1.0)
            power.append((int(feeds[k]), root / max(float(per_fed[k]), 1e-9)))
        for intercept, slope in lines:  # CityLearn's limit at the energy the step starts with
            held = intercept + slope * session.arrival_kwh
            lp.at_most(power + ([(int(gain[k - 1]), -slope)] if k > 0 else []), held)


def _layout(model: SiteModel) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]], list[np.ndarray],
                                       list[np.ndarray | None], list[np.ndarray], int]:
    """The program's variables: imp[B x T] (building-major), then per battery (in[T], out[T], E[T]), then one x per
    session step, then one y per step of each session whose charger can discharge (V2G), then each session's energy
    gained; and how many there are."""
    T, B = model.steps, model.buildings
    imp = np.arange(B * T).reshape(B, T)
    first = B * T
    bat = [(first + 3 * T * k + np.arange(T), first + 3 * T * k + T + np.arange(T),
            first + 3 * T * k + 2 * T + np.arange(T)) for k in range(len(model.batteries))]
    offset = first + 3 * T * len(model.batteries)

    def columns(sessions: list[EvSession | None]) -> list[np.ndarray | None]:
        nonlocal offset
        out: list[np.ndarray | None] = []
        for session in sessions:
            out.append(None if session is None else offset + np.arange(len(session.steps)))
            offset += 0 if session is None else len(session.steps)
        return out

    ev_index = columns(model.sessions)
    feed_index = columns([s if s.max_feed_kwh_per_step > 0 else None for s in model.sessions])
    gain_index = columns(model.sessions)
    return imp, bat, ev_index, feed_index, gain_index, offset  # type: ignore[return-value]


def short_penalty(model: SiteModel) -> float:
    """kg a kWh a car ends short of its need costs the program: ten times the dirtiest hour's kWh."""
    return 10.0 * max(float(np.max(model.carbon, initial=0.0)), 1e-3)


def solve(model: SiteModel, store_early: bool = False) -> Solution:
    """Minimise the period's CO2 (HiGHS via scipy's linprog). ``store_early``: of the plans of least CO2, one that
    fills each battery and car as soon as it can (:data:`STORE_EARLY`): what a plan on a forecast wants, since the
    hours it waits for may not come; with perfect foresight they do, and which of the ties the optimum takes is
    HiGHS's."""
    started = time.perf_counter()
    T, B = model.steps, model.buildings
    imp, bat, ev_index, feed_index, gain_index, offset = _layout(model)
    shorts = offset + np.arange(len(model.sessions))  # one per session: kWh short of a departure's need
    lp = _Program(offset + len(model.sessions))
    lp.cost[imp] = model.carbon + TIE_BREAK

    # Each meter: -imp[b, t] + sum(in - out) + sum(x - y) <= -fixed[b, t]
    site: list[list[list[tuple[int, float]]]] = [[[(int(imp[b, t]), -1.0)] for t in range(T)] for b in range(B)]
    for (charge, discharge, _), battery in zip(bat, model.batteries):
        for t in range(T):
            site[battery.building][t] += [(int(charge[t]), 1.0), (int(discharge[t]), -1.0)]
    for cols, feeds, session in zip(ev_index, feed_index, model.sessions):
        for k, t in enumerate(session.steps):
            site[session.building][t].append((int(cols[k]), 1.0))
            if feeds is not None:
                site[session.building][t].append((int(feeds[k]), -1.0))
    for b in range(B):
        for t in range(T):
            lp.at_most(site[b][t], -model.fixed_net_kwh[b, t])
    for (charge, discharge, energy), battery in zip(bat, model.batteries):
        _add_battery(lp, battery, charge, discharge, energy)
        if store_early:
            lp.cost[energy] -= STORE_EARLY
    penalty = short_penalty(model)
    for cols, feeds, gain, short, session in zip(ev_index, feed_index, gain_index, shorts, model.sessions):
        _add_car(lp, session, cols, feeds, gain, int(short), penalty)
        if store_early:
            lp.cost[gain] -= STORE_EARLY

    x = lp.solve()
    net = model.fixed_net_kwh.copy()
    battery_actions = {}
    for (charge, discharge, _), battery in zip(bat, model.batteries):
        flow = x[charge] - x[discharge]
        net[battery.building] += flow
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
        net[session.building, list(session.steps)] += grid
    return Solution(model.co2_kg(net), net, battery_actions, ev_actions, time.perf_counter() - started, len(x),
                    lp.constraints, float(x[shorts].sum()))


class OptimumReplay:
    """The LP's dispatch, step by step, as a controller (what perfect foresight reaches in CityLearn).

    With the model's ``sessions`` it also knows each car's departure and goal ahead: where a car arrives with less
    than the model assumed (a charger file that gives no arrival state of charge, so CityLearn keeps what the car
    had), its charge is raised to the least that still serves it by its departure. The EV guard cannot: on the
    official datasets a departure is often unknown (-1) until its last hour.
    """

    name = "optimum"

    def __init__(self, solution: Solution, sessions: tuple[EvSession, ...] | list[EvSession] = ()) -> None:
        self.solution = solution
        # Per charger, its sessions' first steps in order, and each session's deadlines (its interim needs, then its
        # departure: step, kWh stored by then, path): a step finds its session by bisection, not by a walk through the
        # year's sessions (in a profile of a year's replay the walk was a quarter of the controller's own time).
        self.firsts: dict[str, list[int]] = {}
        self.deadlines: dict[tuple[str, int], list[tuple[int, float, ChargingPath]]] = {}
        for session in sorted(sessions, key=lambda s: s.steps[0]):
            if session.path is None:
                continue
            first = session.steps[0]
            for k, need in (*session.interim_needs, (len(session.steps) - 1, session.need_kwh)):
                if need > 0:
                    if (session.charger, first) not in self.deadlines:
                        self.firsts.setdefault(session.charger, []).append(first)
                    self.deadlines.setdefault((session.charger, first), []).append(
                        (first + k, session.arrival_kwh + need, session.path))
        self._on: Any = None  # the environment :meth:`act` last read its layout from
        self._layout: list[tuple[int, str, Any]] = []  # each action's building, name and charger (None: not one)
        self._scale: ActionScale | None = None

    def _served(self, charger: Any, t: int, action: float) -> float:
        """``action`` raised to the least that serves the car connected to ``charger`` by its next deadline."""
        ev = charger.connected_electric_vehicle
        firsts = self.firsts.get(charger.charger_id, [])
        session = bisect.bisect_right(firsts, t) - 1  # the one session a step can be in: the last begun by then
        if ev is None or session < 0:
            return action
        for deadline, goal, path in self.deadlines[(charger.charger_id, firsts[session])]:
            if t <= deadline:
                energy = max(float(ev.battery.energy_init), path.min_soc * path.capacity_kwh)
                return minimum_action(path, energy, goal, deadline - t, action)
        return action

    def act(self, obs: np.ndarray, env: Any) -> np.ndarray:
        if self._on is not env:  # read once per environment: its actions' names and scale do not change
            chargers = {f"{EV_ACTION_PREFIX}{c.charger_id}": c for b in env.buildings
                        for c in b.electric_vehicle_chargers or []}
            self._on, self._scale = env, ActionScale.of(env)
            self._layout = [(b, name, chargers.get(name)) for b, name in action_layout(env)]
        t = env.time_step
        native: list[float] = []
        for b, name, charger in self._layout:
            if name == "electrical_storage" and b in self.solution.battery_actions:
                series = self.solution.battery_actions[b]
            elif name.startswith(EV_ACTION_PREFIX):
                series = self.solution.ev_actions.get(name[len(EV_ACTION_PREFIX):])
            else:
                series = None
            action = float(np.clip(series[t], -1.0, 1.0)) if series is not None and t < len(series) else 0.0
            if charger is not None:
                action = self._served(charger, t, action)
            native.append(action)
        return self._scale.to_agent(native)
