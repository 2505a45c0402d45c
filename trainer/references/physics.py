"""The optimum's plan made to hold in CityLearn's physics: the bound first, then a plan a site can follow.

The linear program takes every curve at its best point (trainer.references.optimum): its CO2 is a bound no
controller can beat. CityLearn's batteries are less kind. Their efficiency depends on the power (on the official
datasets' drawn curves, 0.78 at low power, 0.90 at its best), a charger does nothing below its minimum power, and
a car's battery takes less at 7 kW than at its best power. A plan that assumes the best point leaves batteries
empty an hour early and cars short, and the EV guard then charges them at full power in whatever hour comes:
on the shared 14-building district the bound's own dispatch replayed at 82 % of the bound's cut.

So the plan is fitted to the physics by successive linear programs. Each round steps the last plan through the
physics of every battery and car (``ChargingPath.step``, CityLearn's ``Battery.charge`` and charger step by
step) and reads, at each step, the efficiency the plan's power really has; a charge below a charger's minimum
power becomes either that minimum or nothing. The next program uses those numbers. Of the rounds' plans, the one
whose own physics emits least, a kWh its cars end short counted as charged in the dirtiest hour, is the one
replayed, once the hours where its physics still leaves a car short are raised (``served``: the replay would top the
car up in its last hour, at the charger's minimum power); the bound stays the first program's. Where the bound's
plan already holds in the physics (flat curves, as on the built-in site) there is one round.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from trainer.references.optimum import Solution, solve
from trainer.references.optimum_model import BatteryModel, EvSession, OptimumUnavailable, SiteModel
from trainer.shipped.controller import ChargingPath

ROUNDS = 5  # measured: on the shared district's chargers with a minimum power the plan settles by the fourth
SERVED_KWH = 0.05  # cars this short of their needs in all (kWh) are served: the guard's margin covers it
SHORT_EFFICIENCY = 0.8  # a shortfall's kWh is charged at about this efficiency when the replay tops a car up
SETTLED = 1e-3  # a plan whose own physics emits within this share of the bound needs no fitting
SERVE_MARGIN_KWH = 1e-3  # on a charger with a minimum power, a need raised to by this much more: CityLearn keeps a
                         # car's charge in float32, and the replay would top up a car a millionth of a kWh short there
SERVE_BISECTIONS = 30  # the change of one step found to 2^-30 of a step's full power (~1e-8 kWh a kW)


@dataclass(frozen=True)
class FittedPlan:
    """The bound, the plan replayed, and what the plan's own physics emits (before CityLearn replays it)."""

    bound: Solution
    plan: Solution
    physics_co2_kg: float
    rounds: int
    solve_s: float  # every round's program, the bound's included


def _efficiencies(path: ChargingPath, energy: float, stored: float, grid: float, fallback: tuple[float, float]
                  ) -> tuple[float, float]:
    """(stored kWh per grid kWh charged, grid kWh delivered per stored kWh taken) of a step from ``energy`` that
    stored ``stored`` and drew ``grid``; a direction the step did not move is read at full power from ``energy``,
    and one that cannot move at all takes ``fallback``."""
    up_stored, up_grid = (stored, grid) if grid > 1e-9 else path.step(energy, 1.0)
    down_stored, down_grid = (stored, grid) if grid < -1e-9 else path.step(energy, -1.0)
    into = (up_stored - energy) / up_grid if up_grid > 1e-9 else fallback[0]
    out_of = -down_grid / (energy - down_stored) if energy - down_stored > 1e-9 else fallback[1]
    return into, out_of


def _battery_round(battery: BatteryModel, flow: np.ndarray) -> tuple[BatteryModel, np.ndarray]:
    """The battery's per-step efficiencies along ``flow`` (grid kWh, + charges), and the grid kWh it really moves."""
    path = battery.path
    if path is None:
        return battery, flow
    into = np.empty(len(flow))
    out_of = np.empty(len(flow))
    moved = np.zeros(len(flow))
    energy = max(battery.initial_kwh, battery.min_kwh)
    full_power = path.max_power_kw * path.hours
    root = float(np.sqrt(battery.efficiency))
    for t, kwh in enumerate(flow):
        stored, grid = path.step(energy, kwh / full_power)
        moved[t] = grid
        into[t], out_of[t] = _efficiencies(path, energy, stored, grid, (root, root))
        energy = path.carried_over(stored)
    return replace(battery, charge_root=into, discharge_root=out_of), moved


