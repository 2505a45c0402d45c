"""The optimum's dispatch replayed as demonstrations: over the dataset's period and, where the site draws
other years, over those too.

A year's replay is a year of CityLearn (half a minute on 2 cores, a minute on a busy one), and it depends only on the
data, the period, the seed and the settings that shape the site and its observations: never on the agents. So it is
computed once a process for a key of exactly those, and kept in the machine's cache
(``trainer.base.files.cache_root() / "demonstrations"``) for later runs: a second night on the same site, each trial
of ``trainer tune`` and each Ray worker read it instead of replaying again. ``warm_start.reuse_demonstrations:
false`` turns the kept copy off. The optimum reference's run over the part a night learns from is that replay
already (:func:`adopt_replay`). They stay in CityLearn: the training simulator steps one copy of a site no faster
(docs/benchmarks.md, "The warm start's demonstrations").
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

import numpy as np

from trainer.base import logs
from trainer.base.beside import beside, in_turn
from trainer.base.durations import TimeBox
from trainer.base.files import cache_root, write_bytes_atomic
from trainer.base.source import program_digest
from trainer.config.sections import Config
from trainer.env.citylearn import make_sb3_env
from trainer.references.optimum import OptimumReplay
from trainer.references.optimum_model import OptimumUnavailable, site_model
from trainer.references.physics import solve_in_physics
from trainer.run.device import free_cores_now
from trainer.site import Site
from trainer.site.bootstrap import Variation
from trainer.site.scenario import DRAW_SEED_OFFSET


@dataclass(frozen=True)
class Demonstrations:
    observations: np.ndarray  # (steps, observation size), float32
    actions: np.ndarray  # (steps, action size) in the agents' [-1, 1] space
    rewards: np.ndarray  # (steps,) the product's reward for each step
    seconds: float
    periods: tuple[int, ...] = ()  # steps of each period, in order (the dataset's, then each draw's); () = one
    replay_s: float = 0.0  # what replaying them cost: measured here, or when a kept copy was replayed

    @property
    def period_steps(self) -> int:
        """Steps of the dataset's own period (an epoch of imitation draws this many samples)."""
        return self.periods[0] if self.periods else len(self.actions)

    def returns(self, gamma: float) -> np.ndarray:
        """Discounted return from each step to its period's end (what a critic of this policy should say)."""
        out = np.empty(len(self.rewards), dtype=np.float64)
        ends = set(np.cumsum(self.periods).tolist()) if self.periods else set()
        running = 0.0
        for t in range(len(self.rewards) - 1, -1, -1):
            if t + 1 in ends:
                running = 0.0
            running = self.rewards[t] + gamma * running
            out[t] = running
        return out.astype(np.float32)

    @classmethod
    def joined(cls, parts: list[Demonstrations]) -> Demonstrations:
        return cls(np.concatenate([p.observations for p in parts]), np.concatenate([p.actions for p in parts]),
                   np.concatenate([p.rewards for p in parts]), sum(p.seconds for p in parts),
                   tuple(len(p.actions) for p in parts), sum(p.replay_s for p in parts))


_CACHE: dict[str, Demonstrations] = {}
_UNAVAILABLE: dict[str, str] = {}  # why not, for a dataset the optimum does not model

FORMAT = 1  # bump when what is kept changes
# The most of a timed warm start's slot its other years' replays may take: the imitation needs the rest.
DEMONSTRATIONS_SHARE = 0.5
KEEP = 24  # replays kept in the machine's cache (a year is ~2 MB); the least recently used go first
# The settings a replay reads: the site's (a built-in site's data is its scenario, and its content is keyed too), the
# reward recorded with each step, the guard that shapes each action and what the policy observes.
SECTIONS = ("seed", "scenario", "reward", "ev", "observations")


def cache_folder() -> Path:
    return cache_root() / "demonstrations"


