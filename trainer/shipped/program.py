"""The site's linear program, and the day-ahead planner's decision on it: shipped with an exported planner.

The optimum (trainer.references.optimum) solves it over a whole period with perfect foresight; the day-ahead
planner (trainer.references.planner in the product, ``controller.py`` at a site) solves it every hour over the
next day on a forecast and applies the first hour (:func:`decide`). One program and one decision for both, so an
exported planner is the product's planner, not a copy of it. This file needs numpy, and scipy to solve (HiGHS).

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

CityLearn's non-convex details are relaxed to their best case, so the program is a bound: efficiency
curves at their highest point, capacity-power curves at their highest, capacity fade ignored.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the shipped controller's physics; this file imports nothing of the product at run time
    from trainer.shipped.controller import ChargingPath, Curve

HORIZON_STEPS = 24  # the planner's window: 12 hours reach 94.4 %, 24 and 48 the same 95.4 % (docs/agent-quality.md)


class OptimumUnavailable(Exception):
    """The dataset holds something the linear program does not model (the message says what)."""



TIE_BREAK = 1e-6
# kg a kWh held in a battery or a car for a step earns a plan that stores early (``solve(store_early=True)``): among
# plans of equal CO2 (the surplus of noon stored at 9:00 or at 14:00, exports being worth nothing; a car charged at
# 1:00 or at 4:00 of a night as clean) the one that stores first. Small enough to change no plan's CO2 (Building_5's
# optimum over August-April: 571.199 kg either way).
STORE_EARLY = 1e-6



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
    # CityLearn's physics of this battery (its curves), from which trainer.references.physics makes the plan hold.
    path: ChargingPath | None = field(default=None, compare=False, repr=False)
    # Per step, once the plan is fitted to the physics: stored kWh per grid kWh charged, and grid kWh delivered per
    # stored kWh taken (None: the square root of ``efficiency`` both ways).
    charge_root: np.ndarray | None = field(default=None, compare=False, repr=False)
    discharge_root: np.ndarray | None = field(default=None, compare=False, repr=False)
    # The capacity-power curve as lines (kWh a step may move, per kWh stored at its start) whose least bounds the
    # step: exact where the curve is concave, as CityLearn's are; () where only ``max_kwh_per_step`` bounds it.
    power_lines: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class EvSession:
    building: int
    charger: str
    steps: tuple[int, ...]
    max_grid_kwh_per_step: float
    stored_per_grid_kwh: float
    need_kwh: float  # what it must have stored by its last step (0: it leaves after the period, or unflagged)
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
    # Departures flagged before the last step while the same car stays plugged in (a charger file whose
    # countdown restarts without a new arrival): (index in ``steps``, kWh it must have stored by then).
    interim_needs: tuple[tuple[int, float], ...] = ()
    # CityLearn's physics of this charger and car, and, once the plan is fitted to it, per step: stored kWh per grid
    # kWh, grid kWh fed per stored kWh taken, and the grid kWh a step must draw at least (a charger's minimum power).
    path: ChargingPath | None = field(default=None, compare=False, repr=False)
    arrival_kwh: float = 0.0
    stored_per_grid_steps: tuple[float, ...] | None = field(default=None, compare=False, repr=False)
    fed_per_stored_steps: tuple[float, ...] | None = field(default=None, compare=False, repr=False)
    min_grid_steps: tuple[float, ...] | None = field(default=None, compare=False, repr=False)
    max_grid_steps: tuple[float, ...] | None = field(default=None, compare=False, repr=False)
    min_feed_steps: tuple[float, ...] | None = field(default=None, compare=False, repr=False)
    max_feed_steps: tuple[float, ...] | None = field(default=None, compare=False, repr=False)
    # The charger's minimum power as grid kWh a step (charging, feeding), kept by the session's first step: under it
    # CityLearn does nothing. Where either is above 0 the program decides that step on or off (a mixed-integer
    # program of one or two 0/1 variables a car): the planner's step applied now, its later ones planned again each
    # hour. The optimum's year fits its plan to the minimum in rounds instead (trainer.references.physics).
    first_step_min_kwh: tuple[float, float] = (0.0, 0.0)


@dataclass
class SiteModel:
    """The evaluation period as numbers: what the linear program sees.

    Each building has its own meter, as CityLearn counts emissions and the product's metrics do: what one
    building exports is not another's import (``fixed_net_kwh`` is per building; a 1-D array is one meter).
    """

    steps: int
    hours: float
    carbon: np.ndarray
    fixed_net_kwh: np.ndarray  # (buildings, steps) net import with batteries idle and no car charging
    batteries: list[BatteryModel] = field(default_factory=list)
    sessions: list[EvSession] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.fixed_net_kwh = np.atleast_2d(np.asarray(self.fixed_net_kwh, dtype=float))

    @property
    def buildings(self) -> int:
        return self.fixed_net_kwh.shape[0]

    def co2_kg(self, net_kwh: np.ndarray) -> float:
        """kg CO2 of each building's imports (its own meter), summed."""
        return float((np.clip(np.atleast_2d(net_kwh), 0.0, None) * self.carbon).sum())

    def uncontrolled_net_kwh(self) -> np.ndarray:
        """Batteries idle; every car charges at full power from arrival until full or gone (the baseline)."""
        net = self.fixed_net_kwh.copy()
        for session in self.sessions:
            if session.uncontrolled_kwh is not None:
                net[session.building, list(session.steps)] += session.uncontrolled_kwh
                continue
            left = session.room_kwh
            for t in session.steps:
                if left <= 1e-9:
                    break
                grid = min(session.max_grid_kwh_per_step, left / session.stored_per_grid_kwh)
                net[session.building, t] += grid
                left -= grid * session.stored_per_grid_kwh
        return net



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



