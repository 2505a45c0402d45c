"""The commands that run something in a run folder: baseline, train, night, schedule, plan, evaluate, export.

Each parses its options, makes one call into trainer/ and prints.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import click

from trainer.base.errors import UsageError
from trainer.base.signals import STOP, handle_stop_signals
from trainer.cli import options as opts
from trainer.cli.group import cli
from trainer.cli.options import State, command, options
from trainer.config.roster import AGENTS
from trainer.judge.metrics import format_table as results_table
from trainer.judge.metrics import recommended_controller
from trainer.judge.report import currency, write_report
from trainer.learn.preflight import check_resume_config, memory_checks
from trainer.night import install, plan, runner, stages
from trainer.night.request import NightRequest, run_request
from trainer.run import session
from trainer.run.folder import RunContext, RunDir
from trainer.site import given_site


def _print_results(results: dict, run: RunDir) -> None:
    click.echo(results_table(results, currency(run)))
    click.echo(f"\nresults: {run.results_json}")


@command(cli)
@opts.run_options
def baseline(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None, schema: str | None,
             dataset: str | None, holdout: str | None, eval_schema: str | None, eval_dataset: str | None,
             device: str | None, out: str | None, seed: int | None) -> None:
    """Evaluate the references: uncontrolled baseline, rule-based controller and perfect-foresight optimum."""
    overrides = (*overrides, *session.holdout_overrides(holdout, eval_schema, eval_dataset))
    cfg = session.resolve_config(config_files, overrides, seed=seed, device=device, profile=profile)
    with session.open_run(cfg, "baseline", out, schema, dataset) as ctx:
        State.opened(ctx, "baseline")
        _print_results(stages.run_references(ctx), ctx.run)


@command(cli)
@click.argument("agent", type=click.Choice(AGENTS))
@opts.run_options
@click.option("--timesteps", type=click.IntRange(min=1), default=None, help="Training length in environment steps.")
@click.option("--episodes", type=click.IntRange(min=1), default=None, help="Training length in episodes.")
@opts.resume_option
@opts.force_option
def train(agent: str, config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None,
          schema: str | None, dataset: str | None, holdout: str | None, eval_schema: str | None,
          eval_dataset: str | None, device: str | None, out: str | None, seed: int | None,
          timesteps: int | None, episodes: int | None, resume: str | None, force: bool) -> None:
    """Train one agent (sac, ppo or a2c), evaluate it and the uncontrolled baseline."""
    overrides = [*overrides, *session.length_overrides([agent], timesteps, episodes),
                 *session.holdout_overrides(holdout, eval_schema, eval_dataset)]
    cfg, out = session.resolve_for_resume(resume, out, f"{agent}/checkpoints", config_files, overrides, seed=seed,
                                          device=device, profile=profile)
    if resume is not None:
        check_resume_config(Path(out), agent, cfg, force, require_checkpoint=True)
    with session.open_run(cfg, f"train {agent}", out, schema, dataset, resuming=resume is not None,
                          checks=memory_checks([agent])) as ctx:
        State.opened(ctx, f"train {agent}")
        with handle_stop_signals():
            results = stages.train_with_baseline(ctx, agent, resume=resume is not None, force=force)
        _print_results(results, ctx.run)


@command(cli)
@opts.night_options
def night(**given: Any) -> None:
    """Run the night now: baseline → rbc → optimum → each agent → report, within --budget or by --finish-by.

    `trainer schedule install` starts it every night instead.
    """
    request = NightRequest(**given)  # the options' names are the request's fields
    with handle_stop_signals():
        done = run_request(request, click.echo, opened=lambda ctx: State.opened(ctx, "night"))
    if done.summary is not None:
        click.echo(done.summary)
        return
    assert done.run is not None and done.state is not None and done.cfg is not None  # a single night's
    _print_results(done.results, done.run)
    for line in runner.untrained(done.state):  # an agent missing from the table, or there untrained, says why
        click.echo(f"note:    {line}")
    click.echo(f"report:  {done.run.report}")
    best = recommended_controller(done.results, done.cfg.ev.target_met_pct)
    if best:
        what = ("the planner, which cuts more than every agent, as controller.py + its linear program"
                if best == "planner" else f"{best}, the agent the report recommends, as ONNX + controller.py")
        click.echo(f"export:  {opts.invoked()} export {done.run.root}   ({what})")
    runner.raise_for_failures(done.state, done.run)


@cli.group(invoke_without_command=True)
@options(opts.night_options, opts.debug_option)
@click.pass_context
def schedule(click_ctx: click.Context, **night_options: Any) -> None:
    """Schedule the night: `trainer schedule install` starts it every night.

    Without a subcommand this runs the night now, as it always did; its own name is `trainer night`.
    """
    if click_ctx.invoked_subcommand is None:
        click.echo("note: `trainer schedule` runs the night now; its name is `trainer night` "
                   "(`trainer schedule install` starts it every night)", err=True)
        click_ctx.forward(night)  # the options as parsed: night collects its backend's own


@command(schedule, "install")
@click.option("--at", "at", required=True, metavar="HH:MM", help="Local time the night starts.")
@opts.time_options
@opts.agents_option
@opts.config_file_option
@opts.profile_option
@click.option("--cron", is_flag=True, help="Print a crontab line (wrapped in flock) instead of systemd units.")
@click.option("--unit-dir", type=click.Path(file_okay=False), default=None,
              help="Where to write the units (default: ~/.config/systemd/user).")
@click.option("--dry-run", is_flag=True, help="Print what would be written; write nothing.")
def schedule_install(at: str, budget: str | None, finish_by: str | None, agents: str | None,
                     config_files: tuple[str, ...], profile: str | None, cron: bool, unit_dir: str | None,
                     dry_run: bool) -> None:
    """Start the night every day at --at, with a systemd user timer (or cron)."""
    click.echo(install.install_night(at, finish_by, budget, agents, list(config_files), profile, cron,
                                     Path(unit_dir) if unit_dir else None, dry_run))


@command(cli, "plan")
@opts.config_options
@opts.dataset_options
@opts.device_option
@options(opts.quick_option, opts.agents_option, opts.time_options)
@click.option("--refresh", is_flag=True, help="Measure again instead of using the cached calibration.")
def plan_command(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None, schema: str | None,
                 dataset: str | None, device: str | None, quick: bool, agents: str | None, budget: str | None,
                 finish_by: str | None, refresh: bool) -> None:
    """Print the night's timeline from measured speed, and what cannot fit."""
    cfg = session.resolve_config(config_files, overrides, device=device, profile=profile)
    cfg, chosen, deadline = session.night_plan(cfg, quick, agents, budget, finish_by)
    given = given_site(schema, dataset)
    click.echo(plan.plan_text(session.settled_on(cfg, given), given, chosen, quick, deadline, refresh))


