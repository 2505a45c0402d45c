"""`trainer`: the command line. Each command parses its options, makes one call into trainer/,
prints, and turns known errors into one line and an exit code (0 ok, 1 runtime failure, 2 bad
usage or config). Options shared by commands are declared once, below.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import click
import yaml
from click.exceptions import NoArgsIsHelpError

from monitor.summary import format_summary, read_records, summarise
from trainer import benchmark, logs, session
from trainer import cli_shared as opts
from trainer.cli_shared import State, command, options
from trainer.config_files import doc_text
from trainer.doctor import FAIL, format_table, run_checks
from trainer.doctor import as_json as checks_as_json
from trainer.errors import UsageError
from trainer.launch import AGENT_CHOICES, LaunchOptions, split_agent, start
from trainer.learn.preflight import check_resume_config, memory_checks
from trainer.metrics import best_agent
from trainer.metrics import format_table as results_table
from trainer.night import install, plan, runner, stages
from trainer.night.request import NightRequest, run_request
from trainer.report import currency, report_run, write_report
from trainer.roster import AGENTS
from trainer.run_dir import RunDir
from trainer.scenario import build_site
from trainer.signals import handle_stop_signals
from trainer.sim import parity
from trainer.sim.site import Unsupported
from trainer.site import given_site


def _print_results(results: dict, run: RunDir) -> None:
    click.echo(results_table(results, currency(run)))
    click.echo(f"\nresults: {run.results_json}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=opts.start_invocation,
              help="Show full tracebacks and debug logs (also accepted after any command).")
@click.version_option(package_name="pvbess-trainer")
def cli() -> None:
    """Train RL controllers for a PV + battery + EV site on CityLearn, and report CO2."""


@cli.group()
def config() -> None:
    """Inspect the resolved configuration."""


@command(config, "show")
@opts.config_options
@click.option("--doc", is_flag=True, help="List every key with its type, range and meaning.")
def config_show(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None, doc: bool) -> None:
    """Print the resolved config (defaults, --config files, --set overrides)."""
    cfg = session.resolve_config(config_files, overrides, profile=profile)
    click.echo(doc_text(cfg) if doc else yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip("\n"))


@cli.group()
def scenario() -> None:
    """The built-in site."""


@command(scenario, "build")
@opts.config_options
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder to write the dataset into.")
def scenario_build(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None, out: str) -> None:
    """Write the built-in site as a CityLearn dataset (schema.json + CSVs)."""
    cfg = session.resolve_config(config_files, overrides, profile=profile)
    try:
        click.echo(str(build_site(cfg.scenario, Path(out))))
    except OSError as exc:
        raise UsageError(f"cannot write the site to {out}: {exc.strerror} (choose another --out)") from None


@command(cli)
@opts.run_options
def baseline(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None, schema: str | None,
             dataset: str | None, device: str | None, out: str | None, seed: int | None) -> None:
    """Evaluate the references: uncontrolled baseline, rule-based controller and perfect-foresight optimum."""
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
          schema: str | None, dataset: str | None, device: str | None, out: str | None, seed: int | None,
          timesteps: int | None, episodes: int | None, resume: str | None, force: bool) -> None:
    """Train one agent (sac, ppo or a2c), evaluate it and the uncontrolled baseline."""
    overrides = [*overrides, *session.length_overrides([agent], timesteps, episodes)]
    cfg, out = session.resolve_for_resume(resume, out, f"{agent}/checkpoints", config_files, overrides, seed=seed,
                                          device=device, profile=profile)
    if resume is not None:
        check_resume_config(Path(out), agent, cfg, force, require_checkpoint=True)
    with session.open_run(cfg, f"train {agent}", out, schema, dataset, resuming=resume is not None,
                          checks=memory_checks(cfg, [agent])) as ctx:
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
    click.echo(f"report:  {done.run.report}")
    if best_agent(done.results, done.cfg.ev.target_met_pct):
        click.echo(f"export:  trainer export {done.run.root}   (the best agent as ONNX + controller.py)")
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


class LaunchCommand(click.Command):
    """`trainer launch`, whose help speaks of the way it was started: launch.sh, or `docker run IMAGE` when
    trainer.container runs it as the image's entrypoint (ctx.obj is then CONTAINER)."""

    def get_help(self, ctx: click.Context) -> str:
        text = super().get_help(ctx)
        if ctx.find_root().obj is CONTAINER:
            text = text.replace("launch.sh ", "docker run ... IMAGE ") + CONTAINER_HELP
        return text


CONTAINER = object()
CONTAINER_HELP = """

  In the image: one run folder a night in /app/outputs (mount a folder there), owned by --user:
    docker run --gpus all --user "$(id -u):$(id -g)" --stop-timeout 120 --shm-size 1g
        -v "$PWD/outputs:/app/outputs" IMAGE a2c --budget 2h
  docker stop saves a checkpoint; resume with: docker run ... IMAGE all --resume /app/outputs/RUN
"""


