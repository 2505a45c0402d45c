"""The one place that chooses what agents train on: the training simulator or CityLearn itself (train.simulator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer import logs
from trainer.config import Config
from trainer.env import make_citylearn_env, make_training_vec_env
from trainer.errors import UsageError
from trainer.sim.site import unsupported_reason

VECTOR, CITYLEARN = "vector", "citylearn"

# (schema path, mtime, size) -> why the simulator does not model it (None: it does); one dataset a process.
_UNMODELLED: dict[tuple[str, int, int], str | None] = {}


def unmodelled(cfg: Config, schema: Path) -> str | None:
    """Why the training simulator does not model this dataset, or None; asked of CityLearn once a process."""
    stat = schema.stat()
    key = (str(schema.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _UNMODELLED:
        env = make_citylearn_env(cfg, schema, "eval", cfg.seed)
        try:
            _UNMODELLED.clear()
            _UNMODELLED[key] = unsupported_reason(env)
        finally:
            env.close()
    return _UNMODELLED[key]


def simulator_used(cfg: Config, schema: Path) -> str:
    """VECTOR or CITYLEARN: what train.simulator gives on this dataset (a UsageError where vector cannot be had)."""
    choice = cfg.train.simulator
    if choice == CITYLEARN:
        return CITYLEARN
    reason = unmodelled(cfg, schema)
    if reason is None:
        return VECTOR
    if choice == VECTOR:
        raise UsageError(f"train.simulator is vector, but the training simulator does not model this dataset: "
                         f"{reason}; set train.simulator: auto (CityLearn where it must) or citylearn")
    logs.get().info("training on CityLearn: the training simulator does not model this dataset", reason=reason)
    return CITYLEARN


def training_vec_env(cfg: Config, schema: Path, n_envs: int, subprocesses: bool,
                     simulator: str | None = None) -> tuple[Any, str]:
    """(the VecEnv of ``n_envs`` training environments, VECTOR or CITYLEARN); ``simulator`` if already chosen."""
    simulator = simulator or simulator_used(cfg, schema)
    if simulator == VECTOR:
        from trainer.sim.vec_env import SimVecEnv  # lazy: reading the site steps CityLearn through its period

        return SimVecEnv(cfg, schema, n_envs, cfg.seed, episode_steps=cfg.scenario.train_episode_days * 24), VECTOR
    return make_training_vec_env(cfg, schema, cfg.seed, n_envs, subprocesses), CITYLEARN
