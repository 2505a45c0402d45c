"""The optimum's dispatch replayed as demonstrations: over the dataset's period and, where the site draws
other years, over those too; computed once per process for a dataset and config."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config.sections import Config
from trainer.env.citylearn import make_sb3_env
from trainer.references.optimum import OptimumReplay
from trainer.references.optimum_model import OptimumUnavailable, site_model
from trainer.references.physics import solve_in_physics
from trainer.site import Site
from trainer.site.scenario import DRAW_SEED_OFFSET


@dataclass(frozen=True)
class Demonstrations:
    observations: np.ndarray  # (steps, observation size), float32
    actions: np.ndarray  # (steps, action size) in the agents' [-1, 1] space
    rewards: np.ndarray  # (steps,) the product's reward for each step
    seconds: float
    periods: tuple[int, ...] = ()  # steps of each period, in order (the dataset's, then each draw's); () = one

    @property
    def period_steps(self) -> int:
        """Steps of the dataset's own period (an epoch of imitation draws this many samples)."""
        return self.periods[0] if self.periods else len(self.actions)

    def returns(self, gamma: float) -> np.ndarray:
        """Discounted return from each step to its period's end (what a critic of this policy should say)."""
        out = np.empty(len(self.rewards), dtype=np.float64)
        ends = set(np.cumsum(self.periods).tolist()) if self.periods else set()
        running = 0.0
        for t in range(len(self.rewards) - 1, -1, -1):
            if t + 1 in ends:
                running = 0.0
            running = self.rewards[t] + gamma * running
            out[t] = running
        return out.astype(np.float32)

    @classmethod
    def joined(cls, parts: list[Demonstrations]) -> Demonstrations:
        return cls(np.concatenate([p.observations for p in parts]), np.concatenate([p.actions for p in parts]),
                   np.concatenate([p.rewards for p in parts]), sum(p.seconds for p in parts),
                   tuple(len(p.actions) for p in parts))


_CACHE: dict[tuple[Any, ...], Demonstrations] = {}


_UNAVAILABLE: dict[tuple[Any, ...], str] = {}  # why not, for a dataset the optimum does not model


def demonstrations(cfg: Config, site: Site, seed: int) -> Demonstrations:
    """The optimum's dispatch over the dataset's whole period, replayed: what the agent would have seen and done."""
    # A period of the dataset (the imitation's, without its validation part) is other demonstrations, and a part
    # read as another site's is scaled as there.
    scaled_as = site.scaled_as
    key = (str(site.schema), cfg.digest(), seed, site.start, site.end,
           None if scaled_as is None else (str(scaled_as.schema), scaled_as.start, scaled_as.end))
    if key in _CACHE:
        return _CACHE[key]
    if key in _UNAVAILABLE:
        raise OptimumUnavailable(_UNAVAILABLE[key])
    started = time.perf_counter()
    env = make_sb3_env(cfg, site, "eval", seed)
    try:
        env.reset()
        try:
            model = site_model(env.unwrapped, cfg.ev.margin_soc)
            plan = solve_in_physics(model).plan  # the plan that holds in CityLearn's curves, as the reference replays
        except OptimumUnavailable as exc:
            _UNAVAILABLE[key] = str(exc)
            raise
        replay = OptimumReplay(plan, model.sessions)
        obs, _ = env.reset()
        observations, actions, rewards, done = [], [], [], False
        while not done:
            action = replay.act(obs, env.unwrapped)
            observations.append(obs)
            actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            done = terminated or truncated
    finally:
        env.close()
    result = Demonstrations(np.asarray(observations, dtype=np.float32),
                            np.clip(np.asarray(actions, dtype=np.float32), -1.0, 1.0),
                            np.asarray(rewards, dtype=np.float32), time.perf_counter() - started)
    _CACHE[key] = result
    return result


def training_demonstrations(cfg: Config, site: Site, seed: int, draws: Path | None) -> Demonstrations:
    """The dataset's demonstrations and those of ``warm_start.extra_draws`` other years of it (the built-in site's
    climate drawn again, a dataset's own days resampled; built once under ``draws``; None: the dataset's alone).

    One year's demonstrations are a single trajectory: a policy fitted to them drifts off it in closed loop, and how
    far depends on its initialisation (measured: SAC's imitation of one year reached 85.8-91.9 % of the optimum's cut
    over three seeds; with three more years 91.2-93.7 %; docs/agent-quality.md).
    """
    parts = [demonstrations(cfg, year, seed) for year in demonstration_years(cfg, site, draws)]
    return parts[0] if len(parts) == 1 else Demonstrations.joined(parts)


def demonstration_years(cfg: Config, site: Site, draws: Path | None) -> list[Site]:
    """The years the warm start learns from: the dataset and, where its kind draws other years,
    ``warm_start.extra_draws`` of them, built once under ``draws``."""
    years = [site]
    if draws is not None and site.kind.draws:
        years += [site.draw(draws / f"draw-{k + 1}", DRAW_SEED_OFFSET + k) for k in range(cfg.warm_start.extra_draws)]
    return years
