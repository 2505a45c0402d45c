"""`trainer`: the command line. Each command parses options, calls trainer/, and turns
known errors into one line and an exit code (0 ok, 1 runtime failure, 2 bad usage or config).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable

import click

from trainer import logs
from trainer.config import AGENTS, Config, describe, load_config
from trainer.errors import TrainerError, UsageError
from trainer.run_dir import RunDir, default_run_dir, read_json

EXIT_INTERRUPTED = 130


class State:
    debug = False
    log_file: Path | None = None


def config_options(fn: Callable) -> Callable:
    fn = click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
                      help="Override one config key (repeatable), e.g. --set sac.batch_size=128.")(fn)
    fn = click.option("--config", "config_files", multiple=True, type=click.Path(dir_okay=False),
                      help="YAML file merged over configs/default.yaml (repeatable, left to right).")(fn)
    return fn


def run_options(fn: Callable) -> Callable:
    fn = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
                      help="Torch device (default: gpu.device from the config).")(fn)
    fn = click.option("--seed", type=click.IntRange(min=0), default=None, help="Global seed (default: config seed).")(fn)
    fn = click.option("--out", "out", type=click.Path(file_okay=False), default=None,
                      help="Run folder (default: outputs/<scenario>__<command>__<seed>__<time>).")(fn)
    fn = click.option("--dataset", default=None,
                      help="A CityLearn dataset name, found under $CITYLEARN_LOCAL_DATASETS_PATH.")(fn)
    fn = click.option("--schema", type=click.Path(), default=None,
                      help="Path of any CityLearn schema.json (or its folder) instead of the built-in site.")(fn)
    return config_options(fn)


def handle_errors(fn: Callable) -> Callable:
    """One clear line instead of a traceback (unless --debug), with the log path."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrainerError as exc:
            if State.debug:
                raise
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", EXIT_INTERRUPTED)
        except Exception as exc:  # noqa: BLE001 - the edge of the program: report, don't crash
            logs.get().exception("unexpected failure")
            if State.debug:
                raise
            _fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 1)

    return wrapper


def _fail(message: str, code: int) -> None:
    where = f" (log: {State.log_file})" if State.log_file else ""
    click.echo(f"error: {message}{where}", err=True)
    sys.exit(code)


def _resolve(config_files, overrides, *, seed=None, device=None) -> Config:
    extra = list(overrides)
    if seed is not None:
        extra.append(f"seed={seed}")
    if device is not None:
        extra.append(f"gpu.device={device}")
    return load_config(config_files, extra)


def _start_run(cfg: Config, command: str, out: str | None, label: str | None, device: str) -> RunDir:
    run = RunDir(Path(out)) if out else default_run_dir(cfg, command, label)
    run.create(cfg, ["trainer", *sys.argv[1:]], device)
    State.log_file = run.log_file
    logs.configure(run.log_file)
    logs.get().info("run started", run=str(run.root), command=command, device=device)
    return run


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks.")
@click.version_option(package_name="pvbess-trainer")
def cli(debug: bool) -> None:
    """Train RL controllers for a PV + battery + EV site on CityLearn, and report CO2."""
    State.debug = debug
    State.log_file = None
    logs.configure(verbose=debug)


# ------------------------------------------------------------------------------ config


@cli.group()
def config() -> None:
    """Inspect the resolved configuration."""


@config.command("show")
@config_options
@click.option("--doc", is_flag=True, help="List every key with its type, range and meaning.")
@handle_errors
def config_show(config_files, overrides, doc: bool) -> None:
    """Print the resolved config (defaults, --config files, --set overrides)."""
    import yaml

    cfg = load_config(config_files, overrides)
    if doc:
        rows = describe()
        width = max(len(r[0]) for r in rows)
        for path, type_name, text in rows:
            click.echo(f"{path.ljust(width)}  {text}  [{type_name}]")
        return
    click.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False), nl=False)


# ------------------------------------------------------------------------------ scenario


@cli.group()
def scenario() -> None:
    """The built-in site."""


@scenario.command("build")
@config_options
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder to write the dataset into.")
@handle_errors
def scenario_build(config_files, overrides, out: str) -> None:
    """Write the built-in site as a CityLearn dataset (schema.json + CSVs)."""
    from trainer.scenario import build_site

    cfg = load_config(config_files, overrides)
    try:
        schema = build_site(cfg.scenario, Path(out))
    except OSError as exc:
        raise UsageError(f"cannot write the site to {out}: {exc.strerror} (choose another --out)") from None
    click.echo(str(schema))


# ------------------------------------------------------------------------------ runs


def _context(cfg: Config, command: str, out, schema, dataset):
    from trainer.device import apply_gpu_flags, resolve_device
    from trainer.env import resolve_dataset
    from trainer.stages import RunContext, prepare_dataset

    source = resolve_dataset(schema, dataset)  # before anything is written
    device = resolve_device(cfg.gpu.device)
    run = _start_run(cfg, command, out, source.label if source else None, device)
    apply_gpu_flags(cfg.gpu, device)
    return RunContext(cfg, run, prepare_dataset(cfg, run, source), device)


def _print_results(results: dict, run: RunDir) -> None:
    from trainer.stages import results_table

    click.echo(results_table(results))
    click.echo(f"\nresults: {run.results_json}")


