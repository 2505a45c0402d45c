"""One benchmark measurement, run in a process of its own: forked from a server that imported only the libraries
both sides use (trainer.benchmark.measure.TRIAL_PRELOAD), or where there is no forkserver a fresh interpreter
(``python -m trainer.benchmark.trial SPEC``).

Each trial times one side (the plain SB3 recipe or the product) in a process of its own, so peak
RSS belongs to it alone and nothing warmed up by one side helps the other.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np
import psutil
from stable_baselines3.common.callbacks import BaseCallback

from trainer.base import logs
from trainer.benchmark.spec import Sizes, Trial, TrialKind
from trainer.config.agents import OffPolicyConfig
from trainer.config.roster import agent_spec
from trainer.config.sections import Config
from trainer.env.citylearn import make_citylearn_env, make_sb3_env
from trainer.judge.metrics import run_episode
from trainer.references.controllers import PolicyController
from trainer.run.device import apply_gpu_flags, resolve_agent
from trainer.run.folder import RunContext, RunDir
from trainer.run.session import training_timesteps
from trainer.sim.simulators import CITYLEARN, VECTOR, simulator_for
from trainer.site import Site

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.vec_env import VecEnv


# Rounds of the imitation's minibatches timed, each with its critic and without in turn (the fastest of each kept).
IMITATION_ROUNDS = 3


def _peak_rss_mb() -> dict[str, float | None]:
    """Peak resident memory of this process (Linux and macOS; Windows has no getrusage)."""
    try:
        import resource  # POSIX only
    except ImportError:
        return {"peak_rss_mb": None}
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 1024 / 1024  # ru_maxrss: KiB on Linux, bytes on macOS
    return {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, 1)}


def _tree_pss_mb() -> float | None:
    """Proportional memory of this process and its workers: pages they share (the forkserver's
    preloaded modules) counted once, which RSS, counting them in every process, does not."""

    try:
        procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
        total = 0
        for proc in procs:
            info = proc.memory_full_info()
            total += getattr(info, "pss", info.uss)  # PSS on Linux; USS elsewhere
    except (psutil.Error, OSError):
        return None
    return round(total / 2**20, 1)


class _Stopwatch(BaseCallback):
    """Times environment steps from ``start_at`` to the end of training, and the memory there."""

    def __init__(self, start_at: int):
        super().__init__()
        self.start_at = start_at
        self.t0: float | None = None
        self.t1: float | None = None
        self.n0 = self.n1 = 0
        self.tree_pss_mb: float | None = None

    def _on_step(self) -> bool:
        if self.t0 is None and self.num_timesteps >= self.start_at:
            self.t0, self.n0 = time.perf_counter(), self.num_timesteps
        return True

    def _on_training_end(self) -> None:
        self.t1, self.n1 = time.perf_counter(), self.num_timesteps
        self.tree_pss_mb = _tree_pss_mb()  # the workers are still running here

    def rate(self) -> float:
        if self.t0 is None or self.t1 is None or self.n1 <= self.n0:
            return float("nan")
        return (self.n1 - self.n0) / (self.t1 - self.t0)


def _warmup(agent: str, cfg: Config) -> int:
    """Steps before the stopwatch starts: an off-policy agent's collection without updates, one step otherwise."""
    section = cfg.agent(agent)
    return section.learning_starts + 1 if isinstance(section, OffPolicyConfig) else 1


def _steps(agent: str, sizes: Sizes) -> int:
    return sizes.sac_steps if agent_spec(agent).off_policy else sizes.onpolicy_steps


def _env_rate(env: gymnasium.Env, steps: int) -> float:
    env.reset()
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - start)


def _plain_env(site: Site):
    from citylearn.citylearn import CityLearnEnv  # lazy: CityLearn takes seconds to import
    from citylearn.wrappers import NormalizedObservationWrapper, StableBaselines3Wrapper

    # The site was read by trainer.site.datasets.read_schema, which refuses a class the product does not load.
    return StableBaselines3Wrapper(NormalizedObservationWrapper(CityLearnEnv(str(site.schema), central_agent=True)))


