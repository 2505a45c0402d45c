"""A stop signal is honoured within a step wherever the night is, and says only what is true."""

from __future__ import annotations

import signal

import pytest
from click.testing import CliRunner

from trainer.base.signals import STOP, Stopped, handle_stop_signals
from trainer.cli.main import cli
from trainer.env.citylearn import make_sb3_env, make_training_vec_env
from trainer.judge.metrics import run_episode
from trainer.night.calibrate import calibrate
from trainer.references.controllers import UncontrolledBaseline

from .conftest import tiny_overrides


@pytest.fixture(autouse=True)
def no_stop_left_over():
    yield
    STOP.signum, STOP.training, STOP.interrupting = None, False, None


def test_an_evaluation_stops_at_its_next_step(tiny_cfg, built_in):
    env = make_sb3_env(tiny_cfg, built_in, "eval", tiny_cfg.seed, eval_days=1)
    STOP.signum = signal.SIGTERM
    with pytest.raises(Stopped, match=r"^stopped by SIGTERM during an evaluation \(nothing to checkpoint there\)$"):
        run_episode(UncontrolledBaseline(), env)
    env.close()


def test_an_evaluation_inside_training_leaves_the_stop_to_the_training_loop(tiny_cfg, built_in):
    env = make_sb3_env(tiny_cfg, built_in, "eval", tiny_cfg.seed, eval_days=1)
    STOP.signum = signal.SIGINT
    with STOP.while_training():  # a learning-curve evaluation: the guard checkpoints, then stops
        metrics = run_episode(UncontrolledBaseline(), env)
    assert metrics["co2_kg"] > 0
    env.close()


def test_calibration_stops_before_measuring(tiny_cfg, built_in, tmp_path, monkeypatch):
    monkeypatch.setenv("PVBESS_CACHE", str(tmp_path))
    cfg = tiny_cfg.model_copy(update={"output": tiny_cfg.output.model_copy(update={"root": str(tmp_path)})})
    STOP.signum = signal.SIGINT
    with pytest.raises(Stopped, match="during calibration"):
        calibrate(cfg, built_in, "cpu", ["a2c"], refresh=True)
    assert not (tmp_path / "pvbess-trainer" / "calibration").exists()


def test_worker_start_up_is_interrupted_at_once(tiny_cfg, built_in, monkeypatch):
    started = []

    class SlowWorkers:  # a signal arrives while the workers are starting
        def __init__(self, factories):
            started.append(len(factories))
            signal.raise_signal(signal.SIGINT)
            raise AssertionError("the stop was not honoured during start-up")

    monkeypatch.setattr("stable_baselines3.common.vec_env.SubprocVecEnv", SlowWorkers)
    with handle_stop_signals(), pytest.raises(Stopped, match="during the start of the environment workers"):
        make_training_vec_env(tiny_cfg, built_in, tiny_cfg.seed, 2, subprocesses=True)
    assert started == [2]


def test_a_stop_during_the_first_evaluation_offers_no_resume(tmp_path, site_schema, monkeypatch):
    original = UncontrolledBaseline.act

    def act(self, obs, env):
        if env.time_step == 2:
            signal.raise_signal(signal.SIGINT)  # Ctrl+C during the baseline's evaluation
        return original(self, obs, env)

    monkeypatch.setattr(UncontrolledBaseline, "act", act)
    run = tmp_path / "run"
    args = ["train", "a2c", "--timesteps", "100", "--out", str(run), "--schema", str(site_schema), "--device", "cpu"]
    result = CliRunner().invoke(cli, [*args, *[a for o in tiny_overrides() for a in ("--set", o)]])
    assert result.exit_code == 130, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: stopped by SIGINT during an evaluation (nothing to checkpoint there)")
    assert "resume with" not in last
    assert not (run / "a2c").exists()