def _deadbands(session: EvSession, grid_plan: np.ndarray) -> dict[str, tuple[float, ...]]:
    """The session's per-step bounds with each planned step under a charger's minimum power decided: a charge (or a
    discharge) below the minimum does nothing in CityLearn, so it becomes that minimum (from half of it up, the other
    direction shut) or nothing."""
    path = session.path
    n = len(grid_plan)
    bounds = {"min_grid_steps": list(session.min_grid_steps or (0.0,) * n),
              "max_grid_steps": list(session.max_grid_steps or (session.max_grid_kwh_per_step,) * n),
              "min_feed_steps": list(session.min_feed_steps or (0.0,) * n),
              "max_feed_steps": list(session.max_feed_steps or (session.max_feed_kwh_per_step,) * n)}
    charge_min, feed_min = path.min_power_kw * path.hours, path.min_discharge_kw * path.hours
    for k, kwh in enumerate(grid_plan):
        if 1e-9 < kwh < charge_min:
            up = kwh >= charge_min / 2
            bounds["min_grid_steps"][k], bounds["max_feed_steps"][k] = (charge_min, 0.0) if up else (0.0, 0.0)
            bounds["max_grid_steps"][k] = bounds["max_grid_steps"][k] if up else 0.0
        elif -feed_min < kwh < -1e-9:
            down = -kwh >= feed_min / 2
            bounds["min_feed_steps"][k], bounds["max_grid_steps"][k] = (feed_min, 0.0) if down else (0.0, 0.0)
            bounds["max_feed_steps"][k] = bounds["max_feed_steps"][k] if down else 0.0
    return {key: tuple(values) for key, values in bounds.items()}


def _path_action(path: ChargingPath, kwh: float) -> float:
    """The charger's action that asks for ``kwh`` of the grid in a step (- feeds the building)."""
    return kwh / (path.max_power_kw * path.hours) if kwh >= 0 else kwh / (max(path.max_discharge_kw, 1e-9) * path.hours)


