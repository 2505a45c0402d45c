"""The warm start: agents imitate the optimum's dispatch, and the cloned policy is a real controller."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from trainer.base import beside as beside_module
from trainer.base.errors import ConfigError
from trainer.cli.main import cli
from trainer.config.loading import load_config
from trainer.env.citylearn import make_sb3_env
from trainer.judge.metrics import run_episode
from trainer.learn.agents import build_model
from trainer.learn.warm_start import demonstrations, keep_near_demonstrations, time_with_the_term, warm_start
from trainer.references.controllers import PolicyController, UncontrolledBaseline
from trainer.site import Site, SiteKind

from .conftest import built_in_config, tiny_overrides


@pytest.fixture(scope="module")
def cfg():
    return built_in_config("warm_start.epochs=20", "warm_start.ensemble=1")


def test_demonstrations_are_the_optimum_replayed_over_the_whole_dataset(built_in, cfg):
    demos = demonstrations(cfg, built_in, cfg.seed)
    assert demos.observations.shape == (8759, 48) and demos.actions.shape == (8759, 5)
    assert np.all(np.abs(demos.actions) <= 1.0)
    returns = demos.returns(0.99)
    assert returns[-1] == pytest.approx(demos.rewards[-1])
    assert returns[-2] == pytest.approx(demos.rewards[-2] + 0.99 * demos.rewards[-1])
    assert demonstrations(cfg, built_in, cfg.seed) is demos  # once per process


@pytest.mark.parametrize("agent", ["ppo", "sac"])
def test_a_warm_started_policy_cuts_co2_and_serves_every_car(built_in, cfg, agent):
    env = make_sb3_env(cfg, built_in, "train", cfg.seed)
    model = build_model(cfg, agent, env, "cpu", cfg.seed, 1000)
    summary = warm_start(cfg, built_in, agent, model)
    assert summary["epochs"] == 20 and summary["actor_mse"] < 0.15
    # SAC goes on at a temperature on this reward's scale, held near the demonstrations by its own term; PPO by a
    # behaviour-cloning term hooked on its optimizer.
    assert keep_near_demonstrations(cfg, built_in, agent, model)
    if agent == "sac":
        assert float(model.log_ent_coef.detach().exp()) == pytest.approx(cfg.warm_start.sac_temperature)
        assert len(model.fine_tune.observations) == 8759 and model.fine_tune.alpha == 0.25
        assert model.fine_tune.critic_updates == cfg.warm_start.sac_critic_updates > 0
    else:
        assert len(model.policy.optimizer._optimizer_step_pre_hooks) == 1
    # January's four weeks (the optimum cuts 14.5 % there).
    cloned = run_episode(PolicyController(agent, model), make_sb3_env(cfg, built_in, "eval", 0, eval_days=28))
    base = run_episode(UncontrolledBaseline(), make_sb3_env(cfg, built_in, "eval", 0, eval_days=28))
    assert cloned["co2_kg"] < 0.95 * base["co2_kg"]
    assert cloned["ev_departure_soc_met_pct"] == 100.0


def test_a_fresh_stage_records_its_warm_start(tmp_path):
    overrides = tiny_overrides("warm_start.epochs=2", "schedule.eval_days=1")
    result = CliRunner().invoke(
        cli,
        [
            "train",
            "a2c",
            "--timesteps",
            "64",
            "--out",
            str(tmp_path / "run"),
            "--device",
            "cpu",
            *[a for o in overrides for a in ("--set", o)],
        ],
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "run" / "a2c" / "metrics.json").read_text())
    assert metrics["warm_start"]["epochs"] == 2 and metrics["warm_start"]["steps"] == 8759
    # Learning's time and rate leave the warm start out: it is counted apart (its demonstrations computed within it,
    # or read where an earlier stage or run made them).
    assert metrics["warm_start_s"] >= metrics["warm_start"]["demonstrations_s"] >= 0 and metrics["train_wall_s"] > 0
    assert metrics["warm_start"]["imitation_s"] > 0
    assert metrics["steps_per_s"] == pytest.approx(metrics["timesteps"] / metrics["train_wall_s"], rel=0.01)


@pytest.mark.parametrize("agent", ["a2c", "ppo"])
def test_policy_gradient_steps_are_pulled_toward_the_demonstrations(built_in, cfg, agent):
    import torch

    model = build_model(cfg, agent, make_sb3_env(cfg, built_in, "train", cfg.seed), "cpu", cfg.seed, 1000)
    demos = demonstrations(cfg, built_in, cfg.seed)
    observations, actions = torch.as_tensor(demos.observations), torch.as_tensor(demos.actions)

    def distance() -> float:
        with torch.no_grad():
            return float(((model.policy.get_distribution(observations).distribution.mean - actions) ** 2).mean())

    optimizer = model.policy.optimizer
    before = distance()
    optimizer.zero_grad()
    optimizer.step()  # no policy gradient and no term: nothing moves
    assert distance() == before
    assert keep_near_demonstrations(cfg, built_in, agent, model)
    assert keep_near_demonstrations(cfg, built_in, agent, model)
    assert len(optimizer._optimizer_step_pre_hooks) == 1  # attached twice (a resumed model): still one term
    for group in optimizer.param_groups:
        group["lr"] = 1e-3  # the agents' own 1e-5 and 1e-4 would take many steps to show it
    for _ in range(30):
        optimizer.zero_grad()
        optimizer.step()  # the term alone: the policy's mean walks toward the demonstrations
    assert distance() < 0.8 * before


@pytest.mark.parametrize("agent,weight,hooks", [("ppo", 10.0, 1), ("ppo", 0.0, 0), ("a2c", 10.0, 1)])
def test_a_calibration_times_the_term_its_stage_will_carry(built_in, agent, weight, hooks):
    cfg = load_config(overrides=[f"warm_start.{agent}_bc_weight={weight}"])
    model = build_model(cfg, agent, make_sb3_env(cfg, built_in, "train", cfg.seed), "cpu", cfg.seed, 1000)
    time_with_the_term(cfg, agent, model)
    assert len(model.policy.optimizer._optimizer_step_pre_hooks) == hooks
    model.policy.optimizer.zero_grad()
    model.policy.optimizer.step()  # the stand-in term runs: its batch has the policy's shapes


def test_the_warm_start_also_imitates_other_years_of_the_built_in_site(built_in, tmp_path):
    from trainer.learn.warm_start import training_demonstrations
    from trainer.site.scenario import DRAW_SEED_OFFSET

    cfg = load_config(overrides=["warm_start.extra_draws=1"])
    demos = training_demonstrations(cfg, built_in, cfg.seed, tmp_path / "draws")
    drawn = json.loads((tmp_path / "draws" / "draw-1" / "schema.json").read_text())
    assert drawn["pvbess_site"]["seed"] == cfg.scenario.seed + DRAW_SEED_OFFSET
    assert demos.periods == (8759, 8759) and demos.observations.shape == (2 * 8759, 48)
    own = demonstrations(cfg, built_in, cfg.seed)
    assert np.array_equal(demos.observations[:8759], own.observations)
    assert not np.array_equal(demos.observations[8759:], own.observations)  # another year, not a copy
    # Each year's returns end with its own period: the first year's last step is worth its own reward.
    returns = demos.returns(0.99)
    assert returns[8758] == pytest.approx(demos.rewards[8758])
    assert returns[0] == pytest.approx(own.returns(0.99)[0])
    # Without a folder for the draws (or on any other dataset) the dataset's own demonstrations.
    assert training_demonstrations(cfg, built_in, cfg.seed, None) is own


def test_a_replay_is_kept_for_later_processes_and_a_damaged_one_is_replayed_again(week_site, cfg, monkeypatch,
                                                                                  tmp_path):
    """The optimum's replay is a year of CityLearn: a later process (a second night, a tune's trial, a Ray worker)
    reads the kept copy, by the data's content and the settings that shape it, not by a folder or the agents."""
    import shutil

    from trainer.learn.warm_start import optimum_demonstrations as kept_replays

    monkeypatch.setattr(kept_replays, "cache_folder", lambda: tmp_path / "kept")
    monkeypatch.setattr(kept_replays, "_CACHE", {})
    first = demonstrations(cfg, week_site, cfg.seed)
    [kept] = (tmp_path / "kept").glob("*.npz")

    def in_a_new_process(site: Site, config=cfg):
        monkeypatch.setattr(kept_replays, "_CACHE", {})
        return demonstrations(config, site, config.seed)

    # Nothing in memory and no CityLearn: the kept copy, to the bit, whatever folder holds the same data.
    monkeypatch.setattr(kept_replays, "make_sb3_env", None)
    folder = shutil.copytree(week_site.root, tmp_path / "copy")  # its files, and its schema beside them
    (folder / "schema.json").write_text(json.dumps({k: v for k, v in week_site.data.items() if k != "root_directory"}))
    copy = Site.load(folder / "schema.json")
    agents_changed = load_config(overrides=["warm_start.epochs=20", "warm_start.ensemble=1", "sac.learning_rate=0.01"])
    for again in (in_a_new_process(week_site), in_a_new_process(copy), in_a_new_process(week_site, agents_changed)):
        assert again is not first and again.seconds < first.seconds  # read, not replayed
        for name in ("observations", "actions", "rewards"):
            assert np.array_equal(getattr(again, name), getattr(first, name))
    # What changes the replay is another key: the reward it records, the guard, the seed, the period.
    reward_changed = load_config(overrides=["reward.grid=0.5"])
    assert kept_replays.demonstrations_key(reward_changed, week_site, cfg.seed) != kept.stem
    assert kept_replays.demonstrations_key(cfg, week_site, cfg.seed + 1) != kept.stem
    two_days = week_site.period(week_site.start, week_site.start + 47)
    assert kept_replays.demonstrations_key(cfg, two_days, cfg.seed) != kept.stem

    # A copy cut short by a kill is replayed again and kept whole; turned off, nothing is read or kept.
    monkeypatch.undo()
    monkeypatch.setattr(kept_replays, "cache_folder", lambda: tmp_path / "kept")
    kept.write_bytes(kept.read_bytes()[:200])
    assert np.array_equal(in_a_new_process(week_site).actions, first.actions)
    assert np.array_equal(np.load(kept)["actions"], first.actions)
    kept.unlink()
    off = load_config(overrides=["warm_start.epochs=20", "warm_start.ensemble=1",
                                 "warm_start.reuse_demonstrations=false"])
    assert np.array_equal(in_a_new_process(week_site, off).actions, first.actions)
    assert not list((tmp_path / "kept").glob("*.npz"))


