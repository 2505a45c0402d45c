"""`trainer`: the command line. Each command parses its options, makes one call into trainer/,
prints, and turns known errors into one line and an exit code (0 ok, 1 runtime failure, 2 bad
usage or config). The commands live by topic (run_commands, tool_commands, launch_command) and add
themselves to the one group (group.py); options shared by commands are declared once (options.py).
"""

from __future__ import annotations

import sys

import click
from click.exceptions import NoArgsIsHelpError

# Imported for what they do on import: each adds its commands to the group.
from trainer.cli import launch_command, run_commands, tool_commands  # noqa: F401
from trainer.cli.group import cli


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
