"""`trainer tune AGENT`: a search over the agent's settings (trainer/tune/space.py) that finds what holds on fresh
seeds and on the part of the data held out, within a budget, resumable.

The search is Optuna's: TPE proposes settings, a median pruner stops a trial whose validation score at a point of
its training is worse than the median of earlier trials' there. Each trial is trained under ``tune.seeds`` seeds
(trainer/tune/trial.py) and scored by their mean on the validation window; the defaults are the first trial. Once
the search's share of the budget is spent, the best ``tune.rerun_top`` settings and the defaults are trained again
under fresh seeds and judged on the part held out (the report's figures); the re-run ranks them. Everything lives
in the tune folder: the study (Optuna's journal file), each trial's run folder, the re-runs, the report and the
answer (best.yaml, for ``trainer night --config``).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from trainer.base import logs
from trainer.base.errors import TrainerError, UsageError
from trainer.base.files import read_json, write_json_atomic, write_text_atomic
from trainer.base.signals import Stopped
from trainer.config.sections import Config
from trainer.learn.recovery import TrainingInterrupted
from trainer.site import Site
from trainer.site.scenario import build_site
from trainer.tune import space as spaces
from trainer.tune.trial import spread, train_once, trial_config

STUDY_FILE = "study.journal"
STATE_FILE = "tune.json"
RERUNS_FILE = "reruns.json"
BEST_FILE = "best.yaml"
# Optuna stores which trial holds the night's own settings under this user attribute.
DEFAULTS_ATTR = "defaults"
# A validation's step is reported to the pruner as the share of the trial's target it falls in (eighths): the
# curve's evaluations are throttled by time, so trials validate at different steps; the pruner compares like with
# like.
BUCKETS = 8


@dataclass
class TuneFolder:
    """A tune's folder and the files in it."""

    root: Path

    study = property(lambda self: self.root / STUDY_FILE)
    state = property(lambda self: self.root / STATE_FILE)
    reruns = property(lambda self: self.root / RERUNS_FILE)
    best = property(lambda self: self.root / BEST_FILE)
    report = property(lambda self: self.root / "report.md")
    history = property(lambda self: self.root / "history.png")
    config = property(lambda self: self.root / "config.yaml")
    shared = property(lambda self: self.root / "shared")
    site = property(lambda self: self.root / "site")
    log = property(lambda self: self.root / "logs" / "tune.jsonl")


@dataclass(frozen=True)
class TunePlan:
    """What a tune was asked for: kept in tune.json, so a resume goes on with the same."""

    agent: str
    schema: str  # the dataset's schema.json (the built-in site: generated into site/)
    seeds: list[int]  # each trial's
    rerun_seeds: list[int]  # the re-runs' fresh ones
    deadline: str | None  # ISO local time; None: until tune.trials
    started: str
    space: list[dict[str, Any]]  # the parameters searched (trainer.tune.space.to_rows)

    @property
    def params(self) -> tuple[spaces.Param, ...]:
        return spaces.from_rows(self.space)

    def save(self, folder: TuneFolder) -> None:
        write_json_atomic(folder.state, self.__dict__)

    @classmethod
    def load(cls, folder: TuneFolder) -> TunePlan:
        data = read_json(folder.state)
        try:
            return cls(**data)
        except TypeError as exc:
            raise TrainerError(f"{folder.state} is damaged ({exc}); start the tune again in a new folder") from None


