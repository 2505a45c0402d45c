"""The `trainer` command group, defined once: the command modules add their commands to it."""

from __future__ import annotations

import click

from trainer.cli import options as opts


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=opts.start_invocation,
              help="Show full tracebacks and debug logs (also accepted after any command).")
@click.version_option(package_name="pvbess-trainer")
def cli() -> None:
    """Train RL controllers for a PV + battery + EV site on CityLearn, and report CO2."""
