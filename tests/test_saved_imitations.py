"""The warm start's imitations kept in the run folder: another process of the night (a stage on Ray, a resumed night)
loads them instead of imitating them again, and stages side by side split an ensemble's members."""

from __future__ import annotations

import pytest
import torch
from filelock import FileLock
from structlog.testing import capture_logs

from trainer.config.loading import load_config
from trainer.env.citylearn import make_sb3_env
from trainer.learn.agents import build_model
from trainer.learn.warm_start import cloning, demonstrations, imitation_key, warm_start
from trainer.learn.warm_start import ensemble as distilling
from trainer.learn.warm_start.saved import SavedImitations

from .conftest import built_in_config


@pytest.fixture
def cfg():
    return built_in_config("warm_start.epochs=2", "warm_start.ensemble=2", "warm_start.student_epochs=2",
                           "warm_start.teacher=sac")


@pytest.fixture
def new_process(monkeypatch):
    """What a fresh process has in memory: nothing imitated, nothing labelled."""
    def forget() -> None:
        monkeypatch.setattr(cloning, "_IMITATED", {})
        monkeypatch.setattr(distilling, "_DISTILLED", {})
    forget()
    return forget


def _stage(cfg, week_site, saved):
    """One PPO stage's warm start, as a night's process runs it: its model, its summary and its log."""
    model = build_model(cfg, "ppo", make_sb3_env(cfg, week_site, "train", cfg.seed), "cpu", cfg.seed, 1000)
    with capture_logs() as logged:
        summary = warm_start(cfg, week_site, "ppo", model, saved=saved)
    return model, summary, logged


def _reused(logged) -> list[bool]:
    return [e["reused"] for e in logged if "member" in e]


def _first_member_key(cfg, week_site) -> str:
    """The key the first member's imitation is kept under: SAC's policy from the night's seed, its actor alone."""
    member = build_model(cfg, "sac", make_sb3_env(cfg, week_site, "train", cfg.seed), "cpu", cfg.seed, 1 << 30)
    fit = (cfg.warm_start.epochs, cfg.warm_start.learning_rate, cfg.warm_start.batch_size)
    return imitation_key(member, demonstrations(cfg, week_site, cfg.seed), *fit, cfg.seed, machine=False,
                         critic_epochs=0)


def test_another_process_of_the_night_loads_the_members_and_the_student_to_the_bit(week_site, cfg, new_process,
                                                                                   tmp_path):
    saved = SavedImitations(tmp_path / "imitations")
    first, summary, logged = _stage(cfg, week_site, saved)
    assert _reused(logged) == [False, False]
    assert len(list(saved.folder.glob("*.pt"))) == 3  # two SAC members and PPO's student

    new_process()
    second, again, logged = _stage(cfg, week_site, saved)
    assert _reused(logged) == [True, True]
    assert any("the same imitation as an earlier stage's" in e["event"] for e in logged)  # the student
    assert again["ensemble"]["members_actor_mse"] == summary["ensemble"]["members_actor_mse"]
    assert again["actor_mse"] == summary["actor_mse"]
    for name, weights in first.policy.state_dict().items():
        assert torch.equal(second.policy.state_dict()[name], weights), name


@pytest.mark.parametrize("damage", ["half a file", "NaN weights", "another shape"])
def test_a_damaged_imitation_is_set_aside_and_imitated_again(damage, week_site, cfg, new_process, tmp_path):
    saved = SavedImitations(tmp_path / "imitations")
    _, summary, _ = _stage(cfg, week_site, saved)
    key = _first_member_key(cfg, week_site)
    first = saved.path(key)
    if damage == "half a file":
        first.write_bytes(b"half a file")  # a disk that filled up mid-write, a bad copy
    else:
        weights, errors = saved.load(key)
        name = next(n for n, t in weights.items() if t.is_floating_point() and t.dim() == 2)
        weights[name] = (weights[name] * float("nan") if damage == "NaN weights"
                         else torch.zeros(weights[name].shape[0] + 1, weights[name].shape[1]))
        saved.save(key, weights, errors)
    damaged = first.read_bytes()

    new_process()
    _, again, logged = _stage(cfg, week_site, saved)
    warned = [e for e in logged if e["event"].startswith("a saved imitation is unreadable")]
    assert len(warned) == 1 and warned[0]["path"] == str(first)
    assert first.with_suffix(".damaged").read_bytes() == damaged
    assert _reused(logged) == [False, True]
    assert first.stat().st_size > 1000  # imitated again and kept
    assert again["ensemble"]["members_actor_mse"] == summary["ensemble"]["members_actor_mse"]


def test_a_member_another_stage_is_imitating_is_left_to_it_until_the_others_are_done(week_site, cfg, new_process,
                                                                                      tmp_path, monkeypatch):
    busy_first = []

    class BesideAnotherStage(SavedImitations):
        """The first member's lock held by a stage beside this one, until this one has done the second."""

        def busy(self, key):
            if key == member_one and not busy_first:
                busy_first.append(key)
                return True
            return super().busy(key)

    member_one = _first_member_key(cfg, week_site)
    _, summary, logged = _stage(cfg, week_site, BesideAnotherStage(tmp_path / "imitations"))
    assert busy_first == [member_one]
    assert [e["member"] for e in logged if "member" in e] == ["2/2", "1/2"]
    # Recorded in the members' order all the same.
    new_process()
    _, alone, _ = _stage(cfg, week_site, SavedImitations(tmp_path / "alone"))
    assert summary["ensemble"]["members_actor_mse"] == alone["ensemble"]["members_actor_mse"]


def test_a_key_is_busy_while_another_holder_imitates_it(tmp_path):
    saved = SavedImitations(tmp_path)
    assert not saved.busy("k")
    held = FileLock(str(tmp_path / "k.lock"))
    with held:
        assert saved.busy("k")
    assert not saved.busy("k")
    with saved.claim("k"):
        assert saved.busy("k")


def test_an_imitation_a_full_disk_cannot_keep_costs_nothing_but_a_warning(tmp_path, monkeypatch):
    from trainer.learn.warm_start import saved as saved_imitations

    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(saved_imitations, "write_bytes_atomic", full)
    saved = SavedImitations(tmp_path)
    with capture_logs() as logged:
        saved.save("k", {"w": torch.ones(2)}, (0.1, 0.2))
    assert logged[0]["error"] == "No space left on device" and saved.load("k") is None


def test_a_stop_request_ends_the_wait_for_another_stage_s_imitation(tmp_path, monkeypatch):
    import signal

    from trainer.base.signals import STOP, Stopped
    from trainer.learn.warm_start import saved as saved_imitations

    monkeypatch.setattr(saved_imitations, "WAIT_CHECK_S", 0.01)
    monkeypatch.setattr(STOP, "signum", signal.SIGTERM)  # as the signal handler sets it
    saved = SavedImitations(tmp_path)
    with FileLock(str(tmp_path / "k.lock")):  # another stage is imitating it
        with pytest.raises(Stopped, match="SIGTERM during the wait for another stage's imitation"):
            with saved.claim("k"):
                pytest.fail("claimed a key another process holds")


def test_a_run_stopped_in_its_warm_start_can_be_resumed_from_what_it_kept(tmp_path):
    from trainer.base.errors import UsageError
    from trainer.learn.preflight import check_resume_config, has_progress
    from trainer.run.folder import RunDir

    run = RunDir(tmp_path / "run")
    run.create(load_config(), ["trainer", "train", "sac"], "cpu")
    assert not has_progress(run)  # a stop here says nothing of resuming: there is nothing to go on from
    with pytest.raises(UsageError, match=r"has no sac checkpoint to resume \(it holds none\)"):
        check_resume_config(run.root, "sac", load_config(), force=False, require_checkpoint=True)
    SavedImitations(run.imitations).save("k", {"w": torch.ones(2)}, (0.1, 0.2))
    assert has_progress(run)  # a stop's message now says how to resume
    check_resume_config(run.root, "sac", load_config(), force=False, require_checkpoint=True)


