"""`trainer benchmark`: the product's trainer against the plain SB3 recipe, side by side.

The plain recipe is what a user writes instead (CityLearn's quickstart): ``CityLearnEnv(schema,
central_agent=True)`` → ``NormalizedObservationWrapper`` → ``StableBaselines3Wrapper`` → an SB3
model with ``"MlpPolicy"`` → ``model.learn(N)``: one environment, one process, torch's defaults.
The product is :class:`trainer.learn.trainer.StageTrainer` as a night runs it (parallel environments,
FastSAC, the training simulator, checkpoints and callbacks included). Both get the same
hyperparameters: PPO the same rollout size (the product splits it over its environments), A2C the
same steps per environment per update.

- ``spec``: what a trial is (its kind, the sizes it runs at, its result).
- ``trial``: one measurement, in a process of its own (what runs inside the child).
- ``measure``: the parent: which trials, in which order, their summary and the tables.
"""

from trainer.benchmark.measure import (
                                       format_learning,
                                       format_report,
                                       plan_trials,
                                       progress_line,
                                       run_benchmark,
                                       run_command,
                                       run_learning_check,
                                       summarise,
)
from trainer.benchmark.spec import Sizes, Trial, TrialKind

__all__ = ["Sizes", "Trial", "TrialKind", "format_learning", "format_report", "plan_trials", "progress_line",
           "run_benchmark", "run_command", "run_learning_check", "summarise"]