def new_tune(cfg: Config, agent: str, out: Path, given: Site | None, deadline: datetime | None,
             params: tuple[spaces.Param, ...]) -> TuneFolder:
    """A tune folder made for ``agent``: its config, its dataset (the built-in site generated into it) and plan."""
    folder = TuneFolder(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write the tune folder {out}: {exc.strerror} (choose another --out)") from None
    schema = given.schema if given is not None else build_site(cfg.scenario, folder.site)
    write_text_atomic(folder.config, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    base = cfg.seed
    TunePlan(agent, str(Path(schema).resolve()), [base + 1000 * k for k in range(cfg.tune.seeds)],
             [base + 7919 + 1000 * k for k in range(cfg.tune.rerun_seeds)],
             deadline.isoformat(timespec="seconds") if deadline else None,
             datetime.now().isoformat(timespec="seconds"), spaces.to_rows(params)).save(folder)
    return folder


def open_study(folder: TuneFolder, cfg: Config, plan: TunePlan, driver: bool = True) -> Any:
    """The study in the folder's journal (made, with the defaults as its first trial, on the first call); for the
    ``driver``, trials a killed tune left running are failed, so the search goes on from the rest (a Ray worker
    opens it beside trials that are running)."""
    storage = JournalStorage(JournalFileBackend(str(folder.study)))
    name = f"tune-{plan.agent}"
    try:
        earlier = len(optuna.load_study(study_name=name, storage=storage).trials)
    except KeyError:  # the first call: no study yet
        earlier = 0
    # Seeded by the trials so far: a resumed tune does not draw its random startup trials again.
    sampler = optuna.samplers.TPESampler(seed=cfg.seed + earlier, n_startup_trials=cfg.tune.startup_trials)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=cfg.tune.startup_trials, n_warmup_steps=1)
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                                direction="minimize", load_if_exists=True)
    if not study.trials:
        own = spaces.defaults(cfg.to_dict(), plan.params)
        fixed = {}
        for param in plan.params:
            value = own[param.key]
            if param.choices and value not in param.choices:
                continue  # a setting outside the table's choices: that parameter is searched from the start
            if not param.choices and not (param.low <= value <= param.high):
                continue
            fixed[param.key] = param.stored(value)
        study.enqueue_trial(fixed, user_attrs={DEFAULTS_ATTR: True})
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)) if driver else ():
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        logs.get().warning("a trial a stopped tune left running is failed", trial=trial.number)
    return study


def settings_of(trial: Any, params: tuple[spaces.Param, ...]) -> dict[str, Any]:
    """A trial's settings by config key, sampled now."""
    return {param.key: param.sample(trial) for param in params}


def stored_settings(frozen: Any, params: tuple[spaces.Param, ...]) -> dict[str, Any]:
    """A finished trial's settings by config key, as it stored them."""
    table = {param.key: param for param in params}
    return {key: table[key].shown(value) for key, value in frozen.params.items() if key in table}


