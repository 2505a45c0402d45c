"""`trainer tune`'s course: the checks before its folder, the search (here or on Ray), the re-runs on fresh seeds,
the report (trainer/tune/study.py holds the study and one trial's course; docs/tune.md)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna

from trainer.base import logs
from trainer.base.errors import TrainerError, UsageError
from trainer.base.files import read_json, write_json_atomic
from trainer.config.loading import with_overrides
from trainer.config.sections import Config
from trainer.night.backends import backend
from trainer.run import session
from trainer.run.lock import RunLock
from trainer.site import given_site
from trainer.tune import space as spaces
from trainer.tune.report import write_report
from trainer.tune.study import (
    DEFAULTS_ATTR,
    STATE_FILE,
    Search,
    TuneFolder,
    TunePlan,
    new_tune,
    open_study,
    stored_settings,
)
from trainer.tune.trial import held_out_share, train_once, trial_config


def run_tune(folder: TuneFolder, cfg: Config, deadline: datetime | None, backend_name: str,
             backend_options: dict[str, Any], say: Callable[[str], None]) -> Path:
    """The search, then the re-runs, then the report; returns report.md's path. Holds the folder's lock."""
    plan = TunePlan.load(folder)
    lock = RunLock(folder.root).acquire()
    try:
        logs.configure(folder.log)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = open_study(folder, cfg, plan)
        started = time.monotonic()
        total = None if deadline is None else max((deadline - datetime.now()).total_seconds(), 0.0)
        search_end = None if total is None else started + total * (1 - cfg.tune.rerun_share)
        end = None if total is None else started + total
        search = Search(folder, cfg, plan, study, search_end, say)
        if backend_name == "ray":
            from trainer.tune.ray_trials import search_on_ray  # lazy: Ray is an optional extra

            search_on_ray(search, backend_options)
        else:
            search.run_here()
        rerun(folder, cfg, plan, study, end, say)
        return write_report(folder, cfg, plan, study)
    finally:
        logs.configure(folder.log)
        lock.release()


def rerun(folder: TuneFolder, cfg: Config, plan: TunePlan, study: Any, end: float | None,
          say: Callable[[str], None]) -> dict[str, Any]:
    """The best settings and the defaults trained again under fresh seeds and judged on the part held out; kept in
    reruns.json as each ends (a resume skips those done)."""
    done: dict[str, Any] = read_json(folder.reruns) if folder.reruns.is_file() else {}
    candidates = rerun_candidates(study, cfg, plan)
    runs = [(name, settings, seed) for name, settings in candidates for seed in plan.rerun_seeds
            if str(seed) not in done.get(name, {}).get("runs", {})]
    # A fresh seed's run begins with its own warm start, which no time slot cuts: one is started only where a trial's
    # seed took no longer than the time left (measured in the search), so the tune ends on time.
    lengths = [(t.datetime_complete - t.datetime_start).total_seconds() / len(plan.seeds)
               for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
               if t.datetime_complete and t.datetime_start]
    expected = statistics.median(lengths) if lengths else 0.0
    for index, (name, settings, seed) in enumerate(runs):
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= expected:
            say(f"re-runs: the budget ran out with {len(runs) - index} left (a run takes ~{expected:.0f} s; the "
                "report ranks what ran)")
            break
        say(f"re-run {name}, seed {seed} ({index + 1}/{len(runs)})")
        timesteps = cfg.tune.trial_timesteps.get(plan.agent, cfg.agent(plan.agent).timesteps or 100_000)
        run_cfg = with_overrides(trial_config(cfg, spaces.overrides(settings), seed, timesteps, plan.agent),
                                 [f"schedule.eval_days={cfg.tune.rerun_eval_days}"])
        try:
            result = train_once(run_cfg, plan.agent, Path(plan.schema), folder.root / "reruns" / f"{name}-seed-{seed}",
                                folder.shared, time_limit_s=None if left is None else left / (len(runs) - index),
                                judge=True)
        except TrainerError as exc:
            say(f"re-run {name}, seed {seed}: failed: {exc}")
            continue
        finally:
            logs.configure(folder.log)
        entry = done.setdefault(name, {"settings": settings, "runs": {}})
        entry["runs"][str(seed)] = {
            "validation": result["score"], "held_out_share": held_out_share(result),
            "co2_kg_per_year": result["held_out"].get("co2_kg_per_year"),
            "ev_departure_soc_met_pct": result["held_out"].get("ev_departure_soc_met_pct"),
            "folder": result["folder"]}
        write_json_atomic(folder.reruns, done)
    return done


def rerun_candidates(study: Any, cfg: Config, plan: TunePlan) -> list[tuple[str, dict[str, Any]]]:
    """(name, settings) of the best ``tune.rerun_top`` complete trials and of the defaults."""
    complete = sorted(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)),
                      key=lambda t: t.value)
    chosen: list[tuple[str, dict[str, Any]]] = []
    seen: list[dict[str, Any]] = []
    own = spaces.defaults(cfg.to_dict(), plan.params)
    for trial in complete:
        settings = {**own, **stored_settings(trial, plan.params)}
        if settings in seen or trial.user_attrs.get(DEFAULTS_ATTR):
            continue
        chosen.append((f"trial-{trial.number}", settings))
        seen.append(settings)
        if len(chosen) == cfg.tune.rerun_top:
            break
    return [("defaults", own), *chosen]  # the defaults first: a budget cut still leaves the comparison


def prepare(agent: str, config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None,
            schema: str | None, dataset: str | None, holdout: str | None, eval_schema: str | None,
            eval_dataset: str | None, device: str | None, out: str | None, seed: int | None, budget: str | None,
            finish_by: str | None, trials: int | None, resume: str | None, backend_name: str,
            backend_options: dict[str, Any],
            space_file: str | None = None) -> tuple[TuneFolder, Config, datetime | None]:
    """What `trainer tune` was asked, checked (the config, the dataset, the search space, the budget, the backend)
    before its folder is made or, resuming, touched; the folder made for a new tune."""
    extra = [*(f"tune.trials={trials}",) * (trials is not None)]
    if resume is not None:
        if config_files or overrides or profile or schema or dataset or holdout or eval_schema or eval_dataset \
                or seed is not None or space_file:
            raise UsageError("a resumed tune keeps its own config, dataset, seeds and search space (its folder's "
                             "config.yaml and tune.json): pass only --budget, --finish-by, --trials or --backend")
        folder = TuneFolder(Path(resume))
        if not folder.state.is_file():
            raise UsageError(f"--resume: {resume} is not a tune folder (no {STATE_FILE}); pass a folder trainer tune "
                             "made")
        plan = TunePlan.load(folder)
        if plan.agent != agent:
            raise UsageError(f"--resume: {resume} tunes {plan.agent}, not {agent}: trainer tune {plan.agent} "
                             f"--resume {resume}")
        cfg = session.resolve_config([folder.config], extra, device=device)
        deadline = session.night_deadline(cfg, budget, finish_by)
        if deadline is None and plan.deadline is not None:
            deadline = datetime.fromisoformat(plan.deadline)
            if deadline <= datetime.now():
                raise UsageError(f"--resume: the tune's deadline ({plan.deadline}) has passed; give it more time "
                                 "with --budget (e.g. --budget 20m)")
        backend(backend_name).check(cfg, backend_options)
        return folder, cfg, deadline
    cfg = session.resolve_config(config_files, [*overrides, *session.holdout_overrides(holdout, eval_schema,
                                                                                         eval_dataset), *extra],
                                 seed=seed, device=device, profile=profile)
    given = given_site(schema, dataset)
    cfg = session.settled_on(cfg, given)  # before the tune's config.yaml, which its trials and a resume read
    params = spaces.read_space(Path(space_file)) if space_file else spaces.space(agent)
    spaces.check_space(params, cfg)
    deadline = session.night_deadline(cfg, budget, finish_by)
    if deadline is None and trials is None:
        raise UsageError(f"trainer tune needs --budget, --finish-by or --trials (without one it would run "
                         f"tune.trials, {cfg.tune.trials} trials): e.g. trainer tune {agent} --budget 30m")
    if given is not None:
        session.judged_instead(given, cfg.holdout)
    backend(backend_name).check(cfg, backend_options)
    target = Path(out) if out else Path(cfg.output.root) / (
        f"{cfg.scenario.name if given is None else given.label or 'dataset'}__tune-{agent}__{cfg.seed}__"
        f"{datetime.now():%Y%m%d-%H%M%S}")
    if (target / STATE_FILE).exists():
        raise UsageError(f"{target} already holds a tune: resume it with trainer tune {agent} --resume {target}, or "
                         "choose another --out")
    if target.is_dir() and any(target.iterdir()):
        raise UsageError(f"{target} is not empty and holds no tune: choose another --out (a tune writes its study, "
                         "trials and report there)")
    return new_tune(cfg, agent, target, given, deadline, params), cfg, deadline
