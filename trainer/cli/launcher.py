"""What the launchers do, in one tested place (`trainer launch`; launch.sh, the PowerShell
scripts and the container entrypoint only bootstrap Python and call it).

1. run the doctor: a failing check stops the launch with its fix; warnings are shown;
2. start the trainer in its own process group (so a terminal's Ctrl+C reaches it once,
   through us) with its console also written to ``<run>/logs/launcher.log``;
3. start the GPU monitor sidecar beside it, watching the trainer's PID (by default when a
   GPU is present, always with ``--monitor``);
4. forward SIGINT and SIGTERM to the trainer and wait for its checkpoint;
5. whatever happens, stop the monitor; print the GPU summary (and the results so far, when the
   trainer did not finish to print them itself); exit with the trainer's exit code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from monitor.summary import format_summary, read_records, summarise
from trainer.base.durations import deadline
from trainer.base.errors import TrainerError, UsageError
from trainer.cli.doctor import FAIL, format_table, run_checks
from trainer.config.roster import AGENTS
from trainer.config.sections import Config, MonitorConfig
from trainer.judge.metrics import format_table as results_table
from trainer.judge.report import currency
from trainer.run.folder import RunDir, default_run_dir
from trainer.run.session import LATEST, newest_run

AGENT_CHOICES = ("all", *AGENTS, "baseline")
MONITOR_STOP_TIMEOUT_S = 10


@dataclass
class LaunchOptions:
    """The launchers' shared surface (bash, PowerShell and the container offer the same)."""

    agent: str = "all"
    configs: list[str] = field(default_factory=list)
    profile: str | None = None
    budget: str | None = None
    finish_by: str | None = None
    resume: str | None = None
    monitor: bool | None = None  # None: on when a GPU is present
    quick: bool = False
    live_status_s: float | None = None
    extra: list[str] = field(default_factory=list)


WINDOWS = os.name == "nt"


def own_process_group(windows: bool = WINDOWS) -> dict[str, Any]:
    """Popen arguments that give a child its own process group, so a terminal's Ctrl+C reaches it once, through us.
    POSIX: a new session. Windows: a new process group, which can then be sent CTRL_BREAK_EVENT."""
    if windows:
        return {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200)}
    return {"start_new_session": True}


def forward_stop(pid: int, signum: int, windows: bool = WINDOWS, kill: Callable[[int, int], None] = os.kill) -> None:
    """Ask the trainer to checkpoint and stop. On Windows os.kill(pid, SIGINT) would end it outright, with no
    checkpoint: CTRL_BREAK_EVENT reaches its process group instead, and the trainer handles SIGBREAK."""
    kill(pid, getattr(signal, "CTRL_BREAK_EVENT", 1) if windows else signum)


