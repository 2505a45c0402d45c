"""What a wheel install gets: the configs and py.typed inside the package, found without the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_ships_the_configs_and_py_typed(tmp_path):
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources, and the checkout stays as it was.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "outputs", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp_path), str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("pvbess_trainer-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "trainer" / "configs").rglob("*.yaml")}
    assert shipped and shipped <= names
    assert {"trainer/py.typed", "trainer/night/runner.py", "trainer/learn/trainer.py", "monitor/cli.py"} <= names


def test_the_config_is_found_from_any_directory(tmp_path):
    # The package's own data, not a path relative to the working directory or the checkout.
    proc = subprocess.run([sys.executable, "-m", "trainer", "config", "show"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "scenario:" in proc.stdout and "sacramento" in proc.stdout


def test_the_monitor_imports_nothing_from_the_trainer():
    code = ("import sys, monitor.cli, monitor.summary, monitor.sampler; "
            "print(any(m.startswith('trainer') for m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr
