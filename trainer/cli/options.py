"""The CLI's shared parts: options declared once for every command that takes them, and the edge
where errors become one line and an exit code (``trainer.cli.main`` holds the commands themselves)."""

from __future__ import annotations

import functools
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from trainer.base import logs
from trainer.base.errors import TrainerError
from trainer.base.signals import Stopped
from trainer.config import profiles
from trainer.learn.preflight import has_progress
from trainer.learn.recovery import StageFailed, TrainingInterrupted
from trainer.run.folder import RunContext, RunDir
from trainer.run.session import LATEST

EXIT_INTERRUPTED = 130


def invoked() -> str:
    """How to call this program again, as a hint a user pastes: ``trainer`` where that name on the PATH is this
    program, else the path it was started by (``.venv/bin/trainer``: the launchers never activate the venv), or
    ``python -m trainer``."""
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("trainer")
    if started.name == "__main__.py" and started.parent.name == "trainer":
        return f"{shlex.quote(sys.executable)} -m trainer"
    found = shutil.which("trainer")
    if found and started.name == "trainer" and Path(found).resolve() == started.resolve():
        return "trainer"
    try:
        shown = started.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = started.resolve()
    return shlex.quote(str(shown)) if started.name == "trainer" else "trainer"


class State:
    """What the error handler at the edge needs to say: --debug, the run's log and how to resume it."""

    debug = False
    log_file: Path | None = None
    run: RunDir | None = None
    command = ""

    @classmethod
    def opened(cls, ctx: RunContext, command: str) -> None:
        cls.log_file, cls.run, cls.command = ctx.run.log_file, ctx.run, command

    @classmethod
    def resume_hint(cls, exc: TrainerError) -> str:
        """How to go on, only where the run holds something to go on from (a checkpoint, a finished stage)."""
        stopped = isinstance(exc, (TrainingInterrupted, StageFailed, Stopped))
        if stopped and cls.run is not None and has_progress(cls.run):
            return f"; resume with: {invoked()} {cls.command} --resume {cls.run.root}"
        return ""


def _fail(message: str, code: int) -> None:
    where = f" (log: {State.log_file})" if State.log_file else ""
    click.echo(f"error: {message}{where}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable) -> Callable:
    """One clear line instead of a traceback (unless --debug), with the log path and how to resume."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrainerError as exc:
            if State.debug:
                raise
            _fail(str(exc) + State.resume_hint(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", EXIT_INTERRUPTED)
        except OSError as exc:  # a full or read-only disk, a vanished file: the file and the fix, one line
            logs.get().exception("file error")
            if State.debug:
                raise
            _fail(f"{exc.filename or 'a file'}: {exc.strerror or exc} (free disk space, or make it writable)", 1)
        except Exception as exc:  # the edge of the program: report, don't crash
            logs.get().exception("unexpected failure")
            if State.debug:
                raise
            _fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 1)

    return wrapper


def _debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        State.debug = True
        logs.configure(verbose=True)


def start_invocation(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """The group's --debug: a fresh state for this invocation (tests invoke the CLI many times in one process)."""
    State.debug, State.log_file, State.run = value, None, None
    logs.configure(verbose=value)


def options(*decorators: Callable) -> Callable:
    """Several option decorators as one, applied top to bottom as written."""
    return lambda fn: functools.reduce(lambda f, d: d(f), reversed(decorators), fn)


debug_option = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_debug,
                            help="Show full tracebacks and debug logs.")


def command(group: click.Group, *args: Any, **kwargs: Any) -> Callable:
    """A command of ``group`` with --debug and the error handling at the edge."""
    return options(group.command(*args, **kwargs), debug_option, handle_errors)


config_file_option = click.option("--config", "config_files", multiple=True, type=click.Path(dir_okay=False),
                                  help="YAML file merged over trainer/configs/default.yaml (repeatable, in order).")
profile_option = click.option("--profile", type=click.Choice([profiles.AUTO, *profiles.available()]), default=None,
                              help="Device profile (auto: picked by the GPU's name), applied before --config.")