def test_members_imitated_beside_the_stage_are_the_ones_it_would_imitate(week_site, tmp_path, monkeypatch):
    """A process beside the stage imitates the members from the last (one torch thread, as the stage then runs): the
    stage loads what it saved, members equal to the bit to those it imitates itself, and no process outlives it."""
    import multiprocessing

    import torch
    from structlog.testing import capture_logs

    from trainer.base import logs
    from trainer.base.durations import TimeBox
    from trainer.learn.warm_start import members as beside
    from trainer.learn.warm_start.validation import imitation_parts

    monkeypatch.setattr(cloning, "_IMITATED", {})
    monkeypatch.setattr(distilling, "_DISTILLED", {})
    cfg = week_site.settled(load_config(overrides=["warm_start.epochs=2", "warm_start.ensemble=3",
                                                   "warm_start.student_epochs=2", "warm_start.member_processes=1"]))
    parts = imitation_parts(week_site, None)
    demos = demonstrations(cfg, parts.fit, cfg.seed)
    folder = tmp_path / "imitations"
    # The process beside, to its end: members 3 and 2.
    process = multiprocessing.get_context("spawn").Process(
        target=beside._imitate_members, args=(cfg, week_site, "sac", demos, parts, str(folder), [2, 1], 0))
    process.start()
    process.join()
    assert process.exitcode == 0 and len(list(folder.glob("*.pt"))) == 2
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with capture_logs() as logged:
            members, errors = distilling._imitate_members(cfg, week_site, "sac", "cpu", demos, parts,
                                                        SavedImitations(folder), logs.get(), TimeBox())
        cloning._IMITATED.clear()  # a fresh process's memory: imitated here, not recalled
        alone, alone_errors = distilling._imitate_members(cfg, week_site, "sac", "cpu", demos, parts, None,
                                                        logs.get(), TimeBox())
    finally:
        torch.set_num_threads(threads)
    assert [e["reused"] for e in logged if "member" in e] == [False, True, True]
    assert [e[0] for e in errors] == [e[0] for e in alone_errors]  # the critics are not fitted (nan)
    for mine, theirs in zip(members, alone):
        assert all(torch.equal(theirs.state_dict()[n], t) for n, t in mine.state_dict().items())
    # Started by the stage: stopped with its members' part, none left running.
    with beside.members_beside(1, cfg, week_site, "sac", demos, parts, folder, 0) as started:
        assert started == 1 and len(multiprocessing.active_children()) == 1
    assert multiprocessing.active_children() == []


def test_how_many_processes_imitate_the_members():
    from trainer.learn.warm_start.members import MAX_PROCESSES, processes_beside

    settings = load_config().warm_start
    long = 400 * 35
    assert processes_beside(settings, 10, long, "cpu", free=2) == 1  # a quiet 2-core machine: one beside
    assert processes_beside(settings, 10, long, "cpu", free=1) == 0  # a busy one: none
    assert processes_beside(settings, 10, long, "cpu", free=16) == MAX_PROCESSES - 1
    assert processes_beside(settings, 2, long, "cpu", free=16) == 1  # never more than the members
    assert processes_beside(settings, 10, long, "cuda", free=16) == 0  # a CUDA context a process: on the GPU, none
    assert processes_beside(settings, 10, 25 * 35, "cpu", free=16) == 0  # --quick's: not worth a process's start
    assert processes_beside(settings, 1, long, "cpu", free=16) == 0
    one = load_config(overrides=["warm_start.member_processes=1"]).warm_start
    assert processes_beside(one, 10, long, "cpu", free=16) == 0
    three = load_config(overrides=["warm_start.member_processes=3"]).warm_start
    assert processes_beside(three, 10, 10, "cpu", free=1) == 2  # asked for: whatever the machine


STAGE_KILLED_MID_ENSEMBLE = """
import multiprocessing, sys, time
from pathlib import Path
from trainer.config.loading import load_config
from trainer.learn.warm_start.members import members_beside
from trainer.learn.warm_start.optimum_demonstrations import demonstrations
from trainer.learn.warm_start.validation import imitation_parts
from trainer.site import Site

if __name__ == "__main__":
    site = Site.load(Path(sys.argv[1]))
    cfg = site.settled(load_config(overrides=["warm_start.epochs=2000", "warm_start.ensemble=16"]))
    parts = imitation_parts(site, None)
    demos = demonstrations(cfg, parts.fit, cfg.seed)
    with members_beside(1, cfg, site, "sac", demos, parts, Path(sys.argv[2]), 0):
        print("beside:", *[p.pid for p in multiprocessing.active_children()], flush=True)
        while True:  # the stage, killed here
            time.sleep(1)
"""


