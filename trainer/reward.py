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
ev       sum over connected EVs of the departure      SoC fraction (0..1) that can no longer be
         shortfall that full power can no longer      reached before departure
         prevent
=======  ===========================================  =========================================

``scale_kw`` is the building's largest possible import: peak load plus battery and charger
power. Each term is then roughly in [0, 1], so the weights in ``reward`` compare like with
like. The reward is ``-(sum of weight x term)``; with a central agent the buildings are summed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from citylearn.reward_function import RewardFunction

from trainer.config import RewardConfig

TERMS = ("co2", "cost", "ev", "grid", "solar")


@dataclass(frozen=True)
class SiteScale:
    """Per-building normalisers, computed once from the dataset (see :func:`site_scales`)."""

    scale_kw: float
    carbon_max: float
    price_max: float


@dataclass(frozen=True)
class ChargerSpec:
    name: str
    max_power_kw: float
    efficiency: float


def ev_shortfall(
    soc: float, required_soc: float, steps_left: float, capacity_kwh: float,
    max_power_kw: float, efficiency: float, hours_per_step: float = 1.0,
) -> float:
    """SoC the EV will miss at departure even if charged at full power from now on.

    ``steps_left`` counts the steps after this one before departure (0 = leaves after this step),
    so ``steps_left + 1`` steps of charging remain.
    """
    if capacity_kwh <= 0:
        return 0.0
    reachable = soc + (steps_left + 1) * max_power_kw * efficiency * hours_per_step / capacity_kwh
    return max(0.0, required_soc - reachable)


def reward_terms(net_kwh: float, carbon: float, price: float, ev_shortfalls: Iterable[float], scale: SiteScale) -> dict[str, float]:
    """The five penalties for one building and step (all >= 0)."""
    imported = max(net_kwh, 0.0)
    exported = max(-net_kwh, 0.0)
    return {
        "co2": imported * carbon / (scale.scale_kw * scale.carbon_max),
        "cost": imported * price / (scale.scale_kw * scale.price_max),
        "ev": float(sum(ev_shortfalls)),
        "grid": (imported / scale.scale_kw) ** 2,
        "solar": exported / scale.scale_kw,
    }


def weighted_reward(terms: Mapping[str, float], weights: RewardConfig | Mapping[str, float]) -> float:
    get = weights.get if isinstance(weights, Mapping) else (lambda k: getattr(weights, k))
    return -sum(float(get(k)) * terms[k] for k in TERMS)


class MultiObjectiveReward(RewardFunction):
    """CityLearn adapter: reads each building's observations and applies :func:`reward_terms`.

    The per-building scales and charger specs are attached by :func:`trainer.env.make_citylearn_env`
    right after the environment is built, from the dataset itself.
    """

    def __init__(self, env_metadata: Mapping[str, Any] | None, **weights: float):
        super().__init__(env_metadata)
        self.weights = {k: float(weights.get(k, 0.0)) for k in TERMS}
        self.scales: list[SiteScale] = []
        self.chargers: list[list[ChargerSpec]] = []
        self.last_terms: list[dict[str, float]] = []

    def configure(self, scales: list[SiteScale], chargers: list[list[ChargerSpec]]) -> None:
        self.scales = scales
        self.chargers = chargers

    def get_required_observation_names(self) -> list[str] | None:
        if not self.scales:
            return None
        names = {"net_electricity_consumption", "carbon_intensity", "electricity_pricing"}
        for building in self.chargers:
            for c in building:
                names.update(_ev_keys(c.name).values())
        return sorted(names)

    def calculate(self, observations: list[Mapping[str, float]]) -> list[float]:
        rewards, self.last_terms = [], []
        for i, obs in enumerate(observations):
            shortfalls = []
            for charger in self.chargers[i] if i < len(self.chargers) else ():
                keys = _ev_keys(charger.name)
                if obs.get(keys["connected"], 0) != 1:
                    continue
                shortfalls.append(ev_shortfall(
                    obs[keys["soc"]], obs[keys["required"]], obs[keys["departure"]],
                    obs[keys["capacity"]], charger.max_power_kw, charger.efficiency,
                ))
            terms = reward_terms(
                obs["net_electricity_consumption"], obs.get("carbon_intensity", 0.0),
                obs.get("electricity_pricing", 0.0), shortfalls, self.scales[i],
            )
            self.last_terms.append(terms)
            rewards.append(weighted_reward(terms, self.weights))
        return [sum(rewards)] if self.central_agent else rewards


def _ev_keys(charger: str) -> dict[str, str]:
    at = f"connected_electric_vehicle_at_charger_{charger}"
    return {
        "connected": f"electric_vehicle_charger_{charger}_connected_state",
        "soc": f"{at}_soc",
        "required": f"{at}_required_soc_departure",
        "departure": f"{at}_departure_time",
        "capacity": f"{at}_battery_capacity",
    }
