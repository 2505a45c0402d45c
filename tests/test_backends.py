"""Backends are one table: a new one is a class and a row, and the night's driver does the rest.

A toy backend is added here as a plugin would add it, with an option of its own, and runs a tiny
night end to end; another backend's option is refused with the backend it belongs to.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.night.backends import BACKENDS, own_options

from .conftest import tiny_overrides
from .test_reliability import ROOT

TOY_PLUGIN = textwrap.dedent('''
    import sys
    from contextlib import contextmanager

    from trainer.base.errors import UsageError
    from trainer.night import backends
    from trainer.night.stages import run_job
    from trainer.night.state import StageEvent


    class Notebook:
        """Each stage in this process, one after another, noting each job it placed."""

        summary = "each stage here, noted"
        options = {"note": ("FILE", "where to note each stage placed")}
        concurrent_nights = False
        one_process = True
        parallel = False

        @classmethod
        def check(cls, cfg, options):
            if not options["note"]:
                raise UsageError("--backend notebook needs --note FILE")

        @classmethod
        def doctor(cls, options):
            return None

        @classmethod
        @contextmanager
        def open(cls, nights, options, say):
            yield cls(options["note"])

        def __init__(self, note):
            self.note, self.queue = note, []

        def has_room(self):
            return not self.queue

        def submit(self, job, night):
            self.queue.append((job, night))

        def wait(self):
            job, night = self.queue.pop()
            with open(self.note, "a", encoding="utf-8") as handle:
                handle.write(f"{job.name} {job.kind} {job.target}\\n")
            return [StageEvent(job, run_job(night.ctx, job))]


    backends.BACKENDS["notebook"] = Notebook

    from trainer.cli.main import main

    sys.exit(main())
''')


def test_the_table_is_the_backends_and_their_options():
    assert list(BACKENDS) == ["local", "ray"]
    assert own_options("ray", {"address": "head:6379"}) == {"address": "head:6379"}
    assert own_options("local", {"address": None}) == {}


def test_another_backend_s_option_is_refused_with_its_owner(tmp_path):
    result = CliRunner().invoke(cli, ["night", "--quick", "--address", "head:6379", "--out", str(tmp_path / "n")])
    assert result.exit_code == 2
    assert "error: --address is an option of --backend ray, not local: add --backend ray or leave it out" in \
        result.output
    assert not (tmp_path / "n").exists()


@pytest.mark.slow
def test_a_backend_added_in_a_few_lines_runs_a_night(tmp_path):
    plugin = tmp_path / "notebook_plugin.py"
    plugin.write_text(TOY_PLUGIN)
    note, out = tmp_path / "note.txt", tmp_path / "night"
    sets = tiny_overrides("schedule.quick_timesteps={sac: 150, ppo: 128, a2c: 96}", "schedule.eval_days=2",
                          f"output.root={tmp_path / 'o'}")
    command = [sys.executable, str(plugin), "night", "--quick", "--agents", "a2c", "--out", str(out), "--device", "cpu",
               *[a for s in sets for a in ("--set", s)]]
    refused = subprocess.run([*command, "--backend", "notebook"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "--backend notebook needs --note FILE" in refused.stderr
    proc = subprocess.run([*command, "--backend", "notebook", "--note", str(note)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert note.read_text().splitlines() == ["baseline eval 0", "rbc eval 0", "optimum eval 0", "planner eval 0",
                                                 "a2c train 96"]
    schedule = json.loads((out / "schedule.json").read_text())
    assert [(s["name"], s["status"]) for s in schedule["stages"]] == [
        ("baseline", "done"), ("rbc", "done"), ("optimum", "done"), ("planner", "done"), ("a2c", "done"),
        ("report", "done")]
    assert json.loads((out / "results.json").read_text())["a2c"]["timesteps"] == 96
    assert (out / "report.md").is_file()
