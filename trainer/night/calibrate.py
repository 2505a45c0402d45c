"""This machine's speeds with this config, measured once and cached.

A short calibration measures the evaluation environment's speed, each on-policy agent's (PPO's,
A2C's) training speed over one short rollout, and each off-policy agent's (SAC's) from its
environment step and its gradient-update time measured apart (so a config with 1,024 updates per
step is costed without being run). Results are cached per machine and config in the user's cache folder
(``pvbess-trainer/calibration/``, trainer.base.files.cache_root), not where a command was started.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.base import logs
from trainer.base.files import cache_root, write_json_atomic
from trainer.base.signals import STOP
from trainer.config.agents import OffPolicyConfig
from trainer.config.roster import AGENTS, agent_spec
from trainer.config.sections import Config
from trainer.env.citylearn import make_sb3_env
from trainer.learn.agents import build_model, training_envs
from trainer.learn.warm_start.cloning import imitation_update_s, policy_digest
from trainer.learn.warm_start.fine_tune import time_with_the_term
from trainer.references.controllers import UncontrolledBaseline
from trainer.run.device import agent_device, apply_cpu_threads, others_load
from trainer.sim.simulators import Simulator, simulator_for
from trainer.site import Site

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

CALIBRATION_STEPS = 300
# Each short timing (CityLearn's steps, an imitation's minibatches) is taken in this many parts and their median
# kept: one stall of a busy machine measured once passed for its pace. A busy 20-minute night on the official
# Building_10 (2026-12-02) calibrated CityLearn at 322 steps/s where its evaluations then ran at 830-990, and another's
# members' minibatch at 4.7 ms where they then took 2.8: each plan kept one imitation where the ensemble fitted.
TIMING_PARTS = 3
BUSY_CORES = 0.5  # other work of half a core or more makes a calibration (and a plan from it) a busy machine's
UPDATES_MEASURED = 30  # an off-policy agent's gradient updates timed


@dataclass
class Speeds:
    """Measured on this machine, device and config."""

    eval_steps_per_s: float
    train_steps_per_s: dict[str, float]
    env_steps_per_s: dict[str, float] = field(default_factory=dict)  # off-policy agents: stepping alone
    update_s: dict[str, float] = field(default_factory=dict)  # off-policy agents: one gradient update
    # Warm-started agents and their ensembles' teachers: one imitation minibatch, and one of the actor alone (an
    # ensemble's members and the student's epochs after its critic's; a calibration before it was kept: the first).
    imitation_update_s: dict[str, float] = field(default_factory=dict)
    imitation_actor_update_s: dict[str, float] = field(default_factory=dict)
    # Warm-started agents: their fresh policy's digest (imitation.policy_digest). Agents that share one imitate once
    # a night: a night's PPO and A2C build the same policy, and the second reuses the first's weights.
    imitation_policy: dict[str, str] = field(default_factory=dict)
    measured_at: str = ""
    machine: str = ""
    # Cores' worth of other work while it measured (the load average less this process): a plan from a busy
    # calibration is pessimistic, and says so.
    busy_cores: float = 0.0
    # Cores' worth of other work when the plan was made (not kept in the cache's meaning: each plan measures it).
    busy_now: float = 0.0

    @property
    def busy(self) -> bool:
        return self.busy_cores >= BUSY_CORES

    @property
    def busier_now(self) -> bool:
        """Other work runs now that did not while these speeds were measured: the stages will take longer."""
        return self.busy_now >= BUSY_CORES and self.busy_now > self.busy_cores + BUSY_CORES


def _cache_key(cfg: Config, site: Site, device: str) -> str:
    # Not the training seed: a night per seed (trainer night --seeds) trains as fast under each.
    relevant = {k: cfg.to_dict()[k] for k in ("scenario", *AGENTS, "reward", "gpu", "train", "warm_start")}
    relevant["eval_days"] = cfg.schedule.eval_days
    machine = f"{socket.gethostname()}|{platform.machine()}|{os.cpu_count()}|{device}"
    # A generated site is the same wherever it was generated: key it by its scenario, not its path.
    where = site.scenario.model_dump(mode="json") if site.scenario is not None else str(site.schema)
    blob = json.dumps({"m": machine, "c": relevant, "s": where}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def calibration_folder() -> Path:
    """The calibrations of this machine, by config (a run folder's parent, or the folder a command starts in, would
    collect them wherever runs go)."""
    return cache_root() / "calibration"


def calibrate(cfg: Config, site: Site, device: str, agents: list[str], refresh: bool = False) -> Speeds:
    """Speeds for this machine and config, from the cache when it has them."""
    cache = calibration_folder() / f"{_cache_key(cfg, site, device)}.json"
    cached = _read_cache(cache) if not refresh else None
    busy_now = others_load()
    if cached is not None and cached.busy and busy_now < BUSY_CORES:
        logs.get().info("the cached calibration was measured while other work ran; the machine is quiet now: "
                        "measuring again", path=str(cache), busy_cores=round(cached.busy_cores, 1))
        cached = None
    if cached is not None and all(a in cached.train_steps_per_s for a in agents):
        cached.busy_now = round(busy_now, 2)
        logs.get().info("calibration from cache", path=str(cache), busy_cores_now=cached.busy_now)
        return cached
    log = logs.get()
    log.info("calibrating: measuring each agent on this machine (under a minute; later plans read the cache)",
             agents=agents, steps=CALIBRATION_STEPS, device=device)
    speeds = Speeds(eval_steps_per_s=_eval_speed(cfg, site), train_steps_per_s={},
                    measured_at=datetime.now().isoformat(timespec="seconds"),
                    machine=f"{socket.gethostname()} ({os.cpu_count()} CPUs, {device})", busy_cores=busy_now,
                    busy_now=busy_now)
    simulator = simulator_for(cfg, site)  # the night's stages train on what calibration measures
    for agent in agents:
        STOP.check("calibration")
        apply_cpu_threads(cfg, agent, simulator.in_process)  # as the stage will
        section = cfg.agent(agent)
        if isinstance(section, OffPolicyConfig):
            n_envs = training_envs(cfg, agent, simulator)
            env_rate, update_s = _off_policy_speed(cfg, site, agent, agent_device(cfg, agent), simulator, n_envs)
            speeds.env_steps_per_s[agent], speeds.update_s[agent] = env_rate, update_s
            # SB3 takes gradient_steps updates every train_freq steps of all n_envs sites together.
            update = update_s * section.gradient_steps / (section.train_freq * n_envs)
            # Learning while stepping (a CityLearn worker) hides the environment's step behind the update,
            # but not the action choice and the bookkeeping around it: count half of the step, to be safe.
            overlap = not simulator.in_process and section.learns_while_stepping
            per_step = update + (0.5 if overlap else 1.0) / env_rate
            speeds.train_steps_per_s[agent] = 1 / per_step
        else:
            speeds.train_steps_per_s[agent] = _onpolicy_speed(cfg, site, agent_device(cfg, agent), agent,
                                                              simulator)
        if cfg.warm_start.epochs > 0 and agent_spec(agent).warm_start:
            (speeds.imitation_update_s[agent], speeds.imitation_actor_update_s[agent],
             speeds.imitation_policy[agent]) = _imitation_speed(cfg, site, agent, agent_device(cfg, agent), simulator)
        log.info("calibrated", agent=agent, steps_per_s=round(speeds.train_steps_per_s[agent], 2))
    # An ensemble's members are the teacher's policy, imitated at its speed where it does not train tonight.
    if cfg.warm_start.epochs > 0 and cfg.warm_start.ensemble > 1:
        for teacher in sorted({cfg.warm_start.teacher_of(a) for a in agents if agent_spec(a).warm_start}):
            if teacher not in speeds.imitation_update_s:
                apply_cpu_threads(cfg, teacher, simulator.in_process)
                (speeds.imitation_update_s[teacher], speeds.imitation_actor_update_s[teacher],
                 speeds.imitation_policy[teacher]) = _imitation_speed(cfg, site, teacher, agent_device(cfg, teacher),
                                                                      simulator)
    speeds.busy_cores = round(max(speeds.busy_cores, others_load()), 2)
    if speeds.busy:
        log.warning("calibrated while other work ran: the plan may give less than the machine gives when quiet",
                    busy_cores=speeds.busy_cores, fix="trainer plan --refresh on a quiet machine measures again")
    write_json_atomic(cache, asdict(speeds))  # a kill mid-write leaves the old cache or none, never half
    return speeds


def _read_cache(cache: Path) -> Speeds | None:
    """The cached speeds; None (measure again) when the file is missing or unreadable."""
    if not cache.is_file():
        return None
    try:
        return Speeds(**json.loads(cache.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as exc:
        logs.get().warning("calibration cache unreadable: measuring again", path=str(cache), error=str(exc))
        return None


def _eval_speed(cfg: Config, site: Site) -> float:
    env = make_sb3_env(cfg, site, "eval", cfg.seed, eval_days=max(CALIBRATION_STEPS // 24 + 1, 1))
    controller = UncontrolledBaseline()
    try:
        obs, _ = env.reset()
        rates, steps, done = [], 0, False
        for part in range(TIMING_PARTS):
            start, until = time.perf_counter(), CALIBRATION_STEPS * (part + 1) // TIMING_PARTS
            first = steps
            while not done and steps < until:
                STOP.check("calibration")
                obs, _, terminated, truncated, _ = env.step(controller.act(obs, env.unwrapped))
                steps += 1
                done = terminated or truncated
            if steps > first:
                rates.append((steps - first) / (time.perf_counter() - start))
        return statistics.median(rates)
    finally:
        env.close()


def _quiet(model: BaseAlgorithm, folder: str) -> BaseAlgorithm:
    from stable_baselines3.common.logger import configure  # lazy: SB3 imports torch

    model.set_logger(configure(folder, []))
    return model


def _onpolicy_speed(cfg: Config, site: Site, device: str, agent: str, simulator: Simulator) -> float:
    # At least one whole rollout, so the update's cost is in the figure (on CityLearn at most 1,000 steps;
    # the simulator steps a rollout in a fraction of a second).
    rollout = cfg.agent(agent).n_steps
    steps = max(CALIBRATION_STEPS, rollout) if simulator.in_process else min(max(CALIBRATION_STEPS, rollout), 1000)
    n_envs = training_envs(cfg, agent, simulator)
    env = simulator.training_env(cfg, site, n_envs, subprocesses=n_envs > 1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = _quiet(build_model(cfg, agent, env, device, cfg.seed, steps), tmp)
            time_with_the_term(cfg, agent, model)
            start = time.perf_counter()
            model.learn(steps)
            return model.num_timesteps / (time.perf_counter() - start)
    finally:
        env.close()


def _imitation_speed(cfg: Config, site: Site, agent: str, device: str,
                     simulator: Simulator) -> tuple[float, float, str]:
    """Seconds one minibatch of the warm start's imitation takes (trainer.learn.warm_start), its critic fitted too
    and the actor alone, and the digest of the policy it starts from."""
    env = simulator.training_env(cfg, site, 1)
    try:
        model = build_model(cfg, agent, env, device, cfg.seed, CALIBRATION_STEPS)
        digest = policy_digest(model)  # before the timing trains it
        batch = cfg.warm_start.batch_size
        return (imitation_update_s(model, batch, repeats=TIMING_PARTS),
                imitation_update_s(model, batch, critic=False, repeats=TIMING_PARTS), digest)
    finally:
        env.close()


def _off_policy_speed(cfg: Config, site: Site, agent: str, device: str, simulator: Simulator,
                      n_envs: int) -> tuple[float, float]:
    """(environment steps/s without updates, seconds per gradient update at the configured batch)."""
    env = simulator.training_env(cfg, site, n_envs)
    steps = max(CALIBRATION_STEPS, 20 * n_envs)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            calibration_cfg = cfg.model_copy(deep=True)
            section = calibration_cfg.agent(agent)
            section.learning_starts = steps + n_envs  # collect only
            section.buffer_size = min(section.buffer_size, steps * 2)
            model = _quiet(build_model(calibration_cfg, agent, env, device, cfg.seed, steps), tmp)
            start = time.perf_counter()
            model.learn(steps)
            env_rate = model.num_timesteps / (time.perf_counter() - start)
            batch = min(section.batch_size, 1 << 16)  # a batch backed off before training is never larger
            model.train(gradient_steps=2, batch_size=batch)  # warm-up
            start = time.perf_counter()
            model.train(gradient_steps=UPDATES_MEASURED, batch_size=batch)
            update_s = (time.perf_counter() - start) / UPDATES_MEASURED
            return env_rate, update_s
    finally:
        env.close()