def _update_rate(model: BaseAlgorithm, batch_size: int, updates: int) -> float:
    model.train(gradient_steps=2, batch_size=batch_size)  # warm-up
    start = time.perf_counter()
    model.train(gradient_steps=updates, batch_size=batch_size)
    return updates / (time.perf_counter() - start)


def run_trial(trial: Trial, cfg: Config, site: Site, device: str, sizes: Sizes) -> dict[str, Any]:
    """Measure one trial in this process (called in a fresh child by :func:`measure`)."""

    if trial.kind == TrialKind.ENV_PLAIN:
        env = _plain_env(site)
        return {"steps_per_s": _env_rate(env, sizes.env_steps)}
    if trial.kind == TrialKind.ENV_PRODUCT:
        return {"steps_per_s": _env_rate(make_sb3_env(cfg, site, "train", cfg.seed), sizes.env_steps)}
    if trial.kind in (TrialKind.LEARN_PLAIN, TrialKind.LEARN_PRODUCT):
        return _learn_and_evaluate(trial, cfg, site, device)
    if trial.kind == TrialKind.IMITATION:
        assert trial.agent is not None
        return _imitation_rate(trial.agent, cfg, site, device, sizes)
    if trial.kind == TrialKind.SIMULATOR:
        env = VECTOR.training_env(cfg, site, trial.n_envs)
        return {"steps_per_s": _vec_env_rate(env, max(sizes.env_steps, 50 * trial.n_envs))}
    if trial.kind == TrialKind.SWEEP:
        return {
            "steps_per_s": _vec_env_rate(
                CITYLEARN.training_env(cfg, site, trial.n_envs, trial.n_envs > 1), sizes.env_steps
            )
        }
    agent = trial.agent
    assert agent is not None
    stopwatch = _Stopwatch(_warmup(agent, cfg))
    if trial.kind == TrialKind.PLAIN:
        model, n_envs = _train_plain(agent, _plain_env(site), cfg, device, _steps(agent, sizes), stopwatch,
                                     site), 1
    else:
        # The warm start's length changes what a policy knows, not how fast it then trains (Sizes.imitation_epochs).
        # SAC's first updates of critics alone are cheaper than the rest of its stage: a short trial times the rest.
        brief = cfg.warm_start.model_copy(update={"epochs": min(cfg.warm_start.epochs, sizes.imitation_epochs),
                                                  "extra_draws": 0, "ensemble": 1,
                                                  "sac_critic_updates": 0})
        model, n_envs = _train_product(agent, cfg.model_copy(update={"warm_start": brief}), site, device,
                                       _steps(agent, sizes), stopwatch)
    out: dict[str, Any] = {"steps_per_s": stopwatch.rate(), "n_envs": n_envs, "torch_threads": _threads(),
                           "tree_pss_mb": stopwatch.tree_pss_mb}
    section = cfg.agent(agent)
    if isinstance(section, OffPolicyConfig):
        if hasattr(model, "defer_training"):
            model.defer_training = False  # time the update itself, not its deferral
        out["updates_per_s"] = _update_rate(model, section.batch_size, sizes.sac_updates)
    return out


