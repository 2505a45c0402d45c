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

import time
from typing import TYPE_CHECKING, Any

from trainer.base import logs
from trainer.base.durations import TimeBox
from trainer.base.signals import STOP
from trainer.config.agents import AgentConfig
from trainer.config.roster import Agent
from trainer.config.sections import Config
from trainer.learn.agents import (
    apply_sizes,
    build_model,
    fit_rollout,
    save_model_atomic,
    sb3_logger,
    training_envs,
)
from trainer.learn.checkpoint_store import Checkpoint
from trainer.learn.memory import Shapes, free_memory
from trainer.learn.preflight import check_memory, check_resume_config
from trainer.learn.recovery import Failure, OutOfMemory, Recovery, TrainingInterrupted, failure_of
from trainer.learn.selection import BestPolicy, held_out_years, shortlist_size
from trainer.learn.stage_checkpoints import StageCheckpoints
from trainer.learn.state import EpisodeTracker, Sizes, StopReason
from trainer.learn.warm_start import keep_near_demonstrations, warm_start
from trainer.learn.warm_start.saved import SavedImitations
from trainer.learn.warm_start.validation import learning_part
from trainer.run.device import apply_cpu_threads, follows_free_cores
from trainer.run.folder import AgentDir
from trainer.sim.simulators import Simulator, simulator_for
from trainer.site import Site

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.vec_env import VecEnv

    from trainer.run.folder import RunContext


