"""What a benchmark trial is: its kind, its sizes and its result, shared by the parent (trainer.benchmark.measure)
and the process that runs it (trainer.benchmark.trial)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class TrialKind(StrEnum):
    ENV_PLAIN = "env_plain"          # CityLearn's quickstart environment, random actions
    ENV_PRODUCT = "env_product"      # the product's environment, random actions
    PLAIN = "plain"                  # an agent trained by SB3's own loop
    PRODUCT = "product"              # an agent trained by the night's StageTrainer
    SWEEP = "sweep"                  # the product's environments at n_envs in parallel
    SIMULATOR = "simulator"          # the training simulator's n_envs sites in one process, random actions
    LEARN_PLAIN = "learn_plain"      # --learning: CO2 after training with SB3's own loop
    LEARN_PRODUCT = "learn_product"  # --learning: CO2 after training with the product
    IMITATION = "imitation"          # the warm start: one imitation of a year (an ensemble's member), product only


@dataclass(frozen=True)
class Sizes:
    """How much each measurement runs: defaults fit the whole benchmark in about 5 minutes on 2 cores."""

    env_steps: int = 600
    onpolicy_steps: int = 6144  # three of PPO's 2,048-step rollouts
    onpolicy_rollout: int | None = None  # None: the config's n_steps
    sac_steps: int = 1000
    sac_learning_starts: int = 100
    sac_updates: int = 50
    repeats: int = 2
    sweep: tuple[int, ...] | None = None  # None: 1, 2, 4 ... up to the automatic choice's 4 per core
    simulator: tuple[int, ...] = (1, 64, 256, 1024)  # sites stepped at once by the training simulator
    # The product's warm start before the clock: one epoch of one year keeps the imitation term its updates
    # carry; 0 leaves it out (its demonstrations replay a year in CityLearn: half a minute a trial on 2 cores).
    imitation_epochs: int = 1
    imitation_updates: int = 20  # minibatches timed for the warm start's members a second

    @classmethod
    def quick(cls) -> Sizes:
        """A smoke run for CI: every figure produced, none of them meaningful."""
        return cls(env_steps=60, onpolicy_steps=64, onpolicy_rollout=32, sac_steps=60, sac_learning_starts=30,
                   sac_updates=5, repeats=1, sweep=(1, 2), simulator=(1, 8), imitation_epochs=0,
                   imitation_updates=2)


@dataclass
class Trial:
    """One measurement, run in its own process by :func:`run_trial`."""

    kind: TrialKind
    agent: str | None = None
    n_envs: int = 1
    seed: int = 0  # which config: the learning check varies it
    result: dict[str, Any] = field(default_factory=dict)
