"""Any CityLearn dataset works through --schema/--dataset: the official 2022 one (17 buildings)."""

from __future__ import annotations

import json
import math

from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.env.citylearn import make_sb3_env
from trainer.judge.metrics import run_episode
from trainer.references.controllers import RuleBasedController
from trainer.site import Site

from .conftest import OFFICIAL, tiny_overrides, variant


def test_train_ppo_on_the_official_dataset(tmp_path, official_schema):
    # Its 17 buildings and files over one week: the training simulator reads a whole period through CityLearn
    # first (a year of this dataset: a minute and a half on 2 cores).
    week = variant(official_schema, tmp_path / "week", steps=7 * 24)
    out = tmp_path / "official"
    sets = [a for o in tiny_overrides("schedule.eval_days=1") for a in ("--set", o)]
    result = CliRunner().invoke(cli, ["train", "ppo", "--timesteps", "128", "--schema", str(week),
                                      "--out", str(out), "--device", "cpu", *sets])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"baseline", "ppo"}
    assert math.isfinite(results["ppo"]["co2_kg"]) and results["ppo"]["timesteps"] == 128
    assert results["baseline"]["ev_departure_soc_met_pct"] is None  # no EV chargers in this dataset
    assert not (out / "site").exists()  # the given dataset is used, not the built-in site


def test_dataset_by_name(tmp_path, official_schema, monkeypatch):
    monkeypatch.setenv("CITYLEARN_LOCAL_DATASETS_PATH", str(official_schema.parent.parent))
    sets = [a for o in ("schedule.eval_days=1",) for a in ("--set", o)]
    result = CliRunner().invoke(cli, ["baseline", "--dataset", OFFICIAL, "--out", str(tmp_path / "b"), *sets])
    assert result.exit_code == 0, result.output
    assert set(json.loads((tmp_path / "b" / "results.json").read_text())) == {"baseline", "rbc", "optimum", "planner"}
    found = next(line for line in result.output.splitlines() if "dataset found by name" in line)
    # Which copy was read: the folder the variable names, or CityLearn's cache where an earlier run put one first.
    assert "source=" in found and (str(official_schema.parent.parent) in found or "CityLearn's cache" in found)


def test_rbc_acts_on_every_building(official_schema, default_cfg):
    env = make_sb3_env(default_cfg, Site.load(official_schema), "eval", seed=0, eval_days=2)
    metrics = run_episode(RuleBasedController(), env)
    assert metrics["eval_timesteps"] == 47
    assert math.isfinite(metrics["co2_kg"])
