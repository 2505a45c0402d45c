"""What a night survives: kills, signals, corrupt checkpoints, changed configs, a second
trainer, out-of-memory, non-finite losses and a failing disk. Faults are injected at a
chosen step, never waited for.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.learn.checkpoint_store import CheckpointStore
from trainer.learn.memory import is_out_of_memory
from trainer.run.lock import RunLock

from .conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


def sets(*overrides: str) -> list[str]:
    return [a for o in tiny_overrides("schedule.eval_days=1", *overrides) for a in ("--set", o)]


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "logs" / "trainer.jsonl").read_text().splitlines()]


def run_cli(*args: str):
    return CliRunner().invoke(cli, list(args))


# ------------------------------------------------------------------ processes

FAULT = textwrap.dedent("""
    import os, signal, sys
    from trainer.learn import callbacks
    step, signals = int(os.environ["FAULT_STEP"]), [getattr(signal, s) for s in os.environ["FAULT_SIGNALS"].split(",")]
    original = callbacks.ProgressCallback._on_step
    fired = []
    def on_step(self):
        # The first step at or past the fault's: parallel environments advance several at a time.
        if self.num_timesteps >= step and not fired:
            fired.append(self.num_timesteps)
            import json, psutil
            with open(os.environ["FAULT_CHILDREN"], "w") as out:  # the environment workers, for the test
                json.dump([p.pid for p in psutil.Process().children(recursive=True)], out)
            for s in signals:
                os.kill(os.getpid(), s)
        return original(self)
    callbacks.ProgressCallback._on_step = on_step
    from trainer.cli.main import main
    sys.argv[0] = "trainer"
    main()
""")


def trainer_with_fault(step: int, signals: str, *args: str) -> subprocess.CompletedProcess:
    children = Path(args[args.index("--out") + 1]).parent / f"children-{step}.json"
    env = {**os.environ, "FAULT_STEP": str(step), "FAULT_SIGNALS": signals, "PYTHONUNBUFFERED": "1",
           "FAULT_CHILDREN": str(children)}
    proc = subprocess.run(
        [sys.executable, "-c", FAULT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    proc.children = json.loads(children.read_text())  # type: ignore[attr-defined]
    return proc


def assert_no_worker_left(pids: list[int]) -> None:
    """Every child the trainer had at the fault exits: closed by the trainer, or on its pipe's EOF."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=60)  # a bound on waiting for exits, not a delay
    assert not alive, [p.pid for p in alive]


def trainer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_sigkill_then_resume_redoes_at_most_1000_steps(tmp_path, site_schema):
    run = tmp_path / "killed"
    common = ["train", "a2c", "--timesteps", "2600", "--out", str(run), "--schema", str(site_schema), "--device", "cpu",
              *sets("a2c.checkpoint_freq_steps=1000", "train.simulator=citylearn")]  # workers to clean up
    killed = trainer_with_fault(1800, "SIGKILL", *common)
    assert killed.returncode == -signal.SIGKILL
    assert len(killed.children) >= 2  # A2C's parallel environments ran in workers
    assert_no_worker_left(killed.children)
    saved = [e["step"] for e in events(run) if e["event"] == "checkpoint saved"]
    assert saved == [1000]
    resumed = trainer("train", "a2c", "--resume", str(run), "--device", "cpu")  # the stale lock must not block
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    resume = next(e for e in events(run) if e["event"] == "resuming")
    assert 1800 - resume["step"] <= 1000
    results = json.loads((run / "results.json").read_text())
    assert results["a2c"]["timesteps"] == 2600
    assert (run / "a2c" / "progress.before-0000001000.csv").is_file()  # the curve before the kill is kept


KILLED_AFTER_AN_IMITATION = textwrap.dedent("""
    import os, signal, sys
    from trainer.learn.warm_start import saved as saved_imitations
    original = saved_imitations.SavedImitations.save
    def save(self, key, weights, errors):
        original(self, key, weights, errors)
        os.kill(os.getpid(), signal.SIGKILL)  # the first imitation kept, the process dies with no word
    saved_imitations.SavedImitations.save = save
    from trainer.cli.main import main
    sys.argv[0] = "trainer"
    main()
""")


