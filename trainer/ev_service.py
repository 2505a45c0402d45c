"""EV service: what a connected car can still get, and the guard that makes sure it gets it.

A controller counts only if it cuts CO2 *and* serves the cars. Left to a reward, a learner finds
that stranding cars is the cheapest way to cut imports; so, by default, every controller's EV
actions (trained agents, references, the optimum's replay, in training and in evaluation alike)
pass through :class:`EvServiceGuard`, which raises each connected car's charging to the least that
still lets it reach its required state of charge by departure. The controller then decides only
*when* to charge within each car's slack, and what to do with the battery.

"Reach" is computed with the energy CityLearn 3.0.2 really stores: the charger's efficiency (or its
curve), the EV battery's power-efficiency curve (applied as a square root each way), its
capacity-power curve, its standby loss, its capacity and depth of discharge, step by step exactly
as ``Charger.update_connected_electric_vehicle_soc`` and ``Battery.charge`` do, discharge (V2G)
included (tests/test_ev_service.py checks the prediction against CityLearn itself). A controller
may discharge a car only as far as full power afterwards still serves it by departure.

Timing, as CityLearn has it: at step ``t`` a connected car's ``departure_time[t]`` counts the steps
after this one before it leaves, so the action of step ``t`` is one of ``departure_time[t] + 1``
that still charge it; the car leaves with the state of charge it has after the step whose
``departure_time`` is 0.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

CONNECTED = 1
# Bisection on the action over [-1, 1]: 2^-20 of full power is far below any charger's resolution.
_BISECTION_STEPS = 21


@dataclass(frozen=True)
class _Curve:
    """CityLearn's piecewise-linear curves, evaluated as CityLearn does (clamped-extrapolated ends)."""

    x: tuple[float, ...]
    y: tuple[float, ...]

    @classmethod
    def of(cls, array: Any) -> _Curve:
        x, y = np.asarray(array, dtype=float)
        return cls(tuple(float(v) for v in x), tuple(float(v) for v in y))

    def __call__(self, value: float) -> float:
        # CityLearn: idx = clip(searchsorted(x, v, side='left') - 1, 0, len - 2), then a linear segment.
        idx = min(len(self.x) - 2, max(0, bisect.bisect_left(self.x, value) - 1))
        x0, x1, y0, y1 = self.x[idx], self.x[idx + 1], self.y[idx], self.y[idx + 1]
        return y0 + (y1 - y0) * (value - x0) / (x1 - x0)


