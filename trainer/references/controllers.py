"""The two reference controllers every agent is measured against.

- ``baseline``: uncontrolled. The battery idles; each EV charges at full power from
  arrival until it is full or leaves.
- ``rbc``: a sensible rule-based controller. PV surplus goes first to EVs, then to the
  battery; the battery discharges to cover the load in high-carbon or high-price hours;
  an EV is charged at full power once its slack runs out (least-laxity first, with the energy
  CityLearn really stores: trainer.env.ev_guard), so every feasible departure target is met, and
  otherwise only from PV or in clean, cheap hours. Its battery action is a fraction of the
  battery's nominal power, which is how CityLearn 3.0.2 scales it.

Both act on the raw CityLearn state. Every controller returns the central agent's flat action
vector in the agents' [-1, 1] space (trainer.env.citylearn.ActionScale); the references think in
CityLearn's own units and convert.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trainer.env.citylearn import ActionScale, action_slices
from trainer.env.ev_guard import Session, connected_sessions

if TYPE_CHECKING:
    from citylearn.citylearn import CityLearnEnv

# An EV whose slack (hours left minus hours needed at full power) falls below this is
# charged at full power: 1.5 h covers the rounding of hourly steps.
LAXITY_MARGIN_H = 1.5
HIGH_CARBON_QUANTILE = 0.75
LOW_CARBON_QUANTILE = 0.40


class Controller(Protocol):
    """What evaluates over an episode. One that sets ``guarded = False`` runs without the EV guard (the
    uncontrolled baseline: trainer.env.citylearn.guard_for); every other controller's EV actions are guarded."""

    name: str

    def act(self, obs: np.ndarray, env: CityLearnEnv) -> np.ndarray:
        """The action for the current step in the agents' [-1, 1] space; ``env`` is the unwrapped CityLearnEnv."""


class UncontrolledBaseline:
    name = "baseline"
    # A site without control: its cars charge at full power until full (trainer.env.citylearn.guard_for).
    guarded = False

    def act(self, obs: np.ndarray, env: CityLearnEnv) -> np.ndarray:
        actions = []
        for _, names in action_slices(env):
            actions.extend(1.0 if n.startswith("electric_vehicle_storage") else 0.0 for n in names)
        return ActionScale.of(env).to_agent(actions)


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

    def act(self, obs: np.ndarray, env: CityLearnEnv) -> np.ndarray:
        t = env.time_step
        actions: list[float] = []
        sessions = connected_sessions(env)
        for i, ((_, names), b) in enumerate(zip(action_slices(env), env.buildings)):
            high_carbon, low_carbon, median_price = self._limits(i, b)
            sim = b.energy_simulation
            carbon = float(b.carbon_intensity.carbon_intensity[t])
            price = float(b.pricing.electricity_pricing[t])
            load = float(sim.non_shiftable_load[t])
            pv = float(b.pv.get_generation(sim.solar_generation[t])) if b.pv is not None else 0.0
            surplus = max(pv - load, 0.0)
            clean_and_cheap = carbon <= low_carbon and price <= median_price

            ev_actions: dict[str, float] = {}
            ev_load = 0.0
            for charger, session in zip(b.electric_vehicle_chargers or [], sessions[i]):
                name = f"electric_vehicle_storage_{charger.charger_id}"
                if session is None:
                    ev_actions[name] = 0.0
                    continue
                power = float(charger.max_charging_power)
                if _slack_hours(session) < LAXITY_MARGIN_H:
                    action = 1.0
                elif surplus > 0:
                    action = min(1.0, surplus / power)
                elif clean_and_cheap and session.energy_init < session.path.capacity_kwh:
                    action = 1.0
                else:
                    action = 0.0
                ev_actions[name] = action
                ev_load += action * power
                surplus = max(surplus - action * power, 0.0)

            battery = b.electrical_storage
            battery_action = 0.0
            nominal = float(getattr(battery, "nominal_power", 0.0) or 0.0)
            if float(battery.capacity or 0.0) > 0 and nominal > 0:
                # CityLearn 3.0.2 turns the action into energy by the battery's nominal power.
                if surplus > 0:
                    battery_action = min(surplus / nominal, 1.0)
                elif carbon >= high_carbon or price > median_price:
                    battery_action = -min(max(load + ev_load - pv, 0.0) / nominal, 1.0)
            for name in names:
                actions.append(
                    ev_actions.get(name, 0.0)
                    if name in ev_actions
                    else battery_action
                    if name == "electrical_storage"
                    else 0.0
                )
        return ActionScale.of(env).to_agent(actions)


def _slack_hours(session: Session) -> float:
    """Hours the car can wait and still be served at full power (its laxity), with real stored energy."""
    path = session.path
    per_step = path.stored_after(session.energy_init, 1.0) - session.energy_init
    needed = max(session.required_kwh - session.energy_init, 0.0)
    if needed <= 0:
        return math.inf
    return ((session.steps_left + 1) - needed / max(per_step, 1e-9)) * path.hours


# ``predict`` switches the policy to evaluation mode on every call, which walks every module, and checks and converts
# its input each time. Judging runs a policy on every step of a year, so the switch is made once and each call is the
# network's forward pass: 0.12 ms a call of PPO's policy on one observation where ``predict`` took 0.19 (2-core AMD
# EPYC VM, 2026-12-02); SAC's (FastSAC skips the switch already) 0.17-0.19 either way; the ensemble's ten members
# were already called so, and now switch once, not every step.


class Actor:
    """``policy``'s (an SB3 policy's) deterministic action for one observation or a batch of them, equal to
    ``policy.predict(observations, deterministic=True)[0]``: the agents' action box is [-1, 1] (the environment
    scales their actions), where ``predict``'s clip (PPO, A2C) is a clamp and its rescaling of a squashed action
    (SAC) the identity, to a float rounding. Another box goes through ``predict`` itself. Puts the policy in
    evaluation mode, as ``predict`` leaves it."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        space = policy.action_space
        self.direct = bool(np.all(space.low == -1.0) and np.all(space.high == 1.0))
        policy.set_training_mode(False)

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        if not self.direct:
            return self.policy.predict(observations, deterministic=True)[0]
        import torch  # lazy: torch takes seconds to import; an Actor is made after a policy is loaded

        single = np.ndim(observations) == len(self.policy.observation_space.shape)
        with torch.no_grad():
            obs = torch.as_tensor(np.asarray(observations), dtype=torch.float32, device=self.policy.device)
            actions = self.policy._predict(obs.unsqueeze(0) if single else obs, deterministic=True)
            actions = actions.clamp(-1.0, 1.0).cpu().numpy().reshape((-1, *self.policy.action_space.shape))
        return actions[0] if single else actions


class PolicyController:
    """A trained SB3 model, acting deterministically."""

    def __init__(self, name: str, model) -> None:
        self.name = name
        self.model = model
        self.actor = Actor(model.policy)  # predict's action without its cost per call

    def act(self, obs: np.ndarray, env: CityLearnEnv) -> np.ndarray:
        return self.actor(obs)