@pytest.mark.slow
def test_a_run_killed_in_its_warm_start_imitates_only_what_it_had_not_kept(tmp_path, site_schema):
    from .conftest import variant

    week = variant(site_schema, tmp_path / "week", steps=168)  # its optimum and demonstrations take a second
    run = tmp_path / "killed"
    command = ["train", "sac", "--timesteps", "100", "--out", str(run), "--schema", str(week), "--device",
               "cpu", *sets("warm_start.epochs=3", "warm_start.ensemble=3", "warm_start.student_epochs=3",
                            "warm_start.ensemble_min_steps=0")]  # the ensemble, however short the run
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_AN_IMITATION, *command], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert len(list((run / "imitations").glob("*.pt"))) == 1
    again = trainer("train", "sac", "--resume", str(run), "--device", "cpu")  # the dead process's lock must not block
    assert again.returncode == 0, again.stderr[-2000:]
    members = [e for e in events(run) if e["event"] == "warm start: ensemble member imitated"]
    # The killed run died before it logged its first member: the log holds the second run's alone.
    assert [(e["member"], e["reused"]) for e in members] == [("1/3", True), ("2/3", False), ("3/3", False)]
    assert len(list((run / "imitations").glob("*.pt"))) == 4  # three members and the student


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path, site_schema):
    run = tmp_path / "stopped"
    proc = trainer_with_fault(700, "SIGTERM", "train", "a2c", "--timesteps", "2000", "--out", str(run),
                              "--schema", str(site_schema), "--device", "cpu", *sets())
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert_no_worker_left(proc.children)
    last = proc.stderr.strip().splitlines()[-1]
    # A2C's 8-step rollout (all environments together) that began at step 696 is not consistent
    # until its update: the checkpoint is the boundary before it, and the resume redoes those steps.
    assert last.startswith("error: stopped by SIGTERM: checkpoint at step 696 in ")
    assert f"resume with: trainer train a2c --resume {run}" in last
    checkpoint = run / "a2c" / "checkpoints" / "step_0000000696"
    assert (checkpoint / "manifest.json").is_file()
    assert not (run / "a2c" / "model.zip").exists()  # the stage did not pretend to finish


@pytest.mark.slow
def test_second_ctrl_c_aborts_at_once(tmp_path, site_schema):
    run = tmp_path / "aborted"
    proc = trainer_with_fault(300, "SIGINT,SIGINT", "train", "a2c", "--timesteps", "2000", "--out", str(run),
                              "--schema", str(site_schema), "--device", "cpu", *sets())
    assert proc.returncode == 130
    assert proc.stderr.strip().splitlines()[-1].startswith("error: interrupted")
    assert not (run / "a2c" / "checkpoints" / "step_0000000300").exists()


# ------------------------------------------------------------------ checkpoints


def _tiny_model():
    from stable_baselines3 import A2C

    return A2C("MlpPolicy", "Pendulum-v1", seed=0, device="cpu", policy_kwargs={"net_arch": [8]})


def test_truncated_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    model = _tiny_model()
    store = CheckpointStore(tmp_path / "ck", keep=3)
    for step in (100, 200, 300):
        store.save(model, {"step": step}, {"python": None}, with_replay_buffer=False)
    newest = tmp_path / "ck" / "step_0000000300" / "model.zip"
    newest.write_bytes(newest.read_bytes()[:100])
    middle = tmp_path / "ck" / "step_0000000200" / "state.json"
    assert store.latest().step == 200
    middle.write_text('{"step": 200, "tampered": true}')
    assert store.latest().step == 100
    assert store.failures == 0


def test_pruning_keeps_the_newest_complete_checkpoints(tmp_path):
    store = CheckpointStore(tmp_path / "ck", keep=2)
    model = _tiny_model()
    for step in (1, 2, 3, 4):
        store.save(model, {"step": step}, {}, with_replay_buffer=False)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step_0000000003", "step_0000000004"]


