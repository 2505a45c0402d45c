"""What agents train on: one row per simulator in :data:`SIMULATORS`, chosen once per stage by ``train.simulator``.

A row says how its training environments are made, whether they step in the trainer's own process (no worker
processes: the sites are arrays), what it cannot model on a given site, and how the parity harness drives its
physics against CityLearn (``trainer sim check``; ``None`` for CityLearn itself, the reference). Code asks the
:class:`Simulator` it was handed, never its name. A new simulator (one on torch tensors, say) is one module with
its VecEnv and physics, one row here, and its parity test (``tests/test_sim.py`` runs the harness for every row).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from trainer.base import logs
from trainer.base.checks import FAIL, PASS, Check
from trainer.base.errors import UsageError
from trainer.config.sections import Config
from trainer.env.citylearn import make_citylearn_env, make_training_vec_env
from trainer.sim.site import SiteTables, Unsupported, unsupported_reason
from trainer.site import Site


class TrainingEnv(Protocol):
    """What a night asks of training environments beyond SB3's ``VecEnv`` (reset, step_async/step_wait, close).

    The episode cursor: ``env_method("episode_index")`` gives each environment's episode (-1 before the first),
    ``env_method("set_next_episode", index, indices=[i])`` makes environment i's next reset start episode
    ``index``; an episode's window is a function of the seed, the environment and that index alone, so a resumed
    stage walks the same windows (trainer.learn.state.EpisodeTracker)."""

    num_envs: int

    def reset(self) -> Any: ...

    def step(self, actions: np.ndarray) -> Any: ...

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]: ...

    def close(self) -> None: ...


class JudgingEnv(TrainingEnv, Protocol):
    """An in-process simulator's environments, which also judge policies side by side over whole periods (the
    warm start's pick): each step's grid-import CO2 per environment, kg."""

    step_import_co2: np.ndarray


class SitePhysics(Protocol):
    """What the parity harness drives: copies of the site, native actions in, raw observations and each building's
    net consumption (kWh) out."""

    def reset(self, envs: np.ndarray, starts: np.ndarray, lengths: np.ndarray | None = None) -> None: ...

    def observe(self) -> np.ndarray: ...

    def step(self, actions: np.ndarray) -> np.ndarray: ...


class SiteModel(Protocol):
    """A simulator's model of a site, read once from a CityLearnEnv of its whole period."""

    steps: int  # CityLearn's time_steps

    def copies(self, n_envs: int) -> SitePhysics: ...


# (config, site, environments, seed, steps of an episode window or None for the whole period, worker processes)
MakeEnv = Callable[[Config, Site, int, int, "int | None", bool], TrainingEnv]


@dataclass(frozen=True)
class Simulator:
    """One simulator agents may train on: one row of :data:`SIMULATORS`."""

    name: str  # train.simulator's value, the logs' word for it
    title: str  # how the doctor and the logs say it in a sentence
    doc: str
    in_process: bool  # its sites are arrays stepped in the trainer's process: no workers, the trainer's threads
    make: MakeEnv
    unmodelled: Callable[[Config, Site], str | None]  # why it cannot model the site (None: it can)
    physics: Callable[[Any], SiteModel] | None = None  # from a CityLearnEnv of the whole period; None: the reference
    # Copies of the site from its start (all of its period, or its first steps) reporting each step's import CO2, for
    # what only chooses (judging_env); None: a row that judges nothing.
    judge: Callable[[Config, Site, int, int | None], JudgingEnv] | None = None

    def training_env(self, cfg: Config, site: Site, n_envs: int, subprocesses: bool = False) -> TrainingEnv:
        """``n_envs`` training environments in the training episode's random windows of ``site``."""
        return self.make(cfg, site, n_envs, cfg.seed, cfg.scenario.train_episode_days * 24, subprocesses)


def _vector_env(cfg: Config, site: Site, n_envs: int, seed: int, episode_steps: int | None,
                subprocesses: bool) -> TrainingEnv:
    from trainer.sim.vec_env import SimVecEnv  # lazy: reading the site steps CityLearn through its period

    return SimVecEnv(cfg, site, n_envs, seed, episode_steps=episode_steps)


def _vector_judge(cfg: Config, site: Site, n_envs: int, steps: int | None) -> JudgingEnv:
    from trainer.sim.vec_env import SimVecEnv  # lazy: reading the site steps CityLearn through its period

    return SimVecEnv(cfg, site, n_envs, cfg.seed, episode_steps=steps, from_start=True)


def _vector_unmodelled(cfg: Config, site: Site) -> str | None:
    def ask() -> str | None:
        env = make_citylearn_env(cfg, site, "eval", cfg.seed)
        try:
            return unsupported_reason(env)
        finally:
            env.close()

    return site.remember("unmodelled by the training simulator", ask)