def demonstrations_key(cfg: Config, site: Site, seed: int) -> str:
    """What a replay depends on, as one digest: the data and period (by content, so each run folder's copy of a draw
    and another folder's copy of the dataset are one), the part it is scaled as, the seed, the settings in
    SECTIONS and the program."""
    settings = cfg.to_dict()
    scaled = site.scaled_as
    parts = {
        "format": FORMAT, "program": program_digest(), "seed": seed,
        "settings": {name: settings[name] for name in SECTIONS},
        "site": [site.content_digest(), site.start, site.end],
        "scaled_as": None if scaled is None else [scaled.content_digest(), scaled.start, scaled.end],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def demonstrations(cfg: Config, site: Site, seed: int) -> Demonstrations:
    """The optimum's dispatch over the dataset's whole period, replayed: what the agent would have seen and done."""
    # A period of the dataset (the imitation's, without its validation part) is other demonstrations, and a part
    # read as another site's is scaled as there.
    key = demonstrations_key(cfg, site, seed)
    if key in _CACHE:
        return _CACHE[key]
    if key in _UNAVAILABLE:
        raise OptimumUnavailable(_UNAVAILABLE[key])
    kept = _recall(key) if cfg.warm_start.reuse_demonstrations else None
    if kept is not None:
        _CACHE[key] = kept
        return kept
    started = time.perf_counter()
    try:
        observations, actions, rewards = _replay(cfg, site, seed)
    except OptimumUnavailable as exc:
        _UNAVAILABLE[key] = str(exc)
        raise
    seconds = time.perf_counter() - started
    return _keep(cfg, key, observations, actions, rewards, seconds, seconds)


def adopt_replay(cfg: Config, site: Site, seed: int, trajectory: list[tuple[np.ndarray, np.ndarray, float]],
                 seconds: float) -> bool:
    """Keep the optimum's run over ``site`` that a reference evaluation made (trainer.judge.metrics.run_episode's
    ``trajectory``: the same environment and plan as :func:`demonstrations` replays, so the same arrays) as its
    demonstrations, for this process and later ones: the night's first warm start then replays no year of the data
    it learns from. Only a whole period's run, and only where there is a warm start; True where it was kept."""
    if cfg.warm_start.epochs <= 0 or len(trajectory) != site.length - 1:
        return False
    observations, actions, rewards = zip(*trajectory)
    _keep(cfg, demonstrations_key(cfg, site, seed), observations, actions, rewards, 0.0, seconds)
    return True


def _keep(cfg: Config, key: str, observations: Sequence[np.ndarray], actions: Sequence[np.ndarray],
          rewards: Sequence[float], seconds: float, replay_s: float) -> Demonstrations:
    """A replay's steps as demonstrations, kept in this process and (``warm_start.reuse_demonstrations``) the
    machine's cache under ``key``."""
    result = Demonstrations(np.asarray(observations, dtype=np.float32),
                            np.clip(np.asarray(actions, dtype=np.float32), -1.0, 1.0),
                            np.asarray(rewards, dtype=np.float32), seconds, replay_s=replay_s)
    _CACHE[key] = result
    if cfg.warm_start.reuse_demonstrations:
        _remember(key, result)
    return result


Steps = tuple[list[np.ndarray], list[np.ndarray], list[float]]  # each step's observation, action and reward


def _replay(cfg: Config, site: Site, seed: int) -> Steps:
    """The optimum's plan (the one that holds in CityLearn's curves, as the reference replays) stepped through
    CityLearn: a year of the built-in site is ~29 s of a core, about twice that beside another process."""
    env = make_sb3_env(cfg, site, "eval", seed)
    try:
        env.reset()
        model = site_model(env.unwrapped, cfg.ev.margin_soc)
        replay = OptimumReplay(solve_in_physics(model).plan, model.sessions)
        obs, _ = env.reset()
        observations, actions, rewards, done = [], [], [], False
        while not done:
            action = replay.act(obs, env.unwrapped)
            observations.append(obs)
            actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            done = terminated or truncated
    finally:
        env.close()
    return observations, actions, rewards


def _recall(key: str) -> Demonstrations | None:
    """A replay an earlier process kept under ``key``, or None: none kept, or a damaged one (removed, replayed)."""
    path = cache_folder() / f"{key}.npz"
    started = time.perf_counter()
    try:
        with np.load(path, allow_pickle=False) as kept:
            replayed_s = float(kept["seconds"])
            # Its seconds are this process's (reading it): what the stage spent on its demonstrations.
            result = Demonstrations(kept["observations"], kept["actions"], kept["rewards"],
                                    time.perf_counter() - started, replay_s=replayed_s)
        if not (len(result.observations) == len(result.actions) == len(result.rewards) > 0):
            raise ValueError("its arrays differ in length")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # cut short, a disk error: replay
        logs.get().warning("kept demonstrations not reused: replaying the optimum again", path=str(path),
                           reason=str(exc))
        path.unlink(missing_ok=True)
        return None
    os.utime(path)  # recently used: kept longest
    logs.get().info("demonstrations reused", steps=len(result.actions), replayed_in_s=round(replayed_s, 1),
                    read_in_s=round(result.seconds, 2))
    return result


def _remember(key: str, result: Demonstrations) -> None:
    """Keep a replay for later processes; a full or read-only cache costs only the reuse, never the stage."""
    buffer = io.BytesIO()
    np.savez(buffer, observations=result.observations, actions=result.actions, rewards=result.rewards,
             seconds=np.float64(result.replay_s))
    try:
        write_bytes_atomic(cache_folder() / f"{key}.npz", buffer.getvalue())
        kept = sorted(cache_folder().glob("*.npz"), key=lambda p: p.stat().st_mtime)
        for old in kept[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        logs.get().warning("demonstrations not kept for later runs", folder=str(cache_folder()), reason=str(exc))


def training_demonstrations(cfg: Config, site: Site, seed: int, draws: Path | None, box: TimeBox | None = None,
                            replayed_only: bool = False) -> Demonstrations:
    """The dataset's demonstrations and those of ``warm_start.extra_draws`` other years of it (the built-in site's
    climate drawn again, a dataset's own days resampled; built once under ``draws``; None: the dataset's alone).

    One year's demonstrations are a single trajectory: a policy fitted to them drifts off it in closed loop, and how
    far depends on its initialisation (measured: SAC's imitation of one year reached 85.8-91.9 % of the optimum's cut
    over three seeds; with three more years 91.2-93.7 %; docs/agent-quality.md).

    A warm start in a ``box`` (a timed night's slot) takes the other years, in order, only while their replays fit
    DEMONSTRATIONS_SHARE of it, so that its imitation and its stage's learning keep the rest: on a busy machine four
    years' replays outlasted a whole 132 s slot and the agent trained 0 steps. ``replayed_only``: the dataset's year and
    the years after it already replayed (what the stage's warm start imitated: its fine-tuning stays near those).
    """
    years = demonstration_years(cfg, site, draws)
    # Cores free for a process beside this one, looked at once (a quarter of a second), and only where a year is
    # still to replay: the years' replays share them (_replays), and the years a slot affords are counted as they
    # will run (_years_in_time).
    any_to_replay = len(years) > 1 and not replayed_only and not all(_replayed(cfg, year, seed) for year in years)
    free = free_cores_now() if any_to_replay else 1
    if replayed_only:
        years = years[:1] + list(takewhile(lambda year: _replayed(cfg, year, seed), years[1:]))
    elif box is not None and box.until is not None and len(years) > 1:
        years = _years_in_time(cfg, years, seed, box, free)
    parts = _replays(cfg, years, seed, free)
    return parts[0] if len(parts) == 1 else Demonstrations.joined(parts)


def _years_in_time(cfg: Config, years: list[Site], seed: int, box: TimeBox, free: int) -> list[Site]:
    """The dataset's year (always) and the next years, in order, while those still to replay fit their share of
    ``box``: each costs what the dataset's replay cost (measured now, or when it was kept), and those this process
    replays one after another are counted as :func:`_replays` runs them (trainer.base.beside.in_turn: the later half
    beside it where ``free`` cores allow, as the night's plan counts them); one already replayed costs nothing."""
    budget = (box.left_s() or 0.0) * DEMONSTRATIONS_SHARE
    started = time.perf_counter()
    own = demonstrations(cfg, years[0], seed)
    a_year_s = own.replay_s * years[1].length / max(years[0].length, 1)
    chosen, to_replay, before_s = years[:1], 0, time.perf_counter() - started
    for year in years[1:]:
        if not _replayed(cfg, year, seed):
            if before_s + a_year_s * in_turn(to_replay + 1, year.length, free) > budget:
                logs.get().info("warm start: fewer years imitated, to fit its time", years=len(chosen),
                                of=len(years), a_year_s=round(a_year_s, 1), share_s=round(budget, 1))
                break
            to_replay += 1
        chosen.append(year)
    return chosen


def _replays(cfg: Config, years: list[Site], seed: int, free: int) -> list[Demonstrations]:
    """Each year's :func:`demonstrations`. A year's replay is a core's pure Python: where two or more are still to
    replay (none in this process or the machine's cache) and ``free`` cores leave one for it, the later half replay
    in a process beside this one (the same arrays: the replay is deterministic) and are kept here as if replayed
    here."""
    todo = [year for year in years if not _replayed(cfg, year, seed)]
    later = todo[in_turn(len(todo), todo[-1].length, free):] if todo else []
    if not later:
        return [demonstrations(cfg, year, seed) for year in years]
    pending = beside(_replay_all, cfg, later, seed, free=free)
    try:
        here = {id(year): demonstrations(cfg, year, seed) for year in years if year not in later}
        there = dict(zip(map(id, later), pending.result("the warm start's demonstrations")))
    finally:
        pending.cancel()
    for year in later:
        _CACHE[demonstrations_key(cfg, year, seed)] = there[id(year)]
    return [(here | there)[id(year)] for year in years]


def _replay_all(cfg: Config, years: list[Site], seed: int) -> list[Demonstrations]:
    return [demonstrations(cfg, year, seed) for year in years]


def _replayed(cfg: Config, year: Site, seed: int) -> bool:
    """Whether ``year``'s replay is in this process or (reused) in the machine's cache: nothing to replay."""
    key = demonstrations_key(cfg, year, seed)
    return key in _CACHE or (cfg.warm_start.reuse_demonstrations and (cache_folder() / f"{key}.npz").is_file())


def demonstration_years(cfg: Config, site: Site, draws: Path | None) -> list[Site]:
    """The years the warm start learns from: the dataset and, where its kind draws other years,
    ``warm_start.extra_draws`` of them, built once under ``draws`` (a dataset's resampled ones varied as
    ``warm_start.draw_load_scale`` and ``draw_solar_scale`` say)."""
    years = [site]
    if draws is not None and site.kind.draws:
        varied = Variation.of(cfg.warm_start)
        years += [site.draw(draws / f"draw-{k + 1}", DRAW_SEED_OFFSET + k, varied)
                  for k in range(site.demonstration_draws(cfg.warm_start))]
    return years