def _imitation_rate(agent: str, cfg: Config, site: Site, device: str, sizes: Sizes) -> dict[str, Any]:
    """The warm start's imitation of ``agent``'s policy at its speed here: seconds a minibatch as a member fits
    (the actor alone unless ``warm_start.members_fit_critics``) and, timed in turn with it, with its critic as the
    version before fitted every member; then a member's seconds and members a second (``warm_start.epochs`` over the
    period's demonstrations, as the night's plan counts them: trainer.night.plan.warm_start_s)."""
    from trainer.learn.agents import build_model  # lazy: SB3 and torch
    from trainer.learn.warm_start.cloning import imitation_update_s

    apply_gpu_flags(cfg.gpu, device)
    settings = cfg.warm_start
    env = make_sb3_env(cfg, site, "train", cfg.seed)
    timed: dict[bool, list[float]] = {True: [], False: []}
    try:
        model = build_model(cfg, agent, env, device, cfg.seed, 1000)
        for _ in range(IMITATION_ROUNDS):  # in turn: a machine that gets busier mid-trial slows both alike
            for critic in (True, False):
                timed[critic].append(imitation_update_s(model, settings.batch_size, sizes.imitation_updates, critic))
    finally:
        env.close()
    update_s, with_critic_s = min(timed[settings.members_fit_critics]), min(timed[True])
    minibatches = max(settings.epochs, 1) * -(-(site.length - 1) // settings.batch_size)
    return {"update_s": update_s, "member_s": update_s * minibatches, "members_per_s": 1 / (update_s * minibatches),
            "update_with_critic_s": with_critic_s, "members_with_critic_per_s": 1 / (with_critic_s * minibatches),
            "epochs": max(settings.epochs, 1), "minibatches": minibatches, "torch_threads": _threads()}


def _train_plain(agent: str, env: gymnasium.Env, cfg: Config, device: str, steps: int,
                 callback: BaseCallback | None = None, site: Site | None = None) -> BaseAlgorithm:
    """The plain recipe: SB3's own class on one environment, torch's default threads.

    PPO's rollout is the product's whole rollout; A2C's is one of the product's environments' share
    (5 steps of each of 64 sites: 5), since A2C's hyperparameter is its steps per environment per update;
    SAC makes as many gradient steps per environment step as the product (:func:`same_updates_per_step`).
    """
    from trainer.learn.agents import training_envs  # lazy: agents builds SB3 models (torch)

    algo = agent_spec(agent).plain_class()
    share = training_envs(cfg, agent, simulator_for(cfg, site)) if agent == "a2c" and site else 1
    section = cfg.agent(agent)
    params = section.sb3_kwargs(share)
    if isinstance(section, OffPolicyConfig) and site is not None:
        params.update(same_updates_per_step(section, training_envs(cfg, agent, simulator_for(cfg, site))))
    if params.get("normalize_advantage") and params["n_steps"] < 2:
        # One environment's share of a short rollout can be a single step: one advantage has no spread to
        # normalise (SB3 divides by its NaN standard deviation).
        params["normalize_advantage"] = False
    model = algo("MlpPolicy", env, seed=cfg.seed, device=device, verbose=0, **params)
    model.learn(steps, callback=callback)
    return model


def same_updates_per_step(section: OffPolicyConfig, n_envs: int) -> dict[str, int]:
    """The plain recipe's ``train_freq`` and ``gradient_steps`` on one environment for the product's updates per
    environment step: SB3 counts both per step of all ``n_envs`` sites, so SAC's 16 sites with one update a step
    of all 16 are one update every 16 steps, and 16 updates a step of 16 sites are one update a step."""
    rate = Fraction(section.gradient_steps, section.train_freq * n_envs)
    return {"gradient_steps": rate.numerator, "train_freq": rate.denominator}


def _train_product(agent: str, cfg: Config, site: Site, device: str, steps: int,
                   callback: BaseCallback | None = None) -> tuple[BaseAlgorithm, int]:
    """The product: a night's StageTrainer (in a throw-away run folder). Returns (model, n_envs)."""
    from trainer.learn.trainer import StageTrainer  # lazy: SB3 and torch

    apply_gpu_flags(cfg.gpu, device)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = StageTrainer(RunContext(cfg, RunDir(Path(tmp)), site, device), resolve_agent(cfg, agent), steps,
                               callbacks=[callback] if callback else None)
        try:
            return trainer.train(), trainer.n_envs
        finally:
            trainer.close()


class _IgnoreResetSeed(gymnasium.Wrapper):
    """The one fix the plain loop needs to learn at all: CityLearn adopts SB3's reset seed as the seed
    of its episode windows, so every episode would be the same fortnight (see trainer.env.citylearn)."""

    def reset(self, *, seed=None, options=None):
        return self.env.reset(options=options)


def _learn_and_evaluate(trial: Trial, cfg: Config, site: Site, device: str) -> dict[str, Any]:
    """Train ``trial.agent`` for its timesteps with one side, then CO2 kg/year over the evaluation period."""
    # lazy: CityLearn takes seconds to import
    from citylearn.wrappers import NormalizedObservationWrapper, StableBaselines3Wrapper

    agent = trial.agent
    assert agent is not None
    steps = training_timesteps(cfg, agent, site)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if trial.kind == TrialKind.LEARN_PLAIN:
            # The same environment, reward and episode windows as the product; SB3's own loop.
            env = _IgnoreResetSeed(StableBaselines3Wrapper(NormalizedObservationWrapper(
                make_citylearn_env(cfg, site, "train", cfg.seed))))
            model = _train_plain(agent, env, cfg, device, steps, site=site)
        else:
            model, _ = _train_product(agent, cfg, site, device, steps)
        train_s = time.perf_counter() - started
        eval_env = make_sb3_env(cfg, site, "eval", cfg.seed, eval_days=cfg.schedule.eval_days)
        try:
            metrics = run_episode(PolicyController(agent, model), eval_env, Path(tmp) / "timeseries.csv")
        finally:
            eval_env.close()
    return {"co2_kg_per_year": metrics["co2_kg_per_year"], "timesteps": int(model.num_timesteps),
            "ev_departure_soc_met_pct": metrics.get("ev_departure_soc_met_pct"),  # CO2 can fall by not charging
            "train_s": round(train_s, 1), "seed": cfg.seed}


def _vec_env_rate(env: VecEnv, steps: int) -> float:

    try:
        env.reset()
        # a few batches of random actions, drawn before the clock starts, taken in turn
        batches = [np.stack([env.action_space.sample() for _ in range(env.num_envs)]) for _ in range(8)]
        rounds = max(steps // env.num_envs, 1)
        start = time.perf_counter()
        for i in range(rounds):
            env.step(batches[i % len(batches)])
        return rounds * env.num_envs / (time.perf_counter() - start)
    finally:
        env.close()


def _threads() -> int:
    import torch  # lazy: torch takes seconds to import

    return torch.get_num_threads()


def _result(spec_json: str) -> dict[str, Any]:
    spec = json.loads(spec_json)
    cfg = Config.model_validate(json.loads(Path(spec["config"]).read_text(encoding="utf-8")))
    sizes = Sizes(**{**spec["sizes"], "sweep": tuple(spec["sizes"]["sweep"]) if spec["sizes"]["sweep"] else None,
                     "simulator": tuple(spec["sizes"]["simulator"])})
    trial = Trial(**{k: v for k, v in spec["trial"].items() if k != "result"})
    trial.kind = TrialKind(trial.kind)
    result = run_trial(trial, cfg, Site.load(Path(spec["schema"]), fallback=cfg.scenario), spec["device"], sizes)
    result.update(_peak_rss_mb())
    return result


def forked_child(spec_json: str, send: Connection, output: str) -> None:
    """A trial forked from measure()'s server: its output (logs, a traceback) to the parent's file, not to the
    benchmark's console, and its result sent back as JSON."""
    os.environ["CITYLEARN_OFFLINE"] = "1"  # as the fresh interpreter's: a trial never downloads
    with open(output, "w", encoding="utf-8") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    logs.configure()
    send.send(json.dumps(_result(spec_json)))
    send.close()


def _child_main(spec_json: str) -> None:
    logs.configure()  # to stderr, which the parent keeps for an error's last line
    print(json.dumps(_result(spec_json)))


if __name__ == "__main__":  # a child of measure(); the guard also keeps SubprocVecEnv's forkserver safe
    _child_main(sys.argv[1])