def test_the_later_years_replay_beside_this_process_to_the_same_demonstrations(week_site, monkeypatch):
    """Where a core is free, the later half of the years still to replay replay in a process beside the stage's:
    the same arrays as one process's, kept in this process as if replayed here."""
    from trainer.base.beside import beside
    from trainer.learn.warm_start import optimum_demonstrations as replays

    started = []

    def watched(*args, **kwargs):
        work = beside(*args, **kwargs)
        started.append(work.started)
        return work

    cfg = load_config(overrides=["warm_start.reuse_demonstrations=false"])  # the process beside keeps nothing
    years = [week_site, week_site.period(week_site.start, week_site.start + 95),
             week_site.period(week_site.start + 24, week_site.start + 119)]
    monkeypatch.setattr(replays, "beside", watched)
    monkeypatch.setattr(beside_module, "MIN_STEPS", 24)  # a few days are worth a process here
    out = {}
    for free in (2, 1):
        monkeypatch.setattr(replays, "_CACHE", {})
        out[free] = replays._replays(cfg, years, cfg.seed, free)
        if free == 2:  # kept here: asked again, nothing replays
            with monkeypatch.context() as no_citylearn:
                no_citylearn.setattr(replays, "make_sb3_env", None)
                assert all(a is b for a, b in zip(replays._replays(cfg, years, cfg.seed, free), out[2]))
    assert started == [True]  # one core: all here, no process beside
    assert [len(d.actions) for d in out[2]] == [167, 95, 95]  # a period's steps, less its last
    for there, here in zip(out[2], out[1]):
        for name in ("observations", "actions", "rewards"):
            assert np.array_equal(getattr(there, name), getattr(here, name))


