"""The one place that chooses what agents train on: the training simulator or CityLearn itself (train.simulator)."""

from __future__ import annotations

from typing import Any

from trainer import logs
from trainer.config import Config
from trainer.env import make_citylearn_env, make_training_vec_env
from trainer.errors import UsageError
from trainer.sim.site import unsupported_reason
from trainer.site import Site

VECTOR, CITYLEARN = "vector", "citylearn"

def unmodelled(cfg: Config, site: Site) -> str | None:
    """Why the training simulator does not model this dataset, or None; asked of CityLearn once a site."""
    def ask() -> str | None:
        env = make_citylearn_env(cfg, site, "eval", cfg.seed)
        try:
            return unsupported_reason(env)
        finally:
            env.close()

    return site.remember("unmodelled by the training simulator", ask)


def simulator_used(cfg: Config, site: Site) -> str:
    """VECTOR or CITYLEARN: what train.simulator gives on this dataset (a UsageError where vector cannot be had)."""
    choice = cfg.train.simulator
    if choice == CITYLEARN:
        return CITYLEARN
    reason = unmodelled(cfg, site)
    if reason is None:
        return VECTOR
    if choice == VECTOR:
        raise UsageError(f"train.simulator is vector, but the training simulator does not model this dataset: "
                         f"{reason}; set train.simulator: auto (CityLearn where it must) or citylearn")
    logs.get().info("training on CityLearn: the training simulator does not model this dataset", reason=reason)
    return CITYLEARN


def training_vec_env(cfg: Config, site: Site, n_envs: int, subprocesses: bool,
                     simulator: str | None = None) -> tuple[Any, str]:
    """(the VecEnv of ``n_envs`` training environments, VECTOR or CITYLEARN); ``simulator`` if already chosen."""
    simulator = simulator or simulator_used(cfg, site)
    if simulator == VECTOR:
        from trainer.sim.vec_env import SimVecEnv  # lazy: reading the site steps CityLearn through its period

        return SimVecEnv(cfg, site, n_envs, cfg.seed, episode_steps=cfg.scenario.train_episode_days * 24), VECTOR
    return make_training_vec_env(cfg, site, cfg.seed, n_envs, subprocesses), CITYLEARN