@dataclass(frozen=True)
class ChargingPath:
    """One charger and the EV battery plugged into it, as numbers (no CityLearn objects)."""

    max_power_kw: float
    min_power_kw: float
    charger_efficiency: float
    charger_curve: _Curve | None
    capacity_kwh: float
    degraded_capacity_kwh: float
    nominal_power_kw: float
    power_efficiency: _Curve
    capacity_power: _Curve
    loss_per_step: float
    min_soc: float
    hours: float
    max_discharge_kw: float = 0.0  # V2G: 0 where the charger cannot discharge the car
    min_discharge_kw: float = 0.0
    discharge_curve: _Curve | None = None

    @classmethod
    def of(cls, charger: Any, battery: Any) -> ChargingPath:
        curve = charger.charge_efficiency_curve
        down = getattr(charger, "discharge_efficiency_curve", None)
        return cls(
            max_power_kw=float(charger.max_charging_power),
            min_power_kw=float(charger.min_charging_power or 0.0),
            charger_efficiency=float(charger.efficiency),
            charger_curve=None if curve is None else _Curve.of(curve),
            capacity_kwh=float(battery.capacity),
            degraded_capacity_kwh=float(battery.degraded_capacity),
            nominal_power_kw=float(battery.nominal_power),
            power_efficiency=_Curve.of(battery.power_efficiency_curve),
            capacity_power=_Curve.of(battery.capacity_power_curve),
            loss_per_step=float(battery.loss_coefficient),
            min_soc=float(np.clip(1.0 - battery.depth_of_discharge, 0.0, 1.0)),
            hours=float(battery.seconds_per_time_step) / 3600.0,
            max_discharge_kw=max(float(getattr(charger, "max_discharging_power", 0.0) or 0.0), 0.0),
            min_discharge_kw=float(getattr(charger, "min_discharging_power", 0.0) or 0.0),
            discharge_curve=None if down is None else _Curve.of(down),
        )

    def stored_after(self, energy_init: float, action: float) -> float:
        """Stored kWh after one step that starts at ``energy_init`` with ``action`` in [-1, 1] (< 0 discharges)."""
        return self.step(energy_init, action)[0]

    def step(self, energy_init: float, action: float) -> tuple[float, float]:
        """(stored kWh after, grid kWh the charger draws: < 0 where it feeds the building) for one step."""
        action = min(max(float(action), -1.0), 1.0)
        if action < 0.0:
            return self._discharged(energy_init, -action)
        power = action * self.max_power_kw
        if power <= 0.0 or power < min(self.min_power_kw, self.max_power_kw):
            return energy_init, 0.0
        efficiency = self.charger_curve(action) if self.charger_curve is not None else self.charger_efficiency
        requested = power * self.hours * efficiency
        soc = energy_init / max(self.capacity_kwh, 1e-12)
        max_input = max(self.nominal_power_kw * self.capacity_power(soc), 0.0) * self.hours
        limited = min(requested, max_input)
        battery_efficiency = 1.0
        for _ in range(2):  # CityLearn iterates twice: efficiency depends on the power it limits
            battery_efficiency = self.power_efficiency(self._normalised(limited))
            headroom = max(self.degraded_capacity_kwh - energy_init, 0.0) / max(math.sqrt(battery_efficiency), 1e-12)
            limited = min(requested, max_input, headroom)
        stored = min(energy_init + limited * math.sqrt(battery_efficiency), self.capacity_kwh)
        balance = (stored - energy_init) / max(math.sqrt(battery_efficiency), 1e-12)
        return stored, balance / max(efficiency, 1e-12)

    def _discharged(self, energy_init: float, share: float) -> tuple[float, float]:
        """A discharging step at ``share`` of the charger's discharge power (CityLearn's V2G path)."""
        power = share * self.max_discharge_kw
        if power <= 0.0 or power < min(self.min_discharge_kw, self.max_discharge_kw):
            return energy_init, 0.0
        efficiency = self.discharge_curve(share) if self.discharge_curve is not None else self.charger_efficiency
        requested = power * self.hours / max(efficiency, 1e-12)  # the battery gives more than the building gets
        soc = energy_init / max(self.capacity_kwh, 1e-12)
        max_output = max(self.nominal_power_kw * self.capacity_power(soc), 0.0) * self.hours
        floor = self.min_soc * self.capacity_kwh
        limited = min(requested, max_output)
        battery_efficiency = 1.0
        for _ in range(2):
            battery_efficiency = self.power_efficiency(self._normalised(limited))
            reserve = max(energy_init - floor, 0.0) * math.sqrt(battery_efficiency)
            limited = min(requested, max_output, reserve)
        stored = max(floor, energy_init - limited / max(math.sqrt(battery_efficiency), 1e-12))
        balance = (stored - energy_init) * math.sqrt(battery_efficiency)
        return stored, balance * efficiency

    def _normalised(self, kwh: float) -> float:
        return min(max(kwh / self.hours / max(self.nominal_power_kw, 1e-12), 0.0), 1.0)

    def carried_over(self, stored: float) -> float:
        """The energy a step starts with, from what the previous one stored (standby loss, floor)."""
        soc = min(max(stored / self.capacity_kwh * (1.0 - self.loss_per_step), self.min_soc), 1.0)
        return soc * self.capacity_kwh

    def reachable(self, stored: float, steps: int) -> float:
        """Stored kWh after ``steps`` more steps at full power, from ``stored`` at the end of this one."""
        energy = stored
        for _ in range(steps):
            energy = self.stored_after(self.carried_over(energy), 1.0)
        return energy

    def after_step_then_full(self, energy_init: float, action: float, later_steps: int) -> float:
        return self.reachable(self.stored_after(energy_init, action), later_steps)


