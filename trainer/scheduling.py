"""`trainer schedule install`: a systemd user timer (or a crontab line) for the night.

Runs never overlap: systemd does not start a service that is still running, the crontab
line is wrapped in `flock -n`, and the run folder's own lock refuses a second trainer.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from trainer.timing import _CLOCK
from trainer.errors import UsageError

UNIT = "pvbess-trainer"


def check_time(text: str, option: str) -> tuple[int, int]:
    match = _CLOCK.match(text or "")
    if not match or int(match.group(1)) > 23 or int(match.group(2)) > 59:
        raise UsageError(f"{option} expects a local time HH:MM such as 22:00, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def launch_args(finish_by: str | None, budget: str | None, agents: str | None, configs: list[str], profile: str | None) -> list[str]:
    args = ["all"]
    if finish_by:
        args += ["--finish-by", finish_by]
    if budget:
        args += ["--budget", budget]
    for config in configs:
        args += ["--config", str(Path(config).resolve())]
    if profile:
        args += ["--profile", profile]
    if agents:
        args += ["--", "--agents", agents]
    return args


def systemd_units(repo: Path, at: str, args: list[str]) -> dict[str, str]:
    hour, minute = check_time(at, "--at")
    command = " ".join(shlex.quote(a) for a in [str(repo / "launchers" / "launch.sh"), *args])
    service = f"""[Unit]
Description=pvbess-trainer overnight schedule
After=network.target

[Service]
Type=simple
WorkingDirectory={repo}
ExecStart={command}
# SIGTERM makes the trainer save a checkpoint; give it time before SIGKILL.
KillSignal=SIGTERM
TimeoutStopSec=180
"""
    timer = f"""[Unit]
Description=Start pvbess-trainer at {hour:02d}:{minute:02d}

[Timer]
OnCalendar=*-*-* {hour:02d}:{minute:02d}:00
Unit={UNIT}.service
# Waking a suspended machine needs a system (not user) timer with WakeSystem=true.

[Install]
WantedBy=timers.target
"""
    return {f"{UNIT}.service": service, f"{UNIT}.timer": timer}


def crontab_line(repo: Path, at: str, args: list[str], lock: str = "/tmp/pvbess-trainer.lock") -> str:
    hour, minute = check_time(at, "--at")
    command = " ".join(shlex.quote(a) for a in [str(repo / "launchers" / "launch.sh"), *args])
    return (f"{minute} {hour} * * * cd {shlex.quote(str(repo))} && flock -n {lock} {command} "
            f">> {shlex.quote(str(repo / 'outputs' / 'cron.log'))} 2>&1")


def enable_instructions(unit_dir: Path) -> str:
    return (f"enable:  systemctl --user daemon-reload && systemctl --user enable --now {UNIT}.timer\n"
            f"check:   systemctl --user list-timers {UNIT}.timer\n"
            f"remove:  systemctl --user disable --now {UNIT}.timer && rm {unit_dir / (UNIT + '.service')} "
            f"{unit_dir / (UNIT + '.timer')}\n"
            "(to run while logged out: loginctl enable-linger $USER)")