class StageTrainer:
    """Train one agent to ``target`` environment steps in one run folder."""

    def __init__(self, ctx: RunContext, handle: Agent, target: int, callbacks: list | None = None,
                 time_limit_s: float | None = None, warm_start_s: float | None = None, later: tuple[str, ...] = (),
                 floor: tuple[int, float] | None = None, flat_ends: bool = True, decay_steps: int | None = None,
                 spare_s: float = 0.0):
        agent = handle.name
        self.ctx, self.cfg, self.handle, self.agent, self.target = ctx, ctx.cfg, handle, agent, target
        # The steps its learning rate falls over (learning_rate_end), held at its end after: a night's last stage
        # learning on past its target (StageJob.past_target) learns to the target as it would have stopped there.
        self.decay_share = 1.0 if decay_steps is None else min(max(decay_steps / target, 0.0), 1.0)
        self.section = handle.section
        self.rel = self.cfg.reliability
        self.folder = ctx.run.agent(agent)
        self.imitations = SavedImitations(ctx.run.imitations)  # the warm start's, kept for the run's other processes
        self.simulator = simulator_for(self.cfg, ctx.site)
        self.n_envs = training_envs(self.cfg, agent, self.simulator)
        self.sizes = initial_sizes(self.section, agent, target, self.n_envs)
        self.device = handle.device
        self.recovery = Recovery(agent, self.device, self.rel, self.sizes)
        self.checkpoints = StageCheckpoints(self.cfg, agent, target, self.folder, self.sizes, self.n_envs)
        self.stopped_by: StopReason | None = None
        self.time_limit_at = None if time_limit_s is None else time.monotonic() + time_limit_s
        # Past decay_steps (learning on past its target) it stops spare_s before time_limit_at: the night's time left
        # after it has evaluations to run.
        self.past_target = None if decay_steps is None or decay_steps >= target or self.time_limit_at is None \
            else (decay_steps, self.time_limit_at - spare_s)
        # Short of floor's steps at its slot's end, it learns on to them until floor's seconds from now at most.
        self.floor_steps, self.floor_until = (0, None) if floor is None else (floor[0], time.monotonic() + floor[1])
        self.warm_start_limit_s = warm_start_s  # from the stage's start; its box is opened when the stage starts
        self.later = later  # the night's training stages after this one, one after another (their students)
        self.started_at = time.monotonic()
        self.extra_callbacks = callbacks or []
        self.log = logs.get().bind(agent=agent)
        self.env: VecEnv | None = None
        self.episodes: EpisodeTracker | None = None
        self.warm_start: dict[str, Any] | None = None
        self.warm_start_s = 0.0  # the stage's own time in its warm start (demonstrations it computed, imitation)
        self.best = (BestPolicy(self.folder, self.cfg.ev.target_met_pct, shortlist_size(self.cfg, ctx.site))
                     if self.cfg.train.keep_best else None)
        # With keep_best the stage ends once its curve is flat this long (train.patience): the best seen deploys, and
        # the time saved goes to the stages after it. ``flat_ends`` False: a timed night's last stage, whose time
        # nothing after it could use, learns on to its slot's end or its target.
        self.patience_steps = int(self.cfg.train.patience * target) if self.best is not None and flat_ends else None
        self.ended_flat = False  # ended by a flat curve, before its target
        self.curve = self._sb3_logger = None

    @property
    def timed_out(self) -> bool:
        return self.stopped_by is StopReason.TIME_UP

    def train(self, resume: bool = False, force: bool = False) -> BaseAlgorithm:
        """Train to the target; returns the model. Raises TrainingInterrupted on a stop signal."""
        self.log.info("torch threads", cpu_threads=apply_cpu_threads(self.cfg, self.agent, self.simulator.in_process))
        # Trained on the part the selection does not validate on (a dataset's last days are its validation part).
        self.env = training_env(self.cfg, learning_part(self.ctx.site), self.agent, self.n_envs, self.simulator)
        self.episodes = EpisodeTracker(self.env)
        check_memory(self.cfg, self.ctx.site, self.agent)  # again: memory may have gone since the night began
        self.recovery.fit_batch(Shapes(self.env.observation_space.shape[0], self.env.action_space.shape[0],
                                       self.section.layers))
        checkpoint = self.checkpoints.store.latest() if resume else None
        if resume and checkpoint is None:
            kept = " (its warm start loads the imitations the run kept)" if self.imitations.holds_any() else ""
            self.log.warning("no valid checkpoint to resume from", folder=str(self.folder.checkpoints),
                             action=f"starting fresh{kept}")
        if checkpoint is not None:
            check_resume_config(self.ctx.run.root, self.agent, self.cfg, force)
            keep_previous_progress(self.folder, checkpoint.step)
            model = self._load(checkpoint, adopt_state=True)
            self.log.info("resuming", step=checkpoint.step, checkpoint=str(checkpoint.path), target=self.target)
        else:
            model = self._fresh_model()
        fresh = checkpoint is None
        while True:
            try:
                self._learn(model, reset=fresh)
                break
            except Exception as exc:  # out of memory or a non-finite loss is recovered below; the rest re-raised
                failure = failure_of(exc)
                if failure is None:
                    raise
            # Outside the except block: the failed step's frames and tensors can now be freed.
            step = model.num_timesteps
            model = None
            free_memory(self.device)
            model, fresh = self._recover(failure, step)
        if self.stopped_by is StopReason.SIGNAL:
            raise TrainingInterrupted(STOP.name, STOP.exit_code, *self.checkpoints.last_point)
        if self.timed_out:  # steps after the boundary were not learned from
            model.num_timesteps = self.checkpoints.last_checkpoint_step
        elif model.num_timesteps > self.checkpoints.last_checkpoint_step:
            self.checkpoints.save_checkpoint(model, self.episodes.boundary(model, True))
        if self.curve is not None:  # the last policy is a candidate too, also where the time slot ended the stage
            self.curve.finish(model)
        return model

    def close(self) -> None:
        if self.curve is not None:
            self.curve.close()
        if self.env is not None:
            self.env.close()

    # ------------------------------------------------------------------ models

    def _learn(self, model: BaseAlgorithm, reset: bool) -> None:
        remaining = self.target - model.num_timesteps
        if remaining <= 0:
            return
        if model.num_timesteps > 0 and self.best is not None and self.best.flat(model.num_timesteps,
                                                                                self.patience_steps):
            self.ended_flat = True  # resumed after its curve had gone flat: as the stage run straight ended
            return
        # Lazy: these subclass SB3's callbacks, and SB3 (with torch) takes seconds to import.
        from trainer.learn.callbacks import EvalCurve, ProgressCallback, ThreadsFollowCores
        from trainer.learn.guard import CheckpointGuard

        guard = CheckpointGuard(self.checkpoints, self.episodes, self.section.checkpoint_freq_steps, self.time_limit_at,
                                self.rel.checkpoint_min_interval_s, floor_steps=self.floor_steps,
                                floor_until=self.floor_until, past_target=self.past_target)
        if self.curve is not None:
            self.curve.close()
        curve = self.curve = EvalCurve(self.ctx, self.agent, self.folder.curve, best=self.best,
                                       patience_steps=self.patience_steps)
        callbacks = [ProgressCallback(self.agent, self.target), guard, curve, *self.extra_callbacks]
        if self.device == "cpu" and follows_free_cores(self.cfg, self.agent, self.simulator.in_process):
            callbacks.append(ThreadsFollowCores(self.agent))
        STOP.check(f"{self.agent}'s start-up")  # the workers and the warm start took a while
        try:
            with STOP.while_training():
                model.learn(total_timesteps=remaining, callback=callbacks, log_interval=self.section.log_interval,
                            reset_num_timesteps=reset)
        finally:
            self.stopped_by = guard.stopped_by
        if self.timed_out:
            past = 0.0 if self.time_limit_at is None else time.monotonic() - self.time_limit_at
            beyond = {"learnt_past_it_s": round(past, 1), "least_steps": self.floor_steps} if guard.learnt_past_slot \
                else {}
            self.log.info("time slot used up", step=self.checkpoints.last_checkpoint_step, target=self.target,
                          **beyond)
        elif curve.flat_at is not None:  # set only where a best policy exists (BestPolicy.flat)
            assert self.best is not None and self.best.best is not None
            self.ended_flat = True
            self.log.info("no better policy on the validation window for a while: the stage ends early",
                          step=curve.flat_at, target=self.target, best_step=self.best.best.step,
                          fix="--set train.patience=0 trains every stage to its target")

    def _ready(self, model: BaseAlgorithm) -> BaseAlgorithm:
        """One SB3 logger per stage (another would truncate progress.csv), the current sizes, the stepping worker."""
        if self._sb3_logger is None:
            self._sb3_logger = sb3_logger(self.cfg, self.folder.root)
        model.set_logger(self._sb3_logger)
        apply_sizes(model, self.sizes.batch_size, self.sizes.n_steps, self.sizes.learning_rate,
                    self.section.learning_rate_end, self.decay_share)
        keep_near_demonstrations(self.cfg, self.ctx.site, self.agent, model, self.ctx.run.demonstration_sites)
        from trainer.learn.fast_sac import TrainWhileStepping  # lazy: SB3 and torch

        if isinstance(self.env, TrainWhileStepping):
            self.env.attach(model)
        return model

    def _fresh_model(self) -> BaseAlgorithm:
        model = build_model(self.cfg, self.agent, self.env, self.device, self.cfg.seed, self.target)
        started = time.monotonic()
        box = TimeBox(None if self.warm_start_limit_s is None else self.started_at + self.warm_start_limit_s)
        self.warm_start = _warm_start(self.ctx, self.handle, model, self.imitations, box, self.later)
        self.warm_start_s = time.monotonic() - started
        if self.warm_start is not None:  # evaluated like the agent at the end (results.json's warm_start)
            save_warm_start(model, self.folder)
        self.checkpoints.last_checkpoint_step = 0
        return self._ready(model)

    def _load(self, checkpoint: Checkpoint, adopt_state: bool) -> BaseAlgorithm:
        model, state = self.checkpoints.model_at(checkpoint, self.env, self.device)
        if adopt_state:  # a resumed stage goes on with the sizes its checkpoint trained with
            if not self.sizes.adopt(state, self.n_envs):
                self.log.warning("parallel environments changed since the checkpoint: rollout from the config",
                                 checkpoint_n_envs=state.n_envs, n_envs=self.n_envs)
            self.checkpoints.store.failures = state.checkpoint_write_failures
        self.episodes.set_next(state, self.n_envs)
        self.checkpoints.restored(checkpoint)
        return self._ready(model)

    def _recover(self, failure: Failure, step: int) -> tuple[BaseAlgorithm, bool]:
        if isinstance(failure, OutOfMemory):
            self.recovery.back_off(step, failure.detail, self.checkpoints.last_path, in_training=True)
        else:
            self.recovery.lower_learning_rate(step, failure.detail, self.checkpoints.last_path)
        checkpoint = self.checkpoints.store.latest()
        if checkpoint is None:
            self.log.info("no checkpoint yet: restarting the stage", step=step)
            return self._fresh_model(), True
        return self._load(checkpoint, adopt_state=False), False


