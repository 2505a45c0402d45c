"""The split of a night's time between stages, and its timeline (pure functions; durations are
``trainer.base.durations``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from trainer.run.schedule_file import StageKind

# Estimates are padded so the night ends by the deadline even when a stage runs a little slow.
SAFETY = 1.15
# A training slot too short to be worth a model: the stage is skipped rather than run for nothing.
MIN_TRAIN_STEPS = 100
# A warm start leaves its stage the time for this many steps of learning at the plan's speed (or the stage's target,
# if smaller), and at least half the training time the plan gave it: a busy machine's imitation stops at that point
# with the best it has rather than take the learning's time (a 20-minute night's PPO trained 0 steps behind a
# warm start that overran its slot by minutes).
LEARNING_KEPT_STEPS = 20_000
LEARNING_KEPT_SHARE = 0.5


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
    # As a timed night's last training stage it learns on past its target to its slot's end, to this many times
    # its target at most (schedule.last_stage_past_target; 1: it stops at its target).
    past_target: float = 1.0
    # Its warm start is an earlier stage's weights in the same process (A2C starts from PPO's imitation): judging it
    # costs nothing once that one's is judged.
    shares_warm_start: bool = False

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
    setup_s: float = 0.0        # its warm start as it will run: cut to its part of the slot where the night is short
    planned_setup_s: float = 0.0  # its warm start whole, as estimated
    skipped: bool = False       # no time left for training when it starts: the night skips it
    lean: bool = False          # it confirms its pick on the training simulator (the night is short of time)


def learning_floor_s(target: int, steps_per_s: float) -> float:
    """The least learning a training stage keeps: LEARNING_KEPT_STEPS (at most its target) at the plan's speed."""
    steps = min(LEARNING_KEPT_STEPS, target) if target > 0 else LEARNING_KEPT_STEPS
    return steps / steps_per_s if steps_per_s > 0 else 0.0


def floor_s(spec: StageSpec) -> float:
    """The least learning ``spec`` keeps (none for an evaluation or the report)."""
    return learning_floor_s(spec.target_steps, spec.steps_per_s) if spec.kind == StageKind.TRAIN else 0.0


def kept_after_s(specs: list[StageSpec]) -> float:
    """Of the stages left (the first running now), what a first one short of its least learning at its slot's end may
    not take from the others by learning on: every evaluation and the report, and each later stage's least
    learning (their warm starts stop early rather)."""
    return sum(s.fixed_s for s in specs) + sum(floor_s(s) for s in specs[1:])


def slot_s(target: int, steps_per_s: float, limit_s: float) -> tuple[float, str | None]:
    """A training stage's time limit of ``limit_s`` seconds, rounded, and why it is skipped instead (None: it runs).
    The one rule for a stage the night has no time left for, on every backend and in the plan."""
    if limit_s * steps_per_s < min(MIN_TRAIN_STEPS, target):
        return 0.0, (f"no time left for training: {max(limit_s, 0):.0f} s in the plan "
                     f"(~{max(limit_s, 0) * steps_per_s:.0f} steps) before the deadline")
    return round(limit_s, 1), None


def warm_start_cap_s(limit_s: float, setup_s: float, target: int, steps_per_s: float) -> float:
    """Of a slot of ``limit_s`` seconds, the most its warm start (estimated at ``setup_s``) may take: what leaves
    learning LEARNING_KEPT_STEPS (at most the target) at the plan's speed and LEARNING_KEPT_SHARE of its planned
    time."""
    learning = max(learning_floor_s(target, steps_per_s), LEARNING_KEPT_SHARE * max(limit_s - setup_s, 0.0))
    return max(limit_s - learning, 0.0)


def short_of_time(specs: list[StageSpec], left_s: float) -> bool:
    """Whether the stages left, at their evaluations and warm starts as planned and the least learning each keeps,
    outlast the time left, where a leaner evaluation exists."""
    needed = sum(s.fixed_s + s.setup_s + floor_s(s) for s in specs)
    return needed > left_s and any(s.lean_fixed_s is not None for s in specs)


