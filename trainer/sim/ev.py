"""The EV guard and the EV reward term on the simulator's arrays (trainer.env.ev_guard's rules, vectorised).

For each connected car at its charger, in N environments at once: what it stores after a step at a
given action, what it can still reach by departure at full power, the least action that still serves
it (the guard), and how much of its shortfall became unavoidable this step (the reward's EV term).
The charging physics is the batteries' own (trainer.sim.battery.charged), so it is CityLearn's.

What full power does to a car in one step depends only on the car, its charger and what it holds, so on curved
charging paths (the official datasets': CityLearn draws the curves a schema leaves out) it is tabulated once per
(charger, car) pair (:class:`ReachTable`): the guard then asks "how much must the car hold after this step so that
full power serves it by departure" in that table, and searches one step, not one step times the hours left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trainer.env.ev_guard import GuardSettings
from trainer.shipped.controller import GUARD_RAISE
from trainer.sim.battery import BatteryBank, BatterySpec, carried_soc, charged
from trainer.sim.site import SiteTables

# Points of a full-power step tabulated per (charger, car) pair: a car's range in steps of about 0.002 kWh on an
# 80 kWh car, where the guard's actions then agree with stepping through the curves within 1e-5.
REACH_GRID = 32769
REACH_TABLE_BYTES = 2**27  # the tables of a site with many pairs are coarser rather than larger
# The guard's search for an action: each round steps every searched car through SEARCH_POINTS - 1 actions of its
# bracket in one call and keeps the interval where the answer changes. 128**3 narrows [-1, 1] to 9.5e-7, as the
# CityLearn side's BISECTION_STEPS halvings do, in three calls of the physics instead of 21 (on Building_4 the
# bisection was 70 % of a simulator step; 64 points in four rounds and 1,024 in two were slower; docs/benchmarks.md).
SEARCH_POINTS = 128
SEARCH_ROUNDS = 3
Stepper = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (stored kWh, action) -> stored kWh after the step


def narrowed(turns: Callable[[np.ndarray], np.ndarray], low: np.ndarray, high: np.ndarray, where: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """Where ``where``, the bracket [low, high] around the action at which ``turns`` (monotone in the action: False
    at ``low``, True at ``high``, neither evaluated) becomes True, narrowed SEARCH_ROUNDS times. ``turns`` takes
    actions shaped (SEARCH_POINTS - 1, *low.shape)."""
    fractions = (np.arange(1, SEARCH_POINTS) / SEARCH_POINTS).reshape((-1,) + (1,) * low.ndim)
    for _ in range(SEARCH_ROUNDS):
        points = low + (high - low) * fractions
        true = turns(points)
        first = np.argmax(true, axis=0)[None]  # the first point where it holds (0 where none does)
        found = true.any(axis=0)
        above = np.take_along_axis(points, first, axis=0)[0]
        below = np.where(first[0] > 0, np.take_along_axis(points, np.maximum(first - 1, 0), axis=0)[0], low)
        low = np.where(where, np.where(found, below, points[-1]), low)
        high = np.where(where, np.where(found, above, high), high)
    return low, high


class ReachTable:
    """Full-power steps, tabulated for each (charger, car) pair the site's sessions bring together: the stored kWh
    after k steps at full power (``Battery.charge`` through both curves, the standby loss before each) from a grid of
    stored kWh, for every k up to the longest session's hours, linear between grid points. Exact at the grid for one
    step, each later step the one before's grid stepped again; the capacity fade a session accumulates is left out,
    as it binds only at a full battery. What full power reaches by departure, and what a car must hold now to be
    served by it, are then one lookup each, not a walk through the hours left."""

    def __init__(self, tables: SiteTables) -> None:
        chargers, cars = tables.chargers, tables.cars
        n_chargers, n_cars = tables.connected.shape[1], cars.size
        self.pair = np.full((n_chargers, max(n_cars, 1)), -1, dtype=int)
        seen = np.unique(np.stack([np.broadcast_to(np.arange(n_chargers), tables.connected.shape).ravel(),
                                   tables.connected.ravel()], axis=1), axis=0)
        seen = seen[seen[:, 1] >= 0]
        self.pair[seen[:, 0], seen[:, 1]] = np.arange(len(seen))
        pairs = len(seen)
        left = tables.departure[np.isfinite(tables.departure)]
        self.hours = int(max(left.max(initial=0.0), 1.0))  # the most steps any session has left
        grid = int(min(REACH_GRID, max(1025, REACH_TABLE_BYTES // (8 * max(pairs, 1) * (self.hours + 1)))))
        spec = cars.gathered(seen[:, 1])
        full = chargers.max_charge_kw * spec.hours * chargers.efficiency_at(
            np.ones((1, n_chargers)), np.ones((1, n_chargers), dtype=bool))[0]
        self.low = spec.min_soc * spec.capacity  # (P,) the least a car holds (its depth of discharge)
        self.step = (spec.capacity - self.low) / (grid - 1)
        self.grid = grid
        energy = self.low + self.step * np.arange(grid)[:, None]  # (G, P)
        carried = carried_soc(spec, energy / spec.capacity) * spec.capacity
        after = charged(spec, carried, spec.capacity, np.broadcast_to(full[seen[:, 0]], energy.shape))[0]
        # Non-decreasing, as the physics is (float rounding aside), so that it can be searched.
        one = np.maximum.accumulate(after, axis=0).T.copy()  # (P, G)
        self.ahead = np.empty((pairs, self.hours + 1, grid))  # (P, K + 1, G): k full-power steps from the grid
        self.ahead[:, 0] = energy.T
        every = np.arange(pairs)[:, None]
        for k in range(1, self.hours + 1):
            self.ahead[:, k] = self._between(one, every, every, self.ahead[:, k - 1])
        # One sorted array for every (pair, k) row's search: each row's values lifted above the one before.
        self.lift = float(self.ahead.max(initial=0.0)) + 1.0
        rows = pairs * (self.hours + 1)
        self.flat = (self.ahead.reshape(rows, grid) + self.lift * np.arange(rows)[:, None]).ravel()

    def _between(self, table: np.ndarray, row: np.ndarray, pair: np.ndarray, stored: np.ndarray) -> np.ndarray:
        """``table[row]`` (over ``pair``'s grid of stored kWh) at ``stored``, linear between grid points."""
        position = np.clip((stored - self.low[pair]) / self.step[pair], 0.0, self.grid - 1.0)
        j = np.minimum(position.astype(int), self.grid - 2)
        below, above = table[row, j], table[row, j + 1]
        return below + (position - j) * (above - below)

    def pairs_of(self, car: np.ndarray) -> np.ndarray:
        """(N, C) the pair of each charger's car (``car`` (N, C) indexes tables.cars)."""
        return self.pair[np.arange(car.shape[1])[None, :], car]

    def reach(self, pair: np.ndarray, stored: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Stored kWh after ``steps`` full-power steps from ``stored`` (after the standby loss of the first step's
        start); ``stored`` itself where ``steps`` is 0."""
        k = np.clip(steps, 0, self.hours)
        rows = self.ahead.reshape(-1, self.grid)
        return np.where(k > 0, self._between(rows, pair * (self.hours + 1) + k, pair, stored), stored)

    def least_before(self, pair: np.ndarray, goal: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The least stored kWh from which ``steps`` full-power steps leave ``goal`` or more (``goal`` itself where
        ``steps`` is 0): -inf where even the least a car holds does, +inf where nothing does."""
        k = np.clip(steps, 0, self.hours)
        row = pair * (self.hours + 1) + k
        table = self.ahead.reshape(-1, self.grid)
        found = np.searchsorted(self.flat, goal + self.lift * row, side="left") - row * self.grid
        j = np.clip(found, 1, self.grid - 1)
        before, after = table[row, j - 1], table[row, j]
        rise = np.where(after > before, after - before, 1.0)
        energy = self.low[pair] + self.step[pair] * (j - 1 + np.clip((goal - before) / rise, 0.0, 1.0))
        least = np.where(found <= 0, -np.inf, np.where(found >= self.grid, np.inf, energy))
        return np.where(k > 0, least, goal)


@dataclass
class Sessions:
    """The car at each charger at one step, (N, C): where one is connected with a departure and a need."""

    tables: SiteTables
    t: np.ndarray  # (N,) absolute step
    cars: BatteryBank
    linear: bool = False  # every path is linear (linear_paths): closed forms instead of stepping and bisecting
    reach_table: ReachTable | None = None  # curved paths: a full-power step tabulated (None: stepped through curves)

    def __post_init__(self) -> None:
        tab = self.tables
        index = tab.connected[self.t]
        required = tab.required_soc[self.t]
        left = tab.departure[self.t]
        self.connected = index >= 0
        # an unknown departure (-1) owes nothing yet, as trainer.env.ev_guard.connected_sessions has it
        self.valid = self.connected & np.isfinite(required) & np.isfinite(left) & (required > 0) & (left >= 0)
        self.car = np.where(self.connected, index, 0)
        self.spec = tab.cars.gathered(self.car)
        self.rows = np.arange(len(self.t))[:, None]
        self.degraded = self.cars.degraded_capacity[self.rows, self.car]
        self.required_kwh = np.where(self.valid, required, 0.0) * self.spec.capacity
        self.steps_left = np.maximum(np.where(self.valid, left, 0), 0).astype(int)
        self.pair = None if self.reach_table is None else self.reach_table.pairs_of(self.car)

    def soc(self) -> np.ndarray:
        """Each connected car's state of charge now."""
        return self.cars.soc[self.rows, self.car].astype(float)

    def stored(self) -> np.ndarray:
        """Each connected car's stored kWh now (CityLearn's ``energy_init``: floored at its depth of discharge)."""
        return np.maximum(self.spec.min_soc * self.spec.capacity, self.soc() * self.spec.capacity)

    def stored_after(self, energy: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Stored kWh after one step from ``energy`` at ``action`` in [-1, 1] (ChargingPath.stored_after)."""
        return self._stored_after(self.spec, self.degraded, energy, action)

    def _stored_after(self, spec: BatterySpec, degraded: np.ndarray, energy: np.ndarray, action: np.ndarray
                      ) -> np.ndarray:
        chargers = self.tables.chargers
        power = chargers.power_kw(np.clip(action, -1.0, 1.0))
        charging = power >= 0
        max_kw = np.where(charging, chargers.max_charge_kw, chargers.max_discharge_kw)
        efficiency = chargers.efficiency_at(np.abs(power) / np.maximum(max_kw, 1e-8), charging)
        requested = np.where(charging, power * spec.hours * efficiency,
                             power * spec.hours / np.maximum(efficiency, 1e-8))
        return charged(spec, energy, degraded, requested)[0]

    def _searched(self, turns: Callable[[np.ndarray, np.ndarray, Stepper], np.ndarray], low: np.ndarray,
                  high: np.ndarray, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`narrowed` on the environments where a car is searched only: most steps search a few cars of many
        environments. ``turns(actions, rows, stored_after)`` gets those rows and :meth:`stored_after` on them."""
        rows = np.flatnonzero(where.any(axis=1))
        spec, degraded = self.spec.gathered(rows), self.degraded[rows]

        def stored_after(energy: np.ndarray, action: np.ndarray) -> np.ndarray:
            return self._stored_after(spec, degraded, energy, action)

        low, high = low.copy(), high.copy()
        low[rows], high[rows] = narrowed(lambda a: turns(a, rows, stored_after), low[rows], high[rows], where[rows])
        return low, high

    def carried_over(self, stored: np.ndarray) -> np.ndarray:
        return carried_soc(self.spec, stored / self.spec.capacity) * self.spec.capacity

    def full_step_kwh(self) -> np.ndarray:
        """On linear paths, what a step at full power stores when neither the capacity nor the power curve binds."""
        chargers, s = self.tables.chargers, self.spec
        requested = chargers.max_charge_kw * s.hours * chargers.efficiency_at(
            np.ones_like(s.capacity), np.ones(s.capacity.shape, dtype=bool))
        return np.minimum(requested, s.nominal_power * s.power_y[..., 0] * s.hours) * np.sqrt(s.efficiency_y[..., 0])

    def reachable(self, stored: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Stored kWh after ``steps`` more steps at full power, from ``stored`` at the end of this one."""
        if self.linear:  # each step adds the same kWh until the (degraded) capacity: CityLearn's steps in one line
            start = np.maximum(stored, self.spec.min_soc * self.spec.capacity)
            grown = np.where(start >= self.degraded, start, np.minimum(start + steps * self.full_step_kwh(),
                                                                       self.degraded))
            return np.where(steps > 0, grown, stored)
        if self.reach_table is not None:
            return self.reach_table.reach(np.maximum(self.pair, 0), stored, steps)
        energy = stored
        full = np.ones_like(stored)
        for k in range(int(steps.max(initial=0))):
            energy = np.where(k < steps, self.stored_after(self.carried_over(energy), full), energy)
        return energy

    def needed_after(self, goal: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The least stored kWh after this step from which ``steps`` more at full power reach ``goal`` (one search of
        the reach table)."""
        assert self.reach_table is not None
        return self.reach_table.least_before(np.maximum(self.pair, 0), goal.astype(float), steps)

    def minimum_action(self, action: np.ndarray, margin_kwh: np.ndarray) -> np.ndarray:
        """The least action >= ``action`` after which each car can still be served (ev_service's rule, V2G
        included: a discharge is kept where full power afterwards still serves the car)."""
        goal = self.required_kwh + margin_kwh
        now, later = self.stored(), self.steps_left
        base = np.clip(action, -1.0, 1.0)
        if not self.linear and self.reach_table is not None:
            return self._tabled_minimum(action, base, now, self.needed_after(goal, later))
        enough = (action >= 1.0) | (self.reachable(self.stored_after(now, base), later) >= goal)
        hopeless = ~enough & (self.reachable(self.stored_after(now, np.ones_like(base)), later) < goal)
        search = self.valid & ~enough & ~hopeless
        high = np.ones_like(base)
        # The closed form finds the least charge; a discharge that does not serve is searched, which finds
        # the least discharge that does (ChargingPath's rule step for step).
        # (On a charger that cannot discharge, a negative action is idle: the closed form holds.)
        idle_below_zero = self.tables.chargers.max_discharge_kw <= 0
        closed = search & ((base >= 0) | idle_below_zero) if self.linear else np.zeros_like(search)
        if closed.any():
            high = np.where(closed, self._linear_minimum(now, goal, later, np.maximum(base, 0.0)), high)
        bisect = search & ~closed
        if bisect.any():
            _, high = narrowed(lambda a: self.reachable(self.stored_after(now, a), later) >= goal, base, high, bisect)
        return np.where(enough, action, np.where(hopeless, 1.0, high))

    def _tabled_minimum(self, action: np.ndarray, base: np.ndarray, now: np.ndarray, needed: np.ndarray) -> np.ndarray:
        """``minimum_action`` where what the car must hold after this step is known: one step searched
        (:func:`narrowed`; regula falsi took as many steps as a bisection: the slowest of the N x C cars sets the
        count, and a deadband's jump stalls it)."""
        at_base, at_full = self.stored_after(now, np.stack([base, np.ones_like(base)]))  # one call for both
        enough = (action >= 1.0) | (at_base >= needed)
        hopeless = ~enough & (at_full < needed)
        search = self.valid & ~enough & ~hopeless
        high = np.ones_like(base)
        if search.any():
            _, high = self._searched(lambda a, rows, after: after(now[rows], a) >= needed[rows], base, high, search)
        return np.where(enough, action, np.where(hopeless, 1.0, high))

    def most_kept_kwh(self, goal: np.ndarray, where: np.ndarray) -> np.ndarray:
        """The most each car should hold after this step (the standalone controller's ``most_kept_kwh``): its goal,
        and where ``where`` (cars on V2G chargers) that plus a step's full discharge from the goal for each step left
        after this one."""
        drain = np.maximum(goal - self.stored_after(goal, np.full_like(goal, -1.0)), 0.0)
        return np.where(where, goal + self.steps_left * drain, goal)

    def maximum_action(self, action: np.ndarray, goal: np.ndarray) -> np.ndarray:
        """The greatest action <= ``action`` after which each car holds no more than it can use (the standalone
        controller's ``maximum_action`` at its ``most_kept_kwh``): ``action`` where its step stays within that (or,
        charge-only, is no charge); a charge-only car already above its goal takes 0, a V2G car is discharged (at
        full power where even that is not enough)."""
        now = self.stored()
        base = np.clip(action, -1.0, 1.0)
        v2g = self.tables.chargers.max_discharge_kw > 0
        after = self.stored_after(now, base)
        over = self.valid & ((base > 0) | v2g) & (after > goal)  # past the goal: what it may hold is worked out there
        most_kwh = goal
        if (over & v2g).any():
            most_kwh = self.most_kept_kwh(goal, v2g & (self.steps_left > 0))
            over &= after > most_kwh
        if not over.any():
            return base
        low = np.where(v2g, -1.0, 0.0) * np.ones_like(base)
        if self.linear and not v2g.any():  # a step stores in proportion to the action below the power and capacity
            most = np.clip((most_kwh - now) / np.maximum(self._stored_per_action(), 1e-12), 0.0, base)
        else:
            most, _ = self._searched(lambda a, rows, after: after(now[rows], a) > most_kwh[rows], low, base, over)
        return np.where(over, np.where(~v2g & (now >= most_kwh), 0.0, most), base)

    def _stored_per_action(self) -> np.ndarray:
        """On linear paths, the kWh a step stores per unit of action (below the power and capacity limits)."""
        chargers, s = self.tables.chargers, self.spec
        return chargers.max_charge_kw * s.hours * chargers.efficiency * np.sqrt(s.efficiency_y[..., 0])

    def _linear_minimum(self, now: np.ndarray, goal: np.ndarray, later: np.ndarray, base: np.ndarray) -> np.ndarray:
        """The least action whose step leaves enough for full power to serve the car (where that exists)."""
        chargers = self.tables.chargers
        needed = np.where(later > 0, goal - later * self.full_step_kwh(), goal)
        action = (needed - now) / np.maximum(self._stored_per_action(), 1e-12)
        deadband = np.clip(chargers.min_charge_kw, 0.0, chargers.max_charge_kw) / np.maximum(chargers.max_charge_kw,
                                                                                                  1e-12)
        return np.clip(np.maximum(np.maximum(action, deadband), base), 0.0, 1.0)


def linear_paths(tables: SiteTables) -> bool:
    """Whether every car charges linearly: flat power-efficiency and capacity-power curves, no standby loss, and
    chargers of one efficiency (the built-in site's). Then reach and the guard have closed forms."""
    cars, chargers = tables.cars, tables.chargers
    flat = all(np.ptp(cars.efficiency_y[i]) == 0 and np.ptp(cars.power_y[i]) == 0 for i in range(cars.size))
    no_curves = all(c is None or np.ptp(c[1]) == 0 for c in chargers.charge_curves)
    return flat and no_curves and bool(np.all(cars.loss == 0))


class Guard(GuardSettings):
    """The EV service guard (trainer.env.ev_guard.EvServiceGuard) on native action arrays (N, n_actions)."""

    def apply(self, sessions: Sessions, actions: np.ndarray) -> np.ndarray:
        chargers = sessions.tables.chargers
        wanted = actions[:, chargers.action]
        if not sessions.valid.any():
            return actions
        margin = self.margin_soc * sessions.spec.capacity
        needed = sessions.minimum_action(wanted, margin)
        raise_ = sessions.valid & (needed > wanted + GUARD_RAISE)  # bisection noise on a serving schedule is no raise
        self.interventions += int(raise_.sum())
        added = ((np.maximum(needed, 0.0) - np.maximum(wanted, 0.0)) * chargers.max_charge_kw
                 + (np.maximum(-wanted, 0.0) - np.maximum(-needed, 0.0)) * chargers.max_discharge_kw)
        self.raised_kwh += float((added * sessions.spec.hours)[raise_].sum())
        result = np.where(raise_, needed, wanted)
        if self.stop_at_target:  # no car holds more than it can use (standalone_controller.guarded_action)
            most = sessions.maximum_action(wanted, sessions.required_kwh + margin)
            lower = sessions.valid & ~raise_ & (most < wanted - GUARD_RAISE)
            self.lowered += int(lower.sum())
            if lower.any():  # and never below what still serves the car
                result = np.where(lower, sessions.minimum_action(most, margin), result)
        guarded = actions.copy()
        guarded[:, chargers.action] = result
        return guarded


class Shortfalls:
    """Per environment and charger, the connected car's unavoidable shortfall (reward.ShortfallTracker, vectorised)."""

    def __init__(self, n_envs: int, n_chargers: int) -> None:
        self.last = np.zeros((n_envs, n_chargers))
        self.last_steps = np.full((n_envs, n_chargers), np.inf)

    def reset(self, envs: np.ndarray) -> None:
        self.last[envs] = 0.0
        self.last_steps[envs] = np.inf

    def growth(self, sessions: Sessions) -> np.ndarray:
        """(N, C) kWh of shortfall that became unavoidable with this step's actions (after they were applied)."""
        stored = sessions.soc() * sessions.spec.capacity
        shortfall = np.maximum(sessions.required_kwh - sessions.reachable(stored, sessions.steps_left), 0.0)
        new_session = sessions.steps_left >= self.last_steps
        before = np.where(new_session, 0.0, self.last)
        grown = np.where(sessions.valid, np.maximum(shortfall - before, 0.0), 0.0)
        self.last = np.where(sessions.valid, np.maximum(shortfall, before), 0.0)
        self.last_steps = np.where(sessions.valid, sessions.steps_left, np.inf)
        return grown
