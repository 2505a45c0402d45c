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

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import numpy as np

# The guard's arithmetic ships with every exported controller: one copy, in the file that ships.
from trainer.shipped.controller import ChargingPath, Curve, guarded_action

if TYPE_CHECKING:
    from trainer.config.sections import EvConfig

CONNECTED = 1


def charging_path(charger: Any, battery: Any) -> ChargingPath:
    """A CityLearn charger and the EV battery plugged into it, as the numbers the guard steps with."""
    curve = charger.charge_efficiency_curve
    down = getattr(charger, "discharge_efficiency_curve", None)
    return ChargingPath(
        max_power_kw=float(charger.max_charging_power),
        min_power_kw=float(charger.min_charging_power or 0.0),
        charger_efficiency=float(charger.efficiency),
        charger_curve=None if curve is None else Curve.of(curve),
        capacity_kwh=float(battery.capacity),
        degraded_capacity_kwh=float(battery.degraded_capacity),
        nominal_power_kw=float(battery.nominal_power),
        power_efficiency=Curve.of(battery.power_efficiency_curve),
        capacity_power=Curve.of(battery.capacity_power_curve),
        loss_per_step=float(battery.loss_coefficient),
        min_soc=float(np.clip(1.0 - battery.depth_of_discharge, 0.0, 1.0)),
        hours=float(battery.seconds_per_time_step) / 3600.0,
        max_discharge_kw=max(float(getattr(charger, "max_discharging_power", 0.0) or 0.0), 0.0),
        min_discharge_kw=float(getattr(charger, "min_discharging_power", 0.0) or 0.0),
        discharge_curve=None if down is None else Curve.of(down),
    )


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
            # A departure the charger file does not know yet reads -1 (the official datasets' first hours of a stay):
            # nothing is owed until it is known, as CityLearn judges a departure only where the countdown reads 0.
            if not (math.isfinite(required) and math.isfinite(steps_left)) or required <= 0 or steps_left < 0:
                row.append(None)
                continue
            row.append(Session(charger, charging_path(charger, battery), float(battery.energy_init),
                               required * float(battery.capacity), max(int(steps_left), 0)))
        out.append(row)
    return out


def raised_kwh(path: ChargingPath, wanted: float, needed: float) -> float:
    """Grid kWh a raise from ``wanted`` to ``needed`` adds at the charger (less discharge, more charge)."""
    charge = max(needed, 0.0) - max(wanted, 0.0)
    discharge = max(-wanted, 0.0) - max(-needed, 0.0)
    return (charge * path.max_power_kw + discharge * path.max_discharge_kw) * path.hours


class GuardSettings:
    """What every EV guard is set with (the config's ``ev`` section) and what it counts as it acts: this one on
    CityLearn's objects, and the training simulator's on arrays (trainer.sim.ev.Guard)."""

    def __init__(self, margin_soc: float, stop_at_target: bool = False) -> None:
        self.margin_soc = margin_soc
        self.stop_at_target = stop_at_target
        self.interventions = 0
        self.raised_kwh = 0.0
        self.lowered = 0

    @classmethod
    def of(cls, ev: EvConfig) -> Self | None:
        """The guard ``ev`` (the config's section) asks for; None where it is off."""
        return cls(ev.margin_soc, ev.stop_at_target) if ev.guard else None


class EvServiceGuard(GuardSettings):
    """Raises each connected car's charging action to the least that still serves it by departure and, with
    ``stop_at_target``, lowers a charge-only car's to the most that does not fill it past its target.

    ``margin_soc`` (a fraction of the car's capacity) covers what an exact prediction cannot: float
    rounding and capacity fade. Acts on CityLearn's own action list (one array per building for
    a central agent's single array) before ``CityLearnEnv.step``; counts the steps it intervened.
    """

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
                goal = session.required_kwh + self.margin_soc * session.path.capacity_kwh
                action, change = guarded_action(session.path, session.energy_init, goal, session.steps_left, wanted,
                                                self.stop_at_target)
                if change > 0:
                    self.interventions += 1
                    self.raised_kwh += raised_kwh(session.path, wanted, action)
                elif change < 0:
                    self.lowered += 1
                guarded[position] = action
            offset += len(names)
        return guarded