def power_lines(curve: Curve, full_kwh: float, capacity_kwh: float, loss: float) -> tuple[tuple[float, float], ...]:
    """The capacity-power curve (power share by state of charge at the step's start) as lines in the energy stored
    at the end of the step before (kWh a step may move = a + b x that energy, less the standby loss): exact where the
    curve is concave (its least line is the curve); () where it is not, leaving only its best point as the bound."""
    xs, ys = np.asarray(curve.x), np.asarray(curve.y)
    slopes = np.diff(ys) / np.maximum(np.diff(xs), 1e-12)
    if len(xs) < 2 or np.any(np.diff(slopes) > 1e-9) or capacity_kwh <= 0:
        return ()
    return tuple((full_kwh * (y0 - m * x0), full_kwh * m * (1.0 - loss) / capacity_kwh)
                 for x0, y0, m in zip(xs[:-1], ys[:-1], slopes))



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
        self.integral = np.zeros(n, dtype=bool)  # on/off (0 or 1) decisions: with any, a mixed-integer program
        self.switched: list[tuple[int, int, float]] = []  # (a flow, its on/off, the least it flows when on)
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

        upper, rhs = matrix(self.ub), np.asarray(self.ub[3]) if self.ub[3] else None
        result = linprog(self.cost, A_ub=upper, b_ub=rhs, A_eq=matrix(self.eq),
                         b_eq=np.asarray(self.eq[3]) if self.eq[3] else None,
                         bounds=np.column_stack([self.lower, self.upper]), method="highs")
        if result.status != 0:  # the relaxation of a mixed-integer program too: neither has a plan
            raise OptimumUnavailable(f"the linear program could not be solved: {result.message}")
        if not self.integral.any():
            return result.x
        kept = self._keeps_minimums(result.x, upper, rhs)
        if kept is not None:  # a lower bound reached: the relaxation's plan is the mixed-integer program's optimum
            return kept
        from scipy.optimize import Bounds, LinearConstraint, milp  # lazy, as linprog: only a minimum power needs it

        rows = [LinearConstraint(upper, -np.inf, rhs)] if upper is not None else []
        if self.eq[3]:
            rows.append(LinearConstraint(matrix(self.eq), np.asarray(self.eq[3]), np.asarray(self.eq[3])))
        result = milp(self.cost, integrality=self.integral.astype(int), bounds=Bounds(self.lower, self.upper),
                      constraints=rows, options={"mip_rel_gap": 1e-6})
        if result.status != 0 or result.x is None:
            raise OptimumUnavailable(f"the mixed-integer program could not be solved: {result.message}")
        return result.x

    def _keeps_minimums(self, x: np.ndarray, upper: Any, rhs: np.ndarray | None) -> np.ndarray | None:
        """``x`` (the relaxation's plan) with its on/off decisions set, where it already keeps every minimum power
        (each flow nothing or at least its minimum) and so every row; else None (the mixed-integer program decides)."""
        x = x.copy()
        for flow, switch, least in self.switched:
            if x[flow] <= 1e-9:
                x[flow], x[switch] = 0.0, 0.0
            elif x[flow] >= least - 1e-9:
                x[switch] = 1.0
            else:
                return None
        if upper is not None and np.any(upper @ x > rhs + 1e-7):  # a car charging and feeding in one step
            return None
        return x

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


