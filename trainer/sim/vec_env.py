"""The training simulator as stable-baselines3 wants it: one VecEnv of N sites, one process, no workers.

It gives what the product's CityLearn training environment gives (trainer.env.citylearn.CentralAgentArrays under
SB3's Monitor): the same normalised observations (CityLearn's normalisation, the periodic features, the
carbon look-ahead), the same action scale, the EV guard, the same reward (trainer.env.reward's terms, the EV
shortfall and the storage credit), random episode windows that depend only on the seed, the environment
and the episode's index (so a checkpoint's episode cursor resumes them exactly), and SB3's auto-reset
(the last observation in ``infos[i]["terminal_observation"]``, Monitor's ``episode`` record). An episode's
end is a time limit (``TimeLimit.truncated``), as trainer.env.citylearn reports CityLearn's: the site goes on.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv

from trainer.config.sections import Config
from trainer.env.citylearn import (
    CentralAgentArrays,
    learnt_normalisation,
    make_citylearn_env,
    site_forecast,
    site_scales,
)
from trainer.env.reward import TERMS, _grid_kwh_per_stored_kwh, kwh_value, mean_kwh_value
from trainer.sim.ev import Guard, ReachTable, Sessions, Shortfalls, linear_paths
from trainer.sim.site import SiteTables, VectorSite
from trainer.site import Site


class SimVecEnv(VecEnv):
    """``n_envs`` copies of the site in episode windows of ``episode_steps`` (None: the whole period from its start),
    random ones unless ``from_start`` (each episode the period's first ``episode_steps``, as an evaluation's)."""

    def __init__(self, cfg: Config, site: Site, n_envs: int, seed: int, episode_steps: int | None = None,
                 from_start: bool = False) -> None:
        env = make_citylearn_env(cfg, site, "eval", seed)  # the whole period: CityLearn's normalisation is over it
        # Copies judged from the start over a window read only that window of the site (its first steps).
        self.tables = tables = site_tables(env, site, seed, episode_steps if from_start else None)
        # A part of a site (its learning part) reads its observations scaled as the whole site, as every evaluation.
        learnt = None if site.scaled_as is None else learnt_normalisation(cfg, site.scaled_as)
        arrays = CentralAgentArrays(env, None, cfg.observations, learnt, site, site_forecast(cfg, site))
        arrays.reset()
        self.plan, self.scale, self.carbon_ahead = arrays.plan, arrays.scale, arrays.carbon_ahead
        self.load_ago, self.forecast = arrays.load_ago, arrays.forecast
        self.reward = _RewardTerms(cfg, env, tables)
        self.guard = Guard.of(cfg.ev)
        self.linear = linear_paths(tables)
        self.reach_table = None if self.linear else ReachTable(tables)
        self.render_mode = None  # nothing to draw; SB3 asks
        super().__init__(n_envs, arrays.observation_space, arrays.action_space)
        self.length = tables.steps if episode_steps is None else min(episode_steps, tables.steps)
        self.random_windows = self.length < tables.steps and not from_start
        self.seed_value = seed
        self.site = VectorSite(tables, n_envs)
        self.shortfalls = Shortfalls(n_envs, tables.chargers.action.size)
        self.episodes = np.full(n_envs, -1)  # the episode each environment is in (CityLearn's counter, -1 first)
        self.returns = np.zeros(n_envs)
        self.started = np.zeros(n_envs)
        self._actions: np.ndarray | None = None
        self._last_step: tuple[np.ndarray, np.ndarray] | None = None  # (each environment's step, its net kWh)
        env.close()

    # ----------------------------------------------------------------- episodes

    def window_start(self, env: int, episode: int) -> int:
        """Where episode ``episode`` of environment ``env`` starts: a function of the seed, the environment and
        the episode's index alone, so that a resumed run walks the same windows."""
        if not self.random_windows:
            return 0
        rng = np.random.default_rng([self.seed_value, env, episode])
        return int(rng.integers(0, self.tables.steps - self.length + 1))

    def _start_episodes(self, envs: np.ndarray) -> None:
        self.episodes[envs] += 1
        starts = np.asarray([self.window_start(i, int(e)) if envs[i] else 0 for i, e in enumerate(self.episodes)])
        self.site.reset(envs, starts, np.full(self.num_envs, self.length))
        self.shortfalls.reset(envs)
        self.reward.reset(envs)
        self.returns[envs] = 0.0
        self.started[envs] = time.time()

    def episode_index(self) -> list[int]:
        return [int(e) for e in self.episodes]

    def set_next_episode(self, index: int, env: int) -> None:
        self.episodes[env] = index - 1

    # ----------------------------------------------------------------- observations

    def _observations(self) -> np.ndarray:
        raw = self.site.observe()
        if len(self.carbon_ahead):
            t = np.minimum(self.site.t, self.site.end)[:, None] + self.carbon_ahead[None, :]
            raw = np.concatenate([raw, self.tables.carbon[np.minimum(t, self.site.end[:, None]), 0]], axis=1)
        if len(self.load_ago):
            # As CityLearnEnv's wrapper: each building's load that many steps before, the period's first at most.
            ago = np.maximum(np.minimum(self.site.t, self.site.end)[:, None] - self.load_ago[None, :], 0)
            raw = np.concatenate([raw, *(self.tables.raw[ago, column] for column in self.plan.load_columns)], axis=1)
        if self.forecast is not None:
            raw = np.concatenate([raw, self.forecast.at(np.minimum(self.site.t, self.site.end))], axis=1)
        return self.plan(raw)

    # ----------------------------------------------------------------- VecEnv

    def reset(self) -> np.ndarray:
        self._start_episodes(np.ones(self.num_envs, dtype=bool))
        return self._observations()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions, dtype=float).reshape(self.num_envs, -1)

    def step_wait(self):
        native = self.scale.to_native(self._actions)
        self.site.begin()
        now = self.site.t.copy()
        sessions = Sessions(self.tables, now, self.site.cars, self.linear, self.reach_table)
        if self.guard is not None:
            native = self.guard.apply(sessions, native)
        net = self.site.apply(native)
        self._last_step = (now, net.copy())  # an episode that ends here resets the site's own array in place
        rewards = self.reward.step(sessions, net, self.site, self.shortfalls)
        self.returns += rewards
        observations = self._observations()
        dones = self.site.t >= self.site.end
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        if dones.any():
            for i in np.flatnonzero(dones):
                infos[i] = {"terminal_observation": observations[i].copy(), "TimeLimit.truncated": True,
                            "episode": {"r": float(self.returns[i]), "l": int(self.length - 1),
                                        "t": round(time.time() - self.started[i], 6)}}
            self._start_episodes(dones)
            observations = self._observations()
        return observations, rewards.astype(np.float32), dones, infos

    @property
    def step_import_co2(self) -> np.ndarray:
        """kg CO2 each environment's site imported in the last step (each building's imports x carbon intensity, as
        trainer.judge.metrics counts it): what the warm start's pick adds up over a year. Computed when asked: training
        never does."""
        if self._last_step is None:
            return np.zeros(self.num_envs)
        now, net = self._last_step
        return np.clip(net, 0.0, None).sum(axis=1) * self.tables.carbon[now, 0]

    def close(self) -> None:
        pass

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        return [getattr(self, attr_name)] * len(self._get_indices(indices))

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        chosen = list(self._get_indices(indices))
        if method_name == "episode_index":
            return [int(self.episodes[i]) for i in chosen]
        if method_name == "set_next_episode":
            for i in chosen:
                self.set_next_episode(*method_args, env=i, **method_kwargs)
            return [None] * len(chosen)
        raise AttributeError(f"the training simulator has no per-environment method {method_name!r}")

    def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
        return [False] * len(list(self._get_indices(indices)))

    def seed(self, seed: int | None = None) -> list[None]:
        return [None] * self.num_envs  # the windows follow the constructor's seed (see window_start)


