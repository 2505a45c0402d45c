"""`trainer launch`: what the launchers and the container run (doctor, trainer, monitor sidecar, summary)."""

from __future__ import annotations

import sys

import click

from trainer.base import logs
from trainer.cli import options as opts
from trainer.cli.group import cli
from trainer.cli.launcher import AGENT_CHOICES, LaunchOptions, split_agent, start
from trainer.cli.options import command
from trainer.run import session


class LaunchCommand(click.Command):
    """`trainer launch`, whose help speaks of the way it was started: launch.sh, or `docker run IMAGE` when
    trainer.cli.container runs it as the image's entrypoint (ctx.obj is then CONTAINER)."""

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