def test_a_timed_warm_start_imitates_the_other_years_that_fit_its_slot_and_fine_tunes_near_those(week_site,
                                                                                                   monkeypatch):
    """On a busy machine four years' replays outlasted a 132 s slot and SAC trained 0 steps: in a box, the other
    years join, in order, while their replays fit half of it (a year costs what the dataset's did); one replayed
    already costs nothing; fine-tuning stays near the years imitated."""
    from trainer.base.durations import TimeBox
    from trainer.learn.warm_start import optimum_demonstrations as replays

    cfg = load_config(overrides=["warm_start.reuse_demonstrations=false"])
    years = [week_site, week_site.period(week_site.start, week_site.start + 95),
             week_site.period(week_site.start + 24, week_site.start + 119)]
    monkeypatch.setattr(replays, "demonstration_years", lambda config, site, draws: years)
    monkeypatch.setattr(replays, "_CACHE", {})
    monkeypatch.setattr(replays, "free_cores_now", lambda: 1)  # one process: the replays' order is this one's
    own = replays.demonstrations(cfg, week_site, cfg.seed)
    assert own.replay_s > 0 and own.periods == ()
    # Its replay as a busy machine's, so that the boxes below are minutes: no assertion on how fast this one is.
    replays._CACHE[replays.demonstrations_key(cfg, week_site, cfg.seed)] = replace(own, replay_s=1000.0)
    a_year_s = 1000.0 * 96 / 168

    def imitated(box=None, replayed_only=False):
        return replays.training_demonstrations(cfg, week_site, cfg.seed, None, box, replayed_only).periods or (167,)

    assert imitated(TimeBox.of(2 * 0.9 * a_year_s)) == (167,)  # its half is short of one more year's replay
    assert imitated(replayed_only=True) == (167,)
    assert imitated(TimeBox.of(2 * 1.5 * a_year_s)) == (167, 95)
    assert imitated(TimeBox.of(0.0)) == (167, 95)  # replayed: free
    assert imitated(replayed_only=True) == (167, 95)
    assert imitated(TimeBox()) == (167, 95, 95)  # untimed: every year
    assert imitated(replayed_only=True) == (167, 95, 95)
    # Where a second core is free, the later half of the years replay beside this process, counted as they run: two
    # years to replay cost one year's time in the box (the one-and-a-half above held one), one still a whole year.
    for free, held in ((1, (167, 95)), (2, (167, 95, 95))):
        monkeypatch.setattr(replays, "_CACHE", {replays.demonstrations_key(cfg, week_site, cfg.seed):
                                                replace(own, replay_s=1000.0)})
        monkeypatch.setattr(replays, "free_cores_now", lambda free=free: free)
        monkeypatch.setattr(beside_module, "MIN_STEPS", 24)
        assert imitated(TimeBox.of(2 * 0.9 * a_year_s)) == (167,)
        assert imitated(TimeBox.of(2 * 1.5 * a_year_s)) == held