def _stepped(path: ChargingPath, arrival_kwh: float, grid_plan: np.ndarray, first: int = 0,
             energy: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What the car has stored at the end of each step of ``grid_plan`` in CityLearn's physics (what its departure is
    judged on, before the next step's standby loss), and the grid kWh each step draws; from step ``first`` on, the car
    holding ``energy`` then (the arrival's by default)."""
    held, drawn = np.zeros(len(grid_plan)), np.zeros(len(grid_plan))
    energy = arrival_kwh if energy is None else energy
    for k in range(first, len(grid_plan)):
        held[k], drawn[k] = path.step(energy, _path_action(path, grid_plan[k]))
        energy = path.carried_over(held[k])
    return held, drawn


def _car_round(session: EvSession, grid_plan: np.ndarray) -> tuple[EvSession, np.ndarray, float]:
    """The session's per-step efficiencies along its planned grid kWh (+ charges, - feeds the building), the grid
    kWh it really draws, and how far it ends short of its need; steps under a charger's minimum power are decided."""
    path = session.path
    if path is None:
        return session, grid_plan, 0.0
    held, drawn = _stepped(path, session.arrival_kwh, grid_plan)
    per_grid, per_fed = [], []
    energy = session.arrival_kwh
    for stored, grid in zip(held, drawn):
        into, out_of = _efficiencies(path, energy, stored, grid,
                                     (session.stored_per_grid_kwh, session.fed_per_stored_kwh))
        per_grid.append(into)
        per_fed.append(out_of)
        energy = path.carried_over(stored)
    short = max(session.need_kwh - (energy - session.arrival_kwh), 0.0)
    fitted = replace(session, stored_per_grid_steps=tuple(per_grid), fed_per_stored_steps=tuple(per_fed),
                     **_deadbands(session, grid_plan))
    return fitted, drawn, short


def _switched(kwh: float, least: float, least_fed: float) -> bool:
    """Whether a step drawing ``kwh`` moves the car only by a charger's minimum power (it is off, or under it)."""
    return (least > 0 and -1e-9 <= kwh < least - 1e-9) or (least_fed > 0 and -least_fed + 1e-9 < kwh <= 1e-9)


def _served_grid(session: EvSession, grid_plan: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """``grid_plan`` (the session's grid kWh a step) changed at the one step where it costs least (``cost``, kg a kWh
    more drawn there) so that the car's physics holds each of its needs by its deadline; unchanged where it does.

    The rounds' last program reads each step's efficiency off the plan before it, so its plan can leave a car a few
    hundredths of a kWh short. The replay then tops the car up in its last hour, and on a charger with a minimum power
    (Building_4's: 3.7 of 22 kW) a top-up of 0.3 kWh draws 3.7 kWh from the grid there: on Building_4's May-July,
    68 such hours cost the replay 33 kg over its plan's own physics. A step the car already charges or feeds the
    building in can change by a little (more charge, less fed); one under the charger's minimum only by turning on.
    A step that alone cannot serve the car is no candidate (one before the car is full and the plan feeds the
    building from it: its kWh would be lost to the capacity); where none alone can, the cheapest that adds anything
    goes to full power and the next serves the rest.
    """
    path = session.path
    plan = np.array(grid_plan, dtype=float)
    full = path.max_power_kw * path.hours
    least, least_fed = path.min_power_kw * path.hours, path.min_discharge_kw * path.hours
    margin = SERVE_MARGIN_KWH if least > 0 else 0.0  # without a minimum a top-up of float noise costs nothing
    deadlines = [(k, session.arrival_kwh + need + margin)
                 for k, need in (*session.interim_needs, (len(plan) - 1, session.need_kwh)) if need > 0]

    def reached(j: int, kwh: float, held: np.ndarray, k: int) -> float:
        """What the car holds at step ``k`` with step ``j`` drawing ``kwh``, the steps before it as planned."""
        trial = plan.copy()
        trial[j] = kwh
        start = session.arrival_kwh if j == 0 else path.carried_over(held[j - 1])
        return _stepped(path, session.arrival_kwh, trial[:k + 1], j, start)[0][k]

    for k, goal in deadlines:
        for _ in range(k + 1):  # each pass settles one step
            held, _ = _stepped(path, session.arrival_kwh, plan[:k + 1])
            if held[k] >= goal:
                break
            # steps that move by a little first, then those a charger's minimum power turns on (ties: the latest)
            steps = sorted((j for j in range(k + 1) if plan[j] < full - 1e-9),
                           key=lambda j: (_switched(plan[j], least, least_fed), cost[j], -j))
            alone = next((j for j in steps if reached(j, full, held, k) >= goal), None)
            if alone is None:
                adds = [j for j in steps if reached(j, full, held, k) > held[k] + 1e-9]
                if not adds:  # nothing adds to the car: the replay's guard does what it can
                    break
                plan[adds[0]] = full
                continue
            low, high = plan[alone], full
            for _ in range(SERVE_BISECTIONS):
                middle = 0.5 * (low + high)
                low, high = (low, middle) if reached(alone, middle, held, k) >= goal else (middle, high)
            plan[alone] = 0.0 if -least_fed < high < least else high  # a kWh in a dead band moves nothing: none
    return plan


def served(model: SiteModel, solution: Solution) -> Solution:
    """``solution`` with each car's plan changed where its physics leaves the car short of a need (more charged or
    less fed in one hour, see :func:`_served_grid`); a kWh more costs the hour's carbon where the plan's building
    imports, nothing where it exports."""
    net = model.fixed_net_kwh.copy()
    for battery in model.batteries:
        flow = solution.battery_actions[battery.building] * battery.nominal_power_kw * model.hours
        net[battery.building] += _battery_round(battery, flow)[1]
    planned = {}
    for session in model.sessions:
        grid = _planned_car_grid(solution, session, model.hours)
        planned[id(session)] = grid
        if session.path is not None:
            net[session.building, list(session.steps)] += _stepped(session.path, session.arrival_kwh, grid)[1]
    carbon = np.broadcast_to(model.carbon, net.shape)
    actions = {charger: series.copy() for charger, series in solution.ev_actions.items()}
    for session in model.sessions:
        if session.path is None:
            continue
        steps = list(session.steps)
        grid = planned[id(session)]
        cost = np.where(net[session.building, steps] > 0, carbon[session.building, steps], 0.0)
        raised = _served_grid(session, grid, cost)
        if np.array_equal(raised, grid):
            continue
        power = np.where(raised >= 0, session.charger_power_kw, session.discharge_power_kw)
        actions[session.charger][steps] = raised / (np.maximum(power, 1e-9) * model.hours)
    return replace(solution, ev_actions=actions)


def _planned_car_grid(solution: Solution, session: EvSession, hours: float) -> np.ndarray:
    """The grid kWh the plan has this session draw each step (- where it feeds the building)."""
    action = solution.ev_actions[session.charger][list(session.steps)]
    power = np.where(action >= 0, session.charger_power_kw, session.discharge_power_kw)
    return action * power * hours


def fit(model: SiteModel, solution: Solution) -> tuple[SiteModel, float, float]:
    """The model with the efficiencies the plan ``solution`` has in CityLearn's physics, the CO2 that physics emits
    along the plan, and the kWh its cars end short of their needs there."""
    net = model.fixed_net_kwh.copy()
    batteries = []
    for battery in model.batteries:
        flow = solution.battery_actions[battery.building] * battery.nominal_power_kw * model.hours
        fitted, moved = _battery_round(battery, flow)
        batteries.append(fitted)
        net[battery.building] += moved
    sessions, short = [], 0.0
    for session in model.sessions:
        fitted, drawn, missing = _car_round(session, _planned_car_grid(solution, session, model.hours))
        sessions.append(fitted)
        net[session.building, list(session.steps)] += drawn
        short += missing
    return replace(model, batteries=batteries, sessions=sessions), model.co2_kg(net), short


def _solve_round(model: SiteModel) -> Solution:
    """The fitted program; where a charge raised to a charger's minimum leaves it no plan (the car is full by then
    in the new plan), the same program with only the charges turned off kept."""
    try:
        return solve(model)
    except OptimumUnavailable:
        relaxed = [replace(s, min_grid_steps=None, min_feed_steps=None) for s in model.sessions]
        return solve(replace(model, sessions=relaxed))


def solve_in_physics(model: SiteModel, rounds: int = ROUNDS) -> FittedPlan:
    """The bound (the program at each curve's best point) and the plan fitted to CityLearn's physics (see the
    module's doc): of the rounds' plans, the one that emits least in its physics, a kWh its cars end short counted
    as charged in the period's dirtiest hour (the replay tops them up before they leave)."""
    bound = solve(model)
    penalty = float(np.max(model.carbon, initial=0.0)) / SHORT_EFFICIENCY
    fitted, co2, short = fit(model, bound)
    best = (co2 + penalty * short, bound, co2)
    done, seconds = 1, bound.solve_s
    if short <= SERVED_KWH and co2 <= bound.co2_kg * (1 + SETTLED):  # flat curves (the built-in site): it holds
        return _fitted_plan(model, bound, bound, done, seconds)
    for _ in range(rounds - 1):
        try:
            plan = _solve_round(fitted)
        except OptimumUnavailable:  # a round without a feasible program keeps the best plan so far
            break
        done, seconds = done + 1, seconds + plan.solve_s
        fitted, co2, short = fit(fitted, plan)
        if co2 + penalty * short < best[0]:
            best = (co2 + penalty * short, plan, co2)
    return _fitted_plan(model, bound, best[1], done, seconds)


def _fitted_plan(model: SiteModel, bound: Solution, plan: Solution, rounds: int, seconds: float) -> FittedPlan:
    """The plan replayed: ``plan`` with its cars served in its own physics (:func:`served`), and what it emits."""
    plan = served(model, plan)
    return FittedPlan(bound, plan, fit(model, plan)[1], rounds, seconds)
