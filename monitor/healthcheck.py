"""Container HEALTHCHECK: healthy while the newest monitor record is fresh (the heartbeat)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click


@click.command()
@click.option("--outputs", type=click.Path(file_okay=False), default="/app/outputs", help="Folder of run folders.")
@click.option("--max-age", type=float, default=120.0, help="Seconds since the last record before unhealthy.")
def main(outputs: str, max_age: float) -> None:
    files = list(Path(outputs).glob("*/monitor.jsonl"))
    if not files:
        click.echo(f"unhealthy: no monitor.jsonl under {outputs}")
        sys.exit(1)
    newest = max(files, key=lambda p: p.stat().st_mtime)
    age = time.time() - newest.stat().st_mtime
    if age > max_age:
        click.echo(f"unhealthy: {newest} last written {age:.0f} s ago (more than {max_age:.0f} s)")
        sys.exit(1)
    click.echo(f"healthy: {newest} written {age:.0f} s ago")


if __name__ == "__main__":
    main()
