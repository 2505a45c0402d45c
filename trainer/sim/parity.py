"""CityLearn and the training simulator driven with the same actions, compared at every step.

The policies cover what training and evaluation do to a site: ``random`` (uniform over every action's
range), ``extreme`` (hours of full charge, then of full discharge, then idle: every limit and curve end),
``rbc`` (the product's rule-based controller) and ``optimum`` (the perfect-foresight dispatch replayed).
Each acts on CityLearn, its native actions pass through the EV guard where the config has it on, and the
same native actions step both. Every raw observation and each building's net consumption is compared;
the first step where any differs by more than the tolerance is reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer.config.sections import Config
from trainer.env.citylearn import ActionScale, make_citylearn_env
from trainer.env.ev_guard import EvServiceGuard
from trainer.references.optimum_model import arrival_soc, site_model
from trainer.sim.simulators import VECTOR, Simulator, SiteModel
from trainer.site import Site

# kWh and state-of-charge fractions: CityLearn keeps both in float32 and sums a building's devices in an
# order of its own, so a year of steps differs by a few 1e-6 (7.6e-6 on the built-in site).
TOLERANCE = 1e-4
EXTREME_BLOCK_STEPS = 6


@dataclass(frozen=True)
class Mismatch:
    step: int
    what: str
    citylearn: float
    simulator: float
    why: str = ""  # what is known to cause it, where it is

    def __str__(self) -> str:
        return (f"step {self.step}: {self.what} is {self.citylearn:.6g} in CityLearn, {self.simulator:.6g} in the "
                f"simulator (differs by {abs(self.citylearn - self.simulator):.3g})" + (f": {self.why}" if self.why
                                                                                         else ""))


UNPLUGGED_DRIFT = ("the car arrived without a state of charge the charger file gives, so CityLearn keeps its own "
                   "charge after a random drift while it was away, which the simulator does not draw alike")


def _known_cause(env: Any, name: str, t: int) -> str:
    """Why a car's state of charge differs at ``t``, where it arrived then without one CityLearn forces."""
    marker = "connected_electric_vehicle_at_charger_"
    if marker not in name or not name.endswith("_soc"):
        return ""
    charger_id = name.split(marker, 1)[1][:-len("_soc")]
    for building in env.buildings:
        for charger in building.electric_vehicle_chargers or []:
            sim = charger.charger_simulation
            if charger.charger_id != charger_id:
                continue
            plugged = t  # the step the car now connected plugged in
            while plugged > 0 and sim.electric_vehicle_charger_state[plugged - 1] == 1:
                plugged -= 1
            return UNPLUGGED_DRIFT if plugged > 0 and arrival_soc(sim, plugged) is None else ""
    return ""


@dataclass
class ParityResult:
    policy: str
    steps: int = 0
    max_observation_diff: float = 0.0
    max_net_diff: float = 0.0
    first_mismatch: Mismatch | None = None
    worst_column: str = ""

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None

    def line(self) -> str:
        verdict = "matches" if self.ok else f"differs from {self.first_mismatch}"
        return (f"{self.policy:<8} {self.steps:>6} steps  max diff: observations {self.max_observation_diff:.2g}"
                f" ({self.worst_column or '-'}), net {self.max_net_diff:.2g} kWh  {verdict}")


Policy = Callable[[Any, np.ndarray, ActionScale], np.ndarray]  # (CityLearn env, raw observation, scale) -> native


def _random(seed: int, cfg: Config) -> Policy:
    rng = np.random.default_rng(seed)
    return lambda env, obs, scale: rng.uniform(scale.low, scale.high)


