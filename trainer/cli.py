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
from trainer.config import AGENTS, REFERENCES, Config, describe, load_config
from trainer.errors import TrainerError, UsageError
from trainer.run_dir import RunDir, default_run_dir, read_json

LATEST = "latest"

EXIT_INTERRUPTED = 130


class State:
    debug = False
    log_file: Path | None = None
    run_dir: Path | None = None
    command = ""


def config_options(fn: Callable) -> Callable:
    fn = click.option("--profile", default=None, metavar="auto|NAME",
                      help="Device profile from configs/profiles (auto: picked from the detected GPU), applied before --config.")(fn)
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
            _fail(str(exc) + _resume_hint(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", EXIT_INTERRUPTED)
        except Exception as exc:  # noqa: BLE001 - the edge of the program: report, don't crash
            logs.get().exception("unexpected failure")
            if State.debug:
                raise
            _fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 1)

    return wrapper


def _resume_hint(exc: TrainerError) -> str:
    from trainer.training import StageFailed, TrainingInterrupted

    if isinstance(exc, (TrainingInterrupted, StageFailed)) and State.run_dir is not None:
        return f"; resume with: trainer {State.command} --resume {State.run_dir}"
    return ""


def _fail(message: str, code: int) -> None:
    where = f" (log: {State.log_file})" if State.log_file else ""
    click.echo(f"error: {message}{where}", err=True)
    sys.exit(code)


def _resolve(config_files, overrides, *, seed=None, device=None, profile=None) -> Config:
    from trainer import profiles

    extra = list(overrides)
    if seed is not None:
        extra.append(f"seed={seed}")
    if device is not None:
        extra.append(f"gpu.device={device}")
    overlay, note = profiles.resolve(profile)
    if note:
        logs.get().info("device profile", profile=note)
    return load_config(config_files, extra, profile=overlay)


def _start_run(cfg: Config, command: str, out: str | Path | None, label: str | None, device: str,
               resuming: bool = False) -> RunDir:
    from trainer.lock import RunLock

    run = RunDir(Path(out)) if out else default_run_dir(cfg, command.replace(" ", "-"), label)
    try:
        run.root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create run folder {run.root}: {exc.strerror} (choose another --out)") from None
    lock = RunLock(run.root).acquire()  # before anything in the folder is rewritten
    click.get_current_context().call_on_close(lock.release)
    run.create(cfg, ["trainer", *sys.argv[1:]], device, resuming=resuming)
    State.log_file, State.run_dir = run.log_file, run.root
    logs.configure(run.log_file)
    logs.get().info("run resumed" if resuming else "run started", run=str(run.root), command=command, device=device)
    return run


def _resume_dir(cfg: Config, value: str, out: str | None, marker: str) -> Path:
    """The run folder to resume: given, --out, or the newest under output.root holding ``marker``."""
    if value != LATEST:
        path = Path(value)
    elif out:
        path = Path(out)
    else:
        root = Path(cfg.output.root)
        found = sorted((p for p in root.glob("*") if (p / marker).exists()), key=lambda p: p.stat().st_mtime)
        if not found:
            raise UsageError(f"--resume: no run folder under {root} has {marker}; pass the run folder: --resume RUN_DIR")
        path = found[-1]
    if not (path / "config.yaml").is_file():
        raise UsageError(f"--resume: {path} is not a run folder (no config.yaml); pass a folder made by trainer train or schedule")
    return path


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
def config_show(config_files, overrides, profile, doc: bool) -> None:
    """Print the resolved config (defaults, --config files, --set overrides)."""
    import yaml

    cfg = _resolve(config_files, overrides, profile=profile)
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
def scenario_build(config_files, overrides, profile, out: str) -> None:
    """Write the built-in site as a CityLearn dataset (schema.json + CSVs)."""
    from trainer.scenario import build_site

    cfg = _resolve(config_files, overrides, profile=profile)
    try:
        schema = build_site(cfg.scenario, Path(out))
    except OSError as exc:
        raise UsageError(f"cannot write the site to {out}: {exc.strerror} (choose another --out)") from None
    click.echo(str(schema))


# ------------------------------------------------------------------------------ runs


def _context(cfg: Config, command: str, out, schema, dataset, resuming: bool = False):
    from trainer.device import apply_gpu_flags, resolve_device
    from trainer.env import resolve_dataset
    from trainer.stages import RunContext, prepare_dataset

    State.command = command
    if resuming and not schema and not dataset:
        schema = _previous_schema(RunDir(Path(out)))
    source = resolve_dataset(schema, dataset)  # before anything is written
    device = resolve_device(cfg.gpu.device)
    run = _start_run(cfg, command, out, source.label if source else None, device, resuming)
    apply_gpu_flags(cfg.gpu, device)
    if resuming and source is None and (run.site / "schema.json").is_file():
        return RunContext(cfg, run, run.site / "schema.json", device)
    return RunContext(cfg, run, prepare_dataset(cfg, run, source), device)


def _previous_schema(run: RunDir) -> str | None:
    """A resumed run keeps its dataset: its own site/, or the schema its log names."""
    if (run.site / "schema.json").is_file():
        return None
    return str(_recorded_schema(run))


def _resolve_for(resume: str | None, out, marker: str, config_files, overrides, **kw) -> tuple[Config, str | None]:
    # On resume the run's own config.yaml (which already holds any profile's values) is the base.
    """The config: defaults, or on resume the run's own config.yaml; then --config and --set."""
    if resume is None:
        return _resolve(config_files, overrides, **kw), out
    probe = _resolve(config_files, overrides, **kw)
    run_dir = _resume_dir(probe, resume, out, marker)
    return _resolve([run_dir / "config.yaml", *config_files], overrides, **{**kw, "profile": None}), str(run_dir)


def _print_results(results: dict, run: RunDir) -> None:
    from trainer.stages import results_table

    click.echo(results_table(results))
    click.echo(f"\nresults: {run.results_json}")


@cli.command()
@run_options
@handle_errors
def baseline(config_files, overrides, profile, schema, dataset, out, seed, device) -> None:
    """Evaluate the references: uncontrolled baseline, rule-based controller and perfect-foresight optimum."""
    from trainer.stages import evaluate_reference, record_results

    cfg = _resolve(config_files, overrides, seed=seed, device=device, profile=profile)
    ctx = _context(cfg, "baseline", out, schema, dataset)
    results = record_results(ctx.run, {name: evaluate_reference(ctx, name) for name in REFERENCES})
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


def resume_options(fn: Callable) -> Callable:
    fn = click.option("--force", is_flag=True, help="Resume even though the config changed since the checkpoint.")(fn)
    fn = click.option("--resume", is_flag=False, flag_value=LATEST, default=None, metavar="[RUN_DIR]",
                      help="Continue a run folder from its newest valid checkpoint (default: --out, else the newest run).")(fn)
    return fn


@cli.command()
@click.argument("agent", type=click.Choice(AGENTS))
@run_options
@click.option("--timesteps", type=click.IntRange(min=1), default=None, help="Training length in environment steps.")
@click.option("--episodes", type=click.IntRange(min=1), default=None, help="Training length in episodes.")
@resume_options
@handle_errors
def train(agent, config_files, overrides, profile, schema, dataset, out, seed, device, timesteps, episodes, resume, force) -> None:
    """Train one agent (sac, ppo or a2c), evaluate it and the uncontrolled baseline."""
    from trainer.signals import handle_stop_signals
    from trainer.stages import evaluate_reference, record_results, train_agent, training_timesteps

    from trainer.training import check_memory, check_resume_config

    extra = _length_overrides([agent], timesteps, episodes)
    cfg, out = _resolve_for(resume, out, f"{agent}/checkpoints", config_files, [*overrides, *extra], seed=seed, device=device,
                            profile=profile)
    if resume is not None:
        check_resume_config(Path(out), agent, cfg, force)
    ctx = _context(cfg, f"train {agent}", out, schema, dataset, resuming=resume is not None)
    check_memory(ctx, agent)
    with handle_stop_signals():
        done = read_json(ctx.run.results_json) if ctx.run.results_json.is_file() else {}
        if "baseline" not in done:
            record_results(ctx.run, {"baseline": evaluate_reference(ctx, "baseline")})
        steps = training_timesteps(cfg, agent, ctx.schema)
        metrics = train_agent(ctx, agent, steps, resume=resume is not None, force=force)
        results = record_results(ctx.run, {agent: metrics})
    _print_results(results, ctx.run)


def timing_options(fn: Callable) -> Callable:
    fn = click.option("--finish-by", "finish_by", default=None, metavar="HH:MM",
                      help="Local time the night must end by (a time already past means tomorrow).")(fn)
    fn = click.option("--budget", default=None, metavar="DURATION", help="Time for the whole night, e.g. 10h, 90m, 1h30m.")(fn)
    fn = click.option("--agents", default=None, help="Comma-separated subset of agents, e.g. sac,ppo (default: schedule.agents).")(fn)
    fn = click.option("--quick", is_flag=True, help="A small budget per agent (schedule.quick_timesteps): a smoke run of the night.")(fn)
    return fn


def _deadline(cfg: Config, budget: str | None, finish_by: str | None):
    """The night's deadline from --budget/--finish-by, else from the config; None = untimed."""
    from datetime import datetime, timedelta

    from trainer.timing import parse_duration, resolve_finish_by

    if budget and finish_by:
        raise UsageError("pass either --budget or --finish-by, not both")
    if not budget and not finish_by:
        budget, finish_by = cfg.schedule.budget, cfg.schedule.finish_by
    now = datetime.now()
    if budget:
        return now + timedelta(seconds=parse_duration(budget))
    if finish_by:
        return resolve_finish_by(finish_by, now)
    return None


def _targets(cfg: Config, agents: list[str], quick: bool, schema: Path) -> dict[str, int]:
    from trainer.stages import training_timesteps

    return {a: cfg.schedule.quick_timesteps.get(a, 1000) if quick else training_timesteps(cfg, a, schema) for a in agents}


@cli.group(invoke_without_command=True)
@run_options
@timing_options
@resume_options
@click.pass_context
@handle_errors
def schedule(ctx, config_files, overrides, profile, schema, dataset, out, seed, device, quick, agents, budget, finish_by, resume,
             force) -> None:
    """The night: baseline → rbc → each agent → report, within --budget or by --finish-by.

    `trainer schedule install` sets it up to start every night instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    from trainer.night import prepare, run_night
    from trainer.signals import handle_stop_signals
    from trainer.training import check_memory, check_resume_config

    cfg, out = _resolve_for(resume, out, "results.json", config_files, overrides, seed=seed, device=device, profile=profile)
    chosen = _parse_agents(agents) if agents else list(cfg.schedule.agents)
    deadline = _deadline(cfg, budget, finish_by)
    if resume is not None:
        for agent in chosen:
            check_resume_config(Path(out), agent, cfg, force)
    ctx = _context(cfg, "schedule", out, schema, dataset, resuming=resume is not None)
    for agent in chosen:
        check_memory(ctx, agent)
    with handle_stop_signals():
        state, specs, _, text = prepare(ctx, chosen, _targets(cfg, chosen, quick, ctx.schema), deadline, resume is not None)
        click.echo(text + "\n")
        state = run_night(ctx, state, specs, force)
    _print_results(read_json(ctx.run.results_json) if ctx.run.results_json.is_file() else {}, ctx.run)
    click.echo(f"report:  {ctx.run.report}")
    if state.failed():
        failures = "; ".join(f"{s.name} ({s.error})" for s in state.failed())
        raise TrainerError(f"{len(state.failed())} stage(s) failed: {failures}; the others finished, see {ctx.run.report}")


@schedule.command("install")
@click.option("--at", "at", required=True, metavar="HH:MM", help="Local time the night starts.")
@click.option("--finish-by", "finish_by", default=None, metavar="HH:MM", help="Local time it must end by.")
@click.option("--budget", default=None, metavar="DURATION", help="Or a time budget, e.g. 9h.")
@click.option("--agents", default=None, help="Comma-separated subset, e.g. sac,ppo.")
@click.option("--config", "configs", multiple=True, type=click.Path(dir_okay=False), help="Config files for the night.")
@click.option("--profile", default=None, help="Device profile for the night.")
@click.option("--cron", is_flag=True, help="Print a crontab line (wrapped in flock) instead of systemd units.")
@click.option("--unit-dir", type=click.Path(file_okay=False), default=None,
              help="Where to write the units (default: ~/.config/systemd/user).")
@click.option("--dry-run", is_flag=True, help="Print what would be written; write nothing.")
@handle_errors
def schedule_install(at, finish_by, budget, agents, configs, profile, cron, unit_dir, dry_run) -> None:
    """Start the night every day at --at, with a systemd user timer (or cron)."""
    from trainer import scheduling
    from trainer.config import REPO_ROOT

    scheduling.check_time(at, "--at")
    if finish_by:
        scheduling.check_time(finish_by, "--finish-by")
    if bool(finish_by) == bool(budget):
        raise UsageError("pass exactly one of --finish-by or --budget, so the night ends in time for the morning")
    if agents:
        _parse_agents(agents)
    args = scheduling.launch_args(finish_by, budget, agents, list(configs), profile)
    if cron:
        line = scheduling.crontab_line(REPO_ROOT, at, args)
        click.echo(line)
        click.echo("\nadd it with: (crontab -l 2>/dev/null; echo '<the line above>') | crontab -   remove it with: crontab -e")
        return
    target = Path(unit_dir) if unit_dir else Path.home() / ".config" / "systemd" / "user"
    units = scheduling.systemd_units(REPO_ROOT, at, args)
    for name, text in units.items():
        if dry_run:
            click.echo(f"# {target / name}\n{text}")
        else:
            target.mkdir(parents=True, exist_ok=True)
            (target / name).write_text(text, encoding="utf-8")
            click.echo(f"wrote {target / name}")
    click.echo(("(dry run: nothing written)\n" if dry_run else "") + scheduling.enable_instructions(target))


@cli.command()
@click.option("--agent", type=click.Choice(["all", "sac", "ppo", "a2c", "baseline"]), default="all", help="What to run.")
@click.option("--config", "configs", multiple=True, type=click.Path(dir_okay=False), help="Config file (repeatable).")
@click.option("--profile", default=None, metavar="auto|NAME", help="Device profile.")
@click.option("--budget", default=None, metavar="DURATION", help="Time for the night, e.g. 10h.")
@click.option("--finish-by", "finish_by", default=None, metavar="HH:MM", help="Local time the night must end by.")
@click.option("--resume", is_flag=False, flag_value=LATEST, default=None, metavar="[RUN_DIR]", help="Resume a run folder.")
@click.option("--monitor/--no-monitor", default=None, help="GPU monitor sidecar (default: on when a GPU is present).")
@click.option("--quick", is_flag=True, help="A small budget per agent: a smoke run of the night.")
@click.option("--live-status", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Print the GPU status every SECONDS (needs the monitor).")
@click.option("--container", is_flag=True, help="Running as the container's entrypoint (no venv; outputs in /app/outputs).")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def launch(agent, configs, profile, budget, finish_by, resume, monitor, quick, live_status, container, extra) -> None:
    """What the launchers run: doctor, monitor sidecar, the trainer, and the morning's summary.

    Options after `--` go to the trainer, e.g. `trainer launch --agent a2c -- --seed 3`.
    """
    import torch

    from trainer.launch import Launch, LaunchOptions, choose_run_dir, doctor_gate

    if budget and finish_by:
        raise UsageError("pass either --budget or --finish-by, not both")
    overrides = [extra[i + 1] for i, a in enumerate(extra[:-1]) if a == "--set"]
    load = lambda: _resolve(list(configs), overrides, profile=profile)  # noqa: E731
    if not doctor_gate(load, sys.stdout):
        raise TrainerError("launch stopped: a doctor check failed; fix it as shown above and launch again")
    cfg = load()
    options = LaunchOptions(agent, list(configs), profile, budget, finish_by, resume, monitor, quick, live_status, list(extra))
    run_dir = choose_run_dir(options, Path(cfg.output.root), cfg.scenario.name, cfg.seed)
    if container:
        logs.get().info("container mode", outputs=cfg.output.root)
    sys.exit(Launch(options, run_dir, gpu_present=torch.cuda.is_available()).run_all())


@cli.command("plan")
@config_options
@click.option("--schema", type=click.Path(), default=None, help="Plan for this CityLearn schema instead of the built-in site.")
@click.option("--dataset", default=None, help="Plan for a CityLearn dataset found under $CITYLEARN_LOCAL_DATASETS_PATH.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None, help="Torch device.")
@timing_options
@click.option("--refresh", is_flag=True, help="Measure again instead of using the cached calibration.")
@handle_errors
def plan_command(config_files, overrides, profile, schema, dataset, device, quick, agents, budget, finish_by, refresh) -> None:
    """Print the night's timeline from measured speed, and what cannot fit."""
    import tempfile
    from datetime import datetime

    from trainer.device import resolve_device
    from trainer.env import resolve_dataset
    from trainer.plan import build_plan, calibrate, render
    from trainer.scenario import build_site

    cfg = _resolve(config_files, overrides, device=device, profile=profile)
    chosen = _parse_agents(agents) if agents else list(cfg.schedule.agents)
    deadline = _deadline(cfg, budget, finish_by)
    source = resolve_dataset(schema, dataset)
    device_name = resolve_device(cfg.gpu.device)
    from trainer.device import apply_gpu_flags

    apply_gpu_flags(cfg.gpu, device_name)  # calibrate with the threads and flags the night will use
    with tempfile.TemporaryDirectory() as tmp:
        schema_path = source.schema if source else build_site(cfg.scenario, Path(tmp) / "site")
        speeds = calibrate(cfg, schema_path, device_name, chosen, refresh=refresh)
        targets = _targets(cfg, chosen, quick, schema_path)
        planned, notes = build_plan(cfg, schema_path, speeds, chosen, targets, datetime.now(), deadline)
        click.echo(render(planned, deadline, notes, speeds))


@cli.command()
@config_options
@click.option("--schema", type=click.Path(), default=None, help="Benchmark this CityLearn schema instead of the built-in site.")
@click.option("--dataset", default=None, help="Benchmark a CityLearn dataset found under $CITYLEARN_LOCAL_DATASETS_PATH.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None, help="Torch device for both sides.")
@click.option("--agents", default="sac,ppo,a2c", show_default=True, help="Comma-separated subset, e.g. ppo,a2c.")
@click.option("--repeats", type=click.IntRange(min=1, max=20), default=None, help="Interleaved pairs per agent (default 2).")
@click.option("--quick", is_flag=True, help="A tiny run that only checks every figure is produced (CI).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write the figures as JSON here.")
@click.option("--learning", is_flag=True,
              help="Instead of speed: CO2 of each agent trained by the plain SB3 loop and by the product, per seed.")
@click.option("--seeds", default="0,1,2", show_default=True, help="Seeds of --learning.")
@handle_errors
def benchmark(config_files, overrides, profile, schema, dataset, device, agents, repeats, quick, json_path, learning,
              seeds) -> None:
    """Measure the product's trainer against the plain SB3 recipe on this machine (docs/benchmarks.md).

    Each agent's training length in --learning is its config `timesteps` (set it with --set).
    """
    import dataclasses
    import json
    import tempfile

    from trainer.benchmark import Sizes, format_learning, format_report, run_benchmark, run_learning_check
    from trainer.device import resolve_device
    from trainer.env import resolve_dataset
    from trainer.scenario import build_site

    cfg = _resolve(config_files, overrides, device=device, profile=profile)
    chosen = _parse_agents(agents)
    source = resolve_dataset(schema, dataset)
    sizes = Sizes.quick() if quick else Sizes()
    if repeats:
        sizes = dataclasses.replace(sizes, repeats=repeats)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)  # fail now, not after five minutes
    device_name = resolve_device(cfg.gpu.device)

    def progress(i: int, total: int, trial) -> None:
        figure, co2 = trial.result.get("steps_per_s"), trial.result.get("co2_kg_per_year")
        shown = trial.result.get("error") or (f"{figure:,.1f} steps/s" if figure is not None else "") or (
            f"seed {trial.seed}: {co2:,.0f} kg CO2/year" if co2 is not None else "")
        click.echo(f"[{i}/{total}] {trial.kind} {trial.agent or ''} {f'x{trial.n_envs}' if trial.kind == 'sweep' else ''}"
                   f" {shown}".replace("  ", " "), err=True)

    with tempfile.TemporaryDirectory() as tmp:
        schema_path = source.schema if source else build_site(cfg.scenario, Path(tmp) / "site")
        if learning:
            report = run_learning_check(cfg, schema_path, device_name, chosen, _parse_seeds(seeds), progress)
        else:
            report = run_benchmark(cfg, schema_path, device_name, chosen, sizes, progress)
    click.echo(format_learning(report) if learning else format_report(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2), encoding="utf-8")
        click.echo(f"figures written to {json_path}")
    if report["errors"] if learning else report["summary"]["errors"]:
        sys.exit(1)


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise UsageError(f"--seeds expects comma-separated non-negative integers, got {text!r}")
    return seeds


@cli.command()
@config_options
@click.option("--schema", type=click.Path(), default=None, help="Check this CityLearn schema instead of the built-in site.")
@click.option("--dataset", default=None, help="Check a CityLearn dataset found under $CITYLEARN_LOCAL_DATASETS_PATH.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.option("--require-gpu", is_flag=True, help="Fail when CUDA is not available.")
@handle_errors
def doctor(config_files, overrides, profile, schema, dataset, as_json: bool, require_gpu: bool) -> None:
    """Check Python, packages, CUDA, GPU and host memory, disk, dataset and config; say what to fix."""
    import json

    from trainer.doctor import FAIL, as_json as checks_json, format_table, run_checks

    checks = run_checks(lambda: _resolve(config_files, overrides, profile=profile), schema, dataset, require_gpu)
    click.echo(json.dumps(checks_json(checks), indent=2) if as_json else format_table(checks))
    if any(c.status == FAIL for c in checks):
        sys.exit(1)


@cli.group()
def monitor() -> None:
    """The sidecar GPU monitor's records (python -m monitor writes them)."""


@monitor.command("summary")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@handle_errors
def monitor_summary(run_dir: str, as_json: bool) -> None:
    """Mean and peak utilisation, peak memory and temperature, time throttled, warnings."""
    import json

    from monitor.summary import format_summary, read_records, summarise

    path = RunDir(Path(run_dir)).monitor
    if not path.is_file():
        raise UsageError(f"no monitor records: {path} does not exist (start the monitor with the launcher's --monitor, "
                         f"or: python -m monitor --out {path})")
    summary = summarise(read_records(path))
    click.echo(json.dumps(summary, indent=2) if as_json else format_summary(summary))


@cli.command("report")
@click.argument("run_dir", type=click.Path(file_okay=False))
@handle_errors
def report_command(run_dir: str) -> None:
    """Write RUN_DIR/report.md and its plots from what the run folder holds."""
    from trainer.report import write_report

    run = RunDir(Path(run_dir))
    if not run.results_json.is_file():
        raise UsageError(f"no results in {run_dir}: it has no results.json (pass a folder made by trainer train or schedule)")
    click.echo(str(write_report(run)))


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
    from trainer.lock import RunLock

    click.get_current_context().call_on_close(RunLock(run.root).acquire().release)
    State.log_file = run.log_file
    logs.configure(run.log_file)
    ctx = RunContext(cfg, run, resolve_dataset(str(schema), None).schema, resolve_device(device))
    new = {name: evaluate_reference(ctx, name) for name in REFERENCES}
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
