"""SB3 callbacks: a progress bar with steps/s and ETA (checkpoints: trainer.learn.trainer.Guard).

Counts environment steps across all parallel environments (``num_timesteps``), not callback calls.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from stable_baselines3.common.callbacks import BaseCallback

from trainer import logs
from trainer.controllers import PolicyController
from trainer.env import make_sb3_env
from trainer.metrics import run_episode

if TYPE_CHECKING:
    from trainer.session import RunContext

PROGRESS_LOG_FRACTION = 0.1


class ProgressCallback(BaseCallback):
    """A tqdm bar on a terminal; on a pipe, a structured log event every 10% instead."""

    def __init__(self, agent: str, total: int):
        super().__init__()
        self.agent = agent
        self.total = total
        self._bar = None
        self._start = 0.0
        self._start_steps = 0
        self._next_log = 0

    def _on_training_start(self) -> None:
        from tqdm import tqdm

        self._start = time.perf_counter()
        self._start_steps = self.num_timesteps
        self._next_log = self.num_timesteps
        self._bar = tqdm(total=self.total, initial=self.num_timesteps, desc=f"train {self.agent}", unit="step",
                         dynamic_ncols=True, disable=None, leave=False)

    def _on_step(self) -> bool:
        if self._bar is not None:
            self._bar.update(self.num_timesteps - self._bar.n)
        if self.num_timesteps >= self._next_log and self._next_log <= self.total:
            elapsed = max(time.perf_counter() - self._start, 1e-9)
            rate = (self.num_timesteps - self._start_steps) / elapsed
            eta = max(self.total - self.num_timesteps, 0) / rate if rate > 0 else None
            # With a live bar on the terminal the event goes to the JSON log only.
            emit = logs.get().debug if self._bar is not None and not self._bar.disable else logs.get().info
            emit("training progress", agent=self.agent, step=self.num_timesteps, total=self.total,
                 steps_per_s=round(rate, 1), eta_s=round(eta) if eta is not None else None)
            self._next_log += max(int(self.total * PROGRESS_LOG_FRACTION), 1)
        return True

    def _on_training_end(self) -> None:
        if self._bar is not None:
            self._bar.close()


class EvalCurve(BaseCallback):
    """Every ``schedule.curve_every_steps``, evaluate the policy deterministically over
    ``schedule.curve_eval_days`` and append a row to ``eval_curve.csv`` (the report's curve).

    Runs at rollout starts, after the Guard has taken its snapshot, and draws no random
    numbers (deterministic actions, its own environment), so it leaves resumes exact.
    """

    def __init__(self, ctx: RunContext, agent: str, path: Path):
        super().__init__()
        self.ctx = ctx
        self.agent = agent
        self.path = path
        self.every = ctx.cfg.schedule.curve_every_steps
        self._env = None
        self._next = None

    def _on_training_start(self) -> None:
        self._next = (self.num_timesteps // self.every + 1) * self.every

    def _on_rollout_start(self) -> None:
        if self._next is None or self.num_timesteps < self._next:
            return
        self._next = (self.num_timesteps // self.every + 1) * self.every
        self.evaluate()

    def evaluate(self) -> None:
        if self._env is None:
            self._env = make_sb3_env(self.ctx.cfg, self.ctx.schema, "eval", self.ctx.seed,
                                     eval_days=self.ctx.cfg.schedule.curve_eval_days)
        start = time.perf_counter()
        metrics = run_episode(PolicyController(self.agent, self.model), self._env)
        new = not self.path.exists()
        with open(self.path, "a", encoding="utf-8") as handle:
            if new:
                handle.write("step,co2_kg_per_year,ev_departure_soc_met_pct,seconds\n")
            ev = metrics["ev_departure_soc_met_pct"]
            handle.write(f"{self.num_timesteps},{metrics['co2_kg_per_year']:.3f},{'' if ev is None else f'{ev:.2f}'},"
                         f"{time.perf_counter() - start:.2f}\n")

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
