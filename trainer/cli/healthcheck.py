"""Container HEALTHCHECK: healthy while the trainer's own heartbeat is fresh, GPU or not.

The heartbeat is the newest run's log, ``<run>/logs/trainer.jsonl``: training and evaluation
write a progress line at least every minute, so a hung trainer goes stale even while the GPU
monitor (a separate process) keeps writing. Reads file times only: no trainer import.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

HEARTBEAT = "logs/trainer.jsonl"


@click.command()
@click.option("--outputs", type=click.Path(file_okay=False), default="/app/outputs", help="Folder of run folders.")
@click.option("--max-age", type=click.FloatRange(min=1), default=300.0, show_default=True,
              envvar="PVBESS_HEALTH_MAX_AGE", show_envvar=True,
              help="Seconds since the trainer last wrote before unhealthy.")
def main(outputs: str, max_age: float) -> None:
    files = list(Path(outputs).glob(f"*/{HEARTBEAT}"))
    if not files:
        click.echo(f"unhealthy: no {HEARTBEAT} under {outputs} (no run has started)")
        sys.exit(1)
    newest = max(files, key=lambda p: p.stat().st_mtime)
    age = time.time() - newest.stat().st_mtime
    if age > max_age:
        click.echo(f"unhealthy: {newest} last written {age:.0f} s ago (over {max_age:.0f} s): the trainer is stuck")
        sys.exit(1)
    click.echo(f"healthy: {newest} written {age:.0f} s ago")


if __name__ == "__main__":
    main()
