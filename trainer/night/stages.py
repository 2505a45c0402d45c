"""What one stage of a run does: evaluate a reference, or train an agent, save it and evaluate it.

``trainer baseline`` runs the references, ``trainer train`` the baseline and one agent,
``trainer night`` every stage through the night's runner; each writes results.json as it
goes, so whatever finished is kept.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from trainer.base import logs
from trainer.base.beside import MIN_STEPS, beside
from trainer.base.errors import UsageError
from trainer.base.files import DamagedFile, read_json, write_json_atomic, write_text_atomic
from trainer.config.roster import AGENTS, Agent
from trainer.env.citylearn import make_sb3_env
from trainer.judge.metrics import METRIC_KEYS, compare_to_baseline, run_episode
from trainer.learn.agents import save_model_atomic
from trainer.learn.model_file import load_model
from trainer.learn.recovery import StageFailed
from trainer.learn.selection import confirm_over_the_years, kept_summary, validation_site
from trainer.learn.trainer import StageTrainer
from trainer.learn.trainer import summary as training_summary
from trainer.learn.warm_start import adopt_replay
from trainer.learn.warm_start.cloning import weights_digest
from trainer.learn.warm_start.validation import learning_part, validation_part
from trainer.night.budget import SAFETY, StageKind
from trainer.night.plan import ensemble_for_size
from trainer.night.state import StageJob, StageOutcome
from trainer.references import reuse as reuse_references
from trainer.references.controllers import PolicyController
from trainer.references.roster import BASELINE, REFERENCE_ROSTER, REFERENCES, ReferenceUnavailable
from trainer.run.device import agent_device, free_cores_now, resolve_agent
from trainer.run.folder import AgentDir, RunContext, RunDir
from trainer.run.session import training_timesteps, with_fitted_warm_start
from trainer.site import Site
from trainer.site.scenario import UNSEEN_YEAR_SEED_OFFSET

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

    from trainer.config.agents import AgentConfig
    from trainer.config.sections import Config
    from trainer.run.folder import RunContext


def _eval_env(ctx: RunContext, site: Site | None = None):
    """An evaluation environment of ``site`` (default: the part the run learns from; a part judged apart is scaled
    as the policies learnt, ``Site.scaled_as``)."""
    return make_sb3_env(ctx.cfg, site or ctx.site, "eval", ctx.seed, eval_days=ctx.cfg.schedule.eval_days)


def _history_env(ctx: RunContext):
    """The whole part of the data the run learns from, for a reference that learns as it goes (the planner's
    forecast) to read before the part held out."""
    return make_sb3_env(ctx.cfg, ctx.site, "eval", ctx.seed)


# What results.json keeps of an evaluation on the part a run learnt from, beside the held-out figures.
IN_SAMPLE_KEYS = ("co2_kg", "co2_kg_per_year", "ev_departure_soc_met_pct", "ev_unmet_kwh", "ev_excess_kwh", "cost",
                  "peak_kw", "eval_hours", "lp_co2_kg", "skipped")


def judged(ctx: RunContext, evaluate: Callable[[Site, Path | None], dict[str, Any]],
           timeseries: Path | None = None, inside: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """``evaluate(site, timeseries)`` on the part the run is judged on (the figures, the timeseries) and, where
    that is held out, on the part it learnt from too (``in_sample``, beside them). ``inside``, that second
    evaluation as a picklable function (a partial of a module-level one), runs in a process beside the first where
    a core is free (trainer.base.beside): the two years at once, not one after the other."""
    held = ctx.site.held_out
    if held is None:
        return evaluate(ctx.site, timeseries)
    days = ctx.cfg.schedule.eval_days
    steps = ctx.site.length if days is None else min(ctx.site.length, days * 24)
    worth = inside is not None and steps >= MIN_STEPS  # a test's few days: not worth a process's start
    started = time.perf_counter()
    pending = beside(inside or partial(evaluate, ctx.site, None), free=free_cores_now() if worth else 1)
    try:
        metrics = evaluate(held.site, timeseries)
        learnt = pending.result()
    finally:
        pending.cancel()
    metrics["in_sample"] = {k: learnt[k] for k in IN_SAMPLE_KEYS if k in learnt}
    # Both parts' wall time, side by side or one after the other as the machine allowed: what judging another policy
    # of this run costs now (evaluate_left_warm_starts).
    metrics["judged_s"] = round(time.perf_counter() - started, 2)
    return metrics


def _skipped(why: ReferenceUnavailable) -> dict[str, Any]:
    """A reference's entry where it cannot be prepared for this dataset: the reason, and no figures."""
    return {"skipped": str(why), "co2_kg": None, "co2_kg_per_year": None}