def split_agent(option: str | None, extra: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The agent, given as --agent or as a word anywhere among the launcher's options (`launch.sh --quick ppo`),
    and the trainer's options (those after `--`)."""
    words = [w for w in extra[:1] if not w.startswith("-")]
    if not words:
        return option or "all", extra
    if words[0] not in AGENT_CHOICES:
        raise UsageError(f"launch: unknown agent {words[0]!r}; expected one of {', '.join(AGENT_CHOICES)} "
                         "(launch.sh [AGENT] [OPTIONS] [-- TRAINER_OPTIONS...])")
    if option is not None and option != words[0]:
        raise UsageError(f"launch: two agents given, --agent {option} and {words[0]}; pass one")
    return words[0], extra[1:]


def trainer_command(options: LaunchOptions, run_dir: Path) -> list[str]:
    """The trainer's command line for these options (the parity tests compare launchers on it)."""
    cmd = [sys.executable, "-m", "trainer"]
    if options.agent == "baseline":
        cmd += ["baseline"]
    else:
        cmd += ["night"]
        if options.agent != "all":
            cmd += ["--agents", options.agent]
        if options.quick:
            cmd += ["--quick"]
        if options.budget:
            cmd += ["--budget", options.budget]
        if options.finish_by:
            cmd += ["--finish-by", options.finish_by]
    if options.resume is not None:
        cmd += ["--resume", str(run_dir)]
    else:
        cmd += ["--out", str(run_dir)]
        for config in options.configs:
            cmd += ["--config", config]
        if options.profile:
            cmd += ["--profile", options.profile]
    return cmd + list(options.extra)


def choose_run_dir(options: LaunchOptions, cfg: Config) -> Path:
    """The run folder: the one to resume, or a new one named as every run is (output.run_name)."""
    if options.resume not in (None, LATEST):
        return Path(options.resume)
    if options.resume == LATEST:
        found = newest_run(Path(cfg.output.root))
        if found is None:
            raise UsageError(f"--resume: no run folder under {cfg.output.root} to resume; pass --resume RUN_DIR")
        return found
    command = "night" if options.agent == "all" else options.agent
    return default_run_dir(cfg, f"launch-{command}").root


class Launch:
    def __init__(self, options: LaunchOptions, run_dir: Path, gpu_present: bool, out: TextIO = sys.stdout,
                 monitor_settings: MonitorConfig | None = None):
        self.options = options
        self.monitor_settings = monitor_settings
        self.run = RunDir(run_dir)
        self.gpu_present = gpu_present
        self.out = out
        self.trainer: subprocess.Popen | None = None
        self.monitor: subprocess.Popen | None = None
        self._log: TextIO | None = None
        self._signals = 0

    @property
    def monitor_wanted(self) -> bool:
        return self.options.monitor if self.options.monitor is not None else self.gpu_present

    def say(self, line: str) -> None:
        for stream in (self.out, self._log):
            if stream is not None:
                stream.write(line + "\n")
                stream.flush()

    def run_all(self) -> int:
        self.run.refuse_links_out()
        self.run.logs.mkdir(parents=True, exist_ok=True)
        self._log = open(self.run.launcher_log, "a", encoding="utf-8")
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start_trainer()
            if self.monitor_wanted:
                self.start_monitor()
            code = self.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.stop_monitor()
        self.after(code)
        self._log.close()
        return code

    def start_trainer(self) -> None:
        cmd = trainer_command(self.options, self.run.root)
        self.say(f"[launch] run folder: {self.run.root}")
        self.say(f"[launch] trainer: {' '.join(cmd[1:])}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Its own session: a terminal's Ctrl+C reaches the trainer once, forwarded by us, not twice.
        self.trainer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                        env=env, **own_process_group())
        threading.Thread(target=self._tee, args=(self.trainer.stdout,), daemon=True).start()

    def _tee(self, stream) -> None:
        for line in stream:
            self.say(line.rstrip("\n"))

    def start_monitor(self) -> None:
        cmd = [sys.executable, "-m", "monitor", "--out", str(self.run.monitor), "--watch-pid", str(self.trainer.pid),
               "--activity", str(self.run.activity)]
        if self.monitor_settings is not None:  # the user's `monitor` section: the monitor reads no trainer config
            for key, value in self.monitor_settings.model_dump().items():
                flag = "interval" if key == "interval_s" else key
                cmd += [f"--{flag.replace('_', '-')}", str(value)]
        self.monitor = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log, **own_process_group())
        (self.run.root / "monitor.pid").write_text(str(self.monitor.pid))
        self.say(f"[launch] GPU monitor: {self.run.monitor} (PID {self.monitor.pid})")

    def _forward(self, signum, frame) -> None:
        self._signals += 1
        if self.trainer is not None and self.trainer.poll() is None:
            name = signal.Signals(signum).name
            self.say(f"[launch] {name}: forwarded to the trainer; waiting for its checkpoint"
                     if self._signals == 1 else f"[launch] {name} again: the trainer aborts")
            forward_stop(self.trainer.pid, signum)

    def wait(self) -> int:
        last_status = time.monotonic()
        while True:
            try:
                code = self.trainer.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if self.options.live_status_s and time.monotonic() - last_status >= self.options.live_status_s:
                    last_status = time.monotonic()
                    self.live_status()
        self.trainer.stdout.close() if self.trainer.stdout else None
        return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention

    def live_status(self) -> None:
        if not self.run.monitor.is_file():
            return
        lines = self.run.monitor.read_text(encoding="utf-8").splitlines()
        sample = next((json.loads(line) for line in reversed(lines) if '"kind":"sample"' in line), None)
        if sample is None:
            return
        for gpu in sample["gpus"]:
            used = (gpu["memory_used_bytes"] or 0) / 2**30
            self.say(f"[gpu {gpu['index']}] util {gpu['utilization_gpu_pct']}%  mem {used:.1f} GiB  "
                     f"temp {gpu['temperature_c']} C  power {gpu['power_w']} W")
        if not sample["gpus"]:
            self.say(f"[host] cpu {sample['host']['cpu_pct']:.0f}%  ({sample['gpu_error']})")

    def stop_monitor(self) -> None:
        if self.monitor is None:
            return
        # The monitor watches the trainer's PID and may have exited on its own already; its PID file
        # goes either way, so no stale PID points at an unrelated process later.
        if self.monitor.poll() is None:
            self.monitor.terminate()
            try:
                self.monitor.wait(timeout=MONITOR_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.monitor.kill()
                self.monitor.wait()
        (self.run.root / "monitor.pid").unlink(missing_ok=True)

    def after(self, code: int) -> None:
        if self.run.monitor.is_file():
            self.say("[launch] GPU status after the run:\n" + format_summary(summarise(read_records(self.run.monitor))))
        if code != 0 and self.run.results_json.is_file():  # a trainer that finished has printed them
            self.say("[launch] results so far:\n" + results_table(self.run.results(), currency(self.run)))
        self.say(f"[launch] trainer exited with {code}")


def doctor_gate(load: Callable[[], Config], out: TextIO) -> bool:
    """Run the doctor; print it; False when a check fails."""
    checks = run_checks(load, None, None, require_gpu=False)
    out.write(format_table(checks) + "\n")
    return not any(c.status == FAIL for c in checks)


def start(options: LaunchOptions, load: Callable[[], Config]) -> int:
    """`trainer launch`: check the times, the doctor, then run the night under the launcher; its exit code."""
    import torch  # heavy: only a launch needs to know whether CUDA is there

    deadline(options.budget, options.finish_by, datetime.now())  # a bad --budget fails before the doctor runs
    if not doctor_gate(load, sys.stdout):
        raise TrainerError("launch stopped: a doctor check failed; fix it as shown above and launch again")
    cfg = load()
    launch = Launch(options, choose_run_dir(options, cfg), gpu_present=torch.cuda.is_available(),
                    monitor_settings=cfg.monitor)
    return launch.run_all()