@dataclass
class Search:
    """The search's loop and what one trial does, shared by both backends."""

    folder: TuneFolder
    cfg: Config
    plan: TunePlan
    study: Any
    end: float | None  # monotonic time the search stops starting trials by
    say: Callable[[str], None]

    def time_left(self) -> float | None:
        return None if self.end is None else self.end - time.monotonic()

    def room_for_a_trial(self) -> bool:
        """Whether another trial fits: fewer than tune.trials asked, and (timed) its expected length left."""
        trials = self.study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state.is_finished()]
        # Running ones count (side by side on Ray); failed ones do not (a stop, or a trial that could not train).
        if sum(t.state is not optuna.trial.TrialState.FAIL for t in trials) >= self.cfg.tune.trials:
            return False
        left = self.time_left()
        if left is None:
            return True
        lengths = [(t.datetime_complete - t.datetime_start).total_seconds() for t in done
                   if t.state is optuna.trial.TrialState.COMPLETE and t.datetime_complete and t.datetime_start]
        return left > (statistics.median(lengths) if lengths else 0.0)

    def run_here(self) -> None:
        """Trials one after another in this process; a stop signal fails the trial it stopped (a resume goes on)."""
        while self.room_for_a_trial():
            trial = self.study.ask()
            try:
                outcome = self.evaluate(trial, settings_of(trial, self.plan.params))
            except (Stopped, TrainingInterrupted):
                self.tell(trial.number, ("failed", None, "stopped"))
                raise
            self.tell(trial.number, outcome)

    def evaluate(self, trial: Any, settings: dict[str, Any]) -> tuple[str, float | None, str]:
        """One trial under each of its seeds: ("complete", mean score, "") or ("pruned" | "failed", None, why); a stop
        signal raises."""
        agent, tune = self.plan.agent, self.cfg.tune
        overrides = spaces.overrides(settings)
        timesteps = tune.trial_timesteps.get(agent, self.cfg.agent(agent).timesteps or 100_000)
        scores = []
        bucket = max(timesteps // BUCKETS, 1)
        reported = set()

        def report(step: int, value: float) -> None:
            at = step // bucket
            if at in reported:
                return
            reported.add(at)
            trial.report(value, at)
            if trial.should_prune():
                raise optuna.TrialPruned()

        self.say(f"trial {trial.number}: {', '.join(f'{k}={_short(v)}' for k, v in settings.items())}")
        for k, seed in enumerate(self.plan.seeds):
            left = self.time_left()
            if left is not None and left <= 0:
                return "pruned", None, "the search's time ran out"
            cfg = trial_config(self.cfg, overrides, seed, timesteps, agent)
            where = self.folder.root / "trials" / f"{trial.number:04d}-seed-{seed}"
            try:
                result = train_once(cfg, agent, Path(self.plan.schema), where, self.folder.shared,
                                    report=report if k == 0 else None, time_limit_s=left)
            except optuna.TrialPruned:
                return "pruned", None, f"its validation score was worse than the median at that point (seed {seed})"
            except TrainerError as exc:
                return "failed", None, str(exc)
            finally:
                logs.configure(self.folder.log)
            score = result["score"]
            if score["cut_short"]:
                return "pruned", None, "the search's time ran out before its target"
            scores.append(score["value"])
            trial.set_user_attr(f"seed_{seed}", score)
        return "complete", statistics.fmean(scores), ""

    def tell(self, number: int, outcome: tuple[str, float | None, str]) -> None:
        state, value, why = outcome
        if state == "complete":
            self.study.tell(number, value)
            best = self.study.best_value
            standing = "  (best so far)" if value <= best else f", best {best:,.1f}"
            self.say(f"trial {number}: score {value:,.1f}{standing}")
        else:
            self.study.tell(number, state=optuna.trial.TrialState.PRUNED if state == "pruned"
                            else optuna.trial.TrialState.FAIL)
            self.say(f"trial {number}: {state}: {why}")
            logs.get().info("trial ended", trial=number, state=state, why=why)


def ranked(reruns: dict[str, Any]) -> list[dict[str, Any]]:
    """The re-run settings, best first: by mean share of the optimum's cut on the part held out (else its CO2)."""
    rows = []
    for name, entry in reruns.items():
        runs = list(entry["runs"].values())
        shares = [r["held_out_share"] for r in runs if r.get("held_out_share") is not None]
        co2 = [r["co2_kg_per_year"] for r in runs if r.get("co2_kg_per_year") is not None]
        met = [r["ev_departure_soc_met_pct"] for r in runs if r.get("ev_departure_soc_met_pct") is not None]
        rows.append({"name": name, "settings": entry["settings"], "seeds": len(runs),
                     "steps": [r["validation"]["step"] for r in runs],
                     "share": statistics.fmean(shares) if shares else None, "share_sd": spread(shares),
                     "co2": statistics.fmean(co2) if co2 else None, "co2_sd": spread(co2),
                     "ev_met": min(met) if met else None})
    # Best first; a tie with the defaults ranks the defaults first (a setting must beat them to be the answer).
    return sorted(rows, key=lambda r: (-(r["share"] if r["share"] is not None else float("-inf")),
                                       r["co2"] if r["co2"] is not None else float("inf"), r["name"] != "defaults"))


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else json.dumps(value)
