"""The one place that chooses what agents train on: the training simulator or CityLearn itself (train.simulator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer import logs
from trainer.config import Config
from trainer.env import make_training_vec_env
from trainer.errors import UsageError
from trainer.sim.site import Unsupported


def training_vec_env(cfg: Config, schema: Path, n_envs: int, subprocesses: bool) -> tuple[Any, str]:
    """(the VecEnv of ``n_envs`` training environments, "vector" or "citylearn")."""
    choice = cfg.train.simulator
    if choice != "citylearn":
        from trainer.sim.vec_env import SimVecEnv  # lazy: reading the site steps CityLearn through its period

        try:
            env = SimVecEnv(cfg, schema, n_envs, cfg.seed, episode_steps=cfg.scenario.train_episode_days * 24)
            return env, "vector"
        except Unsupported as exc:
            if choice == "vector":
                raise UsageError(f"train.simulator is vector, but the training simulator does not model this dataset: "
                                 f"{exc}; set train.simulator: auto (CityLearn where it must) or citylearn") from None
            logs.get().info("training on CityLearn: the training simulator does not model this dataset",
                            reason=str(exc))
    return make_training_vec_env(cfg, schema, cfg.seed, n_envs, subprocesses), "citylearn"
