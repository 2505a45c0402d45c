"""One trial of `trainer tune` under one seed: the agent trained as a night's stage trains it, in a run folder of its
own, and scored on the validation window (never on the part the report judges on).

A trial is a night's stage made short: the same warm start (its ensemble sized by ``tune.warm_start_ensemble``), the
same training simulator, the same validation window and best-policy selection; its score is the validation CO2 of
the policy the stage would deploy, raised by ``tune.ev_shortfall_cost`` per point of EV departures below the target.
A re-run adds what a night adds: its deployed policy and the references judged on the part held out.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from trainer.config.loading import with_overrides
from trainer.config.sections import Config
from trainer.learn.selection import BestPolicy, Candidate
from trainer.learn.trainer import StageTrainer
from trainer.run import session
from trainer.run.device import resolve_agent
from trainer.run.folder import RunDir

# The run folders' caches a trial shares with the others (the warm start's demonstrations and imitations, keyed
# by what they were made of): copied in before it trains and out after, so each is made once per tune.
SHARED = ("imitations", "demonstration-sites", "validation-site", "unseen-year")



@dataclass(frozen=True)
class Score:
    """A trained trial's validation figures and its score (smaller is better)."""

    value: float
    co2_kg_per_year: float
    ev_departure_soc_met_pct: float | None
    step: int  # the deployed policy's step (0: its warm start)
    trained: int  # steps trained
    cut_short: bool  # its time ran out before its target

    @classmethod
    def of(cls, best: Candidate, cfg: Config, trained: int, cut_short: bool) -> Score:
        return cls(score(best, cfg), best.co2_kg_per_year, best.ev_departure_soc_met_pct, best.step, trained,
                   cut_short)


def score(candidate: Candidate, cfg: Config) -> float:
    """Validation CO2, raised by ``tune.ev_shortfall_cost`` of itself per point of departures met below the target:
    a policy that leaves cars short never wins on CO2 alone."""
    met = candidate.ev_departure_soc_met_pct
    shortfall = 0.0 if met is None else max(cfg.ev.target_met_pct - met, 0.0)
    return candidate.co2_kg_per_year * (1.0 + cfg.tune.ev_shortfall_cost * shortfall)


class ReportToPruner(BaseCallback):
    """After each validation of the stage (its EvalCurve runs just before), tells ``report`` the score of the best
    policy so far at this step; ``report`` raises optuna.TrialPruned to stop the trial."""

    def __init__(self, best: BestPolicy, cfg: Config, report: Callable[[int, float], None]):
        super().__init__()
        self.best, self.cfg, self.report = best, cfg, report
        self._seen = 0

    def _on_rollout_start(self) -> None:
        if self.best.evaluated > self._seen and self.best.best is not None:
            self._seen = self.best.evaluated
            self.report(int(self.num_timesteps), score(self.best.best, self.cfg))

    def _on_step(self) -> bool:
        return True


def trial_config(base: Config, settings_overrides: list[str], seed: int, timesteps: int, agent: str) -> Config:
    """A trial's config: the night's, the trial's settings, its seed, its length and the warm start's size."""
    return with_overrides(base, [*settings_overrides, f"seed={seed}", f"{agent}.timesteps={timesteps}",
                                 f"{agent}.episodes=null", f"warm_start.ensemble={base.tune.warm_start_ensemble}",
                                 "train.keep_best=true"])


def train_once(cfg: Config, agent: str, schema: Path, folder: Path, shared: Path,
               report: Callable[[int, float], None] | None = None, time_limit_s: float | None = None,
               judge: bool = False) -> dict[str, Any]:
    """Train ``agent`` under ``cfg`` in the run folder ``folder`` on the dataset ``schema``; its score on the
    validation window and, with ``judge``, its deployed policy's and the references' figures on the part held out
    (``cfg.schedule.eval_days`` of it)."""
    from trainer.night import stages  # lazy: the stages import the references and the judge

    timesteps = int(cfg.agent(agent).timesteps)
    _share(shared, folder)  # the held-out year and the validation window too, which open_run and the stage draw
    with session.open_run(cfg, f"tune {agent}", folder, str(schema)) as ctx:
        handle = resolve_agent(ctx.cfg, agent)
        trainer = StageTrainer(ctx, handle, timesteps, time_limit_s=time_limit_s)
        if report is not None:
            assert trainer.best is not None  # train.keep_best: the trial's config sets it
            trainer.extra_callbacks.append(ReportToPruner(trainer.best, ctx.cfg, report))
        try:
            model = trainer.train()
        finally:
            trainer.close()
            _share(ctx.run.root, shared)
        assert trainer.best is not None and trainer.best.best is not None  # the warm start is always a candidate
        found = Score.of(trainer.best.best, ctx.cfg, int(model.num_timesteps), trainer.timed_out)
        result: dict[str, Any] = {"score": asdict(found), "folder": str(ctx.run.root)}
        if judge:
            best_path = ctx.run.agent(agent).best_model
            deployed = stages.load_model(ctx.cfg, agent, best_path, device=handle.device, fix="run the tune again")
            result["held_out"] = stages.evaluate_model(ctx, agent, deployed, best_path)
            result["references"] = {name: stages.evaluate_reference(ctx, name) for name in ("baseline", "optimum")}
        else:
            _slim(ctx.run, agent)
        return result


def _slim(run: RunDir, agent: str) -> None:
    """Leave a scored trial's folder with what says how it went (its learning curve, progress, log and config): the
    shared caches' copies, its checkpoints and models go. A tune of 200 trials under two seeds would otherwise keep
    400 sets of them (~10 MB each on the built-in site)."""
    for name in SHARED:
        shutil.rmtree(run.root / name, ignore_errors=True)
    agent_dir = run.agent(agent)
    kept = (agent_dir.curve, agent_dir.progress)
    for path in agent_dir.root.iterdir() if agent_dir.root.is_dir() else ():
        if path in kept:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _share(source: Path, target: Path) -> None:
    """Copy the shared caches' files from ``source`` into ``target`` where ``target`` lacks them."""
    for name in SHARED:
        folder = source / name
        if not folder.is_dir():
            continue
        for path in folder.rglob("*"):
            if path.is_file() and not path.name.endswith(".lock"):
                copy = target / name / path.relative_to(folder)
                if not copy.exists():
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, copy)


def held_out_share(result: dict[str, Any]) -> float | None:
    """A re-run's share of the optimum's cut on the part held out: (baseline - it) / (baseline - optimum)."""
    refs, own = result.get("references") or {}, result.get("held_out") or {}
    baseline = (refs.get("baseline") or {}).get("co2_kg_per_year")
    optimum = (refs.get("optimum") or {}).get("lp_co2_kg_per_year") or (refs.get("optimum") or {}).get(
        "co2_kg_per_year")
    co2 = own.get("co2_kg_per_year")
    if None in (baseline, optimum, co2) or baseline <= optimum:
        return None
    return (baseline - co2) / (baseline - optimum)


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0

