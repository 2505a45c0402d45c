"""`python -m monitor` / `gpu-monitor`: the sidecar GPU monitor."""

from __future__ import annotations

from pathlib import Path

import click

from monitor.sampler import Monitor, Thresholds


def thresholds_from_config(config_files: tuple[str, ...]) -> tuple[Thresholds, dict]:
    from trainer.config import load_config

    section = load_config(config_files).monitor
    return Thresholds(section.util_low_pct, section.util_low_window_s, section.temp_high_c, section.memory_high_pct), \
        section.model_dump()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="JSON-lines file to append records to.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=None, help="Seconds between samples (default: monitor.interval_s, 5).")
@click.option("--watch-pid", type=int, default=None, help="Exit when this process ends (e.g. the trainer).")
@click.option("--once", is_flag=True, help="Write one record and exit.")
@click.option("--config", "config_files", multiple=True, type=click.Path(dir_okay=False),
              help="pvbess-trainer config whose `monitor` section sets the thresholds.")
def main(out: str, interval: float | None, watch_pid: int | None, once: bool, config_files: tuple[str, ...]) -> None:
    """Poll NVML and the host; append one JSON object per line to --out.

    Without a GPU or driver it still writes host records, with "gpus": [] and the reason.
    """
    try:
        thresholds, section = thresholds_from_config(config_files)
    except Exception as exc:  # noqa: BLE001 - the config's own errors are one line already
        raise click.ClickException(str(exc)) from None
    monitor = Monitor(Path(out), interval or section["interval_s"], thresholds, max_bytes=section["max_bytes"],
                      backups=section["backups"], watch_pid=watch_pid)
    raise SystemExit(monitor.run(once=once))