def test_the_optimum_reference_s_run_over_the_part_learnt_from_is_kept_as_the_warm_start_s_demonstrations(
        week_site, tmp_path, monkeypatch):
    """The references' optimum replays the plan the demonstrations replay, in the same environment: its run over the
    part learnt from is kept as them (a year of CityLearn less for the night's first warm start), to the bit; its run
    over a part held out, or over part of a period, never is."""
    from trainer.learn.warm_start import optimum_demonstrations as replays
    from trainer.night import stages
    from trainer.run.folder import RunContext, RunDir

    cfg = load_config(overrides=["warm_start.epochs=20"])
    monkeypatch.setattr(replays, "cache_folder", lambda: tmp_path / "kept")
    monkeypatch.setattr(replays, "_CACHE", {})
    replayed = demonstrations(cfg, week_site, cfg.seed)
    for kept in (tmp_path / "kept").glob("*.npz"):
        kept.unlink()
    monkeypatch.setattr(replays, "_CACHE", {})

    ctx = RunContext(cfg, RunDir(tmp_path / "run"), week_site, "cpu")
    stages._reference_on(ctx, "optimum", week_site, None, held_out=True)
    stages._reference_on(ctx, "rbc", week_site, None, held_out=False)
    assert not replays._CACHE and not list((tmp_path / "kept").glob("*.npz"))
    stages._reference_on(ctx, "optimum", week_site, None, held_out=False)
    monkeypatch.setattr(replays, "_CACHE", {})  # a later process: the machine's cache
    monkeypatch.setattr(replays, "make_sb3_env", None)  # no replay
    adopted = demonstrations(cfg, week_site, cfg.seed)
    for name in ("observations", "actions", "rewards"):
        assert np.array_equal(getattr(adopted, name), getattr(replayed, name))
    assert adopted.replay_s > 0  # what the year would cost to replay: the warm start sizes its other years by it

    trajectory = [(o, a, r) for o, a, r in zip(replayed.observations, replayed.actions, replayed.rewards)]
    assert not replays.adopt_replay(cfg, week_site, cfg.seed, trajectory[:-1], 1.0)  # three evaluation days of seven
    assert not replays.adopt_replay(load_config(overrides=["warm_start.epochs=0"]), week_site, cfg.seed, trajectory,
                                    1.0)  # no warm start: nothing to keep


def test_a_kind_that_draws_no_other_year_draws_nothing(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"buildings": {}}))
    assert Site.load(schema, SiteKind("one-period", "no other year")).draw(tmp_path / "draw", 2000) is None
    assert not (tmp_path / "draw").exists()


def test_the_plan_s_imitation_speed_is_measured_on_the_agent_s_own_model(built_in, cfg):
    import math

    from trainer.learn.warm_start.cloning import imitation_update_s

    model = build_model(cfg, "sac", make_sb3_env(cfg, built_in, "train", cfg.seed), "cpu", cfg.seed, 1000)
    seconds = imitation_update_s(model, 64, updates=3)
    assert seconds > 0 and math.isfinite(seconds)


def test_an_identical_imitation_is_reused_to_the_bit(built_in, cfg, monkeypatch):
    """A night's PPO and A2C build the same policy from the same seed: the second copies the first's imitation."""
    import torch

    from trainer.learn.warm_start import cloning

    monkeypatch.setattr(cloning, "_IMITATED", {})
    env = make_sb3_env(cfg, built_in, "train", cfg.seed)
    args = (demonstrations(cfg, built_in, cfg.seed), 2, cfg.warm_start.learning_rate, cfg.warm_start.batch_size,
            cfg.seed)
    first, reused = cloning.imitate_once(build_model(cfg, "ppo", env, "cpu", cfg.seed, 1000), *args)
    assert not reused
    a2c = build_model(cfg, "a2c", env, "cpu", cfg.seed, 1000)
    second, reused = cloning.imitate_once(a2c, *args)
    assert reused and second == first and not a2c.policy.training
    fresh = build_model(cfg, "a2c", env, "cpu", cfg.seed, 1000)
    assert cloning.imitate(fresh, *args) == first
    for name, weights in fresh.policy.state_dict().items():
        assert torch.equal(a2c.policy.state_dict()[name], weights), name
    # Another seed's policy starts elsewhere: imitated afresh.
    assert not cloning.imitate_once(build_model(cfg, "a2c", env, "cpu", cfg.seed + 1, 1000), *args)[1]
    # What the night's plan counts on (its calibration records each agent's digest).
    digests = {agent: cloning.policy_digest(build_model(cfg, agent, env, "cpu", cfg.seed, 1000))
               for agent in ("sac", "ppo", "a2c")}
    assert digests["ppo"] == digests["a2c"] != digests["sac"]



