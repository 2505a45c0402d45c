"""Training one agent so that a night survives crashes, kills, out-of-memory and Ctrl+C.

The loop, in one place (:meth:`StageTrainer.train`):

1. preflight: refuse a replay buffer that cannot fit in RAM; back off a batch that cannot
   fit in free memory before trying it;
2. start fresh, or resume from the newest valid checkpoint (config checked);
3. ``model.learn``; on out-of-memory or a non-finite loss, leave the except block, free
   memory, restore the last checkpoint, halve the batch (or lower the learning rate) and go on;
4. a stop signal saves a checkpoint at the last consistent point and ends the stage.

Checkpoints are taken at rollout starts, after the learner's update: there the parameters,
optimizers, replay buffer, counters and RNG states agree with each other. See
docs/reliability.md for what each promise means and the test that backs it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from trainer import logs
from trainer.agents import algorithm, build_model, fit_rollout, hyperparameters, training_envs
from trainer.imitation import warm_start
from trainer.checkpoint import Checkpoint, CheckpointStore, capture_rng, restore_rng
from trainer.config import Config
from trainer.errors import TrainerError, UsageError
from trainer.env import make_sb3_env, make_training_vec_env
from trainer.fast_sac import TrainWhileStepping
from trainer.memory import (
    Shapes, available_bytes, batch_bytes, free_memory, host_available_bytes, is_out_of_memory,
    memory_figures, replay_buffer_bytes,
)
from trainer.signals import STOP

GIB = 1024**3


class NonFiniteError(RuntimeError):
    """A loss or parameter became NaN or infinite."""


class StageFailed(TrainerError):
    """The stage cannot go on (below the batch floor, too many non-finite rollbacks)."""


class TrainingInterrupted(TrainerError):
    """A stop signal: the checkpoint is saved and the stage ended early."""

    def __init__(self, signal_name: str, exit_code: int, step: int, checkpoint: Path | None):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        self.exit_code = exit_code
        saved = f"checkpoint at step {step} in {checkpoint}" if checkpoint else "no checkpoint could be saved"
        super().__init__(f"stopped by {signal_name}: {saved}")


def config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Key paths whose values differ, with both values."""
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(config_diff(a, b, f"{path}."))
        elif a != b:
            diffs.append(f"{path} ({a!r} -> {b!r})")
    return diffs


def check_resume_config(run_dir: Path, agent: str, cfg: Config, force: bool) -> None:
    """Refuse, before anything is written, to resume with a config that differs from the checkpoint's."""
    checkpoint = CheckpointStore(run_dir / agent / "checkpoints", keep=1).latest()
    if checkpoint is None or checkpoint.state.get("config_digest") == cfg.digest():
        return
    diffs = config_diff(checkpoint.state.get("config", {}), cfg.to_dict())
    if force:
        logs.get().warning("config changed since the checkpoint; resuming anyway (--force)", agent=agent, changes=diffs)
        return
    raise UsageError(f"the config changed since the checkpoint at step {checkpoint.step}: {'; '.join(diffs)}; "
                     "resume with the same config, or pass --force to resume with the new one")


def check_memory(ctx, agent: str) -> None:
    """Refuse, before the night starts, a replay buffer that cannot fit in RAM."""
    if agent != "sac":
        return
    env = make_sb3_env(ctx.cfg, ctx.schema, "train", ctx.cfg.seed)
    try:
        shapes = Shapes(env.observation_space.shape[0], env.action_space.shape[0], tuple(ctx.cfg.sac.net_arch))
    finally:
        env.close()
    buffer_size = ctx.cfg.sac.buffer_size
    need, have = replay_buffer_bytes(shapes, buffer_size), host_available_bytes()
    if need > have:
        per = replay_buffer_bytes(shapes, 1)
        raise UsageError(
            f"sac.buffer_size={buffer_size:,} needs {need / GIB:.1f} GiB of RAM for the replay buffer "
            f"but {have / GIB:.1f} GiB is available; set sac.buffer_size to at most {int(have * 0.8 // per):,}")


