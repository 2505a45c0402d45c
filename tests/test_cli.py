"""The CLI's exit codes and one-line messages (CliRunner)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainer.cli.main import cli


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_help_lists_every_command():
    result = run("--help")
    assert result.exit_code == 0
    for command in ("config", "scenario", "baseline", "train", "schedule", "evaluate"):
        assert command in result.output


def test_unknown_config_key_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    result = run("train", "ppo", "--out", str(out), "--set", "ppo.n_step=10")
    assert result.exit_code == 2
    assert result.output.strip() == "error: unknown config key 'ppo.n_step': did you mean 'ppo.n_steps'?"
    assert not out.exists()


def test_missing_schema_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    missing = tmp_path / "nowhere" / "schema.json"
    result = run("train", "ppo", "--out", str(out), "--schema", str(missing))
    assert result.exit_code == 2
    assert (
        result.output.strip()
        == f"error: CityLearn schema not found: {missing} (pass the path of a dataset's schema.json)"
    )
    assert not out.exists()


def test_unknown_dataset_explains_how_to_make_it_available(tmp_path, monkeypatch):
    monkeypatch.setenv("CITYLEARN_LOCAL_DATASETS_PATH", str(tmp_path))
    result = run("baseline", "--dataset", "no_such_dataset", "--out", str(tmp_path / "run"))
    assert result.exit_code == 2
    assert "CityLearn dataset 'no_such_dataset' is not available offline" in result.output
    assert "or pass --schema PATH" in result.output


def test_timesteps_and_episodes_together_exit_2(tmp_path):
    result = run("train", "sac", "--timesteps", "10", "--episodes", "1", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert result.output.strip() == "error: pass either --timesteps or --episodes, not both"


def test_bad_agent_is_a_usage_error():
    result = run("train", "dqn")
    assert result.exit_code == 2
    assert "'dqn' is not one of 'sac', 'ppo', 'a2c'" in result.output


def test_cuda_without_a_gpu_exits_2(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run("train", "ppo", "--device", "cuda", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "--device cuda was requested but torch sees no CUDA device" in result.output


def test_config_show_prints_the_resolved_yaml():
    result = run("config", "show", "--set", "sac.batch_size=128")
    assert result.exit_code == 0
    assert "batch_size: 128" in result.output


def test_config_show_doc_explains_each_key():
    result = run("config", "show", "--doc")
    assert result.exit_code == 0
    line = next(row for row in result.output.splitlines() if row.startswith("sac.batch_size "))
    assert "Minibatch size of each gradient step." in line and "[int (>=1)]" in line


def test_yaml_error_exits_2_with_position(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sac: {batch_size: 4\n")
    result = run("config", "show", "--config", str(bad))
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {bad}:2:1: YAML syntax error")


def test_scenario_build_writes_a_dataset(tmp_path):
    result = run("scenario", "build", "--out", str(tmp_path / "site"))
    assert result.exit_code == 0
    schema = json.loads((tmp_path / "site" / "schema.json").read_text())
    assert schema["central_agent"] is True
    assert set(schema["buildings"]["Building_1"]["chargers"]) == {f"charger_1_{i}" for i in range(1, 5)}


def test_evaluate_refuses_a_folder_that_is_not_a_run(tmp_path):
    result = run("evaluate", str(tmp_path))
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: not a run folder: {tmp_path} has no config.yaml (pass a folder made by trainer train or night)"
    )


def test_config_doc_shows_the_allowed_values_and_the_current_value():
    result = run("config", "show", "--doc", "--set", "gpu.device=cpu")
    lines = {row.split()[0]: row for row in result.output.splitlines()}
    assert lines["gpu.device"].endswith('[one of auto|cpu|cuda]  = "cpu"')
    assert lines["schedule.budget"].endswith("[str or null]  = null")
    assert lines["schedule.agents"].endswith('[list of sac|ppo|a2c]  = ["sac", "ppo", "a2c"]')
    assert "Literal" not in result.output and "Union" not in result.output


def test_the_console_script_puts_click_s_usage_errors_in_the_product_s_one_line_form():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "trainer", "train", "banana"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["error: Invalid value for '{sac|ppo|a2c}': 'banana' is not one of 'sac', "
                                        "'ppo', 'a2c'. (trainer train -h for help)"]
    assert subprocess.run([sys.executable, "-m", "trainer", "--version"], capture_output=True, timeout=120
                          ).returncode == 0


def test_hints_name_the_program_as_it_was_started(monkeypatch, tmp_path):
    import shutil
    import sys

    from trainer.cli.options import invoked

    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "trainer").write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # the launchers never activate the venv
    monkeypatch.setattr(sys, "argv", [str(venv / "trainer"), "night"])
    assert invoked() == ".venv/bin/trainer"  # pasteable from where the user stands
    monkeypatch.setattr(shutil, "which", lambda name: str(venv / "trainer"))
    assert invoked() == "trainer"  # on the PATH as itself
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "src" / "trainer" / "__main__.py")])
    assert invoked().endswith(" -m trainer")