def evaluate_reference(ctx: RunContext, name: str, reuse: bool = True) -> dict[str, Any]:
    """Evaluate a reference of ``trainer.references.roster`` over the evaluation period (and the part held out);
    with ``reuse``, an earlier run's figures where its data and settings were this run's (trainer.references.reuse)."""
    log = logs.get().bind(agent=name)
    folder = ctx.run.agent(name)
    folder.root.mkdir(parents=True, exist_ok=True)
    kept = reuse_references.recall(ctx.cfg, ctx.site, ctx.seed, name, folder.timeseries) if reuse else None
    if kept is not None:
        write_json_atomic(folder.metrics, kept)
        log.info("reference reused: an earlier run's evaluation of the same data and settings", run=kept["reused_from"],
                 co2_kg_per_year=None if kept.get("co2_kg_per_year") is None else round(kept["co2_kg_per_year"], 1))
        return kept
    log.info("evaluating reference")

    def evaluate(site: Site, timeseries: Path | None) -> dict[str, Any]:
        return _reference_on(ctx, name, site, timeseries, held_out=site is not ctx.site)

    metrics = judged(ctx, evaluate, folder.timeseries, partial(_reference_on, ctx, name, ctx.site, None, False))
    metrics.update(timesteps=0, train_wall_s=0.0, steps_per_s=None)
    write_json_atomic(folder.metrics, metrics)
    reuse_references.remember(ctx.cfg, ctx.site, ctx.seed, name, metrics, folder.timeseries, ctx.run.root)
    if metrics.get("co2_kg_per_year") is not None:
        log.info("evaluated", co2_kg_per_year=round(metrics["co2_kg_per_year"], 1), seconds=metrics["eval_wall_s"])
    return metrics


def _reference_on(ctx: RunContext, name: str, site: Site, timeseries: Path | None, held_out: bool) -> dict[str, Any]:
    """Reference ``name``'s evaluation on ``site`` (the part learnt from, or the part ``held_out``)."""
    try:
        # A part held out: the references that learn (the planner's forecast) learn first from the part before.
        history = (lambda: _history_env(ctx)) if held_out else None
        controller, own = REFERENCE_ROSTER[name].prepare(ctx.cfg, lambda: _eval_env(ctx, site), history)
    except ReferenceUnavailable as exc:
        logs.get().warning("reference skipped", agent=name, reason=str(exc))
        return _skipped(exc)
    env = _eval_env(ctx, site)
    # The optimum's run over the part learnt from is the warm start's demonstrations of it, where the warm start
    # imitates all of that part (not a dataset it keeps validation days of): a year's replay less for the first
    # stage. Never the part held out, which nothing learns from.
    demonstrates = REFERENCE_ROSTER[name].demonstrates and not held_out and learning_part(site) is site
    trajectory: list | None = [] if demonstrates else None
    try:
        metrics = run_episode(controller, env, timeseries, label=name + (", held out" if held_out else ""),
                              trajectory=trajectory)
    finally:
        env.close()
    if trajectory:
        adopt_replay(ctx.cfg, site, ctx.seed, trajectory, metrics["eval_wall_s"])
    return {**metrics, **own}


def _policy_on(ctx: RunContext, agent: str, model: BaseAlgorithm | Path, site: Site, timeseries: Path | None,
               label: str | None) -> dict[str, Any]:
    """``agent``'s policy (``model``, or the model saved at that path) evaluated on ``site``."""
    if isinstance(model, Path):
        model = load_model(ctx.cfg, agent, model, device="cpu")  # a process beside: the CPU, as an evaluation runs
    env = _eval_env(ctx, site)
    try:
        return run_episode(PolicyController(agent, model), env, timeseries, label=label)
    finally:
        env.close()