@pytest.mark.parametrize("agent", ["sac", "ppo"])
def test_an_actor_fitted_without_its_critic_ends_with_the_same_weights(week_site, cfg, monkeypatch, agent):
    """An ensemble's members fit their actor alone, the student its critic in its first epochs only: the actors are
    the very weights a full imitation leaves, the critic is untouched after its epochs, and none is taken for
    another's imitation."""
    import math

    import torch

    from trainer.learn.warm_start import cloning

    monkeypatch.setattr(cloning, "_IMITATED", {})
    env = make_sb3_env(cfg, week_site, "train", cfg.seed)
    demos = demonstrations(cfg, week_site, cfg.seed)
    fit = (cfg.warm_start.learning_rate, cfg.warm_start.batch_size, cfg.seed)
    # SAC's actor and its two Q networks; PPO's policy network and action head, and its value network and head.
    actor_names = ("actor.",) if agent == "sac" else ("mlp_extractor.policy_net.", "action_net.", "log_std")
    critic_names = ("critic.",) if agent == "sac" else ("mlp_extractor.value_net.", "value_net.")

    def fresh():
        return build_model(cfg, agent, env, "cpu", cfg.seed, 1000)

    def part(model, names):
        return {n: t.clone() for n, t in model.policy.state_dict().items() if n.startswith(names)}

    def same(a, b):
        return a.keys() == b.keys() and len(a) > 0 and all(torch.equal(a[n], b[n]) for n in a)

    full, alone, first = fresh(), fresh(), fresh()
    untouched = part(alone, critic_names)
    full_errors = cloning.imitate(full, demos, 3, *fit)
    alone_errors = cloning.imitate(alone, demos, 3, *fit, critic_epochs=0)
    first_errors = cloning.imitate(first, demos, 3, *fit, critic_epochs=1)
    assert alone_errors[0] == first_errors[0] == full_errors[0] and math.isnan(alone_errors[1])
    assert same(part(full, actor_names), part(alone, actor_names))
    assert same(part(full, actor_names), part(first, actor_names))
    assert same(untouched, part(alone, critic_names))
    once = fresh()
    assert cloning.imitate(once, demos, 1, *fit)[1] == first_errors[1]  # the critic's error: its last epoch's
    assert same(part(once, critic_names), part(first, critic_names))
    # Each is its own imitation: never reused for another (all epochs, or more, fit the critic as None does).
    keys = {cloning.imitation_key(fresh(), demos, 3, *fit, critic_epochs=c) for c in (None, 3, 5, 1, 0)}
    assert len(keys) == 3


def test_an_imitation_out_of_time_stops_with_what_it_has_and_is_not_kept_as_the_whole(week_site, cfg, monkeypatch,
                                                                                      tmp_path):
    """A busy machine's warm start stops at its part of the stage's slot: after the epoch that reaches it, neither
    kept in the process nor saved for the night's other stages under the whole imitation's key."""
    import torch

    from trainer.base.durations import TimeBox
    from trainer.learn.warm_start import SavedImitations, cloning

    monkeypatch.setattr(cloning, "_IMITATED", {})
    env = make_sb3_env(cfg, week_site, "train", cfg.seed)
    demos = demonstrations(cfg, week_site, cfg.seed)
    fit = (cfg.warm_start.learning_rate, cfg.warm_start.batch_size, cfg.seed)
    saved = SavedImitations(tmp_path / "imitations")
    cut = build_model(cfg, "sac", env, "cpu", cfg.seed, 1000)
    box = TimeBox(until=0.0)  # long past
    errors, reused = cloning.imitate_once(cut, demos, 50, *fit, saved=saved, box=box)
    assert box.reached and not reused and not cloning._IMITATED and not saved.holds_any()
    one_epoch = build_model(cfg, "sac", env, "cpu", cfg.seed, 1000)
    assert cloning.imitate(one_epoch, demos, 1, *fit) == errors  # it ran the one epoch it had begun
    for name, weights in one_epoch.policy.state_dict().items():
        assert torch.equal(cut.policy.state_dict()[name], weights), name
    # A box it fits in changes nothing: the whole imitation, kept.
    roomy = TimeBox.of(3600)
    whole, _ = cloning.imitate_once(build_model(cfg, "sac", env, "cpu", cfg.seed, 1000), demos, 2, *fit, box=roomy)
    assert not roomy.reached and len(cloning._IMITATED) == 1
    assert whole == cloning.imitate(build_model(cfg, "sac", env, "cpu", cfg.seed, 1000), demos, 2, *fit)