def _add_first_step_minimum(lp: _Program, session: EvSession, cols: np.ndarray, feeds: np.ndarray | None,
                            on: int | None, off: int | None) -> None:
    """A charger's minimum power at the session's first step: it charges (feeds) at least that or not at all, a 0/1
    decision (``on``, ``off``: its columns, None where that direction has no minimum)."""
    for switch, flows, least in ((on, cols, session.first_step_min_kwh[0]),
                                 (off, feeds, session.first_step_min_kwh[1])):
        if switch is None or flows is None:
            continue
        flow, most = int(flows[0]), float(lp.upper[flows[0]])
        lp.upper[switch], lp.integral[switch] = 1.0, True
        lp.at_most([(flow, 1.0), (switch, -most)], 0.0)
        lp.at_most([(flow, -1.0), (switch, min(least, most))], 0.0)
        lp.switched.append((flow, switch, min(least, most)))
    if on is not None and off is not None:  # one direction
        lp.at_most([(on, 1.0), (off, 1.0)], 1.0)


def _switches(sessions: list[EvSession], feed_index: list[np.ndarray | None], first: int
              ) -> tuple[list[tuple[int | None, int | None]], int]:
    """Each session's first-step on/off columns (charging, feeding) from column ``first``, where its charger has a
    minimum power, and the columns there are then."""
    out, n = [], first
    for feeds, session in zip(feed_index, sessions):
        charge_min, feed_min = session.first_step_min_kwh
        on = n if charge_min > 0 and session.steps else None
        n += on is not None
        off = n if feeds is not None and feed_min > 0 and session.steps else None
        n += off is not None
        out.append((on, off))
    return out, n


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
    switches, n = _switches(model.sessions, feed_index, offset + len(model.sessions))
    lp = _Program(n)
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
    for cols, feeds, gain, short, session, (on, off) in zip(ev_index, feed_index, gain_index, shorts, model.sessions,
                                                            switches):
        _add_car(lp, session, cols, feeds, gain, int(short), penalty)
        _add_first_step_minimum(lp, session, cols, feeds, on, off)
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




# ------------------------------------------------------------------------------------- the day-ahead decision


@dataclass(frozen=True)
class CarNow:
    """A car connected now: what the planner reads of it (CityLearn's objects in the product, the charger's readings
    at a site), its departure and required charge as read or, until they read, as the charger's :class:`Stays`
    estimate them."""

    building: int
    charger: str
    path: ChargingPath  # the charger with this car's battery
    energy_kwh: float  # what it holds, floored at its depth of discharge as CityLearn floors it
    required_kwh: float  # what it must hold when it leaves
    steps_left: int  # steps until it leaves (0: this is its last)