def test_failing_disk_keeps_earlier_checkpoints_and_training_goes_on(tmp_path, site_schema, monkeypatch):
    import trainer.learn.checkpoint_store as checkpoint_module

    run = tmp_path / "disk"
    original = checkpoint_module.write_bytes_atomic
    calls = {"n": 0}

    def read_only_after_first(path, data):
        # Root ignores chmod, so a read-only folder is simulated where the tests run as root.
        if "step_0000000100" not in str(path) and os.geteuid() == 0:
            raise OSError(30, "Read-only file system", str(path))
        calls["n"] += 1
        return original(path, data)

    monkeypatch.setattr(checkpoint_module, "write_bytes_atomic", read_only_after_first)
    if os.geteuid() != 0:
        # A real read-only folder: the first checkpoint is written, then the folder is locked.
        def lock_after_first(path, data):
            result = original(path, data)
            if path.name == "manifest.json":
                os.chmod(path.parent.parent, 0o555)
            return result

        monkeypatch.setattr(checkpoint_module, "write_bytes_atomic", lock_after_first)
    result = run_cli(
        "train",
        "a2c",
        "--timesteps",
        "400",
        "--out",
        str(run),
        "--schema",
        str(site_schema),
        "--device",
        "cpu",
        *sets("a2c.checkpoint_freq_steps=100", "a2c.n_steps=10"),
    )  # rollouts end on 100s
    os.chmod(run / "a2c" / "checkpoints", 0o755)
    assert result.exit_code == 0, result.output
    metrics = json.loads((run / "results.json").read_text())["a2c"]
    assert metrics["timesteps"] == 400
    assert metrics["checkpoint_write_failures"] == 3  # steps 200, 300 and the final 400
    assert sorted(p.name for p in (run / "a2c" / "checkpoints").iterdir()) == ["step_0000000100"]
    failure = next(e for e in events(run) if e["event"] == "checkpoint write failed")
    assert failure["free_bytes"] > 0 and "step_0000000200" in failure["path"]


# ------------------------------------------------------------------ config and lock


def test_changed_config_is_refused_with_the_keys_named_unless_forced(tmp_path, site_schema):
    run = tmp_path / "changed"
    args = ["train", "a2c", "--timesteps", "200", "--out", str(run), "--schema", str(site_schema), "--device", "cpu"]
    assert run_cli(*args, *sets("a2c.checkpoint_freq_steps=100")).exit_code == 0
    config_before = (run / "config.yaml").read_text()
    refused = run_cli("train", "a2c", "--resume", str(run), "--set", "a2c.learning_rate=0.001")
    assert refused.exit_code == 2
    assert (run / "config.yaml").read_text() == config_before  # refused before anything is written
    from trainer.config.loading import load_config

    default = load_config().a2c.learning_rate
    assert refused.output.strip() == (
        f"error: the config changed since the checkpoint at step 200: a2c.learning_rate ({default} -> 0.001); "
        "resume with the same config, or pass --force to resume with the new one"
    )
    forced = run_cli("train", "a2c", "--resume", str(run), "--force", "--set", "a2c.learning_rate=0.001")
    assert forced.exit_code == 0, forced.output


def test_a_resumed_night_may_refit_the_warm_start_s_ensemble_but_not_its_imitation():
    from trainer.config.loading import load_config
    from trainer.learn.preflight import training_view

    # A stage resumes from its checkpoint, never from its warm start: the ensemble a resumed night fits to the time
    # left (trainer.night.plan.fit_ensemble) is not a change to it; what its fine-tuning keeps near still is.
    before = load_config().to_dict()
    assert training_view(load_config(overrides=["warm_start.ensemble=1"]).to_dict(), "sac") == \
        training_view(before, "sac")
    # Nor is the pick among the ensemble's members or its student's epochs, nor their absence from a checkpoint
    # written before they existed.
    older = load_config().to_dict()
    del older["warm_start"]["pick_best"], older["warm_start"]["student_epochs"]
    del older["warm_start"]["student_critic_epochs"], older["warm_start"]["student_decay"]
    assert training_view(older, "sac") == training_view(load_config(overrides=[
        "warm_start.pick_best=false", "warm_start.student_epochs=400", "warm_start.student_critic_epochs=2400",
        "warm_start.student_decay=true"])
        .to_dict(), "sac") == training_view(before, "sac")
    assert training_view(load_config(overrides=["warm_start.sac_bc_alpha=0.5"]).to_dict(), "sac") != \
        training_view(before, "sac")


