"""The image: its lock matches pyproject.toml (always), and the image builds and runs as users run it
(docker/smoke.sh, marked `docker`: it needs an engine and about six minutes)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "docker" / "constraints.txt"


def lock_module():
    spec = importlib.util.spec_from_file_location("docker_lock", ROOT / "docker" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lock_matches_pyproject_and_the_image_s_python():
    lock = lock_module()
    assert lock.drift(LOCK, ROOT / "pyproject.toml") == []
    header, pins = lock.read_lock(LOCK)
    assert header["python"] == "3.11.2"  # Debian 12's, the Dockerfile's base: frozen in the image, not a venv
    assert {"citylearn", "stable-baselines3", "nvidia-ml-py", "platformdirs"} <= set(pins)
    # torch's closure follows its build arguments; CityLearn's building generator is left out.
    assert not {"torch", "torchvision", "triton", "doe-xstock", "openstudio", "sphinx", "pyarrow"} & set(pins)


def test_the_lock_check_names_what_drifted(tmp_path):
    lock = lock_module()
    pyproject = tmp_path / "pyproject.toml"
    text = (ROOT / "pyproject.toml").read_text()
    pyproject.write_text(text.replace('"click>=8.1",', '"click>=99",\n    "rich>=13",'))
    problems = lock.drift(LOCK, pyproject)
    assert any("dependencies changed since the lock was frozen" in p for p in problems)
    assert any("rich" in p and "not pinned" in p for p in problems)
    assert any("click==" in p and "does not satisfy" in p and "click>=99" in p for p in problems)
    proc = subprocess.run([sys.executable, str(ROOT / "docker" / "lock.py"), "drift", str(LOCK), str(pyproject)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "docker/lock.sh" in proc.stderr.splitlines()[-1]


def engine_problem() -> str | None:
    docker = os.environ.get("DOCKER", "docker")
    if shutil.which(docker) is None:
        return f"no Docker client ({docker}) on PATH"
    if subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode != 0:
        return "no Docker engine answers `docker info`"
    return None


@pytest.mark.docker
def test_the_image_builds_and_runs_as_users_run_it():
    if os.environ.get("PVBESS_DOCKER_TESTS") != "1":
        pytest.skip("builds the image (~6 min): set PVBESS_DOCKER_TESTS=1, and PVBESS_DOCKER_SMOKE_ARGS for "
                    "docker/smoke.sh's options (a local base and torch where Docker Hub is out of reach)")
    if problem := engine_problem():
        pytest.skip(problem)
    args = shlex.split(os.environ.get("PVBESS_DOCKER_SMOKE_ARGS", ""))
    proc = subprocess.run(["bash", str(ROOT / "docker" / "smoke.sh"), "--tag", "pvbess-trainer:smoke", *args],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[smoke] ok: all checks passed" in proc.stderr