def test_a_process_beside_ends_with_its_stage_when_the_stage_is_killed(week, tmp_path):
    """SIGKILL leaves a stage no chance to stop what it started: the process beside it sees it gone and ends."""
    import subprocess
    import sys

    import psutil

    script = tmp_path / "stage.py"
    script.write_text(STAGE_KILLED_MID_ENSEMBLE)
    stage = subprocess.Popen([sys.executable, str(script), str(week), str(tmp_path / "imitations")],
                             stdout=subprocess.PIPE, text=True)
    try:
        said = next(line for line in stage.stdout if line.startswith("beside:"))  # the log's lines before it
        beside = psutil.Process(int(said.split()[1]))
        assert beside.is_running()
    finally:
        stage.kill()
        stage.wait()
    beside.wait(timeout=600)  # not our child: no exit code; the timeout keeps a regression from hanging CI
    # Left alone it would have imitated its fifteen members (~7 s each) and saved each: it stopped with its stage.
    assert len(list((tmp_path / "imitations").glob("*.pt"))) < 15


def test_a_later_stage_s_student_imitated_beside_is_the_one_its_stage_would_imitate(week_site, tmp_path, monkeypatch):
    """SAC's stage starts a process imitating PPO's student from the same labels (one torch thread, as PPO's stage
    runs): PPO's stage, its model built on its own training simulator, finds it by its key and loads it, equal to
    the bit to the student it imitates itself."""
    import multiprocessing

    from trainer.learn.agents import training_envs
    from trainer.learn.trainer import training_env
    from trainer.learn.warm_start import students
    from trainer.learn.warm_start.validation import learning_part
    from trainer.sim.simulators import simulator_for

    monkeypatch.setattr(cloning, "_IMITATED", {})
    cfg = load_config(overrides=["warm_start.epochs=2", "warm_start.student_epochs=3"])
    labelled = demonstrations(cfg, week_site, cfg.seed)
    folder = tmp_path / "imitations"
    process = multiprocessing.get_context("spawn").Process(
        target=students._imitate_students, args=(cfg, week_site, ["ppo"], labelled, str(folder)))
    process.start()
    process.join()
    assert process.exitcode == 0 and len(list(folder.glob("*.pt"))) == 1
    simulator = simulator_for(cfg, week_site)
    env = training_env(cfg, learning_part(week_site), "ppo", training_envs(cfg, "ppo", simulator), simulator)
    settings = cfg.warm_start
    fit = (settings.student_epochs, settings.learning_rate, settings.batch_size, cfg.seed)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        stage = build_model(cfg, "ppo", env, "cpu", cfg.seed, 501_760)
        errors, reused = cloning.imitate_once(stage, labelled, *fit, saved=SavedImitations(folder),
                                              critic_epochs=settings.student_critic_epochs,
                                              decay=settings.student_decay)
        cloning._IMITATED.clear()
        alone = build_model(cfg, "ppo", env, "cpu", cfg.seed, 501_760)
        alone_errors, _ = cloning.imitate_once(alone, labelled, *fit, critic_epochs=settings.student_critic_epochs,
                                               decay=settings.student_decay)
    finally:
        torch.set_num_threads(threads)
        env.close()
    assert reused and errors == alone_errors
    assert all(torch.equal(alone.policy.state_dict()[n], t) for n, t in stage.policy.state_dict().items())


def test_which_later_students_are_imitated_beside_the_first_stage(week_site, monkeypatch):
    from trainer.learn.warm_start import students

    monkeypatch.setattr(students, "free_cores_now", lambda seconds: 2)
    cfg = load_config()
    period = 8760

    def ahead(config=cfg, later=("ppo", "a2c"), device="cpu", untimed=True, steps=period):
        return students.students_ahead(config, week_site, "sac", later, device, untimed, steps)

    assert ahead() == ["ppo", "a2c"]  # A2C's is PPO's key: the process loads it, imitated once
    assert ahead(later=("sac", "ppo", "ppo")) == ["ppo"]  # not its own; each once
    assert ahead(untimed=False) == []  # a student cut at its slot's end is not kept: no use to the next stage
    assert ahead(device="cuda") == []  # a CUDA context a process
    assert ahead(steps=168) == []  # 2,400 minibatches of a week: not worth a process's start
    assert ahead(load_config(overrides=["warm_start.member_processes=1"])) == []
    assert ahead(load_config(overrides=["warm_start.teacher=own"])) == []  # each agent its own members
    assert ahead(load_config(overrides=["gpu.cpu_threads=2"])) == []  # the key names the threads PPO's stage uses
    assert ahead(load_config(overrides=["warm_start.ensemble=1"])) == []
    monkeypatch.setattr(students, "free_cores_now", lambda seconds: 1)  # a busy machine: the stages imitate their own
    assert ahead() == []