def train_agent(ctx: RunContext, agent: str, timesteps: int, resume: bool = False, force: bool = False,
                callbacks: list | None = None, time_limit_s: float | None = None,
                warm_start_s: float | None = None, lean: bool = False, later: tuple[str, ...] = (),
                floor: tuple[int, float] | None = None, flat_ends: bool = True, past_target: int = 0,
                spare_s: float = 0.0) -> dict[str, Any]:
    """Train one SB3 agent (resuming from its checkpoints if asked), save it, evaluate it; within ``time_limit_s``
    (None: to its target), its warm start within ``warm_start_s`` of it; ``lean``: the night is short of time, and
    the pick is confirmed on the training simulator; ``later``: the night's training stages after it, whose warm
    starts may be prepared beside its own; ``floor``: (steps, seconds) it learns on past ``time_limit_s`` to those
    steps, for those seconds from now at most (trainer.night.state.StageJob.floor); ``flat_ends`` False: a flat
    curve does not end it (train.patience; trainer.night.state.StageJob.flat_ends); ``past_target`` above
    ``timesteps``: it learns on to that many steps within ``time_limit_s``, its learning rate held at its end past
    ``timesteps`` (trainer.night.state.StageJob.past_target), and stops ``spare_s`` before the end of
    ``time_limit_s`` once past ``timesteps`` (trainer.night.state.StageJob.spare_s)."""
    from stable_baselines3.common.utils import (
        set_random_seed,  # lazy: SB3 imports torch
    )

    handle = resolve_agent(ctx.cfg, agent)
    folder = ctx.run.agent(agent)
    folder.root.mkdir(parents=True, exist_ok=True)
    log = logs.get().bind(agent=agent)
    set_random_seed(ctx.seed)
    learns_to = max(timesteps, past_target)
    trainer = StageTrainer(ctx, handle, learns_to, callbacks, time_limit_s=time_limit_s, warm_start_s=warm_start_s,
                           later=later, floor=floor, flat_ends=flat_ends, decay_steps=timesteps, spare_s=spare_s)
    last_stage = {} if flat_ends or not ctx.cfg.train.patience else {
        "patience": "off: the night's last stage learns to its slot's end or its target"}
    if learns_to > timesteps:
        last_stage["past_target"] = (f"the night's last stage learns on to its slot's end, {learns_to:,} steps at "
                                     "most (schedule.last_stage_past_target), its learning rate held at its end past "
                                     "the target")
    log.info("training", timesteps=timesteps, device=handle.device, resume=resume, **last_stage,
             **_summary(handle.section))
    start = time.perf_counter()
    try:
        model = trainer.train(resume=resume, force=force)
        wall = time.perf_counter() - start
        # SB3 logs SAC per episode: a run shorter than one would leave progress.csv empty.
        model.logger.record("time/total_timesteps", model.num_timesteps)
        model.logger.record("time/wall_s", round(wall, 2))
        model.logger.dump(model.num_timesteps)
        trained_steps = int(model.num_timesteps)
        model, kept = _best_policy(ctx, handle, trainer, model, lean)
        last = trainer.checkpoints.last
        _save_model(model, folder, agent, last.path if last else None)
    finally:
        trainer.close()
    # Learning's own time and rate: the warm start (demonstrations, imitation) is counted apart, as warm_start_s.
    learning = max(wall - trainer.warm_start_s, 0.0)
    rate = round(trained_steps / learning, 2) if learning > 0 and trained_steps else None
    log.info("trained", timesteps=trained_steps, seconds=round(learning, 1), steps_per_s=rate,
             warm_start_s=round(trainer.warm_start_s, 1))
    metrics = evaluate_model(ctx, agent, model, folder.model)  # saved just above
    metrics.update(timesteps=trained_steps, train_wall_s=round(learning, 2),
                   warm_start_s=round(trainer.warm_start_s, 2), steps_per_s=rate, **training_summary(trainer),
                   ended_by=("time slot" if trainer.timed_out else "flat curve" if trainer.ended_flat else "target"),
                   **({"past_target": {"target": timesteps, "up_to": learns_to}} if learns_to > timesteps else {}),
                   checkpoint=str(last.path) if last else None, kept=kept)
    if folder.warm_start.is_file():
        metrics["warm_start"] = {**(metrics.get("warm_start") or {}),
                                 **_evaluate_warm_start(ctx, handle, metrics, lean=lean)}
    write_json_atomic(folder.metrics, metrics)
    return metrics


