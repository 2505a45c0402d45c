"""The callback that checkpoints at rollout boundaries and stops training on a signal or at the time limit."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from stable_baselines3.common.callbacks import BaseCallback

from trainer.base.signals import STOP
from trainer.learn.recovery import check_finite
from trainer.learn.state import Boundary, EpisodeTracker, StopReason


class Checkpointer(Protocol):
    last_checkpoint_step: int

    def save_checkpoint(self, model: Any, boundary: Boundary) -> None: ...


class CheckpointGuard(BaseCallback):
    """Checkpoints every ``every_steps`` at rollout starts, but not within ``min_interval_s`` of the last,
    checks for non-finite values, honours stops.

    Rollout starts are where parameters, optimizers, buffers, counters and RNG states agree
    (docs/reliability.md). ``stopped_by`` says why training ended early, if it did.
    """

    def __init__(self, owner: Checkpointer, tracker: EpisodeTracker, every_steps: int, time_limit_at: float | None,
                 min_interval_s: float = 0.0, clock: Callable[[], float] = time.monotonic, floor_steps: int = 0,
                 floor_until: float | None = None, past_target: tuple[int, float] | None = None):
        super().__init__()
        self.owner = owner
        self.tracker = tracker
        self.every_steps = every_steps
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._saved_at = clock()
        self.time_limit_at = time_limit_at
        # Short of floor_steps at time_limit_at, training goes on to them (from one rollout's start to the next, where
        # it can stop), until floor_until at most (time.monotonic(); None: not past time_limit_at).
        self.floor_steps, self.floor_until = floor_steps, floor_until
        self.learnt_past_slot = False  # it went on past time_limit_at for floor_steps
        # (steps, monotonic time): past those steps (its target, learning on past it), it stops at that time, before
        # time_limit_at (trainer.learn.trainer.StageTrainer.past_target).
        self.past_target = past_target
        self.boundary: Boundary | None = None
        self.stopped_by: StopReason | None = None
        self._started = False

    def _on_training_start(self) -> None:
        self._started = False
        self.tracker.read()  # learn() has just reset the environments

    def _on_rollout_start(self) -> None:
        if self._started:
            check_finite(self.model)
        self._started = True
        due = (self.num_timesteps - self.owner.last_checkpoint_step >= self.every_steps
               and self.clock() - self._saved_at >= self.min_interval_s)
        if due and hasattr(self.model, "run_pending_training"):
            self.model.run_pending_training()  # the checkpoint holds the update SB3 would have made by now
        self.boundary = self.tracker.boundary(self.model)
        if due:
            self.owner.save_checkpoint(self.model, self.boundary)
            self._saved_at = self.clock()

    def _on_step(self) -> bool:
        dones = self.locals.get("dones")
        if dones is not None:
            self.tracker.count(dones)
        if not (STOP.requested or self._time_up()):
            return True
        # Nothing has been learned since the rollout began, so that boundary is consistent (SAC
        # learning while stepping has applied the update due at the boundary: docs/reliability.md).
        if self.boundary is not None and self.boundary.step > self.owner.last_checkpoint_step:
            self.owner.save_checkpoint(self.model, self.boundary)
        self.stopped_by = StopReason.SIGNAL if STOP.requested else StopReason.TIME_UP
        return False

    def _time_up(self) -> bool:
        if self.time_limit_at is None:
            return False
        now = time.monotonic()
        # What a stop now keeps is the last rollout's start (the boundary): past its target means kept past it.
        kept = self.boundary.step if self.boundary is not None else self.num_timesteps
        if now < self.time_limit_at:  # every step: the common case first
            return self.past_target is not None and now >= self.past_target[1] and kept >= self.past_target[0]
        if kept >= self.floor_steps or self.floor_until is None or now >= self.floor_until:
            return True
        self.learnt_past_slot = True
        return False
