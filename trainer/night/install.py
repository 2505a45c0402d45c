"""`trainer schedule install`: a systemd user timer (or a crontab line) for the night.

Runs never overlap: systemd does not start a service that is still running, the crontab
line is wrapped in `flock -n`, and the run folder's own lock refuses a second trainer.
"""

from __future__ import annotations

import os
import shlex
from datetime import datetime
from pathlib import Path

from trainer.base.durations import deadline, parse_clock
from trainer.base.errors import UsageError
from trainer.run.session import parse_agents, resolve_config

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


def _systemd_word(word: str) -> str:
    """A shell-quoted word with systemd's own specifiers and variables escaped (% and $ mean something there)."""
    return shlex.quote(word).replace("%", "%%").replace("$", "$$")


def systemd_units(repo: Path, at: str, args: list[str]) -> dict[str, str]:
    hour, minute = check_time(at, "--at")
    command = " ".join(_systemd_word(a) for a in [str(repo / "launchers" / "launch.sh"), *args])
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


def default_lock(repo: Path) -> Path:
    """The cron line's lock: in the user's own runtime folder, which no other user can hold (not /tmp)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return (Path(runtime) if runtime else repo / "outputs") / "pvbess-trainer.run.lock"


def crontab_line(repo: Path, at: str, args: list[str], lock: Path | None = None) -> str:
    hour, minute = check_time(at, "--at")
    # cron turns an unescaped % into a newline: every % is escaped.
    words = [shlex.quote(a).replace("%", "\\%") for a in [str(repo / "launchers" / "launch.sh"), *args]]
    outputs = shlex.quote(str(repo / "outputs")).replace("%", "\\%")
    lock_path = shlex.quote(str(lock or default_lock(repo))).replace("%", "\\%")
    return (f"{minute} {hour} * * * cd {shlex.quote(str(repo))} && mkdir -p {outputs} && flock -n {lock_path} "
            f"{' '.join(words)} >> {outputs}/cron.log 2>&1")


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
    for option, value in (("--budget", budget), ("--finish-by", finish_by), ("--agents", agents),
                          ("--profile", profile), *(("--config", c) for c in configs)):
        if value and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise UsageError(f"{option} holds a control character ({value!r}); it would break the scheduled line")
    deadline(budget, finish_by, datetime.now())  # a bad --budget or --finish-by fails before anything is written
    if bool(finish_by) == bool(budget):
        raise UsageError("pass exactly one of --finish-by or --budget, so the night ends in time for the morning")
    if agents:
        parse_agents(agents)
    resolve_config(configs, profile=profile)  # every config file read and the profile known, now, not at 22:00
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