def window_battery(battery: BatteryModel, energy_kwh: float, steps: int, period_start_kwh: float | None
                   ) -> BatteryModel:
    """``battery`` as one window's program sees it: it holds ``energy_kwh`` now, and the plan ends with at least
    that; where the window reaches the end of a period being judged (``period_start_kwh``: what the battery held at
    its start), with what it held then, or as near it as the steps left can charge: the period is not won by
    emptying the battery, as the optimum's cannot be. A site runs on with no period to end (None)."""
    if period_start_kwh is None:
        return replace(battery, initial_kwh=energy_kwh, final_kwh=None)
    reachable = energy_kwh + 0.98 * steps * battery.max_kwh_per_step * math.sqrt(battery.efficiency)
    return replace(battery, initial_kwh=energy_kwh,
                   final_kwh=min(max(period_start_kwh, energy_kwh), reachable))


def _car_session(car: CarNow, steps: int, hours: float, margin_soc: float) -> EvSession:
    """A connected car as the window's program sees it; one leaving after the window owes nothing yet."""
    path = car.path
    max_grid, stored_per_grid, feed, fed_per_stored = session_limits(path, hours)
    span = min(car.steps_left + 1, steps)
    room = max(path.capacity_kwh - car.energy_kwh, 0.0)
    need = 0.0
    if car.steps_left + 1 <= steps:
        goal = car.required_kwh + margin_soc * path.capacity_kwh
        # what full power can reach, a hair under: the guard serves the rest in CityLearn's physics
        need = min(max(goal - car.energy_kwh, 0.0), 0.999 * span * max_grid * stored_per_grid, 0.999 * room)
    reserve = max(car.energy_kwh - path.min_soc * path.capacity_kwh, 0.0)
    # A charger's minimum power (the official Building_4's 3.7 of 22 kW), decided for the hour applied now
    least = (min(path.min_power_kw, path.max_power_kw) * hours,
             min(path.min_discharge_kw, path.max_discharge_kw) * hours if feed > 0 else 0.0)
    return EvSession(car.building, car.charger, tuple(range(span)), max_grid, stored_per_grid, need, room,
                     path.max_power_kw, feed, fed_per_stored, reserve, path.max_discharge_kw, first_step_min_kwh=least)


def decide(fixed_net_kwh: np.ndarray, carbon: np.ndarray, hours: float, batteries: list[BatteryModel],
           cars: list[CarNow], margin_soc: float) -> tuple[dict[int, float], dict[str, float]]:
    """The day-ahead planner's action now: the plan of least CO2 over the window (``fixed_net_kwh``, buildings x
    steps, and ``carbon``: the forecast, its first step the one observed now; ``batteries`` as
    :func:`window_battery` makes them), the one that stores soonest of its ties, and its first step as CityLearn's
    actions: each battery's by building, each car's by charger (0 for a charger with no car the plan knows of).
    :class:`OptimumUnavailable` where no plan is feasible: the caller leaves the devices idle (the guard serves the
    cars)."""
    steps = len(carbon)
    sessions = [_car_session(car, steps, hours, margin_soc) for car in cars]
    plan = solve(SiteModel(steps, hours, np.asarray(carbon, dtype=float), fixed_net_kwh, batteries, sessions),
                 store_early=True)
    battery = {b: float(np.clip(series[0], -1.0, 1.0)) for b, series in plan.battery_actions.items()}
    car = {charger: float(np.clip(series[0], -1.0, 1.0)) for charger, series in plan.ev_actions.items()}
    return battery, car


# ----------------------------------------------------------------- cars whose departure is not known yet

# The official datasets' charger files read a car's departure and the charge it must leave with only in its last
# hours (-1 before). A planner that waits for them plans a car's night only once it is nearly over; told each car's
# departure ahead (an oracle), it reached 92.8 % of the optimum's cut on Building_5's May-July instead of 87.3 %. A
# site can estimate it causally from how long its cars stayed before: each charger's median stay by the hour of the
# day a car arrived (docs/agent-quality.md, "Cars whose departure is not known yet").


