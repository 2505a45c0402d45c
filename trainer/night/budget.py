"""The split of a night's time between stages, and its timeline (pure functions; durations are
``trainer.base.durations``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from trainer.run.schedule_file import StageKind


@dataclass(frozen=True)
class StageSpec:
    """What the planner knows of one stage."""

    name: str
    kind: StageKind
    fixed_s: float                  # evaluation (after training, for train stages) or report time
    weight: float = 0.0             # share of the training time
    target_steps: int = 0
    steps_per_s: float = 0.0        # measured training speed
    setup_s: float = 0.0            # before training, inside the stage's time limit (the warm start)
    lean_fixed_s: float | None = None  # its evaluation when the night is short of time (None: it has no leaner)

    def leaned(self) -> StageSpec:
        """This stage as a night short of time runs it: its confirmation judged on the training simulator."""
        return self if self.lean_fixed_s is None else replace(self, fixed_s=self.lean_fixed_s, lean_fixed_s=None)

    @property
    def needed_train_s(self) -> float:
        if self.kind != StageKind.TRAIN or self.target_steps <= 0:
            return 0.0
        return self.target_steps / self.steps_per_s if self.steps_per_s > 0 else float("inf")


def allocate(stages: list[StageSpec], available_s: float | None) -> list[float]:
    """Training seconds for each stage.

    Without a budget each stage gets what its target needs. With one, the time left after
    every stage's fixed cost is shared by weight; a stage whose share exceeds what its target
    needs gets only that, and the rest is shared again among the others (water-filling).
    """
    needs = [s.needed_train_s for s in stages]
    if available_s is None:
        return needs
    alloc = [0.0] * len(stages)
    remaining = max(available_s - sum(s.fixed_s + s.setup_s for s in stages), 0.0)
    active = [i for i, s in enumerate(stages) if s.kind == StageKind.TRAIN and needs[i] > 0]
    while active and remaining > 0:
        total_weight = sum(stages[i].weight for i in active)
        if total_weight <= 0:
            break
        share = {i: remaining * stages[i].weight / total_weight for i in active}
        capped = [i for i in active if needs[i] <= share[i]]
        if not capped:
            for i in active:
                alloc[i] = share[i]
            break
        for i in capped:
            alloc[i] = needs[i]
            remaining -= needs[i]
            active.remove(i)
    return alloc


@dataclass
class PlannedStage:
    name: str
    start: datetime
    end: datetime
    train_s: float
    planned_steps: int
    target_steps: int
    notes: list[str] = field(default_factory=list)


def timeline(stages: list[StageSpec], start: datetime, available_s: float | None) -> list[PlannedStage]:
    """When each stage would start and end if it ran as estimated from ``start``."""
    alloc = allocate(stages, available_s)
    out, clock = [], start
    for spec, train_s in zip(stages, alloc):
        duration = (train_s if train_s != float("inf") else 0.0) + spec.setup_s + spec.fixed_s
        steps = (
            spec.target_steps
            if spec.kind == StageKind.TRAIN and train_s >= spec.needed_train_s
            else int(train_s * spec.steps_per_s)
        )
        out.append(
            PlannedStage(spec.name, clock, clock + timedelta(seconds=duration), train_s, steps, spec.target_steps)
        )
        clock = clock + timedelta(seconds=duration)
    return out
