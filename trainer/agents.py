"""stable-baselines3 agents built from their config sections (one function per fact)."""

from __future__ import annotations

from typing import Any

from trainer.config import A2cConfig, AgentConfig, Config, PpoConfig, SacConfig


def algorithm(name: str):
    from stable_baselines3 import A2C, PPO, SAC

    return {"sac": SAC, "ppo": PPO, "a2c": A2C}[name]


def hyperparameters(section: AgentConfig) -> dict[str, Any]:
    """The SB3 constructor arguments of one agent section."""
    common = {"learning_rate": section.learning_rate, "gamma": section.gamma, "ent_coef": section.ent_coef,
              "policy_kwargs": {"net_arch": list(section.net_arch)}}
    if isinstance(section, SacConfig):
        return {**common, "batch_size": section.batch_size, "buffer_size": section.buffer_size,
                "gradient_steps": section.gradient_steps, "train_freq": section.train_freq,
                "learning_starts": section.learning_starts, "tau": section.tau}
    if isinstance(section, PpoConfig):
        return {**common, "batch_size": section.batch_size, "n_steps": section.n_steps, "n_epochs": section.n_epochs,
                "gae_lambda": section.gae_lambda, "clip_range": section.clip_range, "vf_coef": section.vf_coef,
                "max_grad_norm": section.max_grad_norm}
    if isinstance(section, A2cConfig):
        return {**common, "n_steps": section.n_steps, "gae_lambda": section.gae_lambda, "vf_coef": section.vf_coef,
                "max_grad_norm": section.max_grad_norm}
    raise TypeError(f"unknown agent section {type(section).__name__}")


def fit_rollout(params: dict[str, Any], timesteps: int, n_envs: int = 1) -> dict[str, Any]:
    """Shrink an on-policy rollout longer than the whole run, so the run ends near its target.

    SB3 always completes a rollout: PPO with n_steps=2048 asked for 600 steps would do 2,048.
    """
    if "n_steps" not in params or params["n_steps"] * n_envs <= timesteps:
        return params
    fitted = dict(params, n_steps=max(timesteps // n_envs, 1))
    if "batch_size" in fitted:
        fitted["batch_size"] = min(fitted["batch_size"], fitted["n_steps"] * n_envs)
    return fitted


def build_model(cfg: Config, name: str, env, device: str, seed: int, timesteps: int):
    params = fit_rollout(hyperparameters(cfg.agent(name)), timesteps, getattr(env, "num_envs", 1))
    return algorithm(name)("MlpPolicy", env, seed=seed, device=device, verbose=0, **params)


def load_model(name: str, path, device: str = "cpu"):
    return algorithm(name).load(str(path), device=device)
