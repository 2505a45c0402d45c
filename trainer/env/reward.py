"""The multi-objective reward: a weighted sum of five normalised penalties.

Per building and step (hourly, so kWh and kW coincide), with ``import = max(net, 0)``
and ``export = max(-net, 0)`` of the building's net grid exchange:

=======  ===========================================  =========================================
term     penalty                                      unit and normalisation
=======  ===========================================  =========================================
co2      import x carbon_intensity                    kg CO2 / (scale_kw x max carbon intensity)
cost     import x price                               money / (scale_kw x max price)
grid     (import / scale_kw) ** 2                     dimensionless; squared so peaks cost most
solar    export / scale_kw                            dimensionless; PV sent away, not used
ev       kWh a connected car can no longer get by     kWh x the most one kWh can earn in the
         departure, charged in the step it becomes    four terms above (``kwh_value``), so
         unavoidable                                  ``reward.ev`` > 1 ranks serving above
                                                      stranding
=======  ===========================================  =========================================

``scale_kw`` is the building's largest possible import: peak load plus battery and charger
power. Each of the first four terms is roughly in [0, 1], so the weights compare like with
like. The reward is ``-(sum of weight x term)``; with a central agent the buildings are summed.

The EV term. A car's *unavoidable shortfall* is what it would still lack at departure if it were
charged at full power from the next step on, computed with the energy CityLearn really stores
(trainer.env.ev_guard). It only grows; each step is charged for its growth, so over a session the
term adds up to exactly the car's final shortfall in kWh, and it is charged as soon as the
shortfall can no longer be prevented (not hours later at departure). One stored kWh avoided can
save at most ``(w_co2 + w_cost + 2 w_grid + w_solar) / scale_kw`` per grid kWh (the squared grid
term's slope is at most 2 / scale_kw) times the grid kWh it takes (``1 / efficiency``): that is
``kwh_value``, and ``reward.ev`` is the price of a missed kWh as a multiple of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from citylearn.reward_function import RewardFunction

from trainer.config.sections import RewardConfig
from trainer.env.ev_guard import connected_sessions

TERMS = ("co2", "cost", "ev", "grid", "solar")


@dataclass(frozen=True)
class SiteScale:
    """Per-building normalisers, computed once from the dataset (see :func:`site_scales`)."""

    scale_kw: float
    carbon_max: float
    price_max: float


def kwh_value(weights: Mapping[str, float], scale: SiteScale, grid_kwh_per_stored_kwh: float) -> float:
    """The most one stored kWh can earn in the co2, cost, grid and solar terms, weighted (see the module doc)."""
    per_grid_kwh = (weights["co2"] + weights["cost"] + 2 * weights["grid"] + weights["solar"]) / scale.scale_kw
    return per_grid_kwh * grid_kwh_per_stored_kwh


def reward_terms(net_kwh: float, carbon: float, price: float, ev_kwh: float, ev_kwh_value: float,
                 scale: SiteScale) -> dict[str, float]:
    """The five penalties for one building and step (all >= 0); ``ev_kwh``: shortfall that became unavoidable."""
    imported = max(net_kwh, 0.0)
    exported = max(-net_kwh, 0.0)
    return {
        "co2": imported * carbon / (scale.scale_kw * scale.carbon_max),
        "cost": imported * price / (scale.scale_kw * scale.price_max),
        "ev": ev_kwh * ev_kwh_value,
        "grid": (imported / scale.scale_kw) ** 2,
        "solar": exported / scale.scale_kw,
    }


def weighted_reward(terms: Mapping[str, float], weights: RewardConfig | Mapping[str, float]) -> float:
    get = weights.get if isinstance(weights, Mapping) else (lambda k: getattr(weights, k))
    return -sum(float(get(k)) * terms[k] for k in TERMS)


class ShortfallTracker:
    """Per charger, the connected car's unavoidable shortfall (kWh) and how much it grew this step."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}  # charger id -> (shortfall kWh, steps left)

    def reset(self) -> None:
        self._last.clear()

    def growth(self, env: Any) -> list[float]:
        """Per building, the kWh of shortfall that became unavoidable with this step's actions.

        Called after CityLearn applied the step's actions and before it advances time: a car's
        ``steps_left`` later steps can still charge it (the one leaving now has none).
        """
        t = env.time_step
        out = []
        for building, sessions in zip(env.buildings, connected_sessions(env)):
            total = 0.0
            for charger, session in zip(building.electric_vehicle_chargers or [], sessions):
                key = charger.charger_id
                if session is None:
                    self._last.pop(key, None)
                    continue
                battery = session.charger.connected_electric_vehicle.battery
                stored = float(battery.soc[t]) * session.path.capacity_kwh
                shortfall = max(session.required_kwh - session.path.reachable(stored, session.steps_left), 0.0)
                before, steps_before = self._last.get(key, (0.0, session.steps_left + 1))
                if session.steps_left >= steps_before:  # a new session at this charger
                    before = 0.0
                total += max(shortfall - before, 0.0)
                self._last[key] = (max(shortfall, before), session.steps_left)
            out.append(total)
        return out


