"""`trainer tune`: its search spaces are settings the config takes, bad spaces and budgets are refused in one line
before any folder, and a tune survives a kill: resumed, it fails the trial it was in, searches on, re-runs the best
and the defaults on fresh seeds and writes a config `trainer night --config` takes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.config.loading import load_config
from trainer.tune import space as spaces

from .conftest import tiny_overrides

pytest.importorskip("optuna", reason="trainer tune needs the tune extra (pip install -e '.[tune]')")

TINY_TUNE = (*tiny_overrides(), "tune.trial_timesteps.ppo=2048", "tune.startup_trials=2", "tune.rerun_top=1",
             "tune.rerun_eval_days=2", "schedule.curve_every_steps=512", "ppo.n_steps=512")


def _sets(overrides) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


@pytest.mark.parametrize("agent", list(spaces.SPACES))
def test_every_search_space_is_settings_the_config_takes_and_holds_the_defaults(agent, default_cfg):
    params = spaces.space(agent)
    spaces.check_space(params, default_cfg)  # raises on a key or a value the config refuses
    own = spaces.defaults(default_cfg.to_dict(), params)
    for param in params:  # the defaults are the first trial: each inside its row
        value = own[param.key]
        assert value in param.choices if param.choices else param.low <= value <= param.high, param.key
    assert spaces.from_rows(spaces.to_rows(params)) == params


SPACE_FILES = [
    ("low above high", {"ppo.learning_rate": {"low": 1e-3, "high": 1e-5}},
     "ppo.learning_rate: low and high should be finite numbers with low < high; got low=0.001, high=1e-05"),
    ("log from zero", {"ppo.learning_rate": {"low": 0, "high": 1e-3, "log": True}}, "a log scale needs low > 0"),
    ("unknown key", {"ppo.learning_rat": {"low": 1e-5, "high": 1e-3}},
     "search space: ppo.learning_rat=1e-05 is not a setting this config takes"),
    ("a value the config refuses", {"ppo.clip_range": {"low": 0.1, "high": 2.0}},
     "search space: ppo.clip_range=2.0 is not a setting this config takes"),
    ("empty choices", {"ppo.net_arch": {"choices": []}}, "choices should be a non-empty list"),
    ("not a row", {"ppo.n_epochs": 5}, "ppo.n_epochs: expected {low: L, high: H}"),
    ("empty", {}, "the search space is empty"),
]


@pytest.mark.parametrize("case, space, message", SPACE_FILES, ids=[c[0] for c in SPACE_FILES])
def test_a_bad_search_space_is_refused_in_one_line_before_any_folder(case, space, message, tmp_path, week):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    out = tmp_path / "tune"
    result = CliRunner().invoke(cli, ["tune", "ppo", "--schema", str(week), "--out", str(out), "--trials", "2",
                                      "--space", str(path)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    ([], "trainer tune needs --budget, --finish-by or --trials"),
    (["--budget", "0s"], "--budget expects a duration"),
    (["--budget", "9000h"], "--budget expects a duration of at most 366 days"),
    (["--resume", "{tmp}"], "is not a tune folder (no tune.json)"),
], ids=["no budget", "zero budget", "a budget beyond a year", "resume a folder that is not a tune"])
def test_a_bad_budget_is_refused_in_one_line_before_any_folder(args, message, tmp_path, week):
    out = tmp_path / "tune"
    result = CliRunner().invoke(cli, ["tune", "ppo", *([] if "--resume" in args else ["--schema", str(week), "--out",
                                                                                      str(out)]),
                                      *[a.format(tmp=tmp_path) for a in args]])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
    assert not out.exists()


def _journal_trials_started(journal: Path) -> int:
    """Trials created in an Optuna journal file (one JSON line per operation; op_code 4: a trial created)."""
    if not journal.is_file():
        return 0
    count = 0
    for line in journal.read_text().splitlines():
        try:
            count += json.loads(line).get("op_code") == 4
        except ValueError:  # the line being written
            pass
    return count


@pytest.mark.slow
def test_a_tune_survives_a_kill_and_writes_a_config_a_night_takes(tmp_path, week):
    out = tmp_path / "tune"
    command = [sys.executable, "-m", "trainer", "tune", "ppo", "--schema", str(week), "--out", str(out), "--trials",
               "3", "--device", "cpu", *_sets(TINY_TUNE)]
    env = {**os.environ, "CITYLEARN_OFFLINE": "1"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 600
        while _journal_trials_started(out / "study.journal") < 2 and process.poll() is None:  # the second trial began
            assert time.monotonic() < deadline, "the tune never began its second trial"
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    resumed = CliRunner().invoke(cli, ["tune", "ppo", "--resume", str(out)])
    assert resumed.exit_code == 0, resumed.output

    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    journal = JournalStorage(JournalFileBackend(str(out / "study.journal")))
    study = optuna.load_study(study_name="tune-ppo", storage=journal)
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") + states.count("PRUNED") == 3  # the trial the kill stopped does not count
    assert states.count("FAIL") <= 1 and study.trials[0].user_attrs.get("defaults") is True
    reruns = json.loads((out / "reruns.json").read_text())
    assert "defaults" in reruns and all(len(r["runs"]) == 2 for r in reruns.values())  # tune.rerun_seeds fresh seeds
    for entry in reruns.values():
        for run in entry["runs"].values():
            assert 0 < run["co2_kg_per_year"] and run["ev_departure_soc_met_pct"] is not None
    report = (out / "report.md").read_text()
    assert "## Re-run on fresh seeds, judged on the part held out" in report and "| defaults | 2 |" in report
    assert "deployed step" in report
    assert (out / "history.png").stat().st_size > 0
    tuned = load_config([out / "best.yaml"])  # what trainer night --config takes
    chosen = yaml.safe_load((out / "best.yaml").read_text())
    assert tuned.ppo.learning_rate == chosen["ppo"]["learning_rate"]
    # A scored trial's folder keeps its curve and its log, not its models.
    trial = next((out / "trials").glob("0000-seed-*"))
    assert (trial / "ppo" / "eval_curve.csv").is_file() and not (trial / "ppo" / "checkpoints").exists()
