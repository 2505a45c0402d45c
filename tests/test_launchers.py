"""The four ways users start it: bash, PowerShell (parsed), Docker (parsed, entrypoint run
outside a container) and a scheduled job (generated text)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from click.testing import CliRunner

from trainer.cli.launcher import AGENT_CHOICES
from trainer.cli.main import cli

from .conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = ROOT / "launchers"
QUICK = "schedule.quick_timesteps={sac: 120, ppo: 128, a2c: 100}"


def env() -> dict[str, str]:
    # The launcher bootstraps the venv running these tests (up to date: no reinstall).
    venv = Path(sys.executable).parent.parent
    return {
        **os.environ,
        "PVBESS_VENV": str(venv),
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
    }


def tiny(tmp_path, *extra: str) -> list[str]:
    sets = tiny_overrides(QUICK, "schedule.eval_days=1", f"output.root={tmp_path / 'outputs'}", *extra)
    return ["--", "--device", "cpu", *[a for o in sets for a in ("--set", o)]]


def only_run(tmp_path) -> Path:
    runs = [p for p in (tmp_path / "outputs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(runs) == 1, runs
    return runs[0]


def launch(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(LAUNCHERS / "launch.sh"), *args], cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------------ bash


@pytest.mark.slow
def test_launch_quick_runs_the_whole_night(tmp_path):
    proc = launch("--quick", "--no-monitor", *tiny(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "checks: 0 failed" in proc.stdout  # the doctor ran first
    run = only_run(tmp_path)
    assert list(json.loads((run / "results.json").read_text())) == [
        "baseline", "rbc", "optimum", "planner", "sac", "ppo", "a2c"]
    log = (run / "logs" / "launcher.log").read_text()
    assert "[launch] trainer: -m trainer night --quick --out" in log
    assert "[launch] trainer exited with 0" in log
    assert sum(line.startswith("agent ") for line in log.splitlines()) == 1  # the results table, printed once
    assert (run / "report.md").is_file() and not (run / "monitor.jsonl").exists()


@pytest.mark.slow
def test_launch_a2c_alone(tmp_path):
    proc = launch("a2c", "--quick", "--no-monitor", *tiny(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    run = only_run(tmp_path)
    assert list(json.loads((run / "results.json").read_text())) == ["baseline", "rbc", "optimum", "planner", "a2c"]
    stages = [s["name"] for s in json.loads((run / "schedule.json").read_text())["stages"]]
    assert stages == ["baseline", "rbc", "optimum", "planner", "a2c", "report"]


@pytest.mark.slow
def test_sigterm_checkpoints_stops_the_monitor_and_leaves_no_process(tmp_path):
    proc = subprocess.Popen([str(LAUNCHERS / "launch.sh"), "a2c", "--quick", "--monitor",
                             *tiny(tmp_path, "schedule.quick_timesteps={a2c: 200000}", "monitor.interval_s=1")],
                            cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # wait for an event, not for a while
        lines.append(line)
        saved = re.search(r"checkpoint saved.*\bstep=(\d+)", line)
        if saved and int(saved.group(1)) >= 1000:
            break
    else:
        pytest.fail("the trainer never saved its first checkpoint:\n" + "".join(lines[-40:]))
    run = only_run(tmp_path)
    monitor_pid = int((run / "monitor.pid").read_text())
    trainer_pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 143, rest[-3000:]
    assert "[launch] SIGTERM: forwarded to the trainer; waiting for its checkpoint" in rest
    assert "error: stopped by SIGTERM: checkpoint at step" in rest
    assert any((run / "a2c" / "checkpoints").glob("step_*/manifest.json"))
    assert not psutil.pid_exists(monitor_pid) and not (run / "monitor.pid").exists()
    assert json.loads((run / "monitor.jsonl").read_text().splitlines()[0])["kind"] == "sample"
    assert not [p for p in trainer_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert "[launch] trainer exited with 143" in (run / "logs" / "launcher.log").read_text()


def test_a_monitor_that_exited_on_its_own_leaves_no_pid_file(tmp_path):
    # The monitor watches the trainer's PID and often exits before the launcher stops it.
    from trainer.cli.launcher import Launch, LaunchOptions

    launch_ = Launch(LaunchOptions(), tmp_path, gpu_present=False)
    launch_.monitor = subprocess.Popen([sys.executable, "-c", "pass"])
    launch_.monitor.wait()
    (tmp_path / "monitor.pid").write_text(str(launch_.monitor.pid))
    launch_.stop_monitor()
    assert not (tmp_path / "monitor.pid").exists()


def test_a_failing_doctor_check_stops_the_launch(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = launch("--quick", "--no-monitor", "--", "--set", f"output.root={blocker}/runs")
    assert proc.returncode == 1
    assert "FAIL  disk" in proc.stdout
    assert proc.stderr.strip().endswith(
        "error: launch stopped: a doctor check failed; fix it as shown above and launch again"
    )
    assert not (blocker.parent / "runs").exists()


def test_unknown_launcher_option_is_a_usage_error():
    proc = launch("--frobnicate")
    assert proc.returncode == 2 and "No such option '--frobnicate'" in proc.stderr


def test_the_agent_goes_anywhere_and_a_wrong_one_stops_before_the_doctor(tmp_path):
    from trainer.cli.launcher import split_agent

    assert split_agent(None, ("ppo",)) == ("ppo", ())  # launch.sh --quick ppo
    assert split_agent(None, ("a2c", "--seed", "3")) == ("a2c", ("--seed", "3"))  # launch.sh a2c --quick -- --seed 3
    assert split_agent("sac", ()) == ("sac", ())
    assert split_agent(None, ("--seed", "3")) == ("all", ("--seed", "3"))
    proc = launch("--quick", "ppp", "--", "--set", f"output.root={tmp_path / 'runs'}")
    assert proc.returncode == 2 and "checks:" not in proc.stdout
    assert proc.stderr.strip().endswith("error: launch: unknown agent 'ppp'; expected one of all, sac, ppo, a2c, "
                                        "baseline (launch.sh [AGENT] [OPTIONS] [-- TRAINER_OPTIONS...])")
    assert not (tmp_path / "runs").exists()


def test_launch_help_shows_the_launcher_s_syntax():
    proc = launch("--help")
    assert proc.returncode == 0 and "launch.sh [AGENT] [OPTIONS] [-- TRAINER_OPTIONS...]" in proc.stdout


# ------------------------------------------------------------------ PowerShell


def _ps_tree(name: str):
    import tree_sitter
    import tree_sitter_powershell

    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_powershell.language()))
    return parser.parse((LAUNCHERS / name).read_bytes())


def _errors(node, found=None):
    found = [] if found is None else found
    if node.type == "ERROR" or node.is_missing:
        found.append((node.start_point, node.type))
    for child in node.children:
        _errors(child, found)
    return found


@pytest.mark.parametrize("name", ["launch_training_gpu_optimized.ps1", "launch_a2c_training_gpu.ps1"])
def test_powershell_scripts_parse_without_errors(name):
    tree = _ps_tree(name)
    assert _errors(tree.root_node) == []
    text = (LAUNCHERS / name).read_text()
    for habit in (
        "[CmdletBinding(",
        "Set-StrictMode -Version Latest",
        "$ErrorActionPreference = 'Stop'",
        ".SYNOPSIS",
    ):
        assert habit in text, habit


PS_TO_LAUNCH = {"Config": "--config", "DeviceProfile": "--profile", "Budget": "--budget", "FinishBy": "--finish-by",
                "Resume": "--resume", "Monitor": "--monitor", "NoMonitor": "--no-monitor", "Quick": "--quick"}


def test_powershell_and_bash_offer_the_same_options_and_call_the_same_command():
    text = (LAUNCHERS / "launch_training_gpu_optimized.ps1").read_text()
    params = set(re.findall(r"^\s*\[(?:string|string\[\]|switch)\]\$(\w+)", text, re.M))
    assert params == {"Agent", "Extra", "Schedule", *PS_TO_LAUNCH}
    # The agents PowerShell accepts are the roster's (a new agent's row needs its name here too).
    assert f"ValidateSet({', '.join(repr(a) for a in AGENT_CHOICES)})" in text
    launch_options = {opt for p in cli.commands["launch"].params for opt in (*p.opts, *p.secondary_opts)}
    for flag in PS_TO_LAUNCH.values():
        assert f"'{flag}'" in text, flag            # PowerShell passes it to `trainer launch`
        assert flag in launch_options, flag         # which the bash launcher reaches through "$@"
    bash_usage = (LAUNCHERS / "launch.sh").read_text()
    for flag in PS_TO_LAUNCH.values():
        assert flag in bash_usage, flag
    assert "@('launch', '--agent', $Agent)" in text and 'exec "${PVBESS_VENV}/bin/trainer" launch' in bash_usage
    a2c = (LAUNCHERS / "launch_a2c_training_gpu.ps1").read_text()
    assert set(re.findall(r"^\s*\[(?:string|string\[\]|switch)\]\$(\w+)", a2c, re.M)) == params - {"Agent"}
    assert "-Agent 'a2c' @PSBoundParameters" in a2c


def test_powershell_parameters_are_checked_before_anything_runs():
    text = (LAUNCHERS / "launch_training_gpu_optimized.ps1").read_text()
    assert "[Alias('Profile')]" in text and "[string]$Profile" not in text  # $PROFILE is PowerShell's own
    assert "[Parameter(ParameterSetName = 'Budget', Mandatory = $true)]" in text
    assert "[Parameter(ParameterSetName = 'FinishBy', Mandatory = $true)]" in text  # one or the other
    patterns = re.findall(r"\[ValidatePattern\('(.+?)'\)\]\s*\[string\]\$(\w+)", text)
    checks = {name: re.compile(pattern) for pattern, name in patterns}
    assert set(checks) == {"Budget", "FinishBy", "Schedule"}
    assert all(checks["Budget"].match(v) for v in ("10h", "90m", "1h30m", "45s"))
    assert not checks["Budget"].match("banana") and not checks["FinishBy"].match("25:00")
    assert checks["FinishBy"].match("07:00") and checks["Schedule"].match("22:00") and checks["Schedule"].match("")
    assert "SupportsShouldProcess" in text and "$PSCmdlet.ShouldProcess(" in text  # -Schedule -WhatIf
    assert "$TorchIndex = 'https://download.pytorch.org/whl/cu128'" in text and "Win32_VideoController" in text


def test_powershell_schedule_registers_a_non_overlapping_task():
    text = (LAUNCHERS / "launch_training_gpu_optimized.ps1").read_text()
    task = text[text.index("function Get-TaskArguments"):text.index("function Register-Night")]
    assert "(ConvertTo-TaskArgument $PSCommandPath)" in task  # a path with spaces stays one argument
    for carried in ("-Config", "-Quick", "-Monitor", "-NoMonitor", "-DeviceProfile", "$Extra"):
        assert carried in task, carried  # the scheduled night is the one asked for
    assert "-AllowStartIfOnBatteries" in text and "-DontStopIfGoingOnBatteries" in text
    assert "Register-ScheduledTask" in text and "-MultipleInstances IgnoreNew" in text and "-WakeToRun" in text
    assert "try {" in text and "finally {" in text and "Stop-LeftoverMonitor" in text
    assert text.count("$LASTEXITCODE") >= 3


# ------------------------------------------------------------------ Docker


def test_dockerfile_follows_the_rules():
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    # Debian 12's Python (3.11.2, the lock's), and no CUDA base: the cu118 torch wheels bring CUDA and cuDNN.
    assert parser.parent_images[0] == "debian:bookworm-slim"
    instructions = [(i["instruction"], i["value"]) for i in parser.structure]
    assert not any("latest" in value for kind, value in instructions if kind == "FROM")
    users = [value for kind, value in instructions if kind == "USER"]
    assert users and users[-1] not in ("root", "0")
    entrypoint = next(value for kind, value in instructions if kind == "ENTRYPOINT")
    assert json.loads(entrypoint) == ["/usr/bin/tini", "--", "/app/launchers/docker-entrypoint.sh"]
    runs = " ".join(value for kind, value in instructions if kind == "RUN")
    assert '"torch==${TORCH}"' in runs and '--index-url "${TORCH_INDEX}"' in runs
    args = dict(value.split("=", 1) for kind, value in instructions if kind == "ARG")
    assert args == {"BASE": "debian:bookworm-slim", "TORCH_INDEX": "https://download.pytorch.org/whl/cu118",
                    "TORCH": "2.7.1", "TORCHVISION": "0.22.1"}
    # The lock installed as it is (nothing to resolve), then proved whole; any --user can write its caches.
    assert "pip install --no-deps -r /tmp/lock/constraints.txt" in runs and "lock.py verify" in runs
    assert "HOME=/tmp" in parser.content
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in parser.content
    assert any(kind == "HEALTHCHECK" and "trainer.cli.healthcheck" in value for kind, value in instructions)
    assert any(kind == "VOLUME" and "/app/outputs" in value for kind, value in instructions)
    copies = [value for kind, value in instructions if kind == "COPY"]
    assert copies[0].startswith("docker/constraints.txt")  # dependencies before code
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "outputs", ".git"} <= set(ignored)


def test_compose_runs_the_night_as_documented():
    service = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["trainer"]
    assert service["user"] == "${PVBESS_UID:-1000}:${PVBESS_GID:-1000}"  # not UID: bash's is read-only
    assert service["volumes"] == ["./outputs:/app/outputs"]
    assert (service["stop_grace_period"], service["shm_size"]) == ("2m", "1gb")
    device = service["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


@pytest.mark.slow
def test_container_entrypoint_runs_outside_a_container(tmp_path):
    proc = subprocess.run([str(LAUNCHERS / "docker-entrypoint.sh"), "a2c", "--quick", "--no-monitor", *tiny(tmp_path)],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "container mode" in proc.stderr
    assert list(json.loads((only_run(tmp_path) / "results.json").read_text())) == [
        "baseline", "rbc", "optimum", "planner", "a2c"]


def test_healthcheck_follows_the_trainer_s_heartbeat_not_the_monitor_s(tmp_path):
    def check() -> int:
        return subprocess.run([sys.executable, "-m", "trainer.cli.healthcheck", "--outputs", str(tmp_path),
                               "--max-age", "60"], cwd=ROOT, capture_output=True).returncode

    assert check() == 1  # no run yet
    beat = tmp_path / "run" / "logs" / "trainer.jsonl"
    beat.parent.mkdir(parents=True)
    beat.write_text("{}\n")
    assert check() == 0  # a CPU night: no monitor, still healthy
    os.utime(beat, (time.time() - 600, time.time() - 600))
    (tmp_path / "run" / "monitor.jsonl").write_text("{}\n")
    assert check() == 1  # a hung trainer beside a live monitor


# ------------------------------------------------------------------ scheduled nights


def test_systemd_units_are_written_with_the_night(tmp_path):
    result = CliRunner().invoke(
        cli,
        ["schedule", "install", "--at", "22:00", "--finish-by", "07:00", "--agents", "sac,ppo", "--unit-dir",
         str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    service = (tmp_path / "pvbess-trainer.service").read_text()
    timer = (tmp_path / "pvbess-trainer.timer").read_text()
    assert f"ExecStart={LAUNCHERS / 'launch.sh'} all --finish-by 07:00 -- --agents sac,ppo" in service
    assert f"WorkingDirectory={ROOT}" in service and "KillSignal=SIGTERM" in service
    assert "OnCalendar=*-*-* 22:00:00" in timer and "Unit=pvbess-trainer.service" in timer
    assert "systemctl --user enable --now pvbess-trainer.timer" in result.output


def test_dry_run_prints_and_writes_nothing(tmp_path):
    result = CliRunner().invoke(
        cli, ["schedule", "install", "--at", "21:30", "--budget", "9h", "--unit-dir", str(tmp_path), "--dry-run"]
    )
    assert result.exit_code == 0
    assert "OnCalendar=*-*-* 21:30:00" in result.output and "(dry run: nothing written)" in result.output
    assert list(tmp_path.iterdir()) == []


def test_crontab_line_is_wrapped_in_flock(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # the user's own runtime folder, not /tmp
    result = CliRunner().invoke(cli, ["schedule", "install", "--at", "22:05", "--finish-by", "07:00", "--cron"])
    assert result.exit_code == 0
    line = result.output.splitlines()[0]
    assert line.startswith(f"5 22 * * * cd {ROOT} && mkdir -p {ROOT / 'outputs'} && "
                           f"flock -n {tmp_path / 'pvbess-trainer.run.lock'} {LAUNCHERS / 'launch.sh'} all")
    assert line.endswith(f">> {ROOT / 'outputs'}/cron.log 2>&1")


def test_cron_and_systemd_escape_what_they_would_read_as_syntax():
    from trainer.night.install import crontab_line, systemd_units

    args = ["all", "--", "--set", "output.run_name=night_%Y_$HOME"]
    assert "night_\\%Y_$HOME" in crontab_line(ROOT, "22:00", args)  # cron: % is a newline
    assert "night_%%Y_$$HOME" in systemd_units(ROOT, "22:00", args)["pvbess-trainer.service"]


@pytest.mark.parametrize("args, message", [
    (["--at", "25:00", "--finish-by", "07:00"], "--at expects a local time HH:MM such as 22:00, got '25:00'"),
    (["--at", "22:00"], "pass exactly one of --finish-by or --budget"),
    (["--at", "22:00", "--budget", "banana"], "--budget expects a duration like 10h, 90m or 1h30m, got 'banana'"),
    (["--at", "22:00", "--budget", "8h", "--profile", "nonexistent"], "'nonexistent' is not one of 'auto'"),
    (["--at", "22:00", "--budget", "8h", "--agents", "sac\nrm -rf"], "--agents holds a control character"),
    (["--at", "22:00", "--budget", "8h", "--config", "/no/such.yaml"], "config file not found: /no/such.yaml"),
])
def test_install_refuses_bad_times(args, message):
    result = CliRunner().invoke(cli, ["schedule", "install", *args, "--dry-run"])
    assert result.exit_code == 2 and message in result.output


def test_windows_gets_a_process_group_and_ctrl_break_instead_of_a_killing_sigint():
    from trainer.cli.launcher import forward_stop, own_process_group

    assert own_process_group(windows=False) == {"start_new_session": True}
    assert own_process_group(windows=True) == {"creationflags": 0x200}  # CREATE_NEW_PROCESS_GROUP
    sent = []
    forward_stop(4242, signal.SIGINT, windows=True, kill=lambda pid, sig: sent.append((pid, sig)))
    forward_stop(4242, signal.SIGTERM, windows=False, kill=lambda pid, sig: sent.append((pid, sig)))
    assert sent == [(4242, 1), (4242, signal.SIGTERM)]  # CTRL_BREAK_EVENT is 1