def test_a_second_trainer_on_the_same_run_is_refused(tmp_path, site_schema):
    run = tmp_path / "busy"
    run.mkdir()
    lock = RunLock(run).acquire()
    try:
        result = run_cli("train", "a2c", "--timesteps", "50", "--out", str(run), "--schema", str(site_schema))
    finally:
        lock.release()
    assert result.exit_code == 1
    assert f"run folder {run} is in use by PID {os.getpid()} on host {socket.gethostname()}" in result.output


# ------------------------------------------------------------------ out of memory


@pytest.mark.parametrize(
    "exc, expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (MemoryError(), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: "
                "can't allocate memory: you tried to allocate 8 GB"
            ),
            True,
        ),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_out_of_memory_is_classified(exc, expected):
    assert is_out_of_memory(exc) is expected


def test_numpy_allocation_failure_is_out_of_memory():
    with pytest.raises(MemoryError) as info:
        np.empty(2**43, dtype=np.uint8)  # 8 TiB
    assert is_out_of_memory(info.value)


def _sac_train_raising(monkeypatch, exc_factory, times: int):
    """Fail SAC's update itself, which runs inside the environment step when learning while stepping."""
    from trainer.learn.fast_sac import FastSAC

    original = FastSAC._train_now
    state = {"left": times}

    def train(self, gradient_steps, batch_size):
        if self.num_timesteps >= 120 and state["left"] > 0:
            state["left"] -= 1
            raise exc_factory(batch_size)
        return original(self, gradient_steps, batch_size)

    monkeypatch.setattr(FastSAC, "_train_now", train)


def test_injected_oom_backs_off_and_finishes(tmp_path, site_schema, monkeypatch):
    _sac_train_raising(monkeypatch, lambda b: torch.OutOfMemoryError(f"CUDA out of memory (batch {b})"), times=1)
    run = tmp_path / "oom"
    result = run_cli("train", "sac", "--timesteps", "200", "--out", str(run), "--schema", str(site_schema),
                     "--device", "cpu", *sets("sac.checkpoint_freq_steps=100", "sac.batch_size=64"))
    assert result.exit_code == 0, result.output
    backoff = next(e for e in events(run) if e["event"] == "out of memory: batch size backed off")
    assert (backoff["old"], backoff["new"], backoff["device"], backoff["step"]) == (64, 32, "cpu", 120)
    assert backoff["host_available_bytes"] > 0
    metrics = json.loads((run / "results.json").read_text())["sac"]
    assert (metrics["oom_backoffs"], metrics["final_batch_size"], metrics["timesteps"]) == (1, 32, 200)
    state = json.loads((run / "sac" / "checkpoints" / "step_0000000200" / "state.json").read_text())
    assert state["batch_size"] == 32  # a resume keeps the reduced size


def _real_cuda_oom(batch_size: int) -> BaseException:
    """The error CUDA's own allocator raises when asked for twice the card: its type and message, not ours."""
    try:
        torch.empty(2 * torch.cuda.get_device_properties(0).total_memory, dtype=torch.uint8, device="cuda")
    except Exception as exc:  # noqa: BLE001 - whatever torch raises is what the trainer must recognise
        return exc
    raise AssertionError("allocating twice the GPU's memory succeeded")


