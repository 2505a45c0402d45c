"""`trainer night` as one call: the request the command line parsed, and the night (or sweep) it asks for.

The config is resolved once here (on --resume, from the run's own config.yaml under the new --config and --set),
the backend's own checks run before any folder is made, and the caller prints what comes back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainer.base.errors import UsageError
from trainer.config.sections import Config
from trainer.learn.preflight import check_resume_config, memory_checks
from trainer.night import runner, sweep
from trainer.night.backends import backend
from trainer.night.budget import StageKind
from trainer.run import session
from trainer.run.folder import RunContext, RunDir
from trainer.run.schedule_file import ScheduleState


@dataclass(frozen=True)
class NightRequest:
    """What `trainer night` was asked, as the command line gave it."""

    config_files: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    profile: str | None = None
    schema: str | None = None  # a CityLearn schema.json (or its folder); None with no dataset: the built-in site
    dataset: str | None = None  # a CityLearn dataset's name
    holdout: str | None = None  # --holdout: a share such as 25%, or none (default: holdout.share)
    eval_schema: str | None = None  # --eval-schema: judge on this dataset instead of the end of the period
    eval_dataset: str | None = None  # --eval-dataset: the same, by name
    device: str | None = None
    out: str | None = None  # the run folder (a sweep's folder with seeds)
    seed: int | None = None
    quick: bool = False
    agents: str | None = None  # comma-separated; None: schedule.agents
    budget: str | None = None
    finish_by: str | None = None
    resume: str | None = None  # a run or sweep folder, or 'latest'
    force: bool = False  # resume despite a changed config
    backend: str = "local"
    backend_options: dict[str, Any] = field(default_factory=dict)
    seeds: str | None = None  # a seed sweep's seeds, comma-separated


@dataclass(frozen=True)
class NightDone:
    """A night that ran: its folder, its results, its schedule (a sweep: its summary's text instead)."""

    run: RunDir | None = None
    cfg: Config | None = None  # the night's config, as it ran
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    state: ScheduleState | None = None
    summary: str | None = None


def run_request(request: NightRequest, say: Callable[[str], None],
                opened: Callable[[RunContext], None] = lambda ctx: None) -> NightDone:
    """The night (or the sweep) ``request`` asks for, run to its end; a stop signal propagates. ``opened`` hears of
    the run folder as soon as it is open (the command line's error edge says how to resume it)."""
    request = replace(request, overrides=(*request.overrides, *session.holdout_overrides(
        request.holdout, request.eval_schema, request.eval_dataset)))
    if request.seeds or sweep.is_sweep_resume(request.resume):
        cfg, planned = sweep.from_cli(request.config_files, request.overrides, request.profile, request.device,
                                      request.seeds, request.out, request.resume)
        backend(request.backend).check(cfg, request.backend_options)  # exits 2 before any folder is made
        return NightDone(summary=sweep.run_and_summarise(
            cfg, planned, request.schema, request.dataset, request.agents, request.quick, request.budget,
            request.finish_by, request.force, request.backend, request.backend_options, say))
    cfg, out = session.resolve_for_resume(request.resume, request.out, "results.json", request.config_files,
                                          request.overrides, seed=request.seed, device=request.device,
                                          profile=request.profile)
    backend(request.backend).check(cfg, request.backend_options)  # exits 2 before any folder is made
    cfg, chosen, deadline = session.night_plan(cfg, request.quick, request.agents, request.budget,
                                               request.finish_by)
    resuming = request.resume is not None
    schedule = RunDir(Path(str(out))).schedule
    if resuming and schedule.is_file():
        # A damaged one is named before the run folder is touched (the log included).
        trained = [s.name for s in ScheduleState.load(schedule).stages if s.kind == StageKind.TRAIN]
        # Its agents are the night's, not the config's whole roster: a night of PPO alone, resumed, calibrated SAC
        # and A2C as well (measured: 7 s of a test's 10 s resume; a minute of a real night's).
        if request.agents is not None and trained and set(chosen) != set(trained):
            # The schedule's stages are what a resume runs: other agents would be checked and calibrated, not
            # trained, and the night would say nothing of it.
            raise UsageError(f"{out} is a night of {', '.join(trained)}, not --agents {request.agents}: resume it "
                             f"without --agents, or start a new night (another --out) for {', '.join(chosen)}")
        chosen = trained or chosen
    for agent in chosen if resuming else ():
        check_resume_config(Path(str(out)), agent, cfg, request.force)
    with session.open_run(cfg, "night", out, request.schema, request.dataset, resuming=resuming,
                          checks=memory_checks(chosen)) as ctx:
        opened(ctx)
        targets = session.training_targets(ctx.cfg, chosen, request.quick, ctx.site)
        state = runner.run_night(ctx, chosen, targets, deadline, resuming, request.force, say, request.backend,
                                 request.backend_options)
        return NightDone(ctx.run, ctx.cfg, ctx.run.results(), state)
