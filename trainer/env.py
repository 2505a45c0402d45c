"""CityLearn environments for training and evaluation.

One factory (:func:`make_citylearn_env`) builds every environment the product uses,
with the central agent, the multi-objective reward, and the episode split of its
purpose; :func:`make_sb3_env` adds the wrappers stable-baselines3 needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gymnasium
import numpy as np

from trainer.config import Config
from trainer.errors import DatasetError
from trainer.reward import ChargerSpec, MultiObjectiveReward, SiteScale

LOCAL_DATASETS_ENV = "CITYLEARN_LOCAL_DATASETS_PATH"
Purpose = Literal["train", "eval"]

# CityLearn reads these at import time; the product never downloads at run time.
os.environ.setdefault("CITYLEARN_OFFLINE", "1")


@dataclass(frozen=True)
class DatasetSource:
    """Where a run's dataset comes from: the built-in site, a schema path or a dataset name."""

    schema: Path
    label: str
    builtin: bool


def resolve_dataset(schema: str | None, dataset: str | None) -> DatasetSource | None:
    """Check ``--schema``/``--dataset`` before anything runs; None means the built-in site."""
    if schema and dataset:
        raise DatasetError("pass either --schema or --dataset, not both")
    if schema:
        path = Path(schema).expanduser()
        if path.is_dir():
            path = path / "schema.json"
        if not path.is_file():
            raise DatasetError(f"CityLearn schema not found: {path} (pass the path of a dataset's schema.json)")
        return DatasetSource(path.resolve(), path.parent.name, builtin=False)
    if dataset:
        root = os.environ.get(LOCAL_DATASETS_ENV)
        candidates = [Path(root) / dataset / "schema.json"] if root else []
        for candidate in candidates:
            if candidate.is_file():
                return DatasetSource(candidate.resolve(), dataset, builtin=False)
        where = f"{LOCAL_DATASETS_ENV}={root}" if root else f"{LOCAL_DATASETS_ENV} is not set"
        raise DatasetError(
            f"CityLearn dataset '{dataset}' is not available offline ({where}): set {LOCAL_DATASETS_ENV} "
            f"to a folder holding {dataset}/schema.json, or pass --schema PATH"
        )
    return None


def _episode_kwargs(cfg: Config, purpose: Purpose, n_steps: int, eval_days: int | None) -> dict:
    if purpose == "train":
        length = min(cfg.scenario.train_episode_days * 24, n_steps)
        # Random windows of the year, so training sees every season without year-long episodes.
        return {"episode_time_steps": length, "random_episode_split": length < n_steps, "rolling_episode_split": False}
    end = n_steps - 1 if eval_days is None else min(n_steps, eval_days * 24) - 1
    return {"simulation_start_time_step": 0, "simulation_end_time_step": end,
            "episode_time_steps": None, "random_episode_split": False, "rolling_episode_split": False}


def _schema_length(schema: Path) -> int:
    import json

    data = json.loads(schema.read_text(encoding="utf-8"))
    return int(data.get("simulation_end_time_step", 8759)) - int(data.get("simulation_start_time_step", 0)) + 1


def make_citylearn_env(cfg: Config, schema: Path, purpose: Purpose, seed: int, eval_days: int | None = None):
    """A central-agent CityLearnEnv with the multi-objective reward."""
    from citylearn.citylearn import CityLearnEnv

    try:
        env = CityLearnEnv(
            str(schema),
            central_agent=True,
            reward_function=MultiObjectiveReward,
            reward_function_kwargs=cfg.reward.model_dump(),
            # CityLearn seeds episode window k with random_seed x (k + 1): never let that be 0.
            random_seed=seed + 1,
            offline=True,
            **_episode_kwargs(cfg, purpose, _schema_length(schema), eval_days),
        )
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise DatasetError(f"could not load CityLearn schema {schema}: {exc}") from exc
    env.reward_function.configure(site_scales(env), charger_specs(env))
    return env


def site_scales(env) -> list[SiteScale]:
    """Per-building reward normalisers from the dataset (see trainer.reward)."""
    scales = []
    for b in env.buildings:
        sim = b.energy_simulation
        demand = np.asarray(sim.non_shiftable_load, dtype=float)
        for name in ("dhw_demand", "cooling_demand", "heating_demand"):
            demand = demand + np.nan_to_num(np.asarray(getattr(sim, name), dtype=float))
        storage_kw = float(getattr(b.electrical_storage, "nominal_power", 0.0) or 0.0)
        chargers_kw = sum(float(c.max_charging_power or 0.0) for c in (b.electric_vehicle_chargers or []))
        scales.append(SiteScale(
            scale_kw=max(float(demand.max()) + storage_kw + chargers_kw, 1e-3),
            carbon_max=max(float(np.max(b.carbon_intensity.carbon_intensity)), 1e-6),
            price_max=max(float(np.max(b.pricing.electricity_pricing)), 1e-6),
        ))
    return scales


def charger_specs(env) -> list[list[ChargerSpec]]:
    return [
        [ChargerSpec(c.charger_id, float(c.max_charging_power), float(c.efficiency)) for c in (b.electric_vehicle_chargers or [])]
        for b in env.buildings
    ]


class KeepEpisodeSeed(gymnasium.Wrapper):
    """Ignore the seed SB3 passes to ``reset``.

    CityLearn would adopt it as the seed of its episode windows, so a model seeded with 0 would
    train on the same window every episode, and a resumed run's windows would depend on how
    it was restarted. The windows then depend only on the run's seed and the episode index,
    which checkpoints record (see :func:`set_next_episode`).
    """

    def reset(self, *, seed=None, options=None):
        return self.env.reset(options=options)


def make_sb3_env(cfg: Config, schema: Path, purpose: Purpose, seed: int, eval_days: int | None = None):
    """CityLearn → normalised observations → flat arrays for SB3, with SB3's Monitor for episode stats."""
    from citylearn.wrappers import NormalizedObservationWrapper, StableBaselines3Wrapper
    from stable_baselines3.common.monitor import Monitor

    env = make_citylearn_env(cfg, schema, purpose, seed, eval_days)
    return Monitor(KeepEpisodeSeed(StableBaselines3Wrapper(NormalizedObservationWrapper(env))))


def episode_index(env) -> int:
    """Index of the episode the environment is in (-1 before the first reset)."""
    return int(env.unwrapped.episode_tracker.episode)


def set_next_episode(env, index: int) -> None:
    """Make the next ``reset`` start episode ``index`` (its window is a function of seed and index)."""
    # CityLearn keeps the counter private and increments it on reset.
    env.unwrapped.episode_tracker._EpisodeTracker__episode = index - 1


def action_slices(env) -> list[tuple[int, list[str]]]:
    """(offset, action names) for each building in the central agent's flat action vector."""
    out, offset = [], 0
    for b in env.buildings:
        names = list(b.active_actions)
        out.append((offset, names))
        offset += len(names)
    return out
