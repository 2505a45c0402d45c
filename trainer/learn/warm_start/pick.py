"""The warm start's pick: of the ensemble's imitations and the network distilled from their mean, the one whose
site emits least CO2 over the held-out years (``warm_start.pick_best``; docs/agent-quality.md).

Imitations from different initial weights fit their demonstrations about equally well and still land several
points apart in closed loop (85-93 % of the optimum's cut on one seed), and each lands in the same place on
every year of the site: a member's rank over the held-out years is its rank over the evaluation year. So the
held-out years tell which start is better, and the agent starts from that one.

The candidates run side by side on the training simulator, which steps the site as CityLearn does (the guard
as configured, imports x carbon intensity as trainer.judge.metrics counts them): about a minute for SAC's six over
two years on 2 cores, most of it their networks' calls, where CityLearn would take ~20 s a year for each. It
only chooses; CityLearn still evaluates the warm start and the agent for everything reported.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np

from trainer.base import logs
from trainer.base.signals import STOP
from trainer.config.sections import Config
from trainer.learn.warm_start.cloning import weights_digest
from trainer.references.controllers import Actor
from trainer.sim.simulators import judging_env
from trainer.sim.site import Unsupported
from trainer.site import Site

_PICKED: dict[str, np.ndarray] = {}  # each candidate's CO2 by the candidates' digest (a process's few stages)


def co2_over_the_years(cfg: Config, years: list[Site], policies: list[Any], steps: int | None = None) -> np.ndarray:
    """kg CO2 each policy's site imports over ``years`` together (each year's first ``steps``, None: all of it),
    every policy acting deterministically from the start of each year's period; Unsupported where the simulator does
    not model a year's dataset."""
    totals = np.zeros(len(policies))
    for year in years:
        env = judging_env(cfg, year, len(policies), steps)
        try:
            totals += co2_over(env, policies)
        finally:
            env.close()
    return totals


def co2_over(env: Any, policies: list[Any]) -> np.ndarray:
    """kg CO2 each policy's copy of a judging ``env`` (trainer.sim.simulators.judging_env: a copy a policy) imports
    over one episode from its start."""
    totals = np.zeros(len(policies))
    actors = [Actor(policy) for policy in policies]
    observations = env.reset()
    done = False
    while not done:
        STOP.check("a run on the training simulator")
        actions = np.concatenate([act(observations[i:i + 1]) for i, act in enumerate(actors)])
        observations, _, dones, _ = env.step(actions)
        totals += env.step_import_co2
        done = bool(dones.all())  # every candidate's episode is the whole period: they end together
    return totals


def per_year(year: Site, steps: int | None = None) -> float:
    """What scales kg over ``year``'s first ``steps`` (None: all of it) to kg a year, as an evaluation counts it
    (a window of N steps is N - 1 steps long: trainer.judge.metrics)."""
    length = year.length if steps is None else min(steps, year.length)
    return 365 * year.steps_per_day / max(length - 1, 1)


def co2_per_year(cfg: Config, year: Site, policies: list[Any], steps: int | None = None) -> np.ndarray:
    """:func:`co2_over_the_years` over one year, in kg a year."""
    return co2_over_the_years(cfg, [year], policies, steps) * per_year(year, steps)


def pick_the_best(cfg: Config, agent: str, model: Any, members: list[Any], years: list[Site]) -> dict[str, Any] | None:
    """Leave in ``model`` whichever of its own policy (the distilled mean) and ``members`` (policies of the same
    architecture) emits least CO2 over ``years``; what results.json records of the choice, or None where there is
    nothing to choose by (no held-out year, or a dataset the simulator does not model)."""
    log = logs.get().bind(agent=agent)
    if not years:
        return None
    candidates = [model.policy, *members]
    # A night's PPO and A2C share their imitations (cloning.imitate_once): the second picks alike
    # without running them again.
    parts = [cfg.digest(), *(str(year.schema) for year in years), *(weights_digest(p, 0.0) for p in candidates)]
    key = hashlib.sha256(" ".join(parts).encode()).hexdigest()
    started = time.perf_counter()
    if key not in _PICKED:
        if len(_PICKED) >= 2:
            del _PICKED[next(iter(_PICKED))]
        try:
            _PICKED[key] = co2_over_the_years(cfg, years, candidates)
        except Unsupported as exc:
            log.info("warm start: no pick among the imitations (the training simulator does not model this site)",
                     reason=str(exc))
            return None
    co2 = _PICKED[key]
    best = int(np.argmin(co2))  # a tie keeps the distilled mean: it comes first
    if best > 0:
        model.policy.load_state_dict(members[best - 1].state_dict())
    chosen = "the distilled mean" if best == 0 else f"member {best}"
    mean_year = [round(float(c) / len(years), 1) for c in co2]  # the distilled mean first, then each member
    log.info(f"warm start: {chosen} emits least CO2 over the held-out years", co2_kg=mean_year, years=len(years),
             seconds=round(time.perf_counter() - started, 1))
    # member: 0 for the distilled mean, else which member (1-based, as the log and members_actor_mse count them)
    return {"member": best, "held_out_co2_kg": mean_year}