@pytest.mark.gpu
def test_a_real_cuda_oom_backs_off_and_finishes_on_the_gpu(tmp_path, site_schema, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _sac_train_raising(monkeypatch, _real_cuda_oom, times=1)
    run = tmp_path / "cuda-oom"
    result = run_cli("train", "sac", "--timesteps", "200", "--out", str(run), "--schema", str(site_schema),
                     "--device", "cuda", *sets("sac.checkpoint_freq_steps=100", "sac.batch_size=64"))
    assert result.exit_code == 0, result.output
    backoff = next(e for e in events(run) if e["event"] == "out of memory: batch size backed off")
    assert (backoff["old"], backoff["new"], backoff["device"]) == (64, 32, "cuda")
    assert 0 < backoff["gpu_free_bytes"] <= backoff["gpu_total_bytes"]  # read once the failed step was given back
    assert json.loads((run / "results.json").read_text())["sac"]["final_batch_size"] == 32


def test_oom_below_the_floor_stops_with_the_checkpoint_intact(tmp_path, site_schema, monkeypatch):
    _sac_train_raising(monkeypatch, lambda b: RuntimeError("CUDA out of memory"), times=99)
    run = tmp_path / "floor"
    result = run_cli("train", "sac", "--timesteps", "200", "--out", str(run), "--schema", str(site_schema),
                     "--device", "cpu", *sets("sac.checkpoint_freq_steps=100", "sac.batch_size=64"))
    assert result.exit_code == 1
    message = result.output.strip().splitlines()[-1]
    assert "out of memory with batch_size=16 on cpu" in message
    assert "below reliability.min_batch_size=16" in message
    assert f"the last checkpoint is intact at {run / 'sac' / 'checkpoints' / 'step_0000000100'}" in message
    assert f"resume with: trainer train sac --resume {run}" in message
    assert [e["new"] for e in events(run) if e["event"] == "out of memory: batch size backed off"] == [32, 16]


def test_replay_buffer_that_cannot_fit_in_ram_is_refused(tmp_path, site_schema):
    run = tmp_path / "big"
    result = run_cli("train", "sac", "--timesteps", "50", "--out", str(run), "--schema", str(site_schema),
                     "--device", "cpu", *sets("sac.buffer_size=100000000000"))
    assert result.exit_code == 2
    assert not (run / "results.json").exists()  # refused before the night starts
    message = result.output.strip().splitlines()[-1]
    assert message.startswith("error: sac.buffer_size=100,000,000,000 needs ")
    assert "GiB of RAM for the replay buffer but" in message and "set sac.buffer_size to at most" in message


def test_huge_batch_is_backed_off_before_training(tmp_path, site_schema):
    run = tmp_path / "huge"
    result = run_cli("train", "sac", "--timesteps", "60", "--out", str(run), "--schema", str(site_schema), "--device",
                     "cpu", *sets("sac.batch_size=1073741824", "sac.learning_starts=59"))  # one gradient step
    assert result.exit_code == 0, result.output
    steps = [(e["old"], e["new"]) for e in events(run) if e["event"] == "out of memory: batch size backed off"]
    assert steps[0] == (2**30, 2**29) and all(new == old // 2 for old, new in steps)
    assert all(not e["in_training"] for e in events(run) if e["event"] == "out of memory: batch size backed off")
    final = json.loads((run / "results.json").read_text())["sac"]["final_batch_size"]
    assert final == steps[-1][1] and final < 2**20


# ------------------------------------------------------------------ non-finite


def _sac_train_poisoning(monkeypatch, times: int):
    from trainer.learn.fast_sac import FastSAC

    original = FastSAC._train_now
    state = {"left": times}

    def train(self, gradient_steps, batch_size):
        original(self, gradient_steps, batch_size)
        if self.num_timesteps >= 120 and state["left"] > 0:
            state["left"] -= 1
            with torch.no_grad():
                next(self.policy.actor.parameters()).fill_(float("nan"))

    monkeypatch.setattr(FastSAC, "_train_now", train)


def test_nan_rolls_back_and_lowers_the_learning_rate(tmp_path, site_schema, monkeypatch):
    _sac_train_poisoning(monkeypatch, times=1)
    run = tmp_path / "nan"
    result = run_cli("train", "sac", "--timesteps", "200", "--out", str(run), "--schema", str(site_schema),
                     "--device", "cpu", *sets("sac.checkpoint_freq_steps=100"))
    assert result.exit_code == 0, result.output
    rollback = next(e for e in events(run) if e["event"] == "non-finite values: rolling back")
    assert (rollback["old_learning_rate"], rollback["new_learning_rate"]) == (0.0001, 0.00005)
    metrics = json.loads((run / "results.json").read_text())["sac"]
    assert (metrics["nonfinite_rollbacks"], metrics["final_learning_rate"], metrics["timesteps"]) == (1, 0.00005, 200)


def test_nan_every_time_stops_after_the_retries(tmp_path, site_schema, monkeypatch):
    _sac_train_poisoning(monkeypatch, times=99)
    run = tmp_path / "nan-always"
    result = run_cli("train", "sac", "--timesteps", "200", "--out", str(run), "--schema", str(site_schema),
                     "--device", "cpu", *sets("sac.checkpoint_freq_steps=100", "reliability.nonfinite_retries=2"))
    assert result.exit_code == 1
    message = result.output.strip().splitlines()[-1]
    assert "still non-finite after 2 rollbacks (learning rate now 2.5e-05)" in message
    assert "lower sac.learning_rate or check the reward scale" in message