def _warm_start_key(ctx: RunContext, model: BaseAlgorithm) -> tuple[str, str]:
    """What a warm start's evaluation is kept under in this process: the run, what it is judged on, the weights."""
    held = ctx.site.held_out
    return (f"{ctx.run.root} {ctx.cfg.digest()} {ctx.site.schema} {ctx.site.start}-{ctx.site.end} "
            f"{None if held is None else (held.site.schema, held.site.start, held.site.end)}",
            weights_digest(model.policy, float(model.gamma), machine=False))


def _best_policy(ctx: RunContext, handle: Agent, trainer: StageTrainer, model: BaseAlgorithm,
                 lean: bool = False) -> tuple[BaseAlgorithm, dict[str, Any] | None]:
    """The policy to deploy: the best the stage has seen on the validation window (train.keep_best), or the last."""
    agent = handle.name
    best = trainer.best
    if best is None or best.best is None:
        return model, None
    kept = kept_summary(best, int(model.num_timesteps), validation_site(ctx)[1])
    if trainer.ended_flat:  # the report says why the stage ended before its target
        kept["ended_early"] = {"target": trainer.target, "patience_steps": trainer.patience_steps}
    if validation_part(ctx.site) is not None:  # what the report calls the window: a dataset's own last days
        kept["window"] = "the validation part, the last days of the part learnt from, which no stage trained on"
    if best.best.step != model.num_timesteps:
        logs.get().info("deploying the best policy seen, not the last", agent=agent, step=best.best.step,
                        final_step=int(model.num_timesteps), why=kept["why"],
                        validation_co2_kg_per_year=kept["validation_co2_kg_per_year"],
                        last_validation_co2_kg_per_year=kept["last_validation_co2_kg_per_year"])
        model = load_model(ctx.cfg, agent, best.model_path, device=handle.device)
    folder = ctx.run.agent(agent)
    # The window's pick and its runners-up there (train.shortlist), never the warm start: the years judge it anyway.
    # A night short of time judges the first alone, as its plan counted (trainer.night.plan.stage_specs).
    shortlist = [(candidate, path) for candidate, path in best.shortlist() if candidate.step != 0][:1 if lean else None]
    if shortlist and kept["held_out"] and folder.warm_start.is_file():
        try:
            warm = load_model(ctx.cfg, agent, folder.warm_start, device=handle.device)
        except DamagedFile as exc:  # the trained policy is not lost for it: deployed as the window chose
            logs.get().warning("the warm start is unreadable: the window's pick is deployed unconfirmed", agent=agent,
                               error=str(exc))
            return model, kept
        loaded = [(candidate, model if candidate is best.best else _runner_up(ctx, handle, path))
                  for candidate, path in shortlist]
        contenders = [(candidate, policy) for candidate, policy in loaded if policy is not None]
        if not contenders:
            return model, kept
        model, kept = confirm_over_the_years(ctx, agent, contenders, warm, kept, best.target_pct,
                                             _curve_figure(folder, step=0), on_simulator=lean)
        logs.get().info("the deployed policy over the held-out years", agent=agent, step=kept["step"],
                        years=kept.get("years"))
    return model, kept


def _runner_up(ctx: RunContext, handle: Agent, path: Path) -> BaseAlgorithm | None:
    """A runner-up on the window (train.shortlist), or None where its file is damaged: the others are judged."""
    try:
        return load_model(ctx.cfg, handle.name, path, device=handle.device)
    except DamagedFile as exc:
        logs.get().warning("a runner-up on the validation window is unreadable: the years judge the others",
                           agent=handle.name, error=str(exc))
        return None


def _curve_figure(folder: AgentDir, step: int) -> float | None:
    """The validation curve's CO2 at ``step`` (None where the curve lacks it)."""
    try:
        curve = pd.read_csv(folder.curve)
        rows = curve[curve["step"] == step]
        return None if rows.empty else float(rows["co2_kg_per_year"].iloc[0])
    except (OSError, ValueError, KeyError):
        return None