_TABLES: dict[tuple, SiteTables] = {}


def site_tables(env: Any, site: Site, seed: int, steps: int | None = None) -> SiteTables:
    """The site's tables (all of its period, or its first ``steps``), read once per process for a dataset file as
    it is now (a night's stages share them), and from the disk cache in later processes (trainer.sim.cache)."""
    from trainer.sim.cache import cached_tables  # the one place tables are kept on disk

    if steps is not None and steps >= env.time_steps:
        steps = None  # a window as long as the period is the period: one read, one file
    stat = site.schema.stat()
    # The period too: a dataset's parts (the part learnt from, its validation part) are one schema file read over
    # other steps, and a part's tables taken for another's judged it on the wrong days (the disk cache's key, the
    # site's content digest, holds the period already).
    key = (str(site.schema.resolve()), stat.st_mtime_ns, stat.st_size, seed, steps, site.start, site.end)
    if key not in _TABLES:
        _TABLES.clear()  # one dataset at a time: a year of a 17-building site is tens of MB
        _TABLES[key] = cached_tables(env, site, seed, steps)
    return _TABLES[key]


class _RewardTerms:
    """trainer.env.reward.MultiObjectiveReward on arrays: the five weighted terms per building, summed, plus the
    storage credit. Constants come from the same functions, read once from the CityLearn environment."""

    def __init__(self, cfg: Config, env: Any, tables: SiteTables) -> None:
        self.weights = {k: float(getattr(cfg.reward, k)) for k in TERMS}
        scales = site_scales(env)
        self.scale_kw = np.asarray([s.scale_kw for s in scales])
        self.carbon_max = np.asarray([s.carbon_max for s in scales])
        self.price_max = np.asarray([s.price_max for s in scales])
        evs = list(env.electric_vehicles or [])
        self.ev_value = np.asarray([kwh_value(self.weights, s, _grid_kwh_per_stored_kwh(b, evs))
                                    for s, b in zip(scales, env.buildings)])
        self.credit_weight, self.gamma = float(cfg.reward.storage), float(cfg.reward.storage_gamma)
        self.credit_value = np.asarray([mean_kwh_value(self.weights, s, b) for s, b in zip(scales, env.buildings)])
        self.tables = tables
        self.previous: np.ndarray | None = None

    def reset(self, envs: np.ndarray) -> None:
        if self.previous is not None:
            self.previous[envs] = np.nan

    def _potential(self, site: VectorSite, sessions: Sessions) -> np.ndarray:
        tab = self.tables
        stored = np.zeros((site.n, tab.n_buildings))
        np.add.at(stored.T, tab.battery_building, (site.batteries.soc.astype(float) * tab.batteries.capacity).T)
        cars = np.where(sessions.connected, site.cars.soc[np.arange(site.n)[:, None], sessions.car].astype(float)
                        * sessions.spec.capacity, 0.0)
        np.add.at(stored.T, tab.chargers.building, cars.T)
        return self.credit_weight * self.credit_value * stored

    def step(self, sessions: Sessions, net: np.ndarray, site: VectorSite, shortfalls: Shortfalls) -> np.ndarray:
        w, tab, t = self.weights, self.tables, sessions.t
        net = net.astype(float)
        imported, exported = np.maximum(net, 0.0), np.maximum(-net, 0.0)
        ev_kwh = np.zeros_like(net)
        if w["ev"] > 0:
            np.add.at(ev_kwh.T, tab.chargers.building, shortfalls.growth(sessions).T)
        terms = {
            "co2": imported * tab.carbon[t] / (self.scale_kw * self.carbon_max),
            "cost": imported * tab.price[t] / (self.scale_kw * self.price_max),
            "ev": ev_kwh * self.ev_value,
            "grid": (imported / self.scale_kw) ** 2,
            "solar": exported / self.scale_kw,
        }
        reward = -sum(w[k] * terms[k] for k in TERMS)
        if self.credit_weight:
            now = self._potential(site, sessions)
            before = now if self.previous is None else np.where(np.isnan(self.previous), now, self.previous)
            self.previous = now
            reward = reward + self.gamma * now - before
        return reward.sum(axis=1)