@command(cli, cls=LaunchCommand)
@click.option("--agent", type=click.Choice(AGENT_CHOICES), default=None, help="What to run (or AGENT anywhere).")
@opts.config_file_option
@opts.profile_option
@opts.time_options
@opts.resume_option
@click.option("--monitor/--no-monitor", default=None, help="GPU monitor sidecar (default: on when a GPU is present).")
@opts.quick_option
@click.option("--live-status", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Print the GPU status every SECONDS (needs the monitor).")
@click.option("--container", is_flag=True, help="Running as the container's entrypoint (outputs in /app/outputs).")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[AGENT] [-- TRAINER_OPTIONS...]")
def launch(agent: str | None, config_files: tuple[str, ...], profile: str | None, budget: str | None,
           finish_by: str | None, resume: str | None, monitor: bool | None, quick: bool, live_status: float | None,
           container: bool, extra: tuple[str, ...]) -> None:
    """What the launchers run: doctor, monitor sidecar, the trainer, and the morning's summary.

    \b
    launch.sh [AGENT] [OPTIONS] [-- TRAINER_OPTIONS...]
    AGENT: all (default), sac, ppo, a2c or baseline, before or after the options.
    Options after `--` go to the trainer, e.g. `launch.sh a2c --quick -- --seed 3`.
    """
    agent, extra = split_agent(agent, extra)
    overrides = [extra[i + 1] for i, a in enumerate(extra[:-1]) if a == "--set"]
    chosen = LaunchOptions(agent, list(config_files), profile, budget, finish_by, resume, monitor, quick, live_status,
                           list(extra))
    if container:
        logs.get().info("container mode")
    sys.exit(start(chosen, lambda: session.resolve_config(config_files, overrides, profile=profile)))


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
    click.echo(plan.plan_text(cfg, given_site(schema, dataset), chosen, quick, deadline, refresh))


def _env_counts(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple[int, ...] | None:
    """--sweep's comma-separated environment counts, each 1 to 256."""
    if text is None:
        return None
    counts = tuple(session.comma_integers(text))
    if not counts or min(counts) < 1 or max(counts) > 256:
        raise click.BadParameter(f"expected comma-separated counts from 1 to 256, e.g. 1,4,16; got {text!r}")
    return counts


@command(cli, "benchmark")
@opts.config_options
@opts.dataset_options
@opts.device_option
@opts.agents_option
@click.option("--repeats", type=click.IntRange(1, 20), default=None, help="Interleaved pairs per agent (default 2).")
@click.option("--quick", is_flag=True, help="A tiny run that only checks every figure is produced (CI).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the figures as JSON here.")
@click.option("--learning", is_flag=True,
              help="Instead of speed: CO2 of each agent trained by the plain SB3 loop and by the product, per seed.")
@click.option("--seeds", default="0,1,2", show_default=True, help="Seeds of --learning.")
@click.option("--sweep", callback=_env_counts, default=None,
              help="Parallel environments to measure, e.g. 1,4,16 (default: 1, 2, 4 ... up to four per core).")
def benchmark_command(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None,
                      schema: str | None, dataset: str | None, device: str | None, agents: str | None,
                      repeats: int | None, quick: bool, json_path: str | None, learning: bool, seeds: str,
                      sweep: tuple[int, ...] | None) -> None:
    """Measure the product's trainer against the plain SB3 recipe on this machine (docs/benchmarks.md).

    Each agent's training length in --learning is its config `timesteps` (set it with --set).
    """
    cfg = session.resolve_config(config_files, overrides, device=device, profile=profile)
    chosen = session.parse_agents(agents or ",".join(AGENTS))
    text, failed = benchmark.run_command(cfg, given_site(schema, dataset), chosen, quick, repeats, learning,
                                         session.parse_seeds(seeds) if learning else [], json_path,
                                         lambda *a: click.echo(benchmark.progress_line(*a), err=True), sweep)
    click.echo(text)
    sys.exit(1 if failed else 0)


@cli.group()
def sim() -> None:
    """The training simulator (many sites stepped at once as arrays) and its parity with CityLearn."""


@command(sim, "check")
@opts.config_options
@opts.dataset_options
@click.option("--policy", "policies", multiple=True, type=click.Choice(list(parity.POLICIES)),
              help="Drive both with this policy (repeatable; default: every one).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Compare this many steps (default: all).")
def sim_check(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None, schema: str | None,
              dataset: str | None, policies: tuple[str, ...], steps: int | None) -> None:
    """Whether the training simulator matches CityLearn on this dataset, and where it first does not."""
    cfg = session.resolve_config(config_files, overrides, profile=profile)
    given = given_site(schema, dataset)
    with session.site_for(cfg, given) as site:
        click.echo("reading the dataset: a zero-action pass of CityLearn over its period", err=True)
        try:
            check = parity.ParityCheck(cfg, site)
        except Unsupported as exc:
            raise UsageError(f"the training simulator does not model this dataset: {exc}; "
                             "training uses CityLearn itself there") from None
        results = []
        for policy in policies or parity.POLICIES:
            results.append(check.run(policy, steps))
            click.echo(results[-1].line())
    click.echo(parity.verdict(results, str(site.schema) if given else "the built-in site"))
    matched = all(r.ok for r in results)
    sys.exit(0 if matched else 1)


@command(cli)
@opts.config_options
@opts.dataset_options
@opts.json_option
@click.option("--require-gpu", is_flag=True, help="Fail when CUDA is not available.")
@opts.backend_options
def doctor(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None, schema: str | None,
           dataset: str | None, as_json: bool, require_gpu: bool, backend: str,
           backend_options: dict[str, Any]) -> None:
    """Check Python, packages, CUDA, GPU and host memory, disk, dataset and config; say what to fix."""
    checks = run_checks(lambda: session.resolve_config(config_files, overrides, profile=profile), schema, dataset,
                        require_gpu, backend, backend_options)
    click.echo(json.dumps(checks_as_json(checks), indent=2) if as_json else format_table(checks))
    sys.exit(1 if any(c.status == FAIL for c in checks) else 0)


@cli.group()
def monitor() -> None:
    """The sidecar GPU monitor's records (python -m monitor writes them)."""


@command(monitor, "summary")
@opts.run_dir_argument
@opts.json_option
def monitor_summary(run_dir: str, as_json: bool) -> None:
    """Mean and peak utilisation, peak memory and temperature, time throttled, warnings."""
    path = RunDir(Path(run_dir)).monitor
    if not path.is_file():
        raise UsageError(f"no monitor records: {path} does not exist (start the monitor with the launcher's --monitor, "
                         f"or: python -m monitor --out {path})")
    summary = summarise(read_records(path))
    click.echo(json.dumps(summary, indent=2) if as_json else format_summary(summary))


@command(cli, "report")
@opts.run_dir_argument
def report_command(run_dir: str) -> None:
    """Write RUN_DIR/report.md and its plots from what the run folder holds."""
    click.echo(str(report_run(Path(run_dir))))


@command(cli)
@opts.run_dir_argument
@opts.device_option
@click.option("--unseen-year", is_flag=True,
              help="Instead, run the references, each deployed model and its warm start over a year of the built-in "
                   "site no stage trained on; write RUN_DIR/unseen-year/results.json (results.json untouched).")
def evaluate(run_dir: str, device: str | None, unseen_year: bool) -> None:
    """Re-evaluate the references, every saved model of RUN_DIR and its warm start with this version (after an
    upgrade: its guard and metrics), keeping the training record; rewrite results.json."""
    with session.reopen_run(run_dir, device or "cpu") as ctx:
        State.log_file = ctx.run.log_file
        if unseen_year:
            click.echo(results_table(stages.evaluate_unseen_year(ctx), currency(ctx.run)))
            click.echo(f"\nresults over a year no stage saw ({ctx.run.unseen_year / 'site'}): "
                       f"{ctx.run.unseen_year / 'results.json'}")
            if ctx.run.report.is_file():  # its report gains the year
                click.echo(f"report updated: {write_report(ctx.run)}")
            else:
                click.echo(f"a report with this year: trainer report {ctx.run.root}")
            return
        _print_results(stages.reevaluate(ctx), ctx.run)


# What `trainer export` imports beyond the product's own dependencies (pyproject.toml's export extra).
EXPORT_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


@command(cli, "export")
@opts.run_dir_argument
@click.option("--agent", type=click.Choice(AGENTS), default=None,
              help="The agent to export (default: the one the report recommends).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="The export folder (default: RUN_DIR/export/<agent>; an earlier export there is replaced).")
def export_command(run_dir: str, agent: str | None, out: str | None) -> None:
    """Export an agent as ONNX with controller.py (numpy + onnxruntime only), proven on the night's evaluation."""
    missing = [name for name in EXPORT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"trainer export needs {', '.join(missing)} (the export extra): run "
                         "./launchers/launch.sh once, or .venv/bin/pip install -e '.[export]' in the checkout")
    from trainer.export import exporter  # lazy: the exporter imports torch and onnx

    with session.reopen_run(run_dir, "cpu") as ctx:
        State.log_file = ctx.run.log_file
        name = exporter.choose_agent(ctx, agent)
        target = Path(out) if out else exporter.default_out(ctx, name)
        document = exporter.export_run(ctx, name, target)
    proof = document["verification"]
    click.echo(f"exported {name} to {target}: {proof['steps']:,} steps replayed through CityLearn, actions within "
               f"{proof['max_action_difference']:.1e} of the product's, {proof['step_ms_median']:.3f} ms a step\n"
               f"try it: cd {target} && python controller.py check")


def main() -> None:
    """The console script: Click's own usage errors in the product's one-line form (``error: ...``, exit 2)."""
    try:
        returned = cli.main(prog_name="trainer", standalone_mode=False)
    except NoArgsIsHelpError as exc:  # a group called without a command: its help, as Click prints it
        click.echo(exc.format_message())
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        hint = f" ({exc.ctx.command_path} -h for help)" if exc.ctx is not None else ""
        click.echo(f"error: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(1)
    sys.exit(returned if isinstance(returned, int) else 0)  # --help and --version return 0
