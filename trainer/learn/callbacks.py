"""SB3 callbacks: progress with steps/s and ETA, and the learning curve (checkpoints: trainer.learn.guard).

Counts environment steps across all parallel environments (``num_timesteps``), not callback calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stable_baselines3.common.callbacks import BaseCallback

from trainer.base import logs
from trainer.base.progress import Progress
from trainer.env.citylearn import make_sb3_env
from trainer.judge.metrics import run_episode
from trainer.learn.selection import BestPolicy, Candidate, record_references, validation_site
from trainer.learn.warm_start.pick import co2_over, per_year
from trainer.references.controllers import PolicyController
from trainer.run.device import CoresWatch
from trainer.sim.simulators import chooses_on_simulator, judging_env
from trainer.site import Site

if TYPE_CHECKING:
    from trainer.run.folder import RunContext

class ProgressCallback(BaseCallback):
    """Training progress: a bar on a terminal, a line every 10% (and every minute) on a pipe."""

    def __init__(self, agent: str, total: int):
        super().__init__()
        self.agent = agent
        self.total = total
        self._progress: Progress | None = None

    def _on_training_start(self) -> None:
        self._progress = Progress("training progress", self.total, initial=self.num_timesteps, agent=self.agent)

    def _on_step(self) -> bool:
        if self._progress is not None:
            self._progress.update(self.num_timesteps)
        return True

    def _on_training_end(self) -> None:
        if self._progress is not None:
            self._progress.close()


class ThreadsFollowCores(BaseCallback):
    """An agent whose torch threads are one per free core (trainer.run.device.cpu_threads_for) keeps them so while
    it trains: every ``every_s`` it looks at what the cores did since its last look and sets torch's threads to the
    cores other work left free. The stage's start fixed them at what it found then: work beside it that ends
    later (a later stage's student imitated beside SAC's) would leave a core idle for the minutes it learns, and
    beside work that starts later a second thread waits on the busy core (issue 56: 7x slower). A thread more or
    less changes float roundings, not what is learnt."""

    EVERY_S = 30.0

    def __init__(self, agent: str, every_s: float = EVERY_S):
        super().__init__()
        self.agent, self.every_s = agent, every_s
        self._watch: Any = None
        self._next = 0.0

    def _on_training_start(self) -> None:
        self._watch, self._next = CoresWatch(), time.monotonic() + self.every_s

    def _on_step(self) -> bool:
        if self._watch is None or time.monotonic() < self._next:
            return True
        import torch  # lazy: torch takes seconds to import

        self._next = time.monotonic() + self.every_s
        free, threads = self._watch.free(), torch.get_num_threads()
        if free is not None and free != threads:
            torch.set_num_threads(free)
            logs.get().info("torch threads follow the cores free of other work", agent=self.agent, before=threads,
                            now=free, step=self.num_timesteps)
        return True


class EvalCurve(BaseCallback):
    """The learning curve and the validation behind the deployed policy (trainer.learn.selection).

    A fresh stage's first policy (its warm start, step 0), then one every
    ``schedule.curve_every_steps``, and the last, are evaluated deterministically over
    ``schedule.curve_eval_days`` of the validation window; each gives a row of ``eval_curve.csv`` (the
    report's curve) and is offered to ``BestPolicy``, which keeps the best in ``<agent>/best/``.

    The evaluations run in CityLearn, the judge, or on the training simulator where it steps the window as
    CityLearn does (``train.choose_on``: the built-in site), and take at most ``schedule.curve_max_share`` of
    the stage's time: one that took d seconds is followed by at least d (1 - share) / share seconds
    of training. On CityLearn's own environments that changes nothing; on the training simulator,
    which trains thousands of steps while CityLearn evaluates a week, it keeps the curve from
    becoming the stage. The first and last evaluations are never skipped.

    With ``patience_steps``, an evaluation after which the best policy is that many steps old ends the
    stage (``flat_at``): the next step returns False, before anything more is learnt, so the policy the stage
    ends with is the one just evaluated.

    Runs at rollout starts, after the Guard has taken its snapshot, and draws no random
    numbers (deterministic actions, its own environment), so it leaves resumes exact.
    """

    def __init__(self, ctx: RunContext, agent: str, path: Path, clock: Callable[[], float] = time.perf_counter,
                 best: BestPolicy | None = None, patience_steps: int | None = None):
        super().__init__()
        self.ctx = ctx
        self.agent = agent
        self.path = path
        self.every = ctx.cfg.schedule.curve_every_steps
        self.share = ctx.cfg.schedule.curve_max_share
        self.clock = clock
        self.best = best
        self._env = None
        self._site: Site | None = None  # the window's site, once the first evaluation has asked
        self._on_simulator = False  # judged on the training simulator (chooses_on_simulator), not CityLearn
        self._next = None
        self._not_before = 0.0
        self._last_evaluated: int | None = None
        self.patience_steps = patience_steps
        self.flat_at: int | None = None  # the step whose evaluation found the curve flat for patience_steps

    def _on_training_start(self) -> None:
        self._next = (self.num_timesteps // self.every + 1) * self.every
        if self.num_timesteps == 0 and self.best is not None:
            self._evaluate_now()  # the warm start: the first candidate

    def _on_rollout_start(self) -> None:
        if self._next is None or self.num_timesteps < self._next or self.clock() < self._not_before:
            return
        self._next = (self.num_timesteps // self.every + 1) * self.every
        self._evaluate_now()

    def _evaluate_now(self) -> None:
        started = self.clock()
        self.evaluate()
        self._last_evaluated = self.num_timesteps
        took = self.clock() - started
        self._not_before = self.clock() + took * (1 - self.share) / self.share
        if self.best is not None and self.best.flat(self.num_timesteps, self.patience_steps):
            self.flat_at = self.num_timesteps

    def finish(self, model: Any) -> None:
        """After learn(): the last policy is a candidate too (unless it was just evaluated). A stage that its time
        slot ended has rewound ``model.num_timesteps`` to its last checkpoint, whose policy the model holds."""
        if self.best is None or self._last_evaluated == model.num_timesteps or self.flat_at is not None:
            return  # (a flat curve's stage ended before learning from the policy it had just evaluated)
        self.model, self.num_timesteps = model, model.num_timesteps
        self.evaluate()
        self._last_evaluated = model.num_timesteps

    def evaluate(self) -> None:
        cfg = self.ctx.cfg
        if self._site is None:
            self._site, held_out = validation_site(self.ctx) if self.best is not None else (self.ctx.site, False)
            self._on_simulator = chooses_on_simulator(cfg, self._site)
            if held_out:  # the curve's reference lines, in CityLearn once a run
                env = make_sb3_env(cfg, self._site, "eval", self.ctx.seed, eval_days=cfg.schedule.curve_eval_days)
                try:
                    record_references(self.ctx, env, held_out)
                finally:
                    env.close()
        start = time.perf_counter()
        if self._on_simulator:
            # The same figure as CityLearn's to float roundings in two thirds of its time; EV service is the guard's
            # there as in CityLearn (every reachable departure met), so it is not what the curve tells apart.
            steps = cfg.schedule.curve_eval_days * 24
            if self._env is None:
                self._env = judging_env(cfg, self._site, 1, steps)
            co2 = co2_over(self._env, [self.model.policy])[0] * per_year(self._site, steps)
            metrics = {"co2_kg_per_year": float(co2), "ev_departure_soc_met_pct": None}
        else:
            if self._env is None:
                self._env = make_sb3_env(cfg, self._site, "eval", self.ctx.seed,
                                         eval_days=cfg.schedule.curve_eval_days)
            metrics = run_episode(PolicyController(self.agent, self.model), self._env)
        new = not self.path.exists()
        with open(self.path, "a", encoding="utf-8") as handle:
            if new:
                handle.write("step,co2_kg_per_year,ev_departure_soc_met_pct,seconds\n")
            ev = metrics["ev_departure_soc_met_pct"]
            handle.write(f"{self.num_timesteps},{metrics['co2_kg_per_year']:.3f},{'' if ev is None else f'{ev:.2f}'},"
                         f"{time.perf_counter() - start:.2f}\n")
        if self.best is not None:
            self.best.offer(self.model, Candidate(int(self.num_timesteps), float(metrics["co2_kg_per_year"]),
                                                  None if ev is None else float(ev)))

    def _on_step(self) -> bool:
        return self.flat_at is None

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
