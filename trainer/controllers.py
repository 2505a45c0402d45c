"""The two reference controllers every agent is measured against.

- ``baseline``: uncontrolled. The battery idles; each EV charges at full power from
  arrival until it is full or leaves.
- ``rbc``: a sensible rule-based controller. PV surplus goes first to EVs, then to the
  battery; the battery discharges to cover the load in high-carbon or high-price hours;
  an EV is charged at full power once its slack runs out (least-laxity first), so every
  feasible departure target is met, and otherwise only from PV or in clean, cheap hours.

Both act on the raw CityLearn state and return the central agent's flat action vector.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from trainer.env import action_slices

# An EV whose slack (hours left minus hours needed at full power) falls below this is
# charged at full power: 1.5 h covers the rounding of hourly steps.
LAXITY_MARGIN_H = 1.5
HIGH_CARBON_QUANTILE = 0.75
LOW_CARBON_QUANTILE = 0.40


class Controller(Protocol):
    name: str

    def act(self, obs: np.ndarray, env) -> np.ndarray:
        """The action for the current step; ``env`` is the unwrapped CityLearnEnv."""


def _ev_state(charger, t: int):
    """(steps left, required SoC, current SoC, capacity kWh) of the connected EV, or None."""
    sim = charger.charger_simulation
    ev = charger.connected_electric_vehicle
    if ev is None or t >= len(sim.electric_vehicle_charger_state) or sim.electric_vehicle_charger_state[t] != 1:
        return None
    soc = float(ev.battery.soc[t - 1]) if t > 0 else float(ev.battery.initial_soc)
    return int(sim.electric_vehicle_departure_time[t]), float(sim.electric_vehicle_required_soc_departure[t]), soc, float(ev.battery.capacity)


class UncontrolledBaseline:
    name = "baseline"

    def act(self, obs: np.ndarray, env) -> np.ndarray:
        actions = []
        for _, names in action_slices(env):
            actions.extend(1.0 if n.startswith("electric_vehicle_storage") else 0.0 for n in names)
        return np.asarray(actions, dtype=np.float32)


class RuleBasedController:
    name = "rbc"

    def __init__(self) -> None:
        self._thresholds: dict[int, tuple[float, float, float]] = {}

    def _limits(self, i: int, b) -> tuple[float, float, float]:
        if i not in self._thresholds:
            carbon = np.asarray(b.carbon_intensity.carbon_intensity, dtype=float)
            price = np.asarray(b.pricing.electricity_pricing, dtype=float)
            self._thresholds[i] = (
                float(np.quantile(carbon, HIGH_CARBON_QUANTILE)),
                float(np.quantile(carbon, LOW_CARBON_QUANTILE)),
                float(np.median(price)),
            )
        return self._thresholds[i]

    def act(self, obs: np.ndarray, env) -> np.ndarray:
        t = env.time_step
        actions: list[float] = []
        for i, ((_, names), b) in enumerate(zip(action_slices(env), env.buildings)):
            high_carbon, low_carbon, median_price = self._limits(i, b)
            sim = b.energy_simulation
            carbon = float(b.carbon_intensity.carbon_intensity[t])
            price = float(b.pricing.electricity_pricing[t])
            load = float(sim.non_shiftable_load[t])
            pv = float(b.pv.get_generation(sim.solar_generation[t])) if b.pv is not None else 0.0
            surplus = max(pv - load, 0.0)
            clean_and_cheap = carbon <= low_carbon and price <= median_price

            chargers = {f"electric_vehicle_storage_{c.charger_id}": c for c in (b.electric_vehicle_chargers or [])}
            ev_actions: dict[str, float] = {}
            ev_load = 0.0
            for name, charger in chargers.items():
                state = _ev_state(charger, t)
                if state is None:
                    ev_actions[name] = 0.0
                    continue
                steps_left, required, soc, capacity = state
                kw = float(charger.max_charging_power) * float(charger.efficiency)
                hours_needed = max(required - soc, 0.0) * capacity / kw
                if hours_needed > 0 and (steps_left + 1) - hours_needed < LAXITY_MARGIN_H:
                    action = 1.0
                elif surplus > 0:
                    action = min(1.0, surplus / float(charger.max_charging_power))
                elif clean_and_cheap and soc < 1.0:
                    action = 1.0
                else:
                    action = 0.0
                ev_actions[name] = action
                ev_load += action * float(charger.max_charging_power)
                surplus = max(surplus - action * float(charger.max_charging_power), 0.0)

            battery = b.electrical_storage
            capacity = float(battery.capacity or 0.0)
            battery_action = 0.0
            if capacity > 0:
                max_fraction = float(battery.nominal_power or capacity) / capacity
                if surplus > 0:
                    battery_action = min(surplus / capacity, max_fraction)
                elif carbon >= high_carbon or price > median_price:
                    battery_action = -min((load + ev_load - pv) / capacity, max_fraction)
            for name in names:
                actions.append(ev_actions.get(name, 0.0) if name in chargers else battery_action if name == "electrical_storage" else 0.0)
        return np.asarray(actions, dtype=np.float32)


class PolicyController:
    """A trained SB3 model, acting deterministically."""

    def __init__(self, name: str, model) -> None:
        self.name = name
        self.model = model

    def act(self, obs: np.ndarray, env) -> np.ndarray:
        action, _ = self.model.predict(obs, deterministic=True)
        return action


REFERENCE_CONTROLLERS = {"baseline": UncontrolledBaseline, "rbc": RuleBasedController}