class MultiObjectiveReward(RewardFunction):
    """CityLearn adapter: reads each building's observations and applies :func:`reward_terms`.

    :meth:`configure` attaches the per-building scales and the environment (for the EV term's
    physics) right after :func:`trainer.env.citylearn.make_citylearn_env` builds it.
    """

    def __init__(self, env_metadata: Mapping[str, Any] | None, storage: float = 0.0, storage_gamma: float = 0.99,
                 **weights: float):
        super().__init__(env_metadata)
        self.weights = {k: float(weights.get(k, 0.0)) for k in TERMS}
        self.scales: list[SiteScale] = []
        self.ev_kwh_values: list[float] = []
        self.env: Any = None
        self.shortfalls = ShortfallTracker()
        self.stored = StoredEnergyCredit(storage, storage_gamma)
        self.last_terms: list[dict[str, float]] = []

    def configure(self, scales: list[SiteScale], env: Any = None) -> None:
        self.scales = scales
        self.env = env
        evs = list(env.electric_vehicles or []) if env is not None else []
        buildings = env.buildings if env is not None else []
        self.ev_kwh_values = [kwh_value(self.weights, scale, _grid_kwh_per_stored_kwh(b, evs))
                              for scale, b in zip(scales, buildings)]
        self.stored.configure([mean_kwh_value(self.weights, scale, b) for scale, b in zip(scales, buildings)])
        self.shortfalls.reset()

    def get_required_observation_names(self) -> list[str] | None:
        if not self.scales:
            return None
        return ["carbon_intensity", "electricity_pricing", "net_electricity_consumption"]

    def calculate(self, observations: list[Mapping[str, float]]) -> list[float]:
        ev_kwh = [0.0] * len(observations)
        if self.env is not None and self.weights["ev"] > 0:
            if self.env.time_step == 0:
                self.shortfalls.reset()
            ev_kwh = self.shortfalls.growth(self.env)
        credit = self.stored.step(self.env) if self.env is not None else [0.0] * len(observations)
        rewards, self.last_terms = [], []
        for i, obs in enumerate(observations):
            value = self.ev_kwh_values[i] if i < len(self.ev_kwh_values) else 0.0
            terms = reward_terms(
                obs["net_electricity_consumption"], obs.get("carbon_intensity", 0.0),
                obs.get("electricity_pricing", 0.0), ev_kwh[i] if i < len(ev_kwh) else 0.0, value, self.scales[i],
            )
            self.last_terms.append(terms)
            rewards.append(weighted_reward(terms, self.weights) + (credit[i] if i < len(credit) else 0.0))
        return [sum(rewards)] if self.central_agent else rewards


def mean_kwh_value(weights: Mapping[str, float], scale: SiteScale, building: Any) -> float:
    """What one grid kWh costs in the co2 and cost terms, on average over the dataset's period."""
    carbon = np.asarray(building.carbon_intensity.carbon_intensity, dtype=float)
    price = np.asarray(building.pricing.electricity_pricing, dtype=float)
    return float(np.mean(weights["co2"] * carbon / (scale.scale_kw * scale.carbon_max)
                         + weights["cost"] * price / (scale.scale_kw * scale.price_max)))


class StoredEnergyCredit:
    """Potential-based shaping (Ng, Harada and Russell, 1999): stored energy is worth something now.

    Charging a battery or a car costs imports at once and pays back hours later, so a learner sees
    the cost long before the gain, and an untrained policy learns first never to charge the battery.
    The potential of a state is ``weight x mean kWh value x stored kWh`` (the battery and every
    connected car), and each step adds ``gamma x potential(after) - potential(before)``: charging
    when energy is cheaper than average now earns at once, discharging when dearer likewise.
    Shaping of this form leaves the optimal policy unchanged (for agents discounting with
    ``gamma``); it only tells the learner sooner. ``weight`` 0 turns it off.
    """

    def __init__(self, weight: float, gamma: float) -> None:
        self.weight = weight
        self.gamma = gamma
        self.values: list[float] = []
        self._previous: list[float] | None = None

    def configure(self, values: list[float]) -> None:
        self.values = values
        self._previous = None

    def potentials(self, env: Any) -> list[float]:
        t = env.time_step
        out = []
        for building, value in zip(env.buildings, self.values):
            stored = 0.0
            battery = building.electrical_storage
            if battery is not None and float(battery.capacity or 0.0) > 0:
                stored += float(battery.soc[t]) * float(battery.capacity)
            for charger in building.electric_vehicle_chargers or []:
                ev = charger.connected_electric_vehicle
                if ev is not None:
                    stored += float(ev.battery.soc[t]) * float(ev.battery.capacity)
            out.append(self.weight * value * stored)
        return out

    def step(self, env: Any) -> list[float]:
        """The shaping of this step, per building (0 when off, and on an episode's first step)."""
        if not self.weight:
            return [0.0] * len(env.buildings)
        now = self.potentials(env)
        before = now if env.time_step == 0 or self._previous is None else self._previous
        self._previous = now
        return [self.gamma * after - prior for after, prior in zip(now, before)]


def _grid_kwh_per_stored_kwh(building: Any, evs: list[Any]) -> float:
    """Grid kWh per stored kWh on the worst path from a building's chargers into any of the cars."""
    chargers = building.electric_vehicle_chargers or []
    if not chargers:
        return 1.0
    worst = 1.0
    for charger in chargers:
        charger_efficiency = (min(np.asarray(charger.charge_efficiency_curve)[1])
                              if charger.charge_efficiency_curve is not None else float(charger.efficiency))
        worst = min(worst, charger_efficiency)
    battery = min((min(np.asarray(ev.battery.power_efficiency_curve)[1]) for ev in evs), default=1.0)
    return 1.0 / max(worst * math.sqrt(battery), 1e-6)