# Warm starts' evaluations by run, what it is judged on and policy: a night's PPO and A2C start from the same
# imitation (the same weights), and the second need not drive it through CityLearn's two years again.
_WARM_STARTS: dict[tuple[str, str], dict[str, Any]] = {}


def _evaluate_warm_start(ctx: RunContext, handle: Agent, deployed: dict[str, Any] | None = None,
                         lean: bool = False) -> dict[str, Any]:
    """The stage's warm start evaluated like the agent (the same periods and metrics), for the report's comparison:
    the ``deployed`` policy's evaluation where the stage deploys its warm start, an earlier stage's of the same run
    where that one started from the same weights (or deployed them: A2C starts from PPO's). ``lean``: a night short
    of time evaluates it only where that costs nothing (`trainer evaluate RUN` evaluates it later)."""
    agent = handle.name
    folder = ctx.run.agent(agent)
    try:
        model = load_model(ctx.cfg, agent, folder.warm_start, device=handle.device)
    except DamagedFile as exc:  # a comparison for the report: the trained agent is saved and evaluated without it
        logs.get().warning("the warm start is unreadable: the report cannot compare the agent with it", agent=agent,
                           error=str(exc))
        return {"unreadable": str(exc)}

    def evaluate(site: Site, timeseries: Path | None) -> dict[str, Any]:
        return _policy_on(ctx, agent, model, site, None, None)

    key = _warm_start_key(ctx, model)
    if deployed is not None and deployed.get("policy_digest") == key[1][:16]:
        metrics, how = deployed, "the policy deployed"
    elif key in _WARM_STARTS:
        metrics, how = _WARM_STARTS[key], "an earlier stage's of the same weights"
    elif lean:
        why = f"the night was short of time; `trainer evaluate {ctx.run.root}` evaluates it"
        logs.get().info("the warm start is not evaluated: the night is short of time", agent=agent,
                        fix=f"trainer evaluate {ctx.run.root}")
        return {"not_evaluated": why}
    else:
        metrics, how = judged(ctx, evaluate, None, partial(_policy_on, ctx, agent, folder.warm_start, ctx.site, None,
                                                           None)), None
    if key not in _WARM_STARTS:  # the deployed policy's figures too: a later stage starting from it reads them
        if len(_WARM_STARTS) >= 4:
            del _WARM_STARTS[next(iter(_WARM_STARTS))]
        _WARM_STARTS[key] = metrics
    logs.get().info("evaluated the warm start", agent=agent, co2_kg_per_year=round(metrics["co2_kg_per_year"], 1),
                    **({"same_as": how} if how else {}))
    kept = {k: metrics[k] for k in ("co2_kg", "co2_kg_per_year", "ev_departure_soc_met_pct")}
    if "in_sample" in metrics:
        kept["in_sample"] = {k: metrics["in_sample"][k] for k in kept}
    return kept


def evaluate_left_warm_starts(ctx: RunContext, until: float, clock: Callable[[], float] = time.time) -> list[str]:
    """The warm starts a night short of time left to `trainer evaluate` (``not_evaluated`` under an agent's
    ``warm_start``), evaluated in the time its stages left before ``until`` (POSIX seconds: the deadline less the
    report), the agent of least CO2 first: each where what judging its agent took this night, padded (SAFETY), still
    fits; one of weights an earlier one had (A2C starts from PPO's imitation) costs nothing and is taken too. The
    agents' metrics.json and results.json get its figures, as the stage would have written them. A busy 20-minute
    night (2026-12-02) left PPO's and A2C's unevaluated and ended 77 s before its deadline. Returns the agents
    whose warm start it evaluated."""
    results = ctx.run.results()
    waiting = sorted((agent for agent in AGENTS if agent in results
                      and (results[agent].get("warm_start") or {}).get("not_evaluated")
                      and ctx.run.agent(agent).warm_start.is_file()),
                     key=lambda agent: results[agent].get("co2_kg_per_year") or float("inf"))
    done = []
    for agent in waiting:
        metrics, handle = results[agent], resolve_agent(ctx.cfg, agent)
        measured = metrics.get("judged_s") or 2 * float(metrics.get("eval_wall_s") or 0.0)
        needed, left = float(measured) * SAFETY, until - clock()
        if needed > left and not _known_warm_start(ctx, handle):
            logs.get().info("the warm start stays unevaluated: its evaluation does not fit the time left",
                            agent=agent, needs_s=round(needed), left_s=round(max(left, 0.0)),
                            fix=f"trainer evaluate {ctx.run.root}")
            continue
        logs.get().info("the night has time left: the warm start its stage left for lack of time is evaluated now",
                        agent=agent, left_s=round(max(left, 0.0)))
        warm = _evaluate_warm_start(ctx, handle)
        folder = ctx.run.agent(agent)
        saved = read_json(folder.metrics) if folder.metrics.is_file() else metrics
        before = {k: v for k, v in (saved.get("warm_start") or {}).items() if k != "not_evaluated"}
        saved["warm_start"] = {**before, **warm}
        write_json_atomic(folder.metrics, saved)
        record_results(ctx.run, {agent: saved})
        done.append(agent)
    return done


