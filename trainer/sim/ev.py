"""The EV guard and the EV reward term on the simulator's arrays (trainer.env.ev_guard's rules, vectorised).

For each connected car at its charger, in N environments at once: what it stores after a step at a
given action, what it can still reach by departure at full power, the least action that still serves
it (the guard), and how much of its shortfall became unavoidable this step (the reward's EV term).
The charging physics is the batteries' own (trainer.sim.battery.charged), so it is CityLearn's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trainer.env.ev_guard import GuardSettings
from trainer.shipped.controller import BISECTION_STEPS, GUARD_RAISE
from trainer.sim.battery import BatteryBank, carried_soc, charged
from trainer.sim.site import SiteTables

if TYPE_CHECKING:
    pass


@dataclass
class Sessions:
    """The car at each charger at one step, (N, C): where one is connected with a departure and a need."""

    tables: SiteTables
    t: np.ndarray  # (N,) absolute step
    cars: BatteryBank
    linear: bool = False  # every path is linear (linear_paths): closed forms instead of stepping and bisecting

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

    def soc(self) -> np.ndarray:
        """Each connected car's state of charge now."""
        return self.cars.soc[self.rows, self.car].astype(float)

    def stored(self) -> np.ndarray:
        """Each connected car's stored kWh now (CityLearn's ``energy_init``: floored at its depth of discharge)."""
        return np.maximum(self.spec.min_soc * self.spec.capacity, self.soc() * self.spec.capacity)

    def stored_after(self, energy: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Stored kWh after one step from ``energy`` at ``action`` in [-1, 1] (ChargingPath.stored_after)."""
        chargers = self.tables.chargers
        power = chargers.power_kw(np.clip(action, -1.0, 1.0))
        charging = power >= 0
        max_kw = np.where(charging, chargers.max_charge_kw, chargers.max_discharge_kw)
        efficiency = chargers.efficiency_at(np.abs(power) / np.maximum(max_kw, 1e-8), charging)
        requested = np.where(charging, power * self.spec.hours * efficiency,
                             power * self.spec.hours / np.maximum(efficiency, 1e-8))
        return charged(self.spec, energy, self.degraded, requested)[0]

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
        energy = stored
        full = np.ones_like(stored)
        for k in range(int(steps.max(initial=0))):
            energy = np.where(k < steps, self.stored_after(self.carried_over(energy), full), energy)
        return energy

    def minimum_action(self, action: np.ndarray, margin_kwh: np.ndarray) -> np.ndarray:
        """The least action >= ``action`` after which each car can still be served (ev_service's rule, V2G
        included: a discharge is kept where full power afterwards still serves the car)."""
        goal = self.required_kwh + margin_kwh
        now, later = self.stored(), self.steps_left
        base = np.clip(action, -1.0, 1.0)
        enough = (action >= 1.0) | (self.reachable(self.stored_after(now, base), later) >= goal)
        hopeless = ~enough & (self.reachable(self.stored_after(now, np.ones_like(base)), later) < goal)
        search = self.valid & ~enough & ~hopeless
        high = np.ones_like(base)
        # The closed form finds the least charge; a discharge that does not serve is bisected, which finds
        # the least discharge that does (ChargingPath's rule step for step).
        # (On a charger that cannot discharge, a negative action is idle: the closed form holds.)
        idle_below_zero = self.tables.chargers.max_discharge_kw <= 0
        closed = search & ((base >= 0) | idle_below_zero) if self.linear else np.zeros_like(search)
        if closed.any():
            high = np.where(closed, self._linear_minimum(now, goal, later, np.maximum(base, 0.0)), high)
        bisect = search & ~closed
        if bisect.any():
            low = base.copy()
            for _ in range(BISECTION_STEPS):
                mid = 0.5 * (low + high)
                serves = self.reachable(self.stored_after(now, mid), later) >= goal
                high = np.where(bisect & serves, mid, high)
                low = np.where(bisect & ~serves, mid, low)
        return np.where(enough, action, np.where(hopeless, 1.0, high))

    def maximum_action(self, action: np.ndarray, margin_kwh: np.ndarray) -> np.ndarray:
        """The greatest action <= ``action`` after which each car holds no more than its goal (the standalone
        controller's ``maximum_action``): ``action`` where it is no charge or stays within the goal."""
        goal = self.required_kwh + margin_kwh
        now = self.stored()
        base = np.clip(action, -1.0, 1.0)
        over = self.valid & (base > 0) & (self.stored_after(now, base) > goal)
        if not over.any():
            return base
        if self.linear:  # a step stores in proportion to the action below the power and capacity limits
            most = np.clip((goal - now) / np.maximum(self._stored_per_action(), 1e-12), 0.0, base)
        else:
            low, high = np.zeros_like(base), base.copy()
            for _ in range(BISECTION_STEPS):
                mid = 0.5 * (low + high)
                within = self.stored_after(now, mid) <= goal
                low, high = np.where(within, mid, low), np.where(within, high, mid)
            most = low
        return np.where(over, np.where(now >= goal, 0.0, most), base)

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
        if self.stop_at_target:  # charge-only chargers stop at the goal (standalone_controller.guarded_action)
            most = sessions.maximum_action(wanted, margin)
            lower = sessions.valid & ~raise_ & (chargers.max_discharge_kw <= 0) & (most < wanted - GUARD_RAISE)
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
