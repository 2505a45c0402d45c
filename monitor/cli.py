"""`python -m monitor` / `gpu-monitor`: the sidecar GPU monitor.

It stands alone (it imports nothing from the trainer): `trainer launch` passes the thresholds
of its config's `monitor` section as the flags below.
"""

from __future__ import annotations

from pathlib import Path

import click

from monitor.sampler import Monitor, Thresholds

# Defaults for a monitor started by hand; the trainer's config (monitor section) sets them for a night.
DEFAULTS = {"interval": 5.0, "util_low_pct": 50.0, "util_low_window_s": 60.0, "temp_high_c": 75.0,
            "memory_high_pct": 90.0, "max_bytes": 50 * 2**20, "backups": 3}


def _option(name: str, kind: click.ParamType, text: str):
    return click.option(f"--{name.replace('_', '-')}", name, type=kind, default=DEFAULTS[name], show_default=True,
                        help=text)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="JSON-lines file to append records to.")
@_option("interval", click.FloatRange(min=0.1), "Seconds between samples.")
@click.option("--watch-pid", type=int, default=None, help="Exit when this process ends (e.g. the trainer).")
@click.option("--once", is_flag=True, help="Write one record and exit.")
@click.option("--activity", type=click.Path(dir_okay=False), default=None,
              help="The trainer's activity file ({\"stage\", \"device\"}): no low-utilisation warning on CPU stages.")
@_option("util_low_pct", click.FloatRange(0, 100), "Warn when GPU utilisation stays under this %...")
@_option("util_low_window_s", click.FloatRange(min=0), "...for this many seconds.")
@_option("temp_high_c", click.FloatRange(min=0, min_open=True),
         "Warn over this temperature (degrees C) on GPUs that report no throttle reasons; others: when heat throttles.")
@_option("memory_high_pct", click.FloatRange(0, 100, min_open=True), "Warn when GPU memory use is over this %.")
@_option("max_bytes", click.IntRange(min=1024), "Rotate the records file past this size.")
@_option("backups", click.IntRange(0, 100), "Rotated files kept (.1, .2, ...).")
def main(out: str, interval: float, watch_pid: int | None, once: bool, activity: str | None, util_low_pct: float,
         util_low_window_s: float, temp_high_c: float, memory_high_pct: float, max_bytes: int, backups: int) -> None:
    """Poll NVML and the host; append one JSON object per line to --out.

    Without a GPU or driver it still writes host records, with "gpus": [] and the reason.
    """
    thresholds = Thresholds(util_low_pct, util_low_window_s, temp_high_c, memory_high_pct)
    monitor = Monitor(Path(out), interval, thresholds, max_bytes=max_bytes, backups=backups, watch_pid=watch_pid,
                      activity=Path(activity) if activity else None)
    try:
        code = monitor.run(once=once)
    except OSError as exc:  # a read-only or full --out: one line, not a traceback
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != out else ""
        raise click.ClickException(f"cannot write {out}: {exc.strerror}{where}; choose a writable --out") from None
    raise SystemExit(code)