def left_warm_starts_s(ctx: RunContext, own: bool) -> float:
    """What :func:`evaluate_left_warm_starts` would take, padded (SAFETY): the warm starts the stages done left
    unevaluated, each at what judging its agent took, and with ``own`` one more (the stage about to run, in a night
    short of time, leaves its own) at the longest of those. A night's last stage learning on past its target stops
    that long before its slot's end (trainer.night.state.StageJob.spare_s): the report compares each agent with its
    warm start."""
    results = ctx.run.results()
    done = {agent: float(results[agent].get("judged_s") or 0.0) for agent in AGENTS if agent in results}
    waiting = [agent for agent in done if (results[agent].get("warm_start") or {}).get("not_evaluated")]
    return (sum(done[agent] for agent in waiting) + (max(done.values(), default=0.0) if own else 0.0)) * SAFETY


def _known_warm_start(ctx: RunContext, handle: Agent) -> bool:
    """Whether ``handle``'s warm start has weights this process has evaluated already (its figures cost nothing)."""
    try:
        model = load_model(ctx.cfg, handle.name, ctx.run.agent(handle.name).warm_start, device=handle.device)
    except DamagedFile:
        return False
    return _warm_start_key(ctx, model) in _WARM_STARTS


def _load(run: RunDir, cfg: Config, agent: str) -> BaseAlgorithm:
    return load_model(cfg, agent, run.agent(agent).model, device=agent_device(cfg, agent),
                      fix=f"resume its training from its checkpoints: trainer train {agent} --resume {run.root}")


def saved_policies(run: RunDir, cfg: Config) -> dict[str, BaseAlgorithm]:
    """Every model a run saved, by its row's name ("a2c", "a2c warm start"), each loaded: a damaged one is named
    (with the way on) before a command that re-evaluates them writes anything."""
    policies = {}
    for agent in AGENTS:
        folder = run.agent(agent)
        if folder.model.is_file():
            policies[agent] = _load(run, cfg, agent)
        if folder.warm_start.is_file():
            policies[f"{agent} warm start"] = load_model(
                cfg, agent, folder.warm_start, device=agent_device(cfg, agent),
                fix=f"delete it to evaluate without it; trainer train {agent} writes it again")
    return policies


def unseen_year_of(ctx: RunContext) -> Site:
    """The part of the data the run held out, or refused (before anything is written) where it held none."""
    held = ctx.site.held_out
    year = held.site if held is not None else ctx.site.draw(ctx.run.unseen_year_site, UNSEEN_YEAR_SEED_OFFSET) \
        if ctx.site.kind.unseen_draws else None
    if year is None:
        raise UsageError(f"{ctx.run.root} held nothing of {ctx.site.schema} out (holdout.share 0): --unseen-year "
                         "needs a part no stage learnt from; run the night again without --holdout none, or with "
                         "--eval-schema")
    return year


