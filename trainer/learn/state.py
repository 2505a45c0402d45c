"""What a checkpoint records besides the model: typed, and the same ``state.json`` keys as ever."""

from __future__ import annotations

import enum
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from trainer.learn.checkpoint_store import capture_rng


class StopReason(enum.Enum):
    SIGNAL = "signal"         # Ctrl+C, SIGTERM, docker stop: checkpoint, then end the stage
    TIME_UP = "time slot"     # the night's plan gave this stage no more time


@dataclass
class Boundary:
    """A consistent point to checkpoint at: the step, RNG states and where each environment is."""

    step: int
    rng: dict[str, Any]
    episode_indices: list[int]
    at_episode_starts: list[bool]


@dataclass
class Sizes:
    """The sizes training runs with now: the configured ones, as backed off and rolled back."""

    batch_size: int | None
    n_steps: int | None
    learning_rate: float
    nonfinite_rollbacks: int = 0
    backoffs: list[dict[str, Any]] = field(default_factory=list)

    def adopt(self, state: TrainingState, n_envs: int) -> bool:
        """Take a checkpoint's sizes; False when its rollout is not comparable (parallel environments changed)."""
        self.batch_size = state.batch_size if state.batch_size is not None else self.batch_size
        same_envs = state.n_envs == n_envs
        if same_envs:
            self.n_steps = state.n_steps if state.n_steps is not None else self.n_steps
        self.learning_rate = state.learning_rate or self.learning_rate
        self.nonfinite_rollbacks, self.backoffs = state.nonfinite_rollbacks, list(state.backoffs)
        return same_envs


@dataclass
class TrainingState:
    """``state.json`` of one checkpoint."""

    agent: str
    step: int
    target: int
    episode_indices: list[int]
    at_episode_starts: list[bool]
    n_envs: int
    batch_size: int | None
    n_steps: int | None
    learning_rate: float
    nonfinite_rollbacks: int
    backoffs: list[dict[str, Any]]
    checkpoint_write_failures: int
    config_digest: str
    config: dict[str, Any]
    saved_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        # The first environment's episode under its old single-environment keys, for older readers.
        return {**asdict(self), "episode_index": self.episode_indices[0], "at_episode_start": self.at_episode_starts[0]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingState:
        """Read a checkpoint's state, including those written before a key existed. Raises ValueError naming
        the first key of the wrong type."""
        from pydantic import TypeAdapter  # lazy: pydantic's validators build on first use

        return TypeAdapter(cls).validate_python({
            "agent": data.get("agent", ""), "step": data.get("step"), "target": data.get("target", 0),
            "episode_indices": data.get("episode_indices", [data.get("episode_index", 0)]),
            "at_episode_starts": data.get("at_episode_starts", [data.get("at_episode_start", True)]),
            "n_envs": data.get("n_envs", 1), "batch_size": data.get("batch_size"), "n_steps": data.get("n_steps"),
            "learning_rate": data.get("learning_rate", 0.0), "nonfinite_rollbacks": data.get("nonfinite_rollbacks", 0),
            "backoffs": data.get("backoffs", []), "checkpoint_write_failures": data.get("checkpoint_write_failures", 0),
            "config_digest": data.get("config_digest", ""), "config": data.get("config", {}),
            "saved_at": data.get("saved_at", 0.0),
        })


class EpisodeTracker:
    """Each parallel environment's episode, followed from the ``dones`` of every step.

    A checkpoint says where each environment resumes: its interrupted episode's successor,
    or that episode itself if it was at its start.
    """

    def __init__(self, env: Any):
        self.env = env
        self.episodes: list[int] = []
        self.starts: list[bool] = []

    def read(self) -> None:
        """Each environment's episode, just after a reset."""
        self.episodes = [int(i) for i in self.env.env_method("episode_index")]
        self.starts = [True] * len(self.episodes)

    def count(self, dones: Any) -> None:
        """After a step: an environment that finished an episode has reset into the next one."""
        for i, done in enumerate(dones):
            self.episodes[i] += int(bool(done))
            self.starts[i] = bool(done)

    def set_next(self, state: TrainingState, n_envs: int) -> None:
        indices, starts = state.episode_indices, state.at_episode_starts
        for i in range(n_envs):
            index, start = (indices[i], starts[i]) if i < len(indices) else (max(indices, default=-1) + 1, True)
            self.env.env_method("set_next_episode", index if start else index + 1, indices=[i])

    def boundary(self, model: Any, at_episode_start: bool | None = None) -> Boundary:
        if not self.episodes:  # learn() never ran in this process
            self.read()
        starts = self.starts if at_episode_start is None else [at_episode_start] * len(self.episodes)
        return Boundary(int(model.num_timesteps), capture_rng(model), list(self.episodes), list(starts))
