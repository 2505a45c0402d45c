"""stable-baselines3 agents built from their config sections and their roster rows (one function per fact)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.base import logs
from trainer.config.agents import OffPolicyConfig, OnPolicyConfig
from trainer.config.roster import agent_spec
from trainer.config.sections import Config
from trainer.run import device
from trainer.sim.simulators import Simulator

if TYPE_CHECKING:
    import gymnasium
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.vec_env import VecEnv

ENVS_PER_CORE = 4
MAX_AUTO_ENVS = 32  # each worker holds its own copy of the site (30-100 MB of its own)


def algorithm(name: str):
    """The class that trains ``name`` (its roster row's: SB3's PPO and A2C, FastSAC, ...)."""
    return agent_spec(name).algorithm_class()


def training_envs(cfg: Config, agent: str, simulator: Simulator, cores: int | None = None) -> int:
    """Training environments for an agent on ``simulator`` (a row of trainer.sim.simulators.SIMULATORS).

    On an in-process simulator (the training simulator) every site is a row of arrays in this process: PPO and A2C take
    ``train.sites`` (``n_envs: 0``), SAC ``sac.n_envs``. On CityLearn SAC steps one environment, and
    ``n_envs: 0`` takes the largest divisor of ``n_steps`` up to ENVS_PER_CORE workers per core (at
    most MAX_AUTO_ENVS). More workers than cores: each step waits on the slowest worker and on waking
    it, and while the trainer chooses actions and learns the workers are idle; more of them keep the
    cores busy (on 2 cores, PPO and A2C ran 1.7x the plain recipe with 4 environments, 1.7x and 2.2x
    with 8; docs/benchmarks.md). Either way every environment collects the same share of a rollout.
    """
    section = cfg.agent(agent)
    vector = simulator.in_process
    if isinstance(section, OffPolicyConfig):
        return section.n_envs if vector else 1
    if not isinstance(section, OnPolicyConfig):
        return 1
    if section.n_envs:
        return section.n_envs
    wanted = cfg.train.sites if vector else min(ENVS_PER_CORE * (cores or device.cpu_cores()), MAX_AUTO_ENVS)
    return largest_divisor(section.n_steps, wanted)


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` up to ``limit`` (at least 1): environments that share a rollout evenly, or
    minibatches that cover it whole."""
    limit = max(min(limit, n), 1)
    return max(d for d in range(1, limit + 1) if n % d == 0)


def fit_rollout(params: dict[str, Any], timesteps: int, n_envs: int = 1) -> dict[str, Any]:
    """Shrink an on-policy rollout longer than the whole run, so the run ends near its target.

    SB3 always completes a rollout: PPO with n_steps=2048 asked for 600 steps would do 2,048.
    """
    if "n_steps" not in params or params["n_steps"] * n_envs <= timesteps:
        return params
    fitted = dict(params, n_steps=max(timesteps // n_envs, 1))
    if "batch_size" in fitted:  # whole minibatches (SB3 warns of a truncated one): the largest divisor of the rollout
        fitted["batch_size"] = largest_divisor(fitted["n_steps"] * n_envs, fitted["batch_size"])
    return fitted


def build_model(cfg: Config, name: str, env: VecEnv | gymnasium.Env, device: str, seed: int,
                timesteps: int) -> BaseAlgorithm:
    n_envs = getattr(env, "num_envs", 1)
    params = fit_rollout(cfg.agent(name).sb3_kwargs(n_envs), timesteps, n_envs)
    from trainer.learn.fast_sac import fast_optimizer_kwargs  # lazy: SB3 and torch

    # Adam's fused kernel: the same update within rounding; PPO's minibatch of 64 trains 15 % faster on a CPU.
    params["policy_kwargs"]["optimizer_kwargs"] = fast_optimizer_kwargs(device)
    return algorithm(name)("MlpPolicy", env, seed=seed, device=device, verbose=0, **params)


def save_model_atomic(model: BaseAlgorithm, path: Path) -> None:
    """``model.save`` to a temporary name beside ``path``, then renamed: a kill or a full disk leaves the old file
    or none, never half of one. Raises OSError (the temporary file removed)."""
    tmp = path.parent / f".tmp-{path.name}"
    try:
        model.save(str(tmp))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def apply_sizes(model: BaseAlgorithm, batch_size: int | None, n_steps: int | None, learning_rate: float,
                learning_rate_end: float = 1.0, decay_share: float = 1.0) -> None:
    """Set a model's batch, rollout and learning rate (after a back-off, a rollback or a resume).

    With ``learning_rate_end`` < 1 the rate falls linearly to that share of ``learning_rate`` at the
    stage's last step, or over its first ``decay_share`` of its steps and held there after. SB3 measures the
    progress from the steps taken and the stage's target, so a resumed stage goes on at the rate the straight one
    would have had.
    """
    if batch_size is not None and hasattr(model, "batch_size"):
        model.batch_size = batch_size
    if n_steps is not None and getattr(model, "n_steps", None) != n_steps:
        model.n_steps = n_steps
        model.rollout_buffer = model.rollout_buffer_class(
            model.n_steps, model.observation_space, model.action_space, device=model.device,
            gamma=model.gamma, gae_lambda=model.gae_lambda, n_envs=model.n_envs, **model.rollout_buffer_kwargs)
    model.learning_rate = learning_rate
    if learning_rate_end < 1:
        from stable_baselines3.common.utils import get_linear_fn  # lazy: SB3 imports torch

        model.lr_schedule = get_linear_fn(learning_rate, learning_rate * learning_rate_end, decay_share)
    else:
        model._setup_lr_schedule()


def sb3_logger(cfg: Config, folder: Path):
    """SB3's logger for a stage: progress.csv, and TensorBoard where the optional extra is installed."""
    from stable_baselines3.common.logger import configure  # heavy: SB3 imports torch

    formats = ["csv"]
    if cfg.output.tensorboard and tensorboard_installed():
        formats.append("tensorboard")
    elif cfg.output.tensorboard is True:  # asked for by name: say why there are none
        logs.get().warning("TensorBoard curves are off: the tensorboard package is not installed",
                           fix=TENSORBOARD_FIX)
    logger = configure(str(folder), formats)
    for output in logger.output_formats:  # a full disk costs a progress row, not the stage
        output.write = _never_raises(output.write, folder)
    return logger


def _never_raises(write: Any, folder: Path) -> Any:
    def safe_write(*args: Any, **kwargs: Any) -> None:
        try:
            write(*args, **kwargs)
        except OSError as exc:
            logs.get().warning("training curve not written", folder=str(folder), error=exc.strerror,
                               hint="free disk space; training goes on")

    return safe_write


# The package is not on an index: the extra installs from the checkout only, so name the package itself.
TENSORBOARD_FIX = ("install it into the trainer's environment: .venv/bin/pip install 'tensorboard>=2.14' "
                   "(or set output.tensorboard: auto)")


def tensorboard_installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None