def test_a_warm_start_leaves_its_stage_the_learning_the_plan_gave_it():
    """Of a slot, the warm start may take what leaves 20,000 steps of learning and half the planned training time."""
    from trainer.night.state import StageJob

    job = StageJob("run", None, "sac", "train", target=500_000, steps_per_s=1000.0, setup_s=100.0)
    assert job.warm_start_s(None) is None  # untimed: to its end
    assert job.warm_start_s(400.0) == pytest.approx(400 - 150)  # half of the 300 s of training planned
    assert job.warm_start_s(110.0) == pytest.approx(110 - 20)  # 20,000 steps at 1,000 a second
    assert job.warm_start_s(10.0) == 0.0  # one epoch, then learning
    small = StageJob("run", None, "sac", "train", target=5_000, steps_per_s=1000.0, setup_s=100.0)
    assert small.warm_start_s(110.0) == pytest.approx(110 - 5)


@pytest.mark.parametrize(("agent", "teacher"), [("ppo", "own"), ("sac", "sac"), ("ppo", "sac")])
def test_the_warm_start_imitates_its_ensemble_s_mean_and_the_stage_goes_on_as_with_one(week_site, cfg, monkeypatch,
                                                                                        agent, teacher):
    import torch
    from structlog.testing import capture_logs

    from trainer.learn.warm_start import cloning
    from trainer.learn.warm_start import ensemble as distilling

    monkeypatch.setattr(distilling, "_DISTILLED", {})
    several = cfg.model_copy(update={"warm_start": cfg.warm_start.model_copy(update={
        "epochs": 3, "ensemble": 3, "student_epochs": 5, "teacher": teacher})})
    members_are = agent if teacher == "own" else teacher
    env = make_sb3_env(several, week_site, "train", several.seed)
    model = build_model(several, agent, env, "cpu", several.seed, 1000)
    single = build_model(several, agent, env, "cpu", several.seed, 1000)
    cloning.imitate(single, demonstrations(several, week_site, several.seed), 3, several.warm_start.learning_rate,
                      several.warm_start.batch_size, several.seed)
    torch.manual_seed(123)
    with capture_logs() as logged:
        summary = warm_start(several, week_site, agent, model)
    after = torch.rand(3)  # the stage goes on with the random state it had: building members reseeds it
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3))
    steps = len(demonstrations(several, week_site, several.seed).actions)
    ensemble = summary["ensemble"]
    assert ensemble["members"] == 3 and len(ensemble["members_actor_mse"]) == 3
    assert ensemble["teacher"] == members_are
    assert ensemble["labelled_steps"] == 2 * steps  # the demonstrations' states and the ensemble's own year
    # The first member is the teacher's single imitation; the policy is the student, not it.
    assert ensemble["members_actor_mse"][0] == round(cloning.imitate(
        build_model(several, members_are, env, "cpu", several.seed, 1000),
        demonstrations(several, week_site, several.seed),
        3, several.warm_start.learning_rate, several.warm_start.batch_size, several.seed)[0], 5)
    assert not all(torch.equal(single.policy.state_dict()[n], t) for n, t in model.policy.state_dict().items())
    # The student fits the members' mean for its own epochs, from the stage's model as it was built.
    labelled = next(iter(distilling._DISTILLED.values()))
    assert ensemble["student_epochs"] == 5
    assert summary["actor_mse"] == round(cloning.imitate(
        build_model(several, agent, env, "cpu", several.seed, 1000), labelled, 5, several.warm_start.learning_rate,
        several.warm_start.batch_size, several.seed, decay=several.warm_start.student_decay)[0], 5)
    # Minutes of work on a real site: the log says what is happening, member by member, and how to have one.
    progress = [e for e in logged if e["event"].startswith("warm start")]
    assert "warm_start.ensemble=1" in progress[0]["event"]
    assert [e["member"] for e in progress if "member" in e] == ["1/3", "2/3", "3/3"]
    assert [e for e in progress if "labelled" in e["event"]][0]["steps"] == 2 * steps
    assert {e["teacher"] for e in progress if "member" in e} == {members_are}


def test_one_ensemble_teaches_every_agent_of_a_night_on_any_threads(week_site, cfg, monkeypatch):
    """SAC's stage imitates the members (on every core); PPO's and A2C's (one torch thread) distil the same ones."""
    import torch
    from structlog.testing import capture_logs

    from trainer.learn.warm_start import cloning
    from trainer.learn.warm_start import ensemble as distilling

    monkeypatch.setattr(cloning, "_IMITATED", {})
    monkeypatch.setattr(distilling, "_DISTILLED", {})
    several = cfg.model_copy(update={"warm_start": cfg.warm_start.model_copy(update={
        "epochs": 2, "ensemble": 2, "student_epochs": 2, "teacher": "sac"})})
    env = make_sb3_env(several, week_site, "train", several.seed)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with capture_logs() as first:
            sac = warm_start(several, week_site, "sac", build_model(several, "sac", env, "cpu", several.seed, 1000))
        torch.set_num_threads(1)
        with capture_logs() as second:
            ppo = warm_start(several, week_site, "ppo", build_model(several, "ppo", env, "cpu", several.seed, 1000))
            a2c = warm_start(several, week_site, "a2c", build_model(several, "a2c", env, "cpu", several.seed, 1000))
    finally:
        torch.set_num_threads(threads)
    # The same members (their fit's errors too) and their labels: imitated once, by SAC's stage.
    assert ppo["ensemble"]["members_actor_mse"] == sac["ensemble"]["members_actor_mse"] == \
        a2c["ensemble"]["members_actor_mse"]
    assert [e["reused"] for e in first if "member" in e] == [False, False]
    assert [e["reused"] for e in second if "member" in e] == [True, True, True, True]
    assert len(distilling._DISTILLED) == 1
    # Each agent fits its own student: A2C's policy is PPO's, so it reuses PPO's.
    assert ppo["actor_mse"] == a2c["actor_mse"] != sac["actor_mse"]
    assert any("the same imitation as an earlier stage's" in e["event"] for e in second)