class Guard(BaseCallback):
    """Checkpoints at rollout boundaries, stop requests and non-finite checks.

    Also follows each environment's episode (index, and whether it is at its start) from the
    ``dones`` of every step, so a checkpoint can say where each parallel environment resumes.
    """

    def __init__(self, trainer: "StageTrainer"):
        super().__init__()
        self.trainer = trainer
        self.boundary: dict[str, Any] | None = None
        self._started = False

    def _on_training_start(self) -> None:
        self._started = False
        self.trainer.read_episodes()  # learn() has just reset the environments

    def _on_rollout_start(self) -> None:
        if self._started:
            self.trainer.check_finite(self.model)
        self._started = True
        due = self.num_timesteps - self.trainer.last_checkpoint_step >= self.trainer.section.checkpoint_freq_steps
        if due and hasattr(self.model, "run_pending_training"):
            self.model.run_pending_training()  # the checkpoint holds the update SB3 would have made by now
        self.boundary = self.trainer.boundary(self.model)
        if due:
            self.trainer.checkpoint(self.model, self.boundary)

    def _on_step(self) -> bool:
        dones = self.locals.get("dones")
        if dones is not None:
            self.trainer.count_episodes(dones)
        time_up = self.trainer.time_limit_at is not None and time.monotonic() >= self.trainer.time_limit_at
        if STOP.requested or time_up:
            # Nothing has been learned since the rollout began, so that boundary is consistent (SAC
            # learning while stepping has applied the update due at the boundary: docs/reliability.md).
            if self.boundary is not None and self.boundary["step"] > self.trainer.last_checkpoint_step:
                self.trainer.checkpoint(self.model, self.boundary)
            if STOP.requested:
                self.trainer.stopped = True
            else:
                self.trainer.timed_out = True
                logs.get().info("time slot used up", agent=self.trainer.agent, step=self.boundary["step"],
                                target=self.trainer.target)
            return False
        return True