def evaluate_unseen_year(ctx: RunContext, policies: dict[str, BaseAlgorithm]) -> dict[str, dict[str, Any]]:
    """``trainer evaluate --unseen-year``: the references, each deployed model and its warm start over the part of
    the data the run held out (``holdout``: a year of the built-in site that no stage trained, validated or imitated
    on, ``scenario.seed`` + UNSEEN_YEAR_SEED_OFFSET; the end of a dataset's period; another dataset), as long as the
    run's own evaluation; written to ``<run>/unseen-year/results.json``, results.json untouched.

    A run from before held-out periods was evaluated on the year its agents trained on, so this is where a
    controller shows it is causal, not a memorised year: measured, the nights' agents lose 1.3-2.5 points of the
    optimum's cut there (docs/agent-quality.md).
    """
    year = unseen_year_of(ctx)
    # By the row's name; every model was loaded before anything was written.
    controllers = {name: PolicyController(name.split()[0], model) for name, model in policies.items()}

    def open_env():
        return _eval_env(ctx, year)

    results: dict[str, dict[str, Any]] = {}
    for name, spec in REFERENCE_ROSTER.items():
        try:
            controller, own = spec.prepare(ctx.cfg, open_env, lambda: _history_env(ctx))
        except ReferenceUnavailable as exc:
            results[name] = _skipped(exc)
            continue
        env = open_env()
        try:
            results[name] = {**run_episode(controller, env, label=f"{name}, unseen year"), **own}
        finally:
            env.close()
    for name, policy in controllers.items():
        env = open_env()
        try:
            results[name] = run_episode(policy, env, label=f"{name}, unseen year")
        finally:
            env.close()
    compare_to_baseline(results)
    write_json_atomic(ctx.run.unseen_year_results, results)
    return results


def _save_model(model: BaseAlgorithm, folder: AgentDir, agent: str, checkpoint: Path | None) -> None:
    """The trained model, atomically; a full or read-only disk costs this save, not the checkpoints before it."""
    try:
        save_model_atomic(model, folder.model)
    except OSError as exc:
        free = shutil.disk_usage(folder.root).free if folder.root.exists() else 0
        raise StageFailed(f"{agent}: could not save the trained model to {folder.model}: {exc.strerror} "
                          f"({free / 2**20:,.0f} MB free); the last checkpoint is {checkpoint or '(none)'}; "
                          "free disk space") from None


def evaluate_model(ctx: RunContext, agent: str, model: BaseAlgorithm | None = None,
                   saved_at: Path | None = None) -> dict[str, Any]:
    """``agent``'s deployed policy judged: ``model`` (the one the run saved, read from there where not given);
    ``saved_at``, the file that holds it, lets a process beside judge it on the part learnt from meanwhile."""
    folder = ctx.run.agent(agent)
    if model is None:
        model, saved_at = _load(ctx.run, ctx.cfg, agent), folder.model

    def evaluate(site: Site, timeseries: Path | None) -> dict[str, Any]:
        return _policy_on(ctx, agent, model, site, timeseries, agent if site is ctx.site else f"{agent}, held out")

    inside = None if saved_at is None else partial(_policy_on, ctx, agent, saved_at, ctx.site, None, None)
    metrics = judged(ctx, evaluate, folder.timeseries, inside)
    # Two agents can deploy one policy (A2C starts from PPO's imitation; where neither trains past it, they are the
    # same weights): the report says so rather than rank them as two controllers.
    metrics["policy_digest"] = weights_digest(model.policy, float(model.gamma), machine=False)[:16]
    logs.get().info("evaluated", agent=agent, co2_kg_per_year=round(metrics["co2_kg_per_year"], 1),
                    seconds=metrics["eval_wall_s"])
    return metrics


def run_job(ctx: RunContext, job: StageJob) -> StageOutcome:
    """One stage of a night, wherever a backend runs it: a reference's evaluation, or an agent's training in the
    time its slot leaves (skipped when that is too little to be worth a model). Its results are the driver's
    to record. A stop signal (TrainingInterrupted, Stopped) propagates."""
    if job.kind == StageKind.EVAL:
        return StageOutcome(metrics=evaluate_reference(ctx, job.name))
    now = time.time()  # the slot and the floor from one instant
    limit, skipped = job.slot(now)
    if skipped is not None:
        return StageOutcome(skipped=skipped)
    resume = job.resume and ctx.run.agent(job.name).checkpoints.is_dir()
    metrics = train_agent(ctx, job.name, job.target, resume=resume, force=job.force, time_limit_s=limit,
                          warm_start_s=job.warm_start_s(limit), lean=job.lean, later=job.later, floor=job.floor(now),
                          flat_ends=job.flat_ends, past_target=job.past_target, spare_s=job.spare_s)
    return StageOutcome(metrics=metrics, time_limit_s=limit)