config_options = options(
    config_file_option,
    click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
                 help="Override one config key (repeatable), e.g. --set sac.batch_size=128."),
    profile_option)
dataset_options = options(
    click.option(
        "--schema",
        type=click.Path(),
        default=None,
        help="Path of any CityLearn schema.json (or its folder) instead of the built-in site.",
    ),
    click.option(
        "--dataset", default=None, help="A CityLearn dataset name, found under $CITYLEARN_LOCAL_DATASETS_PATH."
    ),
)
holdout_options = options(
    click.option("--holdout", default=None, metavar="SHARE|none",
                 help="Share of the dataset's period held out at its end and judged on, e.g. 25% (default: "
                      "holdout.share); none: judge on what the agents learnt from (in-sample figures, said so)."),
    click.option("--eval-schema", "eval_schema", type=click.Path(), default=None,
                 help="Judge on this CityLearn schema.json (another period, or a building with the same devices); "
                      "the dataset's own period is then all for learning."),
    click.option("--eval-dataset", "eval_dataset", default=None,
                 help="Judge on this CityLearn dataset, found as --dataset finds one."))
device_option = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
                             help="Torch device (default: gpu.device from the config).")
run_options = options(
    config_options, dataset_options, holdout_options, device_option,
    click.option("--out", type=click.Path(file_okay=False), default=None,
                 help="Run folder (default: outputs/<scenario>__<command>__<seed>__<time>)."),
    click.option("--seed", type=click.IntRange(min=0), default=None, help="Global seed (default: config seed)."))
agents_option = click.option("--agents", default=None, help="Comma-separated subset of agents, e.g. sac,ppo.")
time_options = options(
    click.option("--budget", default=None, metavar="DURATION", help="Time for the whole night, e.g. 10h, 90m, 1h30m."),
    click.option("--finish-by", "finish_by", default=None, metavar="HH:MM",
                 help="Local time the night must end by (a time already past means tomorrow)."))
quick_option = click.option("--quick", is_flag=True,
                            help="A small budget per agent (schedule.quick_timesteps): a smoke run of the night.")
resume_option = click.option("--resume", is_flag=False, flag_value=LATEST, default=None, metavar="[RUN_DIR]",
                             help="Continue a run folder (default: --out, else the newest run).")
force_option = click.option("--force", is_flag=True, help="Resume even though the config changed since the checkpoint.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
run_dir_argument = click.argument("run_dir", type=click.Path(file_okay=False))
def backend_options(fn: Callable) -> Callable:
    """``--backend`` (a row of trainer.night.backends) and each backend's own options (Ray's ``--address``),
    handed to the command as ``backend`` and ``backend_options``, the options of the backend chosen."""
    # lazy: the night's modules, when a command declares --backend
    from trainer.night.backends import BACKENDS, own_options

    owned = {option: name for name, row in BACKENDS.items() for option in row.options}

    @functools.wraps(fn)
    def collected(*args: Any, backend: str, **kwargs: Any) -> Any:
        given = {option: kwargs.pop(option) for option in owned}
        return fn(*args, backend=backend, backend_options=own_options(backend, given), **kwargs)

    for option, name in owned.items():
        metavar, text = BACKENDS[name].options[option]
        collected = click.option(f"--{option.replace('_', '-')}", option, default=None, metavar=metavar,
                                 help=f"With --backend {name}: {text}.")(collected)
    where = "; ".join(f"{name}: {row.summary}" for name, row in BACKENDS.items())
    return click.option("--backend", type=click.Choice(list(BACKENDS)), default="local", show_default=True,
                        help=f"Where the stages run ({where}).")(collected)
seeds_option = click.option("--seeds", default=None, metavar="1,2,3",
                            help="A seed sweep: one run folder per seed and sweep.md with mean ± sd (both backends).")
night_options = options(run_options, quick_option, agents_option, time_options, resume_option, force_option,
                        backend_options, seeds_option)
