"""CityLearn environments for training and evaluation.

One factory (:func:`make_citylearn_env`) builds every environment the product uses,
with the central agent, the multi-objective reward, and the episode split of its
purpose; :func:`make_sb3_env` adds the wrappers stable-baselines3 needs.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

import gymnasium
import numpy as np

from trainer.base import logs
from trainer.base.errors import ConfigError, DatasetError
from trainer.base.signals import STOP, Stopped
from trainer.config.sections import LOAD_NOW, Config, ObservationsConfig
from trainer.env.ev_guard import EvServiceGuard
from trainer.env.forecast import ForecastTable, Readings, forecast_table, readings
from trainer.shipped.controller import Normaliser
from trainer.site import Site

if TYPE_CHECKING:
    from citylearn.citylearn import CityLearnEnv

    from trainer.env.reward import SiteScale

Purpose = Literal["train", "eval"]

# CityLearn reads these at import time; the product never downloads at run time.
os.environ.setdefault("CITYLEARN_OFFLINE", "1")


def _episode_kwargs(cfg: Config, purpose: Purpose, site: Site, eval_days: int | None) -> dict:
    """The schema's own period (``simulation_start_time_step`` to its end) for every purpose: training's windows
    lie inside it and an evaluation starts at its first step."""
    start, n_steps = site.start, site.length
    period = {"simulation_start_time_step": start, "simulation_end_time_step": start + n_steps - 1}
    if purpose == "train":
        length = min(cfg.scenario.train_episode_days * 24, n_steps)
        # Random windows of the year, so training sees every season without year-long episodes.
        return {**period, "episode_time_steps": length, "random_episode_split": length < n_steps,
                "rolling_episode_split": False}
    # A shorter evaluation is the first episode of the whole period, not a shorter period: CityLearn
    # normalises observations by the period's range, and a policy trained on the year would see
    # other numbers for the same state in a period of a few days.
    # One split, so that every reset of the same environment replays that same window.
    window = None if eval_days is None else [(start, start + min(n_steps, eval_days * 24) - 1)]
    return {**period, "episode_time_steps": window, "random_episode_split": False, "rolling_episode_split": False}


def make_citylearn_env(cfg: Config, site: Site, purpose: Purpose, seed: int, eval_days: int | None = None):
    """A central-agent CityLearnEnv with the multi-objective reward."""
    # Lazy: CityLearn (and the reward, which subclasses its RewardFunction) take seconds to import.
    from citylearn.citylearn import CityLearnEnv

    from trainer.env.reward import MultiObjectiveReward

    kwargs = _episode_kwargs(cfg, purpose, site, eval_days)
    try:
        env = CityLearnEnv(
            str(site.schema),
            central_agent=True,
            reward_function=MultiObjectiveReward,
            reward_function_kwargs=cfg.reward.model_dump(),
            # CityLearn seeds episode window k with random_seed x (k + 1): never let that be 0.
            random_seed=seed + 1,
            offline=True,
            **kwargs,
        )
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise DatasetError(f"could not load CityLearn schema {site.schema}: {exc}") from exc
    # CityLearn 3.0.2 passes this argument on under another name and keeps the schema's value
    # (false for the built-in site): set it where reset() reads it, or training walks the windows in order.
    env.random_episode_split = bool(kwargs["random_episode_split"])
    env.reward_function.configure(site_scales(env), env)
    return env


def site_scales(env: CityLearnEnv) -> list[SiteScale]:
    """Per-building reward normalisers from the dataset (see trainer.env.reward)."""
    from trainer.env.reward import SiteScale  # lazy: imports CityLearn
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


@dataclass(frozen=True)
class ActionScale:
    """Agents act in [-1, 1] on every action; CityLearn wants each in its own range.

    SB3 advises a symmetric box for Gaussian policies: with CityLearn's [0, 1] for EV chargers an
    untrained PPO/A2C (mean ~0) is clipped to "never charge", the very policy a reward that misses
    stranded cars prefers. Mapped linearly, an agent's 0 is half power (and the battery's -1..1 is
    unchanged: CityLearn scales it by the battery's nominal power).
    """

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, env: CityLearnEnv) -> ActionScale:
        space = env.action_space[0]
        return cls(np.asarray(space.low, dtype=float), np.asarray(space.high, dtype=float))

    @property
    def agent_space(self) -> gymnasium.spaces.Box:
        return gymnasium.spaces.Box(-1.0, 1.0, shape=self.low.shape, dtype=np.float32)

    def to_native(self, action) -> np.ndarray:
        unit = (np.clip(np.asarray(action, dtype=float), -1.0, 1.0) + 1.0) / 2.0
        return self.low + unit * (self.high - self.low)

    def to_agent(self, native) -> np.ndarray:
        span = np.where(self.high > self.low, self.high - self.low, 1.0)
        return (2.0 * (np.asarray(native, dtype=float) - self.low) / span - 1.0).astype(np.float32)


class CentralAgentArrays(gymnasium.Wrapper):
    """A central-agent CityLearnEnv as SB3 wants it: flat float32 observations normalised exactly as
    CityLearn's ``NormalizedObservationWrapper`` does, a flat action array in [-1, 1]
    (:class:`ActionScale`) and a float reward. With a ``guard``, every step's EV actions first pass
    through the EV service guard (trainer.env.ev_guard).

    CityLearn's wrapper re-reads every building's observations a second time each step and rebuilds
    its name lists on every access; here the normalisation (cos/sin of hour, day type and month, then
    min-max to the building's limits) is planned once per episode as index arrays and applied to the
    observations the step already returned (tests/test_speedups.py checks it matches CityLearn's).

    It also ignores the seed SB3 passes to ``reset``: CityLearn would adopt it as the seed of its
    episode windows, so a model seeded with 0 would train on the same window every episode, and a
    resumed run's windows would depend on how it was restarted. The windows then depend only on the
    environment's seed and the episode index, which checkpoints record (:meth:`set_next_episode`).
    """

    def __init__(
        self, env: CityLearnEnv, guard: EvServiceGuard | None = None, seen: ObservationsConfig | None = None,
        learnt: NormalisationPlan | None = None, site: Site | None = None, forecast: ForecastTable | None = None,
    ):
        super().__init__(env)
        seen = seen or ObservationsConfig(carbon_ahead_hours=[], load_ago_hours=[], ignore=[], forecast=False)
        self.carbon_ahead = np.asarray(seen.carbon_ahead_hours, dtype=int)
        self.load_ago = np.asarray(load_look_back(seen, site), dtype=int)
        self.ignored = ignored_observations(seen, site)
        self.forecast = forecast  # observations.forecast: its table over the site's period, read by the step
        # Every feature is min-max scaled to [0, 1] (cos/sin to [-1, 1] before it), as CityLearn's own wrapper
        # declares; its space is not asked, for it knows nothing of the features added or left out here.
        size = len((learnt or self._own_plan(env.unwrapped)).features)
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, shape=(size,), dtype=np.float32)
        self.scale = ActionScale.of(env)
        self.action_space = self.scale.agent_space
        self.guard = guard
        self.learnt = learnt
        self._plan: NormalisationPlan | None = None
        self._raw = np.zeros(0)

    def reset(self, *, seed=None, options=None):
        observations, info = self.env.reset(options=options)
        own = self._own_plan(self.env.unwrapped)
        if self.learnt is not None and len(self.learnt.names) != len(own.names):
            raise DatasetError(f"the dataset judged on gives {len(own.names)} observations where the policy learnt "
                               f"on {len(self.learnt.names)}; judge it on a dataset with the same devices and "
                               "observations")
        # A period judged apart is scaled as the policy learnt, not by its own range: beyond the learnt range a
        # policy reads values past [0, 1], as a deployed controller would.
        self._plan = own if self.learnt is None else self.learnt
        return self._observe(observations), info

    def _own_plan(self, env: CityLearnEnv) -> NormalisationPlan:
        return NormalisationPlan(env, self.carbon_ahead, self.ignored, self.load_ago, self.forecast)

    @property
    def raw(self) -> np.ndarray:
        """This step's raw observations in the plan's order (``plan.names``), the look-ahead and look-back
        included."""
        return self._raw

    def _observe(self, observations) -> np.ndarray:
        env = self.env.unwrapped
        self._raw = np.asarray(observations[0], dtype=float)
        if len(self.carbon_ahead):
            carbon = env.buildings[0].carbon_intensity.carbon_intensity
            ahead = carbon[np.minimum(env.time_step + self.carbon_ahead, len(carbon) - 1)]
            self._raw = np.concatenate([self._raw, ahead])
        if len(self.load_ago):
            # The meter's past: the dataset's loads before this step (its first where the period has none before).
            ago = np.maximum(env.time_step - self.load_ago, 0)
            self._raw = np.concatenate([self._raw, *(np.asarray(getattr(b.energy_simulation, LOAD_NOW))[ago]
                                                     for b in env.buildings)])
        if self.forecast is not None:  # by the step of the period (a training episode is a window of it)
            tracker = env.episode_tracker
            step = tracker.episode_start_time_step - tracker.simulation_start_time_step + env.time_step
            self._raw = np.concatenate([self._raw, self.forecast.at(step)])
        return self._plan(self._raw)

    def step(self, action):
        native = self.scale.to_native(action)
        if self.guard is not None:
            native = self.guard.apply(self.env.unwrapped, native)
        observations, reward, terminated, truncated, info = self.env.step([native])
        # CityLearn ends every episode as terminated, but the site goes on after the window: its end is a
        # time limit, and a learner that took it for the end of the world would value storing nothing for
        # the last days of each window (measured: PPO unlearned its warm start; docs/agent-quality.md).
        return self._observe(observations), float(reward[0]), False, bool(terminated or truncated), info

    @property
    def plan(self) -> NormalisationPlan | None:
        """The normalisation of this episode's raw observations (None before the first reset)."""
        return self._plan

    def episode_index(self) -> int:
        """Index of the episode the environment is in (-1 before the first reset)."""
        return int(self.env.unwrapped.episode_tracker.episode)

    def set_next_episode(self, index: int) -> None:
        """Make the next ``reset`` start episode ``index`` (its window is a function of seed and index)."""
        # CityLearn keeps the counter private and increments it on reset.
        self.env.unwrapped.episode_tracker._EpisodeTracker__episode = index - 1


def ignored_observations(seen: ObservationsConfig, site: Site | None) -> frozenset[str]:
    """What the policy does not read on ``site`` (:meth:`Site.unread`). No site: what the config names, auto none."""
    return site.unread(seen) if site is not None else seen.ignored(one_period=False, observed=frozenset())


def load_look_back(seen: ObservationsConfig, site: Site | None) -> tuple[int, ...]:
    """Hours ago of each building's load the policy reads on ``site`` (:meth:`Site.load_look_back`). No site: what
    the config names, auto none."""
    return site.load_look_back(seen) if site is not None else seen.load_look_back(one_period=False,
                                                                                   observed=frozenset())


def carbon_ahead_name(hours: int) -> str:
    """The raw observation of grid carbon intensity ``hours`` ahead (``observations.carbon_ahead_hours``)."""
    return f"carbon_intensity_ahead_{hours}h"


def load_ago_name(building: str, hours: int, buildings: int) -> str:
    """The raw observation of a building's other loads ``hours`` ago (``observations.load_ago_hours``)."""
    return raw_observation_name(building, f"non_shiftable_load_ago_{hours}h", buildings)


def carbon_scale(env: CityLearnEnv) -> tuple[float, float]:
    """(low, span) that normalise grid carbon intensity as CityLearn normalises the current one (first building)."""
    lows, highs = env.buildings[0].periodic_normalized_observation_space_limits
    low = float(lows["carbon_intensity"])
    return low, max(float(highs["carbon_intensity"]) - low, 1e-9)


@dataclass(frozen=True)
class Feature:
    """One input of the policy: a raw observation, how it is transformed (``cos``/``sin`` of a period, or
    ``identity``) and the range it is min-max scaled from (clipped to [0, 1] where ``clip``)."""

    observation: str
    transform: str
    period: float
    low: float
    high: float
    clip: bool = False


def raw_observation_name(building: str, key: str, buildings: int) -> str:
    """A raw observation's name: CityLearn's key, after its building's name on a site of several."""
    return key if buildings == 1 else f"{building}.{key}"


class NormalisationPlan:
    """The central agent's raw observation list, by name, and the features the policy reads from it."""

    def __init__(self, env: CityLearnEnv, carbon_ahead: np.ndarray, ignored: frozenset[str] = frozenset(),
                 load_ago: np.ndarray | None = None, forecast: ForecastTable | None = None):
        periodic = env.buildings[0].get_periodic_observation_metadata()
        shared, seen = set(env.shared_observations), set()
        self.names: list[str] = []  # the raw list's positions
        self.features: list[Feature] = []
        # What an ignored observation would have given the policy: an export still checks its readings by this range.
        self.unread: list[Feature] = []
        for i, building in enumerate(env.buildings):
            lows, highs = building.periodic_normalized_observation_space_limits
            for key in building.observations(normalize=False, periodic_normalization=False):
                if not (i == 0 or key not in shared or key not in seen):
                    continue  # a shared observation appears once, in the first building's part
                if key in shared:
                    seen.add(key)
                name = key if key in shared else raw_observation_name(building.name, key, len(env.buildings))
                self.names.append(name)
                # Read (the raw list stays CityLearn's) but not a feature where ignored: observations.ignore.
                kept = self.unread if key in ignored else self.features
                if key in periodic:  # expands to (cos, sin), in that order
                    period = float(max(periodic[key]))
                    kept += [Feature(name, t, period, float(lows[f"{key}_{t}"]), float(highs[f"{key}_{t}"]))
                             for t in ("cos", "sin")]
                else:
                    kept.append(Feature(name, "identity", 0.0, float(lows[key]), float(highs[key])))
        unknown = sorted(ignored - {key for b in env.buildings for key in b.observations(normalize=False,
                                                                                           periodic_normalization=False)})
        if unknown:
            observed = ", ".join(sorted({n.split(".")[-1] for n in self.names}))
            raise ConfigError(f"observations.ignore names {', '.join(map(repr, unknown))}, which this dataset does not "
                              f"observe; its observations: {observed}. Fix the name or remove it")
        low, span = carbon_scale(env)
        for hours in carbon_ahead.tolist():
            self.names.append(carbon_ahead_name(hours))
            self.features.append(Feature(carbon_ahead_name(hours), "identity", 0.0, low, low + span, clip=True))
        # Each building's loads hours ago, scaled as its load now; where in the raw list its load now is (the
        # training simulator reads the past from its table of them).
        self.load_columns: list[int] = []
        hours_ago = [] if load_ago is None else np.asarray(load_ago, dtype=int).tolist()
        for building in env.buildings if hours_ago else []:
            now = raw_observation_name(building.name, LOAD_NOW, len(env.buildings))
            if now not in self.names:
                raise ConfigError(f"observations.load_ago_hours needs the site to observe {now!r}, which this "
                                  "dataset leaves inactive; activate it in the schema or set load_ago_hours: []")
            self.load_columns.append(self.names.index(now))
            lows, highs = building.periodic_normalized_observation_space_limits
            for hours in hours_ago:
                name = load_ago_name(building.name, hours, len(env.buildings))
                self.names.append(name)
                self.features.append(Feature(name, "identity", 0.0, float(lows[LOAD_NOW]), float(highs[LOAD_NOW])))
        # The forecast of the hours ahead (observations.forecast), scaled by its range over this site's period.
        self.forecast_names: list[str] = [] if forecast is None else list(forecast.names)
        for name, (low, high) in zip(self.forecast_names, [] if forecast is None else forecast.ranges):
            self.names.append(name)
            self.features.append(Feature(name, "identity", 0.0, low, high))
        self.normalise = Normaliser.from_features([asdict(f) for f in self.features], self.names)

    def __call__(self, raw) -> np.ndarray:
        """One raw observation vector, or a batch (N, K), normalised."""
        return self.normalise(raw)


def central_arrays(sb3_env: gymnasium.Env) -> CentralAgentArrays | None:
    """The :class:`CentralAgentArrays` inside ``sb3_env``'s wrappers, or None."""
    arrays = sb3_env
    while not isinstance(arrays, CentralAgentArrays) and hasattr(arrays, "env"):
        arrays = arrays.env
    return arrays if isinstance(arrays, CentralAgentArrays) else None


@contextmanager
def guard_for(sb3_env: gymnasium.Env, controller: object) -> Iterator[None]:
    """The EV guard off while a controller that says ``guarded = False`` runs (the uncontrolled baseline, whose cars
    charge at full power until full, as on a site without control); else the environment as it is."""
    arrays = central_arrays(sb3_env)
    if getattr(controller, "guarded", True) or arrays is None:
        yield
        return
    saved, arrays.guard = arrays.guard, None
    try:
        yield
    finally:
        arrays.guard = saved


def make_sb3_env(cfg: Config, site: Site, purpose: Purpose, seed: int, eval_days: int | None = None):
    """CityLearn → flat normalised arrays for SB3, with SB3's Monitor for episode stats. A site read as another
    (``site.scaled_as``: a draw, a part held out) has its observations scaled as on that one, where the policy
    learnt."""
    from stable_baselines3.common.monitor import Monitor  # lazy: SB3 imports torch

    learnt = None if site.scaled_as is None else learnt_normalisation(cfg, site.scaled_as)
    env = make_citylearn_env(cfg, site, purpose, seed, eval_days)
    guard = EvServiceGuard.of(cfg.ev)
    return Monitor(CentralAgentArrays(env, guard, cfg.observations, learnt, site, site_forecast(cfg, site)))


def site_forecast(cfg: Config, site: Site) -> ForecastTable | None:
    """The forecast a policy on ``site`` reads (observations.forecast), or None."""
    if not site.reads_forecast(cfg.observations):
        return None

    def read(period: Site) -> Readings:
        env = make_citylearn_env(cfg, period, "eval", cfg.seed)
        try:
            env.reset()
            return readings(env)
        finally:
            env.close()

    return forecast_table(site, read)


def learnt_normalisation(cfg: Config, site: Site) -> NormalisationPlan:
    """How a policy that learnt on ``site`` scales its observations (CityLearn's, by ``site``'s period), learnt
    once per site."""
    def measure() -> NormalisationPlan:
        env = make_sb3_env(cfg, site, "eval", cfg.seed, eval_days=1)
        try:
            env.reset()
            plan = central_arrays(env).plan
            assert plan is not None  # set by the reset
            return plan
        finally:
            env.close()

    seen = cfg.observations
    ignored = tuple(sorted(ignored_observations(seen, site)))
    return site.remember(("normalisation", tuple(seen.carbon_ahead_hours), load_look_back(seen, site), ignored,
                          site.reads_forecast(seen)), measure)


def policy_sizes(cfg: Config, site: Site) -> tuple[int, int]:
    """(observations, actions) of a policy on ``site`` with this config's observations, learnt once per site."""
    def measure() -> tuple[int, int]:
        env = make_sb3_env(cfg, site, "train", cfg.seed)
        try:
            return env.observation_space.shape[0], env.action_space.shape[0]
        finally:
            env.close()

    ignored = tuple(sorted(ignored_observations(cfg.observations, site)))
    seen = cfg.observations
    return site.remember(("policy sizes", tuple(seen.carbon_ahead_hours), load_look_back(seen, site), ignored,
                          site.reads_forecast(seen)), measure)


# CityLearn seeds episode window k with random_seed x (k + 1): a prime stride between the seeds of
# parallel environments keeps their windows from coinciding.
ENV_SEED_STRIDE = 7919
WORKER_PRELOAD = ["trainer.env.citylearn", "citylearn.citylearn", "stable_baselines3.common.vec_env.subproc_vec_env"]


def _training_env(cfg: Config, site: Site, seed: int, index: int):
    if multiprocessing.parent_process() is not None:
        # Ctrl+C and a service manager's SIGTERM reach the whole process group: the trainer saves a
        # checkpoint and closes its workers itself. A worker whose trainer died reads EOF and exits.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return make_sb3_env(cfg, site, "train", seed + index * ENV_SEED_STRIDE)


def make_training_vec_env(cfg: Config, site: Site, seed: int, n_envs: int, subprocesses: bool):
    """``n_envs`` training environments, stepped in worker processes when ``subprocesses``.

    Falls back to stepping them in this process (DummyVecEnv), with a warning, where worker
    processes cannot start.
    """
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv  # lazy: SB3 imports torch

    factories = [functools.partial(_training_env, cfg, site, seed, i) for i in range(n_envs)]
    if subprocesses:
        if "forkserver" in multiprocessing.get_all_start_methods():  # SB3's choice where it exists (not Windows)
            # Workers fork from a server that has imported these once (about 5 s each otherwise).
            multiprocessing.set_forkserver_preload(WORKER_PRELOAD)
        logs.get().info("starting environment workers", n_envs=n_envs)  # ~20 s: say so, not silence
        try:
            with STOP.interruptible("the start of the environment workers"):
                return SubprocVecEnv(factories)
        except Stopped:
            raise
        except Exception as exc:  # any failure to start workers has the same remedy
            logs.get().warning("parallel environments could not start: stepping them in this process",
                               error=f"{type(exc).__name__}: {exc}", n_envs=n_envs, fallback="DummyVecEnv")
    return DummyVecEnv(factories)


def action_slices(env: CityLearnEnv) -> list[tuple[int, list[str]]]:
    """(offset, action names) for each building in the central agent's flat action vector."""
    out, offset = [], 0
    for b in env.buildings:
        names = list(b.active_actions)
        out.append((offset, names))
        offset += len(names)
    return out


def action_layout(env: CityLearnEnv) -> list[tuple[int, str]]:
    """(building index, action name) of each action in the central agent's flat action vector."""
    return [(b, name) for b, (_, names) in enumerate(action_slices(env)) for name in names]