def _citylearn_env(cfg: Config, site: Site, n_envs: int, seed: int, episode_steps: int | None,
                   subprocesses: bool) -> TrainingEnv:
    return make_training_vec_env(cfg, site, seed, n_envs, subprocesses)


VECTOR = Simulator("vector", "the training simulator", "many copies of the site as numpy arrays in one process "
                             "(docs/simulator.md)", True, _vector_env, _vector_unmodelled, SiteTables.read,
                  _vector_judge)
CITYLEARN = Simulator("citylearn", "CityLearn", "CityLearn itself, one environment per worker process", False,
                      _citylearn_env, lambda cfg, site: None)

# In the order train.simulator: auto prefers them: the first that models the site.
SIMULATORS: dict[str, Simulator] = {row.name: row for row in (VECTOR, CITYLEARN)}


def simulator_for(cfg: Config, site: Site) -> Simulator:
    """What ``train.simulator`` gives on ``site``: the row it names (a UsageError where that row cannot model the
    site), or with ``auto`` the first row that can."""
    choice = cfg.train.simulator
    rows = list(SIMULATORS.values()) if choice == "auto" else [SIMULATORS[choice]]
    passed = []
    for row in rows:
        reason = row.unmodelled(cfg, site)
        if reason is None:
            if passed:
                logs.get().info(f"training on {row.title}: {passed[0][0].title} does not model this dataset",
                                reason=passed[0][1])
            return row
        passed.append((row, reason))
    row, reason = passed[0]
    raise UsageError(f"train.simulator is {choice}, but {row.title} does not model this dataset: {reason}; set "
                     "train.simulator: auto (CityLearn where it must) or citylearn")


def simulator_check(cfg: Config, site: Site) -> Check:
    """The doctor's line: what agents will train on (``train.simulator``), and why where it is not the first row."""
    choice = cfg.train.simulator
    try:
        row = simulator_for(cfg, site)
    except UsageError:
        named = SIMULATORS[choice]
        return Check("simulator", FAIL, f"train.simulator is {named.name}, but {named.title} does not model this "
                                        f"dataset: {named.unmodelled(cfg, site)}", "set train.simulator: auto or "
                                                                                   "citylearn")
    rows = list(SIMULATORS.values())
    skipped = rows[:rows.index(row)] if choice == "auto" else []  # the rows before it, which do not model the site
    if skipped:
        return Check("simulator", PASS, f"agents train on {row.title}: {skipped[0].title} does not model this "
                                        f"dataset ({skipped[0].unmodelled(cfg, site)})")
    detail = f"agents train on {row.title} (train.simulator: {choice})"
    if row.in_process:
        detail += "; evaluation runs in CityLearn"
    preferred = next(r for r in rows if r.unmodelled(cfg, site) is None)  # the last row models every site
    if preferred is not row:
        detail += f"; {preferred.title} models this dataset: train.simulator: auto uses it"
    return Check("simulator", PASS, detail)


def judging_env(cfg: Config, site: Site, n_envs: int, steps: int | None = None) -> JudgingEnv:
    """``n_envs`` copies of ``site``'s whole period (or its first ``steps``, as an evaluation's ``eval_days``) from
    its start, stepped in process, reporting each step's import CO2: the first in-process row that models the site.
    Unsupported where none does."""
    for row in SIMULATORS.values():
        if row.judge is not None and row.unmodelled(cfg, site) is None:
            return row.judge(cfg, site, n_envs, steps)
    raise Unsupported("no in-process simulator models this dataset")


def chooses_on_simulator(cfg: Config, site: Site) -> bool:
    """Whether the night's choices on ``site`` (the learning curve behind the policy deployed, the pick's
    confirmation over held-out years, the ensemble's labels) run on the training simulator rather than CityLearn:
    ``train.choose_on`` auto, agents training on it (``train.simulator`` not citylearn: a user who trains in CityLearn
    chooses there too, and no site is read into the simulator for it alone), a site it steps as CityLearn does (its
    kind's ``simulated_exactly``) and models. A step of it takes 3.1 ms on 2 cores where CityLearn's takes 4.0, and
    it steps a few policies side by side in one run where CityLearn runs each apart; the figures are the same to
    float roundings (2e-8 of a year's CO2, docs/simulator.md), and CityLearn still makes every figure reported."""
    return (cfg.train.choose_on == "auto" and cfg.train.simulator != CITYLEARN.name and site.kind.simulated_exactly
            and VECTOR.unmodelled(cfg, site) is None)