def record_results(run: RunDir, new: dict[str, dict[str, Any]], rebuild: bool = False) -> dict[str, dict[str, Any]]:
    """Merge ``new`` into results.json (baseline first, then rbc, then agents) and rewrite results.csv;
    ``rebuild``: start from ``new`` alone (re-evaluation, which also mends a damaged results.json)."""
    results = run.results() if not rebuild else {}
    results.update(new)
    order = [*REFERENCES, *AGENTS]
    results = {k: results[k] for k in sorted(results, key=lambda k: order.index(k) if k in order else len(order))}
    compare_to_baseline(results)
    for metrics in results.values():
        for key in METRIC_KEYS:
            metrics.setdefault(key, None)
    write_json_atomic(run.results_json, results)
    flat = [{"agent": name, **{k: v for k, v in m.items() if k != "citylearn_kpis"}} for name, m in results.items()]
    write_text_atomic(run.results_csv, pd.DataFrame(flat).to_csv(index=False))
    return results


def _summary(section: AgentConfig) -> dict[str, Any]:
    keys = ("batch_size", "n_steps", "learning_rate", "buffer_size", "gradient_steps", "train_freq")
    return {k: getattr(section, k) for k in keys if hasattr(section, k)}


def run_references(ctx: RunContext) -> dict[str, dict[str, Any]]:
    """``trainer baseline``: every reference, recorded."""
    return record_results(ctx.run, {name: evaluate_reference(ctx, name) for name in REFERENCES})


def train_with_baseline(ctx: RunContext, agent: str, resume: bool, force: bool) -> dict[str, dict[str, Any]]:
    """``trainer train``: the baseline (unless the run has it already), then the agent, recorded."""
    done = ctx.run.results()
    if BASELINE not in done:
        record_results(ctx.run, {BASELINE: evaluate_reference(ctx, BASELINE)})
    steps = training_timesteps(ctx.cfg, agent, ctx.site)
    sized, why = ensemble_for_size(ctx.cfg, ctx.site, {agent: steps})
    if why is not None and not resume:  # written to config.yaml: a resumed run reads it from there
        logs.get().info(f"warm start: {why}")
        ctx = with_fitted_warm_start(ctx, sized)
    return record_results(ctx.run, {agent: train_agent(ctx, agent, steps, resume=resume, force=force)})


def reevaluate(ctx: RunContext, policies: dict[str, BaseAlgorithm]) -> dict[str, dict[str, Any]]:
    """``trainer evaluate``: the references, every saved model and its warm start again, with this version's
    evaluation (after an upgrade: its guard, its metrics); the training record (steps, time, which policy was kept
    and why, the warm start's imitation) is kept. Every model is loaded first, so a damaged one stops the command
    before anything is rewritten (``policies``: :func:`saved_policies`, loaded before the run's lock)."""
    models = {agent: policies[agent] for agent in AGENTS if agent in policies}
    new = {name: evaluate_reference(ctx, name, reuse=False) for name in REFERENCES}
    for agent, model in models.items():
        folder = ctx.run.agent(agent)
        try:
            previous = read_json(folder.metrics) if folder.metrics.is_file() else {}
        except DamagedFile:
            previous = {}
        metrics = {**previous, **evaluate_model(ctx, agent, model, folder.model)}  # saved_policies read it there
        if folder.warm_start.is_file():
            warm = _evaluate_warm_start(ctx, resolve_agent(ctx.cfg, agent))
            before = {k: v for k, v in (previous.get("warm_start") or {}).items() if k != "not_evaluated"}
            metrics["warm_start"] = {**before, **warm}
        write_json_atomic(folder.metrics, metrics)
        new[agent] = metrics
    return record_results(ctx.run, new, rebuild=True)