@dataclass(frozen=True)
class Session:
    """The car at one charger at the current step."""

    charger: Any
    path: ChargingPath
    energy_init: float
    required_kwh: float
    steps_left: int  # the charger's departure_time: steps after this one before the car leaves


def connected_sessions(env: Any) -> list[list[Session | None]]:
    """Per building, per charger: the connected car's session at the current step, or None."""
    t = env.time_step
    out: list[list[Session | None]] = []
    for building in env.buildings:
        row: list[Session | None] = []
        for charger in building.electric_vehicle_chargers or []:
            sim = charger.charger_simulation
            ev = charger.connected_electric_vehicle
            state = sim.electric_vehicle_charger_state
            if ev is None or t >= len(state) or state[t] != CONNECTED:
                row.append(None)
                continue
            battery = ev.battery
            required = float(sim.electric_vehicle_required_soc_departure[t])
            steps_left = sim.electric_vehicle_departure_time[t]
            if not (math.isfinite(required) and math.isfinite(steps_left)) or required <= 0:
                row.append(None)
                continue
            row.append(Session(charger, ChargingPath.of(charger, battery), float(battery.energy_init),
                               required * float(battery.capacity), max(int(steps_left), 0)))
        out.append(row)
    return out


def minimum_action(session: Session, action: float, margin_kwh: float) -> float:
    """The least action >= ``action`` (in [-1, 1]) after which the car can still be served by departure.

    A discharge (V2G) is kept where full power afterwards still serves the car, else lessened or turned
    into charging. Where even full power from now on cannot serve it, full power (the least shortfall).
    """
    goal = session.required_kwh + margin_kwh
    path, later = session.path, session.steps_left
    action = min(max(float(action), -1.0), 1.0)
    if action >= 1.0 or path.after_step_then_full(session.energy_init, action, later) >= goal:
        return action
    if path.after_step_then_full(session.energy_init, 1.0, later) < goal:
        return 1.0
    low, high = action, 1.0
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if path.after_step_then_full(session.energy_init, mid, later) >= goal:
            high = mid
        else:
            low = mid
    return high


def raised_kwh(path: ChargingPath, wanted: float, needed: float) -> float:
    """Grid kWh a raise from ``wanted`` to ``needed`` adds at the charger (less discharge, more charge)."""
    charge = max(needed, 0.0) - max(wanted, 0.0)
    discharge = max(-wanted, 0.0) - max(-needed, 0.0)
    return (charge * path.max_power_kw + discharge * path.max_discharge_kw) * path.hours


class EvServiceGuard:
    """Raises each connected car's charging action to the least that still serves it by departure.

    ``margin_soc`` (a fraction of the car's capacity) covers what an exact prediction cannot: float
    rounding and capacity fade. Acts on CityLearn's own action list (one array per building for
    a central agent's single array) before ``CityLearnEnv.step``; counts the steps it intervened.
    """

    def __init__(self, margin_soc: float) -> None:
        self.margin_soc = margin_soc
        self.interventions = 0
        self.raised_kwh = 0.0

    def apply(self, env: Any, actions: np.ndarray) -> np.ndarray:
        """``actions``: the central agent's flat native action vector; returns a guarded copy."""
        guarded = np.array(actions, dtype=float, copy=True)
        offset = 0
        for building, sessions in zip(env.buildings, connected_sessions(env)):
            names = list(building.active_actions)
            index = {name: offset + i for i, name in enumerate(names)}
            for charger, session in zip(building.electric_vehicle_chargers or [], sessions):
                position = index.get(f"electric_vehicle_storage_{charger.charger_id}")
                if session is None or position is None:
                    continue
                wanted = float(guarded[position])
                needed = minimum_action(session, wanted, self.margin_soc * session.path.capacity_kwh)
                if needed > wanted + 1e-4:  # bisection noise on a schedule that already serves the car is no raise
                    self.interventions += 1
                    self.raised_kwh += raised_kwh(session.path, wanted, needed)
                    guarded[position] = needed
            offset += len(names)
        return guarded