def _warm_start(ctx: RunContext, handle: Agent, model: BaseAlgorithm, imitations: SavedImitations,
                box: TimeBox, later: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """A fresh model's warm start (trainer.learn.warm_start) within its ``box``, picking by the held-out years where
    it picks."""
    held_out = held_out_years(ctx) if ctx.cfg.warm_start.picks_a_member(handle.name) else []
    return warm_start(ctx.cfg, ctx.site, handle.name, model, ctx.run.demonstration_sites, held_out, imitations, box,
                      later)


def summary(trainer: StageTrainer) -> dict[str, Any]:
    """What the stage's metrics record of its training: failures met, sizes it ended with, its warm start."""
    sizes = trainer.sizes
    return {"checkpoint_write_failures": trainer.checkpoints.store.failures, "oom_backoffs": len(sizes.backoffs),
            "nonfinite_rollbacks": sizes.nonfinite_rollbacks, "final_batch_size": sizes.batch_size,
            "final_n_steps": sizes.n_steps, "final_learning_rate": sizes.learning_rate,
            "warm_start": trainer.warm_start}


def initial_sizes(section: AgentConfig, agent: str, target: int, n_envs: int) -> Sizes:
    """The configured batch, rollout and learning rate, the rollout shortened to fit a short run."""
    params = fit_rollout(section.sb3_kwargs(n_envs), target, n_envs)
    sizes = Sizes(params.get("batch_size"), params.get("n_steps"), float(section.learning_rate))
    if sizes.n_steps is not None and sizes.n_steps * n_envs != section.n_steps:
        logs.get().warning("rollout shortened to fit the run", agent=agent, n_steps=sizes.n_steps * n_envs,
                           configured=section.n_steps)
    return sizes


def training_env(cfg: Config, site: Site, agent: str, n_envs: int, simulator: Simulator) -> VecEnv:
    """The training environments (train.simulator): the simulator's N sites in this process, or CityLearn's,
    parallel for on-policy agents and in a worker for one learning while stepping."""
    from stable_baselines3.common.vec_env import (
        SubprocVecEnv,  # lazy: SB3 imports torch
    )

    from trainer.learn.fast_sac import TrainWhileStepping

    overlap = cfg.agent(agent).learns_while_stepping
    env = simulator.training_env(cfg, site, n_envs, subprocesses=n_envs > 1 or overlap)
    workers = isinstance(env, SubprocVecEnv)
    logs.get().info("training environments", agent=agent, n_envs=n_envs, simulator=simulator.name, workers=workers,
                    learn_while_stepping=overlap and workers)
    return TrainWhileStepping(env) if overlap and workers else env


def save_warm_start(model: BaseAlgorithm, folder: AgentDir) -> None:
    """The warm start's model beside the stage, evaluated like the agent at the end (results.json's warm_start);
    a full disk costs that evaluation, not the stage."""
    try:
        folder.root.mkdir(parents=True, exist_ok=True)
        save_model_atomic(model, folder.warm_start)
    except OSError as exc:
        logs.get().warning("warm start not saved: it will not be evaluated", path=str(folder.warm_start),
                           error=exc.strerror)


def keep_previous_progress(folder: AgentDir, step: int) -> None:
    """SB3's CSV logger truncates progress.csv: keep the curve of the run before a resume."""
    if step > 0 and folder.progress.is_file():
        # Two resumes from one checkpoint each keep theirs: never replace an earlier one.
        n = 1
        while folder.previous_progress(step, n).exists():
            n += 1
        kept = folder.previous_progress(step, n)
        folder.progress.rename(kept)