@cli.command()
@run_options
@handle_errors
def baseline(config_files, overrides, schema, dataset, out, seed, device) -> None:
    """Evaluate the uncontrolled baseline and the rule-based controller."""
    from trainer.stages import evaluate_reference, record_results

    cfg = _resolve(config_files, overrides, seed=seed, device=device)
    ctx = _context(cfg, "baseline", out, schema, dataset)
    results = record_results(ctx.run, {name: evaluate_reference(ctx, name) for name in ("baseline", "rbc")})
    _print_results(results, ctx.run)


def _length_overrides(agents, timesteps: int | None, episodes: int | None) -> list[str]:
    if timesteps is not None and episodes is not None:
        raise UsageError("pass either --timesteps or --episodes, not both")
    extra = []
    for agent in agents:
        if timesteps is not None:
            extra += [f"{agent}.timesteps={timesteps}", f"{agent}.episodes=null"]
        if episodes is not None:
            extra += [f"{agent}.episodes={episodes}", f"{agent}.timesteps=null"]
    return extra


@cli.command()
@click.argument("agent", type=click.Choice(AGENTS))
@run_options
@click.option("--timesteps", type=click.IntRange(min=1), default=None, help="Training length in environment steps.")
@click.option("--episodes", type=click.IntRange(min=1), default=None, help="Training length in episodes.")
@handle_errors
def train(agent, config_files, overrides, schema, dataset, out, seed, device, timesteps, episodes) -> None:
    """Train one agent (sac, ppo or a2c), evaluate it and the uncontrolled baseline."""
    from trainer.stages import evaluate_reference, record_results, train_agent, training_timesteps

    extra = _length_overrides([agent], timesteps, episodes)
    cfg = _resolve(config_files, [*overrides, *extra], seed=seed, device=device)
    ctx = _context(cfg, f"train-{agent}", out, schema, dataset)
    record_results(ctx.run, {"baseline": evaluate_reference(ctx, "baseline")})
    results = record_results(ctx.run, {agent: train_agent(ctx, agent, training_timesteps(cfg, agent, ctx.schema))})
    _print_results(results, ctx.run)


@cli.command()
@run_options
@click.option("--quick", is_flag=True, help="A small budget per agent (schedule.quick_timesteps): a smoke run of the night.")
@click.option("--agents", default=None, help="Comma-separated subset of agents, e.g. sac,ppo (default: schedule.agents).")
@handle_errors
def schedule(config_files, overrides, schema, dataset, out, seed, device, quick, agents) -> None:
    """Run baseline → rbc → each agent, then print the results table."""
    from trainer.stages import evaluate_reference, record_results, train_agent, training_timesteps

    cfg = _resolve(config_files, overrides, seed=seed, device=device)
    chosen = _parse_agents(agents) if agents else list(cfg.schedule.agents)
    ctx = _context(cfg, "schedule", out, schema, dataset)
    results: dict = {}
    for name in ("baseline", "rbc"):
        results = record_results(ctx.run, {name: evaluate_reference(ctx, name)})
    for agent in chosen:
        steps = cfg.schedule.quick_timesteps.get(agent, 1000) if quick else training_timesteps(cfg, agent, ctx.schema)
        results = record_results(ctx.run, {agent: train_agent(ctx, agent, steps)})
    _print_results(results, ctx.run)


def _parse_agents(text: str) -> list[str]:
    chosen = [a.strip().lower() for a in text.split(",") if a.strip()]
    unknown = [a for a in chosen if a not in AGENTS]
    if unknown or not chosen:
        raise UsageError(f"--agents expects a comma-separated subset of {', '.join(AGENTS)}, got {text!r}")
    return chosen


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="cpu", help="Device for the policies.")
@handle_errors
def evaluate(run_dir: str, device: str) -> None:
    """Re-evaluate every saved model of RUN_DIR and the baselines; rewrite results.json."""
    from trainer.device import resolve_device
    from trainer.env import resolve_dataset
    from trainer.stages import RunContext, evaluate_model, evaluate_reference, record_results

    run = RunDir(Path(run_dir))
    if not run.config.is_file():
        raise UsageError(f"not a run folder: {run_dir} has no config.yaml (pass a folder made by trainer train or schedule)")
    cfg = load_config([run.config])
    schema = run.site / "schema.json"
    if not schema.is_file():
        schema = _recorded_schema(run)
    State.log_file = run.log_file
    logs.configure(run.log_file)
    ctx = RunContext(cfg, run, resolve_dataset(str(schema), None).schema, resolve_device(device))
    new = {name: evaluate_reference(ctx, name) for name in ("baseline", "rbc")}
    for agent in AGENTS:
        if run.agent(agent).model.is_file():
            previous = read_json(run.agent(agent).metrics) if run.agent(agent).metrics.is_file() else {}
            metrics = evaluate_model(ctx, agent)
            metrics.update({k: previous.get(k) for k in ("timesteps", "train_wall_s", "steps_per_s")})
            new[agent] = metrics
    _print_results(record_results(run, new), run)


def _recorded_schema(run: RunDir) -> Path:
    for line in reversed(run.log_file.read_text(encoding="utf-8").splitlines() if run.log_file.is_file() else []):
        if '"event": "dataset"' in line:
            import json

            return Path(json.loads(line)["schema"])
    raise UsageError(f"{run.root}: cannot tell which dataset this run used (no site/ folder and no dataset in its log)")


def main() -> None:
    cli(prog_name="trainer")


if __name__ == "__main__":
    main()
