"""The plan before the night: measured speeds, the timeline, and configs that cannot fit.

A short calibration measures this machine and device with this config: the evaluation
environment's speed, PPO's and A2C's training speed over one short rollout, and SAC's
speed from its environment step and its gradient-update time measured apart (so a config
with 1,024 updates per step is costed without being run). Results are cached per machine
and config under ``<output.root>/.calibration/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from trainer import logs
from trainer.config import REFERENCES, Config
from trainer.env import _schema_length, make_sb3_env, make_training_vec_env
from trainer.timing import PlannedStage, StageSpec, timeline

CALIBRATION_STEPS = 300
SAC_UPDATES_MEASURED = 30
REPORT_S = 20.0
OPTIMUM_SOLVE_S = 10.0  # a year of the built-in site solves in ~1-2 s on 2 cores; padded for larger sites
# Estimates are padded so the night ends by the deadline even when a stage runs a little slow.
SAFETY = 1.15


@dataclass
class Speeds:
    """Measured on this machine, device and config."""

    eval_steps_per_s: float
    train_steps_per_s: dict[str, float]
    sac_env_steps_per_s: float | None = None
    sac_update_s: float | None = None
    measured_at: str = ""
    machine: str = ""


def _cache_key(cfg: Config, schema: Path, device: str) -> str:
    relevant = {k: cfg.to_dict()[k] for k in ("scenario", "sac", "ppo", "a2c", "reward", "seed", "gpu")}
    relevant["eval_days"] = cfg.schedule.eval_days
    machine = f"{socket.gethostname()}|{platform.machine()}|{os.cpu_count()}|{device}"
    # The built-in site is the same wherever it was generated: key it by its config, not its path.
    builtin = "pvbess_site" in json.loads(schema.read_text(encoding="utf-8"))
    blob = json.dumps({"m": machine, "c": relevant, "s": "builtin" if builtin else str(schema)}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def calibrate(cfg: Config, schema: Path, device: str, agents: list[str], refresh: bool = False) -> Speeds:
    """Speeds for this machine and config, from the cache when it has them."""
    cache = Path(cfg.output.root) / ".calibration" / f"{_cache_key(cfg, schema, device)}.json"
    if cache.is_file() and not refresh:
        speeds = Speeds(**json.loads(cache.read_text()))
        if all(a in speeds.train_steps_per_s for a in agents):
            logs.get().info("calibration from cache", path=str(cache))
            return speeds
    log = logs.get()
    log.info("calibrating", agents=agents, steps=CALIBRATION_STEPS, device=device)
    speeds = Speeds(eval_steps_per_s=_eval_speed(cfg, schema), train_steps_per_s={},
                    measured_at=datetime.now().isoformat(timespec="seconds"),
                    machine=f"{socket.gethostname()} ({os.cpu_count()} CPUs, {device})")
    from trainer.device import apply_cpu_threads

    for agent in agents:
        apply_cpu_threads(cfg, agent)  # as the stage will
        if agent == "sac":
            env_rate, update_s = _sac_speed(cfg, schema, device)
            speeds.sac_env_steps_per_s, speeds.sac_update_s = env_rate, update_s
            update = update_s * cfg.sac.gradient_steps / cfg.sac.train_freq
            # Learning while stepping hides the environment's step behind the update, but not the
            # action choice and the bookkeeping around it: count half of the step, to be safe.
            per_step = update + (0.5 if cfg.sac.learn_while_stepping else 1.0) / env_rate
            speeds.train_steps_per_s["sac"] = 1 / per_step
        else:
            speeds.train_steps_per_s[agent] = _onpolicy_speed(cfg, schema, device, agent)
        log.info("calibrated", agent=agent, steps_per_s=round(speeds.train_steps_per_s[agent], 2))
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(asdict(speeds), indent=2))
    return speeds


def _eval_speed(cfg: Config, schema: Path) -> float:
    from trainer.controllers import UncontrolledBaseline

    env = make_sb3_env(cfg, schema, "eval", cfg.seed, eval_days=max(CALIBRATION_STEPS // 24 + 1, 1))
    controller = UncontrolledBaseline()
    try:
        obs, _ = env.reset()
        start, steps, done = time.perf_counter(), 0, False
        while not done and steps < CALIBRATION_STEPS:
            obs, _, terminated, truncated, _ = env.step(controller.act(obs, env.unwrapped))
            steps += 1
            done = terminated or truncated
        return steps / (time.perf_counter() - start)
    finally:
        env.close()


def _quiet(model, folder: str):
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(folder, []))
    return model


def _onpolicy_speed(cfg: Config, schema: Path, device: str, agent: str) -> float:
    from trainer.agents import build_model

    # At least one whole rollout, so the update's cost is in the figure (at most 1,000 steps).
    from trainer.agents import training_envs

    steps = min(max(CALIBRATION_STEPS, cfg.agent(agent).n_steps), 1000)
    n_envs = training_envs(cfg.agent(agent))
    env = make_training_vec_env(cfg, schema, cfg.seed, n_envs, subprocesses=n_envs > 1)  # as the night will
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = _quiet(build_model(cfg, agent, env, device, cfg.seed, steps), tmp)
            start = time.perf_counter()
            model.learn(steps)
            return model.num_timesteps / (time.perf_counter() - start)
    finally:
        env.close()


def _sac_speed(cfg: Config, schema: Path, device: str) -> tuple[float, float]:
    """(environment steps/s without updates, seconds per gradient update at the configured batch)."""
    from trainer.agents import build_model

    env = make_sb3_env(cfg, schema, "train", cfg.seed)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            calibration_cfg = cfg.model_copy(deep=True)
            calibration_cfg.sac.learning_starts = CALIBRATION_STEPS + 1  # collect only
            calibration_cfg.sac.buffer_size = min(cfg.sac.buffer_size, CALIBRATION_STEPS * 2)
            model = _quiet(build_model(calibration_cfg, "sac", env, device, cfg.seed, CALIBRATION_STEPS), tmp)
            start = time.perf_counter()
            model.learn(CALIBRATION_STEPS)
            env_rate = model.num_timesteps / (time.perf_counter() - start)
            batch = min(cfg.sac.batch_size, 1 << 16)  # a batch backed off before training is never larger
            model.train(gradient_steps=2, batch_size=batch)  # warm-up
            start = time.perf_counter()
            model.train(gradient_steps=SAC_UPDATES_MEASURED, batch_size=batch)
            update_s = (time.perf_counter() - start) / SAC_UPDATES_MEASURED
            return env_rate, update_s
    finally:
        env.close()


def stage_specs(cfg: Config, schema: Path, speeds: Speeds, agents: list[str], targets: dict[str, int]) -> dict[str, StageSpec]:
    """What the planner knows of each stage (evaluation times padded by SAFETY)."""
    eval_steps = _schema_length(schema) - 1 if cfg.schedule.eval_days is None else min(
        cfg.schedule.eval_days * 24, _schema_length(schema)) - 1
    eval_s = eval_steps / speeds.eval_steps_per_s * SAFETY
    # A trained policy adds its forward pass to every evaluation step.
    policy_eval_s = eval_s * 1.25
    # The optimum solves a linear program (about a second for a year of one building) before its replay.
    specs = {"baseline": StageSpec("baseline", "eval", eval_s), "rbc": StageSpec("rbc", "eval", eval_s * 1.1),
             "optimum": StageSpec("optimum", "eval", eval_s * 1.1 + OPTIMUM_SOLVE_S),
             "report": StageSpec("report", "report", REPORT_S)}
    for agent in agents:
        specs[agent] = StageSpec(agent, "train", policy_eval_s, float(cfg.schedule.weights.get(agent, 1.0)),
                                 targets[agent], speeds.train_steps_per_s[agent] / SAFETY)
    return specs


def fit_warnings(cfg: Config, speeds: Speeds, planned: list[PlannedStage]) -> list[str]:
    """Stages that cannot reach their target in their slot, with the numbers and what would fit."""
    notes = []
    for stage in planned:
        if stage.target_steps <= 0 or stage.planned_steps >= stage.target_steps:
            continue
        agent = stage.name
        rate = speeds.train_steps_per_s[agent]
        note = (f"{agent}: {human_duration(stage.train_s)} at ~{rate:.3g} steps/s reaches ~{stage.planned_steps:,} of its "
                f"{stage.target_steps:,} timesteps")
        if agent == "sac" and speeds.sac_update_s is not None and cfg.sac.gradient_steps / cfg.sac.train_freq > 1:
            updates = cfg.sac.gradient_steps / cfg.sac.train_freq
            cost = updates * speeds.sac_update_s
            note += (f"; gradient_steps={cfg.sac.gradient_steps} / train_freq={cfg.sac.train_freq} = {updates:g} gradient "
                     f"updates per environment step at ~{speeds.sac_update_s * 1000:.1f} ms each = {cost:.2f} s per step")
            fit_rate = 1 / (1 / speeds.sac_env_steps_per_s + speeds.sac_update_s)
            note += (f"; with gradient_steps=1, train_freq=1 it would do ~{fit_rate:.0f} steps/s, "
                     f"~{int(fit_rate * stage.train_s):,} steps in the same slot")
        else:
            note += f"; to finish, set {agent}.timesteps to {stage.planned_steps:,} or give the night more time"
        notes.append(note)
    return notes


def human_duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def render(planned: list[PlannedStage], deadline: datetime | None, notes: list[str], speeds: Speeds) -> str:
    lines = [f"plan ({speeds.machine}; speeds measured {speeds.measured_at})"]
    for stage in planned:
        what = f"train {stage.planned_steps:,}/{stage.target_steps:,} steps + evaluate" if stage.target_steps else (
            "write the report" if stage.name == "report" else "evaluate")
        lines.append(f"  {stage.start:%a %H:%M}  {stage.name:<8} {what:<40} done {stage.end:%H:%M}")
    if deadline is not None:
        end = planned[-1].end if planned else datetime.now()
        lines.append(f"  deadline {deadline:%a %H:%M}; planned end {end:%a %H:%M}")
    for note in notes:
        lines.append(f"  ! {note}")
    return "\n".join(lines)


def build_plan(cfg: Config, schema: Path, speeds: Speeds, agents: list[str], targets: dict[str, int],
               start: datetime, deadline: datetime | None) -> tuple[list[PlannedStage], list[str]]:
    specs = stage_specs(cfg, schema, speeds, agents, targets)
    order = [*REFERENCES, *agents, "report"]
    available = (deadline - start).total_seconds() if deadline else None
    planned = timeline([specs[n] for n in order], start, available)
    return planned, fit_warnings(cfg, speeds, planned)


def summary(speeds: Speeds) -> dict[str, Any]:
    return asdict(speeds)
