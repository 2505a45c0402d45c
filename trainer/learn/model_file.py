"""Loading an SB3 ``model.zip`` without running anything it holds, whoever wrote it.

SB3 saves a model as a zip of a JSON ``data`` entry and torch ``.pth`` files. Loaded the usual way,
both can run code: every non-JSON value in ``data`` (the policy class, the spaces, the schedules,
buffers of the last observations) is a cloudpickle, and SB3 reads the ``.pth`` files with
``torch.load(weights_only=False)``. A run folder unpacked from a colleague's tarball is owned by
whoever unpacked it, so ownership says nothing about where a file came from.

Here every pickled value is replaced by the product's own object before SB3 sees it (SB3's
``custom_objects``), entries the product never writes are refused, and torch reads the weights with
``weights_only`` (tensors, numbers and containers only). Nothing in the file is ever unpickled.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.base.files import DamagedFile
from trainer.config.roster import agent_spec

if TYPE_CHECKING:
    import gymnasium
    from stable_baselines3.common.base_class import BaseAlgorithm

    from trainer.config.sections import Config

# What SB3 2.3 writes into ``data`` for the product's SAC, PPO and A2C (another agent's roster row adds its own
# ``saved_keys``). A key outside the list would be set on the model as it is: refused, the product never writes one.
SAVED_KEYS = frozenset({
    "policy_class", "verbose", "policy_kwargs", "num_timesteps", "_total_timesteps", "_num_timesteps_at_start",
    "seed", "action_noise", "start_time", "learning_rate", "tensorboard_log", "_last_obs", "_last_episode_starts",
    "_last_original_obs", "_episode_num", "use_sde", "sde_sample_freq", "_current_progress_remaining",
    "_stats_window_size", "ep_info_buffer", "ep_success_buffer", "_n_updates", "observation_space", "action_space",
    "n_envs", "lr_schedule",
    # SAC
    "buffer_size", "batch_size", "learning_starts", "tau", "gamma", "gradient_steps", "optimize_memory_usage",
    "replay_buffer_class", "replay_buffer_kwargs", "train_freq", "use_sde_at_warmup", "target_entropy",
    "ent_coef", "target_update_interval", "batch_norm_stats", "batch_norm_stats_target",
    # PPO and A2C
    "n_steps", "gae_lambda", "vf_coef", "max_grad_norm", "rollout_buffer_class", "rollout_buffer_kwargs",
    "n_epochs", "clip_range", "clip_range_vf", "normalize_advantage", "target_kl",
})
# Values SB3 rebuilds or resets on load when they are None (the schedules from the learning rate, the
# buffers' classes, the last observations: SB3 resets the environment before training again).
RESET_ON_LOAD = ("lr_schedule", "_last_obs", "_last_episode_starts", "_last_original_obs", "ep_info_buffer",
                 "ep_success_buffer", "replay_buffer_class", "rollout_buffer_class", "action_noise")
_MAX_DATA_BYTES = 16 * 2**20  # the product's data entry is ~10 kB; a larger one is not the product's


def load_model(cfg: Config, name: str, path: Path, device: str = "cpu", env: gymnasium.Env | None = None,
               fix: str = "") -> BaseAlgorithm:
    """The model at ``path`` for agent ``name`` (trained with ``cfg``), its pickled values the product's own.

    With ``env`` (resuming) the model is bound to it and its spaces are the environment's; without one
    (evaluating) they are the product's observation and action boxes of the sizes the file records.
    Raises :class:`DamagedFile` naming the file when it is not a model this product wrote for this site, and
    ``fix`` (or a default: delete it and train again).
    """
    from trainer.learn.agents import algorithm  # lazy: agents builds SB3 models (torch)

    fix = fix or _FIX
    data = _read_data(path, fix, SAVED_KEYS | agent_spec(name).saved_keys)
    spaces = _spaces(path, data, env, fix)
    replacements = {**_product_values(cfg, name, device), **spaces}
    custom = {key: replacements.get(key) for key, value in data.items() if _pickled(value)}
    try:
        with _weights_only():
            return algorithm(name).load(str(path), env=env, device=device, custom_objects=custom)
    except pickle.UnpicklingError:  # torch's weights-only reader met a pickled object
        raise DamagedFile(f"{path} holds objects other than tensors; it was not loaded: {fix}") from None
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, AssertionError, zipfile.BadZipFile) as exc:
        detail = str(exc).splitlines()[0][:200] if str(exc) else "no detail"
        raise DamagedFile(f"{path} could not be loaded as a {name} model of this site ({type(exc).__name__}: "
                          f"{detail}); {fix}") from None


_FIX = "delete it (or its checkpoint folder) and train again, or resume from an earlier checkpoint"


def _read_data(path: Path, fix: str, saved_keys: frozenset[str]) -> dict[str, Any]:
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo("data")
            if info.file_size > _MAX_DATA_BYTES:
                raise ValueError(f"its data entry is {info.file_size:,} bytes")
            data = json.loads(archive.read(info).decode("utf-8"))
    except FileNotFoundError:
        raise DamagedFile(f"{path} is missing; {fix}") from None
    except (OSError, KeyError, ValueError, UnicodeDecodeError, zipfile.BadZipFile) as exc:
        raise DamagedFile(f"{path} is not an SB3 model.zip ({type(exc).__name__}: {str(exc)[:160]}); {fix}") from None
    if not isinstance(data, dict):
        raise DamagedFile(f"{path}: its data entry is a JSON {type(data).__name__}, not an object; {fix}")
    unknown = sorted(set(data) - saved_keys)
    if unknown:
        raise DamagedFile(f"{path} holds entries this product never writes ({', '.join(unknown[:5])}); it was not "
                          f"loaded: {fix}")
    return data


def _pickled(value: Any) -> bool:
    return isinstance(value, dict) and ":serialized:" in value


def _product_values(cfg: Config, name: str, device: str) -> dict[str, Any]:
    """The values the product gave the model's constructor (the policy class, its arguments, the schedules'
    constants), read from an unbuilt model of the same config: SB3 turns them into schedules on load."""
    from trainer.learn.agents import algorithm  # lazy: agents builds SB3 models (torch)
    from trainer.learn.fast_sac import fast_optimizer_kwargs

    params = cfg.agent(name).sb3_kwargs()
    params["policy_kwargs"]["optimizer_kwargs"] = fast_optimizer_kwargs(device)
    template = algorithm(name)("MlpPolicy", None, device=device, _init_setup_model=False, **params)
    values = {key: getattr(template, key) for key in ("policy_class", "policy_kwargs", "clip_range", "clip_range_vf",
                                                      "train_freq", "learning_rate") if hasattr(template, key)}
    return {**values, **dict.fromkeys(RESET_ON_LOAD)}


def _spaces(path: Path, data: dict[str, Any], env: gymnasium.Env | None, fix: str) -> dict[str, Any]:
    if env is not None:
        return {"observation_space": env.observation_space, "action_space": env.action_space}
    import gymnasium  # lazy: gymnasium, only to make boxes without an environment
    import numpy as np

    # The product's agents see observations min-max normalised into [0, 1] and act in [-1, 1]
    # (trainer.env.citylearn); SB3's MLP policy reads only the boxes' shapes.
    obs, act = (_shape(path, data, key, fix) for key in ("observation_space", "action_space"))
    return {"observation_space": gymnasium.spaces.Box(0.0, 1.0, obs, dtype=np.float32),
            "action_space": gymnasium.spaces.Box(-1.0, 1.0, act, dtype=np.float32)}


def _shape(path: Path, data: dict[str, Any], key: str, fix: str) -> tuple[int, ...]:
    shape = data.get(key, {}).get("_shape") if isinstance(data.get(key), dict) else None
    if not (isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) and 0 < shape[0] < 100_000):
        raise DamagedFile(f"{path}: its {key} is not a box of one dimension (found {str(shape)[:60]}); {fix}")
    return (shape[0],)


@contextlib.contextmanager
def _weights_only():
    """torch reads every ``.pth`` with ``weights_only`` however SB3 calls it (torch's documented switch)."""
    previous = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = previous