@command(cli)
@opts.run_dir_argument
@opts.device_option
@click.option("--unseen-year", is_flag=True,
              help="Instead, run the references, each deployed model and its warm start over a year of the built-in "
                   "site no stage trained on; write RUN_DIR/unseen-year/results.json (results.json untouched).")
def evaluate(run_dir: str, device: str | None, unseen_year: bool) -> None:
    """Re-evaluate the references, every saved model of RUN_DIR and its warm start with this version (after an
    upgrade: its guard and metrics), keeping the training record; rewrite results.json."""
    policies: dict[str, Any] = {}

    def check(ctx: RunContext) -> None:  # before the run's log is written to: a refusal leaves it as it was
        if unseen_year:
            stages.unseen_year_of(ctx)
        policies.update(stages.saved_policies(ctx.run, ctx.cfg))

    with session.reopen_run(run_dir, device or "cpu", check) as ctx:
        State.log_file = ctx.run.log_file
        if unseen_year:
            click.echo(results_table(stages.evaluate_unseen_year(ctx, policies), currency(ctx.run)))
            click.echo(f"\nresults over a year no stage saw ({ctx.run.unseen_year / 'site'}): "
                       f"{ctx.run.unseen_year / 'results.json'}")
            if ctx.run.report.is_file():  # its report gains the year
                click.echo(f"report updated: {write_report(ctx.run)}")
            else:
                click.echo(f"a report with this year: trainer report {ctx.run.root}")
            return
        _print_results(stages.reevaluate(ctx, policies), ctx.run)