class StageTrainer:
    """Train one agent to ``target`` environment steps in one run folder."""

    def __init__(self, ctx, agent: str, target: int, callbacks: list | None = None, time_limit_s: float | None = None):
        self.ctx = ctx
        self.cfg: Config = ctx.cfg
        self.agent = agent
        self.target = target
        self.section = self.cfg.agent(agent)
        self.rel = self.cfg.reliability
        self.folder = ctx.run.agent(agent)
        self.store = CheckpointStore(self.folder.checkpoints, self.rel.keep_checkpoints)
        self.n_envs = training_envs(self.section)
        params = fit_rollout(hyperparameters(self.section, self.n_envs), target, self.n_envs)
        self.batch_size: int | None = params.get("batch_size")
        self.n_steps: int | None = params.get("n_steps")
        if self.n_steps is not None and self.n_steps * self.n_envs != self.section.n_steps:
            logs.get().warning("rollout shortened to fit the run", agent=agent, n_steps=self.n_steps * self.n_envs,
                               configured=self.section.n_steps)
        self.learning_rate = float(self.section.learning_rate)
        self.nonfinite_rollbacks = 0
        self.backoffs: list[dict[str, Any]] = []
        self.last_checkpoint_step = 0
        self.last_checkpoint: Checkpoint | None = None
        self.stopped = False
        self.timed_out = False
        self.time_limit_at = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.extra_callbacks = callbacks or []
        self.log = logs.get().bind(agent=agent)
        self.env = None
        self.episodes: list[int] = []
        self.episode_starts: list[bool] = []
        self.shapes: Shapes | None = None
        self.warm_start: dict[str, Any] | None = None
        self._sb3_logger = None

    # ------------------------------------------------------------------ the loop

    def train(self, resume: bool = False, force: bool = False):
        """Train to the target; returns the model. Raises TrainingInterrupted on a stop signal."""
        from trainer.device import apply_cpu_threads

        threads = apply_cpu_threads(self.cfg, self.agent)
        self.log.info("torch threads", cpu_threads=threads)
        self.env = self.make_env()
        self.shapes = Shapes(self.env.observation_space.shape[0], self.env.action_space.shape[0], tuple(self.section.net_arch))
        self.preflight()
        checkpoint = self.store.latest() if resume else None
        if resume and checkpoint is None:
            self.log.warning("no valid checkpoint to resume from", folder=str(self.folder.checkpoints), action="starting fresh")
        if checkpoint is not None:
            check_resume_config(self.ctx.run.root, self.agent, self.cfg, force)
            self._keep_previous_progress(checkpoint.step)
            model = self.load(checkpoint, adopt_state=True)
            self.log.info("resuming", step=checkpoint.step, checkpoint=str(checkpoint.path), target=self.target)
        else:
            model = self.fresh_model()
        fresh = checkpoint is None
        while True:
            failure = None
            try:
                self.learn(model, reset=fresh)
                break
            except NonFiniteError as exc:
                failure = ("nonfinite", str(exc))
            except Exception as exc:  # noqa: BLE001 - classified below; anything else re-raised
                if not is_out_of_memory(exc):
                    raise
                failure = ("oom", f"{type(exc).__name__}: {str(exc)[:300]}")
            # Outside the except block: the failed step's frames and tensors can now be freed.
            step = model.num_timesteps
            model = None
            free_memory(self.ctx.device)
            model, fresh = self.recover(failure, step)
        if self.stopped:
            raise TrainingInterrupted(STOP.name, STOP.exit_code, self.last_checkpoint_step,
                                      self.last_checkpoint.path if self.last_checkpoint else None)
        if self.timed_out:
            model.num_timesteps = self.last_checkpoint_step  # steps after the boundary were not learned from
        elif model.num_timesteps > self.last_checkpoint_step:
            self.checkpoint(model, self.boundary(model, True))
        return model

    def make_env(self):
        """The training environments: parallel for PPO and A2C, in a worker for SAC learning while stepping."""
        overlap = self.agent == "sac" and self.cfg.sac.learn_while_stepping
        env = make_training_vec_env(self.cfg, self.ctx.schema, self.cfg.seed, self.n_envs,
                                    subprocesses=self.n_envs > 1 or overlap)
        from stable_baselines3.common.vec_env import SubprocVecEnv

        self.log.info("training environments", n_envs=self.n_envs, workers=isinstance(env, SubprocVecEnv),
                      learn_while_stepping=overlap and isinstance(env, SubprocVecEnv))
        return TrainWhileStepping(env) if overlap and isinstance(env, SubprocVecEnv) else env

    def _attach(self, model):
        if isinstance(self.env, TrainWhileStepping):
            self.env.attach(model)
        return model

    def learn(self, model, reset: bool) -> None:
        from trainer.callbacks import ProgressCallback

        remaining = self.target - model.num_timesteps
        if remaining <= 0:
            return
        from trainer.callbacks import EvalCurve

        curve = EvalCurve(self.ctx, self.agent, self.folder.root / "eval_curve.csv")
        callbacks = [ProgressCallback(self.agent, self.target), Guard(self), curve, *self.extra_callbacks]
        model.learn(total_timesteps=remaining, callback=callbacks, log_interval=self.section.log_interval,
                    reset_num_timesteps=reset)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()

    # ------------------------------------------------------------------ models

    def sb3_logger(self):
        """One SB3 logger per stage: configuring another would truncate progress.csv."""
        if self._sb3_logger is None:
            from stable_baselines3.common.logger import configure

            self._sb3_logger = configure(str(self.folder.root), _logger_formats(self.cfg))
        return self._sb3_logger

    def fresh_model(self):
        model = build_model(self.cfg, self.agent, self.env, self.ctx.device, self.cfg.seed, self.target)
        self.warm_start = warm_start(self.cfg, self.ctx.schema, self.agent, model)
        model.set_logger(self.sb3_logger())
        self.apply_sizes(model)
        self.last_checkpoint_step = 0
        return self._attach(model)

    def load(self, checkpoint: Checkpoint, adopt_state: bool):
        model = algorithm(self.agent).load(str(checkpoint.model), env=self.env, device=self.ctx.device)
        if checkpoint.replay_buffer is not None:
            model.load_replay_buffer(str(checkpoint.replay_buffer))
        state = checkpoint.state
        model.num_timesteps = int(state["step"])
        if adopt_state:
            self.batch_size = state.get("batch_size", self.batch_size)
            if state.get("n_envs", 1) == self.n_envs:
                self.n_steps = state.get("n_steps", self.n_steps)
            else:
                self.log.warning("parallel environments changed since the checkpoint: rollout from the config",
                                 checkpoint_n_envs=state.get("n_envs", 1), n_envs=self.n_envs)
            self.learning_rate = float(state.get("learning_rate", self.learning_rate))
            self.nonfinite_rollbacks = int(state.get("nonfinite_rollbacks", 0))
            self.backoffs = list(state.get("backoffs", []))
            self.store.failures = int(state.get("checkpoint_write_failures", 0))
        self.apply_sizes(model)
        # load() re-seeds every generator from the model's seed: put the saved states back.
        restore_rng(model, checkpoint.rng())
        self.set_next_episodes(state)
        model.set_logger(self.sb3_logger())
        self.last_checkpoint_step = checkpoint.step
        self.last_checkpoint = checkpoint
        return self._attach(model)

    def apply_sizes(self, model) -> None:
        if self.batch_size is not None and hasattr(model, "batch_size"):
            model.batch_size = self.batch_size
        if self.n_steps is not None and getattr(model, "n_steps", None) != self.n_steps:
            model.n_steps = self.n_steps
            model.rollout_buffer = model.rollout_buffer_class(
                model.n_steps, model.observation_space, model.action_space, device=model.device,
                gamma=model.gamma, gae_lambda=model.gae_lambda, n_envs=model.n_envs, **model.rollout_buffer_kwargs)
        if model.learning_rate != self.learning_rate:
            model.learning_rate = self.learning_rate
            model._setup_lr_schedule()

    # ------------------------------------------------------------------ checkpoints

    def read_episodes(self) -> None:
        """Each environment's episode, just after a reset."""
        self.episodes = [int(i) for i in self.env.env_method("episode_index")]
        self.episode_starts = [True] * len(self.episodes)

    def count_episodes(self, dones) -> None:
        """After a step: an environment that finished an episode has reset into the next one."""
        for i, done in enumerate(dones):
            self.episodes[i] += int(bool(done))
            self.episode_starts[i] = bool(done)

    def set_next_episodes(self, state: dict[str, Any]) -> None:
        """Resume each environment at its interrupted episode's successor (or that episode, if at its start)."""
        indices = state.get("episode_indices", [state["episode_index"]])
        starts = state.get("at_episode_starts", [state["at_episode_start"]])
        for i in range(self.n_envs):
            index, start = (indices[i], starts[i]) if i < len(indices) else (max(indices, default=-1) + 1, True)
            self.env.env_method("set_next_episode", index if start else index + 1, indices=[i])

    def boundary(self, model, at_episode_start: bool | None = None) -> dict[str, Any]:
        if not self.episodes:  # learn() never ran in this process
            self.read_episodes()
        starts = self.episode_starts if at_episode_start is None else [at_episode_start] * len(self.episodes)
        return {"step": int(model.num_timesteps), "rng": capture_rng(model),
                "episode_indices": list(self.episodes), "at_episode_starts": list(starts)}

    def checkpoint(self, model, boundary: dict[str, Any] | None) -> None:
        if boundary is None:
            return
        state = {
            "agent": self.agent, "step": boundary["step"], "target": self.target,
            "episode_indices": boundary["episode_indices"], "at_episode_starts": boundary["at_episode_starts"],
            "episode_index": boundary["episode_indices"][0], "at_episode_start": boundary["at_episode_starts"][0],
            "n_envs": self.n_envs,
            "batch_size": self.batch_size, "n_steps": self.n_steps, "learning_rate": self.learning_rate,
            "nonfinite_rollbacks": self.nonfinite_rollbacks, "backoffs": self.backoffs,
            "checkpoint_write_failures": self.store.failures,
            "config_digest": self.cfg.digest(), "config": self.cfg.to_dict(), "saved_at": time.time(),
        }
        saved = self.store.save(model, state, boundary["rng"], with_replay_buffer=hasattr(model, "replay_buffer"))
        self.last_checkpoint_step = boundary["step"]
        if saved is not None:
            self.last_checkpoint = saved

    # ------------------------------------------------------------------ failures

    def check_finite(self, model) -> None:
        import torch

        for key, value in model.logger.name_to_value.items():
            if "loss" in key and not math.isfinite(float(value)):
                raise NonFiniteError(f"{key} is {value} at step {model.num_timesteps}")
        tensors = [t.detach() for t in model.policy.parameters()]
        if getattr(model, "log_ent_coef", None) is not None:
            tensors.append(model.log_ent_coef.detach())
        # One multi-tensor norm instead of a check per tensor (this runs at every SAC step): a NaN or
        # inf anywhere makes its tensor's norm non-finite, and so does a weight past 1e19 (diverged).
        norms = torch.stack(torch._foreach_norm(tensors))
        if not bool(torch.isfinite(norms).all()):
            raise NonFiniteError(f"a parameter became non-finite at step {model.num_timesteps}")

    def recover(self, failure: tuple[str, str], step: int):
        kind, detail = failure
        if kind == "oom":
            self.back_off(step, detail, in_training=True)
        else:
            self.nonfinite_rollbacks += 1
            if self.nonfinite_rollbacks > self.rel.nonfinite_retries:
                raise StageFailed(f"{self.agent}: {detail}; still non-finite after {self.rel.nonfinite_retries} rollbacks "
                                  f"(learning rate now {self.learning_rate:g}); the last checkpoint is intact at "
                                  f"{self._last_path()}; lower {self.agent}.learning_rate or check the reward scale")
            old = self.learning_rate
            self.learning_rate = old * self.rel.nonfinite_lr_factor
            self.log.warning("non-finite values: rolling back", step=step, detail=detail, old_learning_rate=old,
                             new_learning_rate=self.learning_rate, rollback=self.nonfinite_rollbacks)
        checkpoint = self.store.latest()
        if checkpoint is None:
            self.log.info("no checkpoint yet: restarting the stage", step=step)
            return self.fresh_model(), True
        return self.load(checkpoint, adopt_state=False), False

    def back_off(self, step: int, detail: str, in_training: bool) -> None:
        """Halve the batch (A2C: the rollout); stop below the floor."""
        field = "batch_size" if self.batch_size is not None else "n_steps"
        old = getattr(self, field)
        new = old // 2
        if new < self.rel.min_batch_size:
            raise StageFailed(
                f"{self.agent}: out of memory with {field}={old} on {self.ctx.device} ({detail}); halving would go below "
                f"reliability.min_batch_size={self.rel.min_batch_size}; the last checkpoint is intact at {self._last_path()}; "
                f"use a smaller {self.agent}.net_arch or free memory on the device")
        setattr(self, field, new)
        event = {"step": step, "field": field, "old": old, "new": new, "device": self.ctx.device,
                 "cause": detail, "in_training": in_training, **memory_figures(self.ctx.device)}
        self.backoffs.append(event)
        self.log.warning("out of memory: batch size backed off", **event)

    def preflight(self) -> None:
        """Refuse what cannot fit in RAM (again: memory may have gone); back off a batch that cannot fit."""
        assert self.shapes is not None
        check_memory(self.ctx, self.agent)
        budget = available_bytes(self.ctx.device) * self.rel.batch_memory_fraction
        while True:
            size = self.batch_size if self.batch_size is not None else self.n_steps
            need = batch_bytes(self.agent, int(size), self.shapes)
            if need <= budget or size // 2 < self.rel.min_batch_size:
                break
            self.back_off(0, f"a batch of {size:,} needs ~{need / GIB:.1f} GiB, over the "
                             f"{self.rel.batch_memory_fraction:.0%} of free memory allowed ({budget / GIB:.1f} GiB)",
                          in_training=False)

    def _last_path(self) -> str:
        return str(self.last_checkpoint.path) if self.last_checkpoint else "(none saved yet)"

    def _keep_previous_progress(self, step: int) -> None:
        """SB3's CSV logger truncates progress.csv: keep the curve of the run before a resume."""
        if step > 0 and self.folder.progress.is_file():
            self.folder.progress.rename(self.folder.root / f"progress.before-{step:010d}.csv")

    def summary(self, model) -> dict[str, Any]:
        return {"checkpoint_write_failures": self.store.failures, "oom_backoffs": len(self.backoffs),
                "nonfinite_rollbacks": self.nonfinite_rollbacks, "final_batch_size": self.batch_size,
                "final_n_steps": self.n_steps, "final_learning_rate": self.learning_rate, "warm_start": self.warm_start}


def _logger_formats(cfg: Config) -> list[str]:
    formats = ["csv"]
    if cfg.output.tensorboard:
        try:
            import tensorboard  # noqa: F401  (optional extra: pvbess-trainer[tensorboard])

            formats.append("tensorboard")
        except ImportError:
            pass
    return formats