def test_the_ensemble_s_labels_are_its_mean_action_where_it_goes_in_closed_loop(week_site, cfg, monkeypatch):
    from trainer.learn.warm_start import ensemble as distilling

    monkeypatch.setattr(distilling, "_DISTILLED", {})
    env = make_sb3_env(cfg, week_site, "train", cfg.seed)
    members = [build_model(cfg, "ppo", env, "cpu", seed, 1000).policy for seed in (1, 2)]
    demos = demonstrations(cfg, week_site, cfg.seed)
    labelled = distilling._ensemble_labels(cfg, week_site, members, demos, None)
    steps = len(demos.actions)
    assert labelled.periods == (steps, steps) and labelled.period_steps == steps

    def mean(observations):
        return np.clip(np.mean([m.predict(observations, deterministic=True)[0] for m in members], axis=0), -1, 1)

    np.testing.assert_allclose(labelled.actions[:steps], mean(demos.observations), atol=1e-6)
    np.testing.assert_array_equal(labelled.observations[:steps], demos.observations)
    # The second period: the mean action run in closed loop from the year's start, each state labelled with it; on
    # the built-in site on the training simulator (train.choose_on: auto), which steps it as CityLearn does.
    assert distilling._Year(cfg, week_site).simulated is not None
    ours = labelled.observations[steps:]
    assert ours.shape == demos.observations.shape and not np.array_equal(ours, demos.observations)
    np.testing.assert_allclose(labelled.actions[steps:], mean(ours), atol=1e-6)
    replay = make_sb3_env(cfg, week_site, "eval", cfg.seed)
    obs, _ = replay.reset()
    for t in range(3):
        np.testing.assert_allclose(ours[t], obs, atol=1e-6)
        obs, reward, _, _, _ = replay.step(mean(obs[None])[0])
        assert labelled.rewards[steps + t] == pytest.approx(reward)
    # train.choose_on: citylearn labels the same states in CityLearn.
    in_citylearn = cfg.model_copy(update={"train": cfg.train.model_copy(update={"choose_on": "citylearn"})})
    assert distilling._Year(in_citylearn, week_site).simulated is None
    theirs = distilling._ensemble_labels(in_citylearn, week_site, members, demos, None)
    np.testing.assert_allclose(theirs.observations, labelled.observations, atol=1e-5)
    np.testing.assert_allclose(theirs.actions, labelled.actions, atol=1e-5)
    np.testing.assert_allclose(theirs.rewards, labelled.rewards, rtol=1e-5, atol=1e-6)
    # A second agent's ensemble of the same members is not run again.
    monkeypatch.setattr(distilling, "make_sb3_env", None)
    monkeypatch.setattr(distilling, "judging_env", None)
    assert distilling._ensemble_labels(cfg, week_site, members, demos, None) is labelled


def test_the_ensemble_s_years_in_closed_loop_beside_this_process_are_labelled_as_here(week_site, tmp_path,
                                                                                     monkeypatch):
    """Where a core is free, half the years' closed loops run in a process beside the stage's: the labels are the
    ones one process gives, to float roundings (one torch thread there)."""
    from trainer.learn.warm_start import ensemble as distilling

    monkeypatch.setattr(distilling, "_DISTILLED", {})
    monkeypatch.setattr(beside_module, "MIN_STEPS", 100)  # a week's loop is worth a process here
    # Two years of the demonstrations, each the week (a drawn year would read a whole year into the simulator).
    monkeypatch.setattr(distilling, "demonstration_years", lambda cfg, site, draws: [site, site])
    cfg = week_site.settled(load_config(overrides=["warm_start.epochs=2"]))
    env = make_sb3_env(cfg, week_site, "train", cfg.seed)
    members = [build_model(cfg, "sac", env, "cpu", seed, 1000).policy for seed in (1, 2)]
    week = demonstrations(cfg, week_site, cfg.seed)
    demos = type(week).joined([week, week])  # the two years imitated
    labelled = {}
    for free in (2, 1):
        monkeypatch.setattr(distilling, "free_cores_now", lambda free=free: free)
        distilling._DISTILLED.clear()
        labelled[free] = distilling._ensemble_labels(cfg, week_site, members, demos, tmp_path / "draws")
    # The demonstrations' two years, then each year's closed loop.
    assert labelled[2].periods == labelled[1].periods and len(labelled[2].periods) == 4
    np.testing.assert_allclose(labelled[2].observations, labelled[1].observations, atol=1e-6)
    np.testing.assert_allclose(labelled[2].actions, labelled[1].actions, atol=1e-6)
    np.testing.assert_allclose(labelled[2].rewards, labelled[1].rewards, atol=1e-6)