def reserve_s(specs: list[StageSpec], left_s: float) -> float:
    """Of ``left_s`` seconds, what the first of ``specs`` (the stages left, run one after another) keeps for its own
    evaluation and the stages after it; the rest is its slot. Its own warm start runs inside the slot; the later
    stages' are theirs to keep, with the least learning each keeps (a later agent is not starved by an earlier
    one's slot)."""
    alloc = allocate(specs, left_s)
    reserve = (sum(s.fixed_s for s in specs) + sum(s.setup_s for s in specs[1:])
               + sum(max(a, floor_s(s)) for a, s in zip(alloc[1:], specs[1:])))
    return min(reserve, _fair_reserve(specs, alloc, left_s))


def _fair_reserve(specs: list[StageSpec], alloc: list[float], left_s: float) -> float:
    """What the first of ``specs`` leaves the others. Where their warm starts and least learning do not all fit:
    every evaluation as planned (they cannot be shortened), and of the time beside them each stage's share in
    proportion to its warm start and least learning, so that each stops its warm start early and learns a little.
    Without it the first stage kept nothing and was skipped: a 20-minute night beside other work (its references
    twice as slow as calibrated) skipped SAC with 13 of its 20 minutes ahead. Otherwise (everything fits, or no stage
    warm-starts: the training is shared by weight) the later stages' warm starts and learning as allocated."""
    least = [s.setup_s + floor_s(s) for s in specs]
    fixed = sum(s.fixed_s for s in specs)
    spare = left_s - fixed
    if spare <= 0 or sum(least) <= spare or not any(s.setup_s > 0 for s in specs):
        return fixed + sum(s.setup_s + max(a, floor_s(s)) for a, s in zip(alloc[1:], specs[1:]))
    return fixed + spare * sum(least[1:]) / sum(least)


def forecast(stages: list[StageSpec], start: datetime, available_s: float | None) -> list[PlannedStage]:
    """When each stage would start and end if it ran as estimated from ``start``, one after another, as the night's
    driver (trainer.night.state) runs them: with a deadline, a night short of time confirms on the training simulator
    (:func:`short_of_time`), each training stage gets the slot :func:`reserve_s` leaves it, its warm start stops at
    its part of that slot (:func:`warm_start_cap_s`) and it trains the rest, or is skipped (:func:`slot_s`). Without
    a deadline, every stage whole (:func:`timeline`)."""
    if available_s is None:
        return timeline(stages, start, None)
    lean = short_of_time(stages, available_s)
    specs = [s.leaned() for s in stages] if lean else list(stages)
    last = max((i for i, s in enumerate(specs) if s.kind == StageKind.TRAIN), default=None)
    out, clock = [], start
    for i, spec in enumerate(specs):
        if spec.kind != StageKind.TRAIN:
            end = clock + timedelta(seconds=spec.fixed_s)
            out.append(PlannedStage(spec.name, clock, end, 0.0, 0, spec.target_steps))
            clock = end
            continue
        left = available_s - (clock - start).total_seconds()
        limit, skipped = slot_s(spec.target_steps, spec.steps_per_s, left - reserve_s(specs[i:], left))
        if skipped is not None:
            out.append(PlannedStage(spec.name, clock, clock, 0.0, 0, spec.target_steps, [skipped],
                                    planned_setup_s=spec.setup_s, skipped=True, lean=lean))
            continue
        setup = min(spec.setup_s, warm_start_cap_s(limit, spec.setup_s, spec.target_steps, spec.steps_per_s))
        stretch = spec.past_target if i == last else 1.0  # the last learns on past its target in what is left
        train_s = min(spec.needed_train_s * stretch, max(limit - setup, 0.0))
        steps = spec.target_steps if train_s >= spec.needed_train_s else int(train_s * spec.steps_per_s)
        steps = max(steps, min(int(train_s * spec.steps_per_s), int(spec.target_steps * stretch)))
        end = clock + timedelta(seconds=setup + train_s + spec.fixed_s)
        out.append(PlannedStage(spec.name, clock, end, train_s, steps, spec.target_steps, setup_s=setup,
                                planned_setup_s=spec.setup_s, lean=lean))
        clock = end
    return out


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
        out.append(PlannedStage(spec.name, clock, clock + timedelta(seconds=duration), train_s, steps,
                                spec.target_steps, setup_s=spec.setup_s, planned_setup_s=spec.setup_s))
        clock = clock + timedelta(seconds=duration)
    return out
