"""What can go wrong in training, as types: failures the loop recovers from and errors that end a stage."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.base import logs
from trainer.base.errors import TrainerError
from trainer.config.sections import ReliabilityConfig
from trainer.learn.memory import (
    GIB,
    BatchBackoff,
    Shapes,
    available_bytes,
    batch_bytes,
    is_out_of_memory,
    memory_figures,
)
from trainer.learn.state import Sizes


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


@dataclass(frozen=True)
class OutOfMemory:
    """``model.learn`` ran out of memory: back the batch off and go on from the last checkpoint."""

    detail: str


@dataclass(frozen=True)
class NonFinite:
    """A loss or parameter became non-finite: lower the learning rate and go on from the last checkpoint."""

    detail: str


Failure = OutOfMemory | NonFinite


def failure_of(exc: BaseException) -> Failure | None:
    """What a failed ``model.learn`` means for the stage: out of memory, a non-finite value, or (None) neither."""
    if isinstance(exc, NonFiniteError):
        return NonFinite(str(exc))
    if is_out_of_memory(exc):
        return OutOfMemory(f"{type(exc).__name__}: {str(exc)[:300]}")
    return None


def check_finite(model: Any) -> None:
    """Raise NonFiniteError when a logged loss or any policy parameter is NaN or infinite."""
    import torch  # heavy: imported when training, not for `trainer --help`

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


class Recovery:
    """How a stage adjusts its sizes after a failure: back the batch off, or lower the learning rate."""

    def __init__(self, agent: str, device: str, rel: ReliabilityConfig, sizes: Sizes):
        self.agent, self.device, self.rel, self.sizes = agent, device, rel, sizes
        self.backoff = BatchBackoff(rel.min_batch_size)
        self.log = logs.get().bind(agent=agent)

    def lower_learning_rate(self, step: int, detail: str, last_checkpoint: str) -> None:
        self.sizes.nonfinite_rollbacks += 1
        if self.sizes.nonfinite_rollbacks > self.rel.nonfinite_retries:
            raise StageFailed(f"{self.agent}: {detail}; still non-finite after {self.rel.nonfinite_retries} rollbacks "
                              f"(learning rate now {self.sizes.learning_rate:g}); the last checkpoint is intact at "
                              f"{last_checkpoint}; lower {self.agent}.learning_rate or check the reward scale")
        old = self.sizes.learning_rate
        self.sizes.learning_rate = old * self.rel.nonfinite_lr_factor
        self.log.warning("non-finite values: rolling back", step=step, detail=detail, old_learning_rate=old,
                         new_learning_rate=self.sizes.learning_rate, rollback=self.sizes.nonfinite_rollbacks)

    def back_off(self, step: int, detail: str, last_checkpoint: str, in_training: bool) -> None:
        """Halve the batch (A2C: the rollout); stop below the floor."""
        field = "batch_size" if self.sizes.batch_size is not None else "n_steps"
        old = getattr(self.sizes, field)
        new, changed = self.backoff.next(old)
        if not changed:
            raise StageFailed(
                f"{self.agent}: out of memory with {field}={old} on {self.device} ({detail}); halving would go "
                f"below reliability.min_batch_size={self.rel.min_batch_size}; the last checkpoint is intact at "
                f"{last_checkpoint}; use a smaller {self.agent}.net_arch or free memory on the device")
        setattr(self.sizes, field, new)
        event = {"step": step, "field": field, "old": old, "new": new, "device": self.device,
                 "cause": detail, "in_training": in_training, **memory_figures(self.device)}
        self.sizes.backoffs.append(event)
        self.log.warning("out of memory: batch size backed off", **event)

    def fit_batch(self, shapes: Shapes) -> None:
        """Back off, before training, a batch that cannot fit in the share of free memory allowed."""
        budget = available_bytes(self.device) * self.rel.batch_memory_fraction
        while True:
            size = self.sizes.batch_size if self.sizes.batch_size is not None else self.sizes.n_steps
            need = batch_bytes(self.agent, int(size), shapes)
            if need <= budget or not self.backoff.next(size)[1]:
                return
            self.back_off(0, f"a batch of {size:,} needs ~{need / GIB:.1f} GiB, over the "
                             f"{self.rel.batch_memory_fraction:.0%} of free memory allowed ({budget / GIB:.1f} GiB)",
                          "(none saved yet)", in_training=False)