def test_a_decaying_rate_fits_closer_in_as_many_epochs_and_is_its_own_imitation(week_site, cfg, monkeypatch):
    """warm_start.student_decay: the learning rate falls to 0 over the epochs (a cosine). Its first epoch is a
    constant rate's first, to the bit; over the whole fit it ends closer to the demonstrations; and it is never taken
    for the constant rate's imitation."""
    import torch

    from trainer.learn.warm_start import cloning

    monkeypatch.setattr(cloning, "_IMITATED", {})
    env = make_sb3_env(cfg, week_site, "train", cfg.seed)
    demos = demonstrations(cfg, week_site, cfg.seed)
    fit = (cfg.warm_start.learning_rate, cfg.warm_start.batch_size, cfg.seed)

    def fresh():
        return build_model(cfg, "sac", env, "cpu", cfg.seed, 1000)

    one, one_decayed = fresh(), fresh()
    assert cloning.imitate(one, demos, 1, *fit, critic_epochs=0)[0] == \
        cloning.imitate(one_decayed, demos, 1, *fit, critic_epochs=0, decay=True)[0]
    assert all(torch.equal(t, one_decayed.policy.state_dict()[n]) for n, t in one.policy.state_dict().items())
    # A student's labels: one function of the observation (here another policy's actions). At the end of its fit a
    # constant rate keeps stepping around them; the decayed one settles on them.
    teacher = build_model(cfg, "sac", env, "cpu", cfg.seed + 1, 1000).policy
    labels = replace(demos, actions=teacher.predict(demos.observations, deterministic=True)[0].astype(np.float32))
    constant = cloning.imitate(fresh(), labels, 100, 0.001, 16, cfg.seed, critic_epochs=0)[0]
    decayed = cloning.imitate(fresh(), labels, 100, 0.001, 16, cfg.seed, critic_epochs=0, decay=True)[0]
    assert decayed < 0.5 * constant  # measured: 5.4e-7 against 4.9e-6
    keys = {cloning.imitation_key(fresh(), demos, 30, *fit, critic_epochs=0, decay=d) for d in (False, True)}
    assert len(keys) == 2


def test_the_student_imitates_the_mean_of_the_members_that_did_best_on_the_validation_part(cfg, monkeypatch):
    """On a dataset with a validation part, warm_start.members_kept of the members make the mean: those of least CO2
    there, at least one; each member is driven once a process; with no validation part, or a share of 1, all."""
    import types

    import torch

    from trainer.learn.warm_start import ensemble as distilling

    monkeypatch.setattr(distilling, "_SCORED", {})
    driven = []

    def check(cfg, parts, agent, model):  # a member's CO2 over the validation part: its weight, here
        def co2():
            driven.append(float(model.policy.weight.detach()))
            return float(model.policy.weight.detach())
        return co2

    monkeypatch.setattr(distilling, "policy_check", check)
    members = []
    for co2 in (3.0, 1.0, 4.0, 2.0):
        member = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.constant_(member.weight, co2)
        members.append(member)
    parts = types.SimpleNamespace(check=object(), label="fit 0-99 check 100-127")

    def keeping(share):
        return cfg.model_copy(update={"warm_start": cfg.warm_start.model_copy(update={"members_kept": share})})

    assert distilling.best_members(keeping(0.5), parts, "sac", members) == ([1, 3], [3.0, 1.0, 4.0, 2.0])
    assert driven == [3.0, 1.0, 4.0, 2.0]
    assert distilling.best_members(keeping(0.5), parts, "sac", members)[0] == [1, 3]
    assert len(driven) == 4  # a later stage of the night distils the same members: not driven again
    assert distilling.best_members(keeping(0.1), parts, "sac", members) == ([1], [3.0, 1.0, 4.0, 2.0])
    assert distilling.best_members(keeping(0.75), parts, "sac", members)[0] == [0, 1, 3]
    assert distilling.best_members(keeping(1.0), parts, "sac", members) == ([0, 1, 2, 3], [])
    unchecked = types.SimpleNamespace(check=None, label="")
    assert distilling.best_members(keeping(0.5), unchecked, "sac", members) == ([0, 1, 2, 3], [])
    with pytest.raises(ConfigError, match="warm_start.members_kept.*greater than 0"):
        load_config(overrides=["warm_start.members_kept=0"])