@command(cli)
@click.argument("agent", type=click.Choice(AGENTS))
@opts.config_options
@opts.dataset_options
@opts.holdout_options
@opts.device_option
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="The tune folder (default: outputs/<scenario>__tune-<agent>__<seed>__<time>).")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="The first trial seed (default: config seed).")
@opts.time_options
@click.option("--trials", type=click.IntRange(min=1, max=10_000), default=None,
              help="Most trials the search runs (default: tune.trials).")
@click.option("--space", "space_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="A YAML search space instead of the agent's own (docs/tune.md): KEY: {low: L, high: H} or "
                   "{choices: [...]}.")
@click.option("--resume", "resume", type=click.Path(file_okay=False), default=None, metavar="TUNE_DIR",
              help="Go on with a tune a kill or Ctrl+C stopped (its own config and dataset; a new --budget if given).")
@opts.backend_options
def tune(agent: str, config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None,
         schema: str | None, dataset: str | None, holdout: str | None, eval_schema: str | None,
         eval_dataset: str | None, device: str | None, out: str | None, seed: int | None, budget: str | None,
         finish_by: str | None, trials: int | None, space_file: str | None, resume: str | None, backend: str,
         backend_options: dict[str, Any]) -> None:
    """Search AGENT's settings with Optuna (TPE, median pruning) within --budget or by --finish-by; re-run the best
    on fresh seeds, judged on the part held out; write report.md and best.yaml (for trainer night --config)."""
    if importlib.util.find_spec("optuna") is None:
        raise UsageError("trainer tune needs optuna (the tune extra): run ./launchers/launch.sh once, or "
                         ".venv/bin/pip install -e '.[tune]' in the checkout")
    from trainer.tune import tuning  # lazy: Optuna and the trials' stack, for this command alone

    folder, cfg, deadline = tuning.prepare(agent, config_files, overrides, profile, schema, dataset,
                                           holdout, eval_schema, eval_dataset, device, out, seed, budget, finish_by,
                                           trials, resume, backend, backend_options, space_file)
    with handle_stop_signals():
        report = tuning.run_tune(folder, cfg, deadline, backend, backend_options, click.echo)
    click.echo(f"report:  {report}")
    if folder.best.is_file():
        click.echo(f"config:  {folder.best}   (trainer night --config {folder.best})")


# What `trainer export` imports beyond the product's own dependencies (pyproject.toml's export extra).
EXPORT_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


@command(cli, "export")
@opts.run_dir_argument
@click.option("--agent", type=click.Choice([*AGENTS, "planner"]), default=None,
              help="The agent to export, or planner: the run's day-ahead planner (default: the controller the report "
                   "recommends).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="The export folder (default: RUN_DIR/export/<agent>; an earlier export there is replaced).")
def export_command(run_dir: str, agent: str | None, out: str | None) -> None:
    """Export an agent as ONNX with controller.py (numpy + onnxruntime only), or the day-ahead planner with its
    linear program (numpy + scipy), proven on the night's evaluation."""
    missing = [name for name in EXPORT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"trainer export needs {', '.join(missing)} (the export extra): run "
                         "./launchers/launch.sh once, or .venv/bin/pip install -e '.[export]' in the checkout")
    from trainer.export import exporter  # lazy: the exporter imports torch and onnx

    asked: list[exporter.ExportRequest] = []

    def check(ctx: RunContext) -> None:  # before the run's log is written to: a refusal leaves it as it was
        asked.append(exporter.request(ctx.run, ctx.cfg, agent, out))

    # A stop signal raises at once (an export holds nothing to save): the half-written folder is removed on the way.
    with handle_stop_signals(), STOP.interruptible("the export"), session.reopen_run(run_dir, "cpu", check) as ctx:
        State.log_file = ctx.run.log_file
        document = exporter.export_run(ctx, asked[0])
    name, target = asked[0].agent, asked[0].out
    proof = document["verification"]
    click.echo(f"exported {name} to {target}: {proof['steps']:,} steps replayed through CityLearn, actions within "
               f"{proof['max_action_difference']:.1e} of the product's, {proof['step_ms_median']:.3f} ms a step\n"
               f"try it: cd {target} && python controller.py check")
