"""A training stage's checkpoints: where the last one was taken, taking the next, reading one back.

The checkpoint guard (trainer.learn.guard) asks it when one is due and has it save; the stage's
trainer resumes, recovers and reports from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from trainer.base.files import DamagedFile, first_problem
from trainer.learn.checkpoint_store import Checkpoint, CheckpointStore, load_replay, restore_rng
from trainer.learn.model_file import load_model
from trainer.learn.state import Boundary, Sizes, TrainingState

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.vec_env import VecEnv

    from trainer.config.sections import Config
    from trainer.run.folder import AgentDir


class StageCheckpoints:
    """One stage's checkpoints in its agent folder, keeping the newest ``reliability.keep_checkpoints``."""

    def __init__(self, cfg: Config, agent: str, target: int, folder: AgentDir, sizes: Sizes, n_envs: int):
        self.cfg, self.agent, self.target, self.sizes, self.n_envs = cfg, agent, target, sizes, n_envs
        self.store = CheckpointStore(folder.checkpoints, cfg.reliability.keep_checkpoints)
        self.last_checkpoint_step = 0  # the guard's name: steps are counted from here
        self.last: Checkpoint | None = None

    @property
    def last_point(self) -> tuple[int, Path | None]:
        """(the step of the last checkpoint, its folder or None when it could not be written)."""
        return self.last_checkpoint_step, self.last.path if self.last else None

    @property
    def last_path(self) -> str:
        return str(self.last.path) if self.last else "(none saved yet)"

    def save_checkpoint(self, model: BaseAlgorithm, boundary: Boundary) -> None:
        """The model, its replay buffer and RNG states at ``boundary``, with the stage's sizes and config."""
        sizes = self.sizes
        state = TrainingState(
            agent=self.agent, step=boundary.step, target=self.target, episode_indices=boundary.episode_indices,
            at_episode_starts=boundary.at_episode_starts, n_envs=self.n_envs, batch_size=sizes.batch_size,
            n_steps=sizes.n_steps, learning_rate=sizes.learning_rate, nonfinite_rollbacks=sizes.nonfinite_rollbacks,
            backoffs=sizes.backoffs, checkpoint_write_failures=self.store.failures, config_digest=self.cfg.digest(),
            config=self.cfg.to_dict())
        saved = self.store.save(model, state.to_dict(), boundary.rng,
                                with_replay_buffer=hasattr(model, "replay_buffer"))
        self.last_checkpoint_step = boundary.step
        if saved is not None:
            self.last = saved

    def model_at(self, checkpoint: Checkpoint, env: VecEnv, device: str) -> tuple[BaseAlgorithm, TrainingState]:
        """The model as ``checkpoint`` saved it, with its replay buffer, step and random generators, and its state."""
        model = load_model(self.cfg, self.agent, checkpoint.model, device=device, env=env)
        if checkpoint.replay_buffer is not None:
            load_replay(model, checkpoint.replay_buffer)
        state = self.state(checkpoint)
        model.num_timesteps = state.step
        restore_rng(model, checkpoint.rng())  # load() re-seeded every generator from the model's seed
        return model, state

    def state(self, checkpoint: Checkpoint) -> TrainingState:
        """A checkpoint's ``state.json``; one with a key of the wrong type is named, with the way on."""
        try:
            return TrainingState.from_dict(checkpoint.state)
        except ValidationError as exc:
            raise DamagedFile(f"{checkpoint.path / 'state.json'} is damaged: {first_problem(exc)}; delete that "
                              "checkpoint folder to resume from the one before") from None

    def restored(self, checkpoint: Checkpoint) -> None:
        """Training goes on from ``checkpoint``."""
        self.last_checkpoint_step, self.last = checkpoint.step, checkpoint
