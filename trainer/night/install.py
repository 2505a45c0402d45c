"""`trainer schedule install`: a systemd user timer (or a crontab line) for the night.

Runs never overlap: systemd does not start a service that is still running, the crontab
line is wrapped in `flock -n`, and the run folder's own lock refuses a second trainer.
"""

from __future__ import annotations

import shlex
from datetime import datetime
from pathlib import Path

from trainer.errors import UsageError
from trainer.night.budget import deadline, parse_clock
from trainer.session import parse_agents

UNIT = "pvbess-trainer"


# The checkout whose launcher the units and the crontab line start.
CHECKOUT = Path(__file__).resolve().parents[2]


def check_time(text: str, option: str) -> tuple[int, int]:
    return parse_clock(text, option, example="22:00")


def launch_args(
    finish_by: str | None, budget: str | None, agents: str | None, configs: list[str], profile: str | None
) -> list[str]:
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


def install_night(at: str, finish_by: str | None, budget: str | None, agents: str | None, configs: list[str],
                  profile: str | None, cron: bool, unit_dir: Path | None, dry_run: bool) -> str:
    """`trainer schedule install`: write the systemd units (or print the crontab line); what to tell the user."""
    check_time(at, "--at")
    deadline(budget, finish_by, datetime.now())  # a bad --budget or --finish-by fails before anything is written
    if bool(finish_by) == bool(budget):
        raise UsageError("pass exactly one of --finish-by or --budget, so the night ends in time for the morning")
    if agents:
        parse_agents(agents)
    args = launch_args(finish_by, budget, agents, configs, profile)
    if cron:
        return (crontab_line(CHECKOUT, at, args) + "\n\nadd it with: (crontab -l 2>/dev/null; echo '<the line above>') "
                "| crontab -   remove it with: crontab -e")
    target = unit_dir or Path.home() / ".config" / "systemd" / "user"
    lines = []
    for name, text in systemd_units(CHECKOUT, at, args).items():
        if dry_run:
            lines.append(f"# {target / name}\n{text}")
        else:
            target.mkdir(parents=True, exist_ok=True)
            (target / name).write_text(text, encoding="utf-8")
            lines.append(f"wrote {target / name}")
    lines.append(("(dry run: nothing written)\n" if dry_run else "") + enable_instructions(target))
    return "\n".join(lines)