@dataclass
class Stay:
    """The car at one charger now, as its readings tell it hour by hour (:meth:`read`, every hour in order): the hour
    of the day it arrived and the steps since. Readings only, no car's identity: a car connected the hour after one
    whose departure read 0 is another car."""

    arrival_hour: int | None = None  # None: no car connected
    age: int = 0  # steps since it arrived (0: it arrived this hour)
    leaving: bool = False  # its departure read 0 this hour (this was its last)

    def read(self, hour: int, connected: bool, departure: float) -> None:
        if connected and (self.arrival_hour is None or self.leaving):
            self.arrival_hour, self.age = int(hour) % 24, 0
        elif connected:
            self.age += 1
        else:
            self.arrival_hour, self.age = None, 0
        self.leaving = bool(connected and departure == 0)

    def state(self) -> list[Any]:
        return [self.arrival_hour, self.age, self.leaving]

    @classmethod
    def from_state(cls, state: list[Any]) -> Stay:
        hour, age, leaving = state
        return cls(None if hour is None else int(hour) % 24, int(age), bool(leaving))


@dataclass(frozen=True)
class Stays:
    """How long one charger's cars stayed and what they had to leave with, learnt from the hours a run learns from
    (:func:`learn_stays`): what the planner assumes of a connected car whose departure is not known yet."""

    steps: tuple[float, ...]  # by the hour of the day a car arrived (24): the median stay in steps (of all, where none)
    required_soc: float  # the median state of charge the cars had to leave with

    def departure(self, stay: Stay) -> int | None:
        """Steps left (0: this is its last) of the car ``stay`` reads: its expected stay less its age, and one where it
        has stayed longer (it may leave any hour now); None where no car is connected."""
        if stay.arrival_hour is None:
            return None
        return max(int(round(self.steps[stay.arrival_hour])) - 1 - stay.age, 1)

    def as_json(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "required_soc": self.required_soc}

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> Stays:
        steps = tuple(float(s) for s in entry["steps"])
        if len(steps) != 24 or not all(math.isfinite(s) and s >= 1 for s in steps):
            raise ValueError(f"a charger's stays are 24 numbers of at least one step, not {entry['steps']!r}")
        return cls(steps, float(entry["required_soc"]))


def car_due(required_soc: float, departure: float, stay: Stay, stays: Stays | None) -> tuple[float, int] | None:
    """(the state of charge a connected car must leave with, the steps until it leaves) as the planner plans it: the
    readings where its departure reads (0 or more, a charge required), else its charger's ``stays``' estimate, with the
    required charge the reading's where that reads; None where neither says (the car is left to the guard)."""
    if math.isfinite(required_soc) and math.isfinite(departure) and required_soc > 0 and departure >= 0:
        return required_soc, int(departure)
    estimate = None if stays is None else stays.departure(stay)
    if estimate is None:
        return None
    known = math.isfinite(required_soc) and required_soc > 0
    return (required_soc if known else stays.required_soc), estimate  # type: ignore[union-attr]


def learn_stays(hour: np.ndarray, connected: np.ndarray, departure: np.ndarray, required_soc: np.ndarray
                ) -> Stays | None:
    """One charger's :class:`Stays` from its readings over a period, hour by hour: each stay that ended with its
    departure read 0 and a charge required, by the hour of the day it began as :class:`Stay` reads it (a stay under
    way when the period began counts from the period's start). None where no car left in the period."""
    stay, by_hour, required = Stay(), [[] for _ in range(24)], []
    for h, c, d, r in zip(hour, connected, departure, required_soc):
        stay.read(int(h), bool(c), float(d))
        if stay.leaving and math.isfinite(float(r)) and float(r) > 0:
            by_hour[stay.arrival_hour].append(stay.age + 1)  # type: ignore[index]
            required.append(float(r))
    if not required:
        return None
    every = float(np.median([s for stays in by_hour for s in stays]))
    return Stays(tuple(float(np.median(s)) if s else every for s in by_hour), float(np.median(required)))
