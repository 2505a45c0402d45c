"""The commands that look or measure: config, scenario, benchmark, sim check, doctor, monitor, report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from monitor.summary import format_summary, read_records, summarise
from trainer import benchmark
from trainer.base.errors import UsageError
from trainer.cli import options as opts
from trainer.cli.doctor import FAIL, format_table, run_checks
from trainer.cli.doctor import as_json as checks_as_json
from trainer.cli.group import cli
from trainer.cli.options import command
from trainer.config.loading import doc_text
from trainer.config.roster import AGENTS
from trainer.judge.optimum_check import check_optimum
from trainer.judge.report import report_run
from trainer.references.optimum_model import OptimumUnavailable
from trainer.run import session
from trainer.run.folder import RunDir
from trainer.sim import parity
from trainer.sim.site import Unsupported
from trainer.site import given_site
from trainer.site.scenario import build_site


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


@cli.group()
def optimum() -> None:
    """The perfect-foresight optimum and how far its model of a dataset is from CityLearn."""


@command(optimum, "check")
@opts.config_options
@opts.dataset_options
@click.option("--days", type=click.IntRange(min=1), default=None,
              help="Compare over the first DAYS of the period (default: schedule.eval_days, else all of it).")
def optimum_check(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None, schema: str | None,
                  dataset: str | None, days: int | None) -> None:
    """Whether the optimum's model of this dataset matches CityLearn, and how close its replay comes to its bound."""
    cfg = session.resolve_config(config_files, overrides, profile=profile)
    given = given_site(schema, dataset)
    with session.site_for(cfg, given) as site:
        click.echo("solving the optimum and replaying it and the uncontrolled site through CityLearn", err=True)
        try:
            result = check_optimum(cfg, site, days or cfg.schedule.eval_days)
        except OptimumUnavailable as exc:
            raise UsageError(f"the optimum does not model this dataset: {exc}") from None
    click.echo("\n".join(result.lines()))
    click.echo(result.verdict())
    sys.exit(0 if result.ok else 1)


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