def _extreme(seed: int, cfg: Config) -> Policy:
    def act(env: Any, obs: np.ndarray, scale: ActionScale) -> np.ndarray:
        phase = (env.time_step // EXTREME_BLOCK_STEPS) % 3
        return [scale.high, scale.low, np.zeros_like(scale.low)][phase].copy()

    return act


def _controller(make: Callable[[Any, Config], Any], cfg: Config) -> Policy:
    """A product controller (acting in [-1, 1] on the CityLearn env, made at its first step) as native actions."""
    made: list[Any] = []

    def act(env: Any, obs: np.ndarray, scale: ActionScale) -> np.ndarray:
        if not made:
            made.append(make(env, cfg))
        return scale.to_native(made[0].act(obs, env))

    return act


def _rbc(env: Any, cfg: Config) -> Any:
    from trainer.references.controllers import RuleBasedController  # lazy: imports CityLearn's agents

    return RuleBasedController()


def _optimum(env: Any, cfg: Config) -> Any:
    from trainer.references.optimum import OptimumReplay, solve  # lazy: scipy's HiGHS

    return OptimumReplay(solve(site_model(env, cfg.ev.margin_soc)))


POLICIES: dict[str, Callable[[int, Config], Policy]] = {
    "random": _random,
    "extreme": _extreme,
    "rbc": lambda seed, cfg: _controller(_rbc, cfg),
    "optimum": lambda seed, cfg: _controller(_optimum, cfg),
}


@dataclass
class ParityCheck:
    """One CityLearn environment of the whole period and a simulator's model of the site read from it (any row of
    trainer.sim.simulators.SIMULATORS with physics; the training simulator by default)."""

    cfg: Config
    site: Site
    simulator: Simulator = VECTOR
    model: SiteModel = field(init=False)
    env: Any = field(init=False)

    def __post_init__(self) -> None:
        if self.simulator.physics is None:
            raise ValueError(f"{self.simulator.name} is the reference the parity harness compares with")
        self.env = make_citylearn_env(self.cfg, self.site, "eval", self.cfg.seed)
        self.model = self.simulator.physics(self.env)
        self.names = _column_names(self.env)

    def run(self, policy: str, steps: int | None = None, tolerance: float = TOLERANCE) -> ParityResult:
        env, model = self.env, self.model
        act = POLICIES[policy](self.cfg.seed, self.cfg)
        scale = ActionScale.of(env)
        guard = EvServiceGuard.of(self.cfg.ev)
        sim = model.copies(1)
        sim.reset(np.ones(1, dtype=bool), np.zeros(1, dtype=int))
        observations, _ = env.reset()
        result = ParityResult(policy)
        limit = model.steps - 1 if steps is None else min(steps, model.steps - 1)
        for t in range(limit + 1):
            raw = np.asarray(observations[0], dtype=float)
            simulated = sim.observe()[0]
            diff = np.abs(raw - simulated)
            column = int(diff.argmax())
            if diff[column] > result.max_observation_diff:
                result.max_observation_diff, result.worst_column = float(diff[column]), self.names[column]
            if diff[column] > tolerance and result.first_mismatch is None:
                result.first_mismatch = Mismatch(t, f"observation {self.names[column]}", raw[column],
                                                 float(simulated[column]), _known_cause(env, self.names[column], t))
            if t == limit or result.first_mismatch is not None:
                break
            native = np.asarray(act(env, raw, scale), dtype=float)
            if guard is not None:
                native = guard.apply(env, native)
            observations, _, _, _, _ = env.step([native])
            net = sim.step(native[None, :])[0]
            actual = np.asarray([b.net_electricity_consumption[t] for b in env.buildings], dtype=float)
            gaps = np.abs(actual - net)
            result.max_net_diff = max(result.max_net_diff, float(gaps.max()))
            if gaps.max() > tolerance:
                b = int(gaps.argmax())
                result.first_mismatch = Mismatch(t, f"net consumption of {env.buildings[b].name} (kWh)",
                                                 float(actual[b]), float(net[b]))
                break
            result.steps = t + 1
        return result


def _column_names(env: Any) -> list[str]:
    """Each raw observation's name, with its building where several buildings have one of that name."""
    shared, seen, names = set(env.shared_observations), set(), []
    for b, building in enumerate(env.buildings):
        for key in building.observations(normalize=False, periodic_normalization=False):
            if b > 0 and key in shared and key in seen:
                continue
            seen.add(key)
            names.append(key if key in shared or len(env.buildings) == 1 else f"{building.name}.{key}")
    return names



def verdict(results: list[ParityResult], where: str) -> str:
    """The last line of ``trainer sim check``."""
    if all(r.ok for r in results):
        return (f"the training simulator matches CityLearn on {where}: every observation and net consumption within "
                f"{TOLERANCE:g} at every step")
    return (f"the training simulator differs from CityLearn on {where}: train with --set train.simulator=citylearn "
            "and report the first differing step above")
