"""`trainer night --backend ray`: stages side by side on a local Ray, re-run from their checkpoints."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.config.loading import load_config
from trainer.night.budget import StageKind
from trainer.night.ray_cluster import RAY_VERSION, import_ray
from trainer.night.ray_runner import stage_resources
from trainer.run.schedule_file import StageRecord

from .conftest import built_in_config, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'pvbess-trainer[ray]')")


def test_resources_come_from_the_config_and_sac_reserves_its_replay_buffer():
    cfg = built_in_config("ray.num_gpus={sac: 0.5, ppo: 0, a2c: 0, eval: 0}", "sac.buffer_size=100000")
    sac = stage_resources(cfg, StageRecord("sac", StageKind.TRAIN), (48, 5))
    ppo = stage_resources(cfg, StageRecord("ppo", StageKind.TRAIN), (48, 5))
    rbc = stage_resources(cfg, StageRecord("rbc", StageKind.EVAL), (48, 5))
    assert (sac["num_gpus"], sac["num_cpus"], ppo["num_cpus"], rbc["num_cpus"]) == (0.5, 1.0, 2.0, 1.0)
    assert sac["memory"] == int(1e9 + 100_000 * (2 * 48 + 5 + 3) * 4)  # headroom + observations, actions, rewards…


def test_an_unknown_stage_in_the_ray_resources_is_a_config_error():
    from trainer.base.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown stage"):
        load_config(overrides=["ray.num_cpus={sac: 1, dqn: 2}"])


def test_without_ray_the_backend_says_how_to_install_it(monkeypatch):
    from trainer.base.errors import UsageError

    monkeypatch.setitem(sys.modules, "ray", None)
    expected = rf"--backend ray needs Ray {RAY_VERSION}: pip install 'pvbess-trainer\[ray\]'"
    with pytest.raises(UsageError, match=expected):
        import_ray()


def _night(out: Path, *extra: str) -> list[str]:
    # On CityLearn: its PPO stage runs for seconds, long enough to be stopped or killed mid-stage.
    sets = tiny_overrides("train.simulator=citylearn", "schedule.quick_timesteps={ppo: 1200}",
                          "schedule.quick_eval_days=1", "ppo.n_steps=100",
                          "ppo.batch_size=50", "ppo.checkpoint_freq_steps=100", "ray.num_cpus={ppo: 1, eval: 1}")
    return [sys.executable, "-m", "trainer", "night", "--backend", "ray", "--quick", "--agents", "ppo", "--out",
            str(out), "--device", "cpu", *extra, *[a for o in sets for a in ("--set", o)]]


ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}


def _start(tmp_path: Path, out: Path) -> tuple[subprocess.Popen, Path]:
    """The night on Ray in a subprocess, its console in a file, once its PPO stage has a checkpoint."""
    console = tmp_path / "console.txt"
    with open(console, "w") as sink:
        proc = subprocess.Popen(_night(out), cwd=ROOT, env=ENV, stdout=sink, stderr=subprocess.STDOUT)
    waited = 0.0  # wait for the event (a generous limit), not for a while
    while not (any((out / "ppo" / "checkpoints").glob("step_*/manifest.json")) and
               (out / "ppo" / "attempts.jsonl").is_file()) and proc.poll() is None and waited < 600:
        time.sleep(0.05)
        waited += 0.05
    return proc, console


def _log_events(out: Path, name: str) -> list[dict]:
    path = out / "logs" / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.slow
def test_a_killed_stage_runs_again_from_its_checkpoint_and_ctrl_c_then_lets_the_night_resume_locally(tmp_path):
    """One night on Ray (starting one costs half a minute of a 2-core machine, so both are seen in one): its PPO
    worker killed as on a lost node, the stage run again from its checkpoint; then Ctrl-C to the driver while that
    second attempt trains, every stage on Ray checkpointed, and the night resumed on the local backend."""
    out = tmp_path / "night"
    proc, console = _start(tmp_path, out)
    assert proc.poll() is None, "the night ended before its PPO stage saved a checkpoint"
    killed = json.loads((out / "ppo" / "attempts.jsonl").read_text().splitlines()[0])["pid"]
    os.kill(killed, signal.SIGKILL)  # its worker dies, as on a lost node
    waited = 0.0  # until the second attempt has gone on from a checkpoint (a generous limit, not a while)
    while not any(e["event"] == "resuming" for e in _log_events(out, "ppo")) and proc.poll() is None and waited < 600:
        time.sleep(0.05)
        waited += 0.05
    resumed = [e for e in _log_events(out, "ppo") if e["event"] == "resuming"]
    assert resumed and resumed[0]["step"] >= 100, console.read_text()[-3000:]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=600) == 130, console.read_text()[-3000:]
    last = console.read_text().strip().splitlines()[-1]
    # the references may still run beside ppo when the signal comes; ppo, the one training, saved its checkpoint
    saved = r"stopped by SIGINT: the stages running on Ray \((\w+, )*ppo\) saved their checkpoints"
    assert re.search(saved, last), last
    assert f"resume with: {sys.executable} -m trainer night --resume {out}" in last  # as it was started
    schedule = json.loads((out / "schedule.json").read_text())
    ppo = next(s for s in schedule["stages"] if s["name"] == "ppo")
    assert ppo["status"] == "running" and ppo["timesteps_done"] < 1200
    assert len(ppo["attempts"]) == 2 and ppo["attempts"][0]["pid"] == killed != ppo["attempts"][1]["pid"]
    resumed = subprocess.run([sys.executable, "-m", "trainer", "night", "--resume", str(out)], cwd=ROOT, env=ENV,
                             capture_output=True, text=True, timeout=600)  # on the local backend
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    schedule = json.loads((out / "schedule.json").read_text())
    assert [s["status"] for s in schedule["stages"]] == ["done"] * 6
    assert next(s for s in schedule["stages"] if s["name"] == "ppo")["timesteps_done"] == 1200
    results = json.loads((out / "results.json").read_text())
    assert list(results) == ["baseline", "rbc", "optimum", "planner", "ppo"] and (out / "report.md").is_file()
    # The resume measured the night's agent alone, not the config's whole roster.
    measured = [e["agents"] for e in _log_events(out, "trainer") if e["event"].startswith("calibrating")]
    assert measured and all(agents == ["ppo"] for agents in measured), measured
    assert {p.name for p in (out / "logs").iterdir()} >= {"trainer.jsonl", "ppo.jsonl", "baseline.jsonl"}


def test_a_cluster_without_the_auth_token_is_refused_with_the_fix(monkeypatch, tmp_path):
    from trainer.base.errors import UsageError
    from trainer.night.ray_cluster import _token_present

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(UsageError, match=r"copy ~/\.ray/auth_token from the head node, or set RAY_AUTH_TOKEN"):
        _token_present()
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("secret")
    _token_present()


def test_an_address_with_no_ray_head_is_one_line_in_the_doctor_and_the_night(tmp_path):
    from click.testing import CliRunner

    from trainer.cli.main import cli

    result = CliRunner().invoke(cli, ["doctor", "--backend", "ray", "--address", "127.0.0.1:9"])
    assert "FAIL  ray" in result.output and "--address 127.0.0.1:9: no Ray head answers there" in result.output
    night = CliRunner().invoke(cli, ["night", "--backend", "ray", "--address", "127.0.0.1:9", "--quick",
                                     "--out", str(tmp_path / "run")])
    assert night.exit_code == 2
    assert night.output.strip().splitlines()[-1].startswith("error: --address 127.0.0.1:9: no Ray head answers")
    assert not (tmp_path / "run").exists()


def test_the_sweep_summary_gives_mean_and_sd_per_agent():
    from trainer.night.sweep import SEEDS, summarise

    results = [{"baseline": {"co2_kg_per_year": 100.0, "co2_vs_baseline_pct": 0.0, "ev_departure_soc_met_pct": 100.0,
                             "cost": 10.0},
                "ppo": {"co2_kg_per_year": 80.0, "co2_vs_baseline_pct": -20.0, "ev_departure_soc_met_pct": 100.0,
                        "cost": 8.0}},
               {"baseline": {"co2_kg_per_year": 100.0, "co2_vs_baseline_pct": 0.0, "ev_departure_soc_met_pct": 100.0,
                             "cost": 10.0},
                "ppo": {"co2_kg_per_year": 90.0, "co2_vs_baseline_pct": -10.0, "ev_departure_soc_met_pct": 98.0,
                        "cost": 9.0}}]
    text = summarise(results, SEEDS.title(SEEDS.variants("1,2")))
    assert "| ppo | 2 | 85 ± 7 | -15.0 ± 7.1 | 99.0 ± 1.4 | 8 ± 1 |" in text
    assert "| baseline | 2 | 100 ± 0 |" in text and text.startswith("# Seed sweep: seeds 1, 2")


@pytest.mark.slow
def test_a_seed_sweep_makes_one_run_per_seed_and_ray_gives_a_seed_the_local_backend_s_results(tmp_path):
    """A local seed sweep: one run folder per seed and a summary. Then one of its seeds on Ray: the same results
    and, but for times, speeds and where each stage ran, the same schedule.json (one driver owns the stages' lives)."""
    # On CityLearn: a seed's site is read into the training simulator in two whole-year passes (~45 s), which is
    # not what either part checks. One environment on both backends, whatever this machine's cores.
    sets = tiny_overrides("schedule.quick_timesteps={a2c: 300}", "schedule.quick_eval_days=1", "a2c.n_steps=100",
                          "a2c.n_envs=1", "train.simulator=citylearn", "ray.num_cpus={a2c: 1, eval: 1}")
    args = ["--quick", "--agents", "a2c", "--device", "cpu", *[a for o in sets for a in ("--set", o)]]
    from click.testing import CliRunner

    from trainer.cli.main import cli

    out = tmp_path / "sweep"
    result = CliRunner().invoke(cli, ["night", "--seeds", "3,4", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["seed-3", "seed-4", "sweep.json", "sweep.md"]
    assert json.loads((out / "sweep.json").read_text())["seeds"] == [3, 4]
    for seed in (3, 4):
        run = out / f"seed-{seed}"
        assert list(json.loads((run / "results.json").read_text())) == ["baseline", "rbc", "optimum", "planner", "a2c"]
        assert "seed: " + str(seed) in (run / "config.yaml").read_text()
    assert "| a2c | 2 |" in (out / "sweep.md").read_text()

    on_ray = tmp_path / "ray"
    proc = subprocess.run([sys.executable, "-m", "trainer", "night", "--backend", "ray", "--seed", "3", "--out",
                           str(on_ray), *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, schedules = {}, {}
    for backend, run in (("local", out / "seed-3"), ("ray", on_ray)):
        results[backend] = json.loads((run / "results.json").read_text())
        schedules[backend] = [{**{k: s[k] for k in ("name", "kind", "status", "timesteps_target", "timesteps_done",
                                                    "error")},
                               "results": {k: v for k, v in (s["results"] or {}).items() if k != "steps_per_s"}}
                              for s in json.loads((run / "schedule.json").read_text())["stages"]]
    assert list(results["local"]) == list(results["ray"]) == ["baseline", "rbc", "optimum", "planner", "a2c"]
    assert {k: v["co2_kg"] for k, v in results["local"].items()} == {k: v["co2_kg"] for k, v in results["ray"].items()}
    assert schedules["local"] == schedules["ray"]
    assert [s["status"] for s in schedules["ray"]] == ["done"] * 6


def test_a_stage_needing_more_memory_than_the_cluster_is_refused(tmp_path):
    from click.testing import CliRunner

    from trainer.cli.main import cli

    result = CliRunner().invoke(cli, ["night", "--quick", "--agents", "ppo", "--backend", "ray", "--set",
                                      "ray.memory_headroom_gb=100000", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: stage baseline needs 100,000.0 GB of memory (ray.memory_headroom_gb) but the Ray "
                           "cluster has ") and "lower ray.memory_headroom_gb" in line


@pytest.fixture(scope="module")
def local_ray():
    """One small local Ray for the fast tests: 2 CPUs and a logical GPU, to place fractions without one.
    It lives until the module ends: tests that start their own Ray (a night) come before the first use."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, object_store_memory=80 * 2**20,
             log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _meet(marker: str, other: str, limit_s: float) -> dict:
    """A stub stage: says it started, then waits (a generous limit) for the other to have started too."""
    import ray as node_ray

    from trainer.night.ray_runner import stage_device

    Path(marker).touch()
    waited = 0.0
    while not Path(other).exists() and waited < limit_s:
        time.sleep(0.05)
        waited += 0.05
    assigned = node_ray.get_runtime_context().get_assigned_resources()
    return {"met": Path(other).exists(), "device": stage_device(assigned)}


def test_two_half_gpu_stages_run_at_once_and_a_no_gpu_stage_is_told_cpu(local_ray, tmp_path):
    cfg = built_in_config("ray.num_gpus={sac: 0.5, ppo: 0, a2c: 0, eval: 0}")
    half = {k: v for k, v in stage_resources(cfg, StageRecord("sac", StageKind.TRAIN), (48, 5)).items()
            if k != "memory"}
    task = local_ray.remote(_meet)
    a, b = tmp_path / "a", tmp_path / "b"
    both = local_ray.get([task.options(**half).remote(str(a), str(b), 300),
                          task.options(**half).remote(str(b), str(a), 300)])
    assert [r["met"] for r in both] == [True, True]  # each saw the other running: they overlapped
    assert [r["device"] for r in both] == ["cuda", "cuda"]
    cpu_only = local_ray.get(task.options(num_cpus=1, num_gpus=0).remote(str(tmp_path / "c"), str(a), 300))
    assert cpu_only["device"] == "cpu"  # no GPU given: the stage trains on the CPU


def test_the_cluster_preflight_probes_each_node(local_ray, tmp_path, monkeypatch):
    """The same checks as for --address, against a local Ray: versions, the config, the shared run folder."""
    import trainer.night.ray_cluster as ray_cluster
    from trainer.base.errors import UsageError

    ray_cluster.preflight(local_ray, tmp_path)  # this node sees the folder and loads the config
    assert not list(tmp_path.glob(".ray-probe-*"))  # the probe file is cleaned up
    monkeypatch.setattr(ray_cluster, "RAY_VERSION", "0.0.0")  # as if the driver ran another Ray than the node
    with pytest.raises(UsageError, match=r"has Ray 2\.60\.0 and Python .*: install the same venv there"):
        ray_cluster.preflight(local_ray, tmp_path)


def test_the_plan_shows_which_stages_run_side_by_side(tmp_path):
    from datetime import datetime
    from types import SimpleNamespace

    from trainer.night.budget import StageSpec
    from trainer.night.ray_runner import Night, lanes
    from trainer.run.folder import RunDir
    from trainer.run.schedule_file import ScheduleState

    cfg = built_in_config("ray.num_cpus={sac: 1, ppo: 2, a2c: 2, eval: 1}",
                          "ray.num_gpus={sac: 0.5, ppo: 0, a2c: 0, eval: 0}")
    now = datetime(2026, 11, 23, 22, 0)
    specs = {"baseline": StageSpec("baseline", StageKind.EVAL, 10), "rbc": StageSpec("rbc", StageKind.EVAL, 10),
             "sac": StageSpec("sac", StageKind.TRAIN, 10, 1, 900, 10.0),  # 90 s of training + 10 s evaluation
             "ppo": StageSpec("ppo", StageKind.TRAIN, 10, 1, 400, 10.0), "report": StageSpec("report",
                                                                                            StageKind.REPORT, 5)}

    def night(name: str, stages: list[str]) -> Night:
        state = ScheduleState.new(tmp_path / f"{name}.json", [(s, specs[s].kind, specs[s].target_steps)
                                                             for s in stages], now, None)
        return Night(SimpleNamespace(cfg=cfg, run=RunDir(tmp_path / name)), state, specs)

    placed = lanes([night("one", ["baseline", "rbc", "sac", "ppo", "report"])], (48, 5), cpus=2, gpus=1, now=now)
    seconds = {name: ((start - now).seconds, (end - now).seconds) for _, name, start, end in placed}
    # Two CPUs: both references at once, SAC when one is free, PPO (2 CPUs) once SAC has finished.
    assert seconds == {"baseline": (0, 10), "rbc": (0, 10), "sac": (10, 110), "ppo": (110, 160)}
    two = lanes([night("a", ["sac"]), night("b", ["sac"])], (48, 5), cpus=2, gpus=1, now=now)
    assert [(start - now).seconds for *_, start, _ in two] == [0, 0]  # two 0.5-GPU stages share the card


@pytest.mark.parametrize("setting, message", [
    ("ray.num_cpus.sac=1000", "error: ray.num_cpus.sac=1000 asks for more than this machine has ({cpus}); Ray would "
                              "never start that stage: set ray.num_cpus.sac to at most {cpus}"),
    ("ray.num_gpus.ppo=3", "error: ray.num_gpus.ppo=3 asks for more than this machine has ({gpus}); Ray would never "
                           "start that stage: set ray.num_gpus.ppo to at most {gpus}"),
])
def test_a_stage_no_machine_could_run_is_refused_before_any_folder(setting, message, tmp_path):
    from click.testing import CliRunner

    from trainer.cli.main import cli
    from trainer.night.ray_cluster import _local_gpus
    from trainer.run.device import cpu_cores

    result = CliRunner().invoke(cli, ["night", "--quick", "--backend", "ray", "--set", setting, "--out",
                                      str(tmp_path / "run")])
    assert result.exit_code == 2
    assert result.output.strip() == message.format(cpus=f"{cpu_cores():g}", gpus=f"{_local_gpus():g}")
    assert not (tmp_path / "run").exists()



@pytest.mark.slow
def test_a_tune_on_ray_scores_its_trials_as_the_local_tune_does(tmp_path, week):
    """Two trials side by side on Ray, reporting into the study's journal from their workers: the same settings and
    the same scores as one after another in this process, and the same answer."""
    from .test_tune import TINY_TUNE

    # Two of PPO's rollouts a trial, not four: what is compared is where each trial runs, not how long it learns.
    sets = [a for o in (*TINY_TUNE, "ray.num_cpus={ppo: 1, eval: 1}", "tune.rerun_seeds=2",
                        "tune.trial_timesteps.ppo=1024") for a in ("--set", o)]
    from click.testing import CliRunner

    from trainer.cli.main import cli

    found = {}
    for backend in ("local", "ray"):
        out = tmp_path / backend
        args = ["tune", "ppo", "--backend", backend, "--schema", str(week), "--trials", "2", "--out", str(out),
                "--device", "cpu", *sets]
        if backend == "local":  # in this process, whose imports are paid
            result = CliRunner().invoke(cli, args)
            assert result.exit_code == 0, result.output
        else:
            proc = subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, env=ENV, capture_output=True,
                                  text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        study = optuna.load_study(study_name="tune-ppo",
                                  storage=JournalStorage(JournalFileBackend(str(out / "study.journal"))))
        found[backend] = [(t.number, t.state.name, t.params, t.value) for t in study.trials]
        assert (out / "best.yaml").is_file() and (out / "report.md").is_file()
    # The same trials and settings; scores a few float roundings apart at most (a worker imitates under its own
    # torch threads, where one process reuses an imitation made under others: trainer.learn.warm_start.saved).
    assert [t[:3] for t in found["local"]] == [t[:3] for t in found["ray"]]
    assert all(abs(a[3] - b[3]) <= 0.01 * a[3] for a, b in zip(found["local"], found["ray"]))
    assert [state for _, state, _, _ in found["ray"]] == ["COMPLETE", "COMPLETE"]
    assert (tmp_path / "ray" / "logs" / "trial-0001.jsonl").is_file()  # the trial ran in a Ray worker
