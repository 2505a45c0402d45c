"""The speed-ups change how fast, not what: observations, SAC updates, saved models, rollouts."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from citylearn.wrappers import NormalizedObservationWrapper, StableBaselines3Wrapper
from stable_baselines3 import SAC

from trainer.base.errors import ConfigError
from trainer.config.loading import load_config
from trainer.config.sections import ONE_PERIOD_IGNORED, ONE_PERIOD_LOAD_AGO
from trainer.env.citylearn import CentralAgentArrays, central_arrays, make_citylearn_env, make_sb3_env
from trainer.learn.agents import MAX_AUTO_ENVS, apply_sizes, training_envs
from trainer.learn.fast_sac import FastSAC
from trainer.shipped.controller import forecast_names
from trainer.sim.simulators import CITYLEARN, VECTOR
from trainer.site import Site


def _same_observations(cfg, schema, steps: int) -> float:
    """Step the product's wrapper and CityLearn's side by side with the same actions; worst difference."""
    ours = CentralAgentArrays(make_citylearn_env(cfg, Site.load(schema), "eval", 0, eval_days=30))
    theirs = StableBaselines3Wrapper(
        NormalizedObservationWrapper(make_citylearn_env(cfg, Site.load(schema), "eval", 0, eval_days=30))
    )
    assert ours.observation_space == theirs.observation_space
    a, _ = ours.reset()
    b, _ = theirs.reset()
    worst = float(np.abs(a - b).max())
    rng = np.random.default_rng(0)
    for _ in range(steps):
        action = rng.uniform(ours.action_space.low, ours.action_space.high).astype(np.float32)
        a, reward_a, *_ = ours.step(action)
        b, reward_b, *_ = theirs.step(ours.scale.to_native(action))  # ours acts in [-1, 1]
        assert a.dtype == np.float32 and a.shape == b.shape
        assert reward_a == reward_b
        worst = max(worst, float(np.abs(a - b).max()))
    return worst


def test_observations_match_citylearns_wrapper_on_the_builtin_site(default_cfg, site_schema):
    # 300 hours cover days, weeks, EV arrivals and departures.
    assert _same_observations(default_cfg, site_schema, 300) <= 1e-6


def test_observations_match_citylearns_wrapper_with_17_buildings(default_cfg, official_schema):
    # Shared observations (weather, time, prices) appear once, in the first building's part.
    assert _same_observations(default_cfg, official_schema, 50) <= 1e-6


def test_ignored_observations_are_left_out_of_what_the_policy_reads_and_a_misspelt_one_is_refused(site_schema):
    full = CentralAgentArrays(make_citylearn_env(load_config(), Site.load(site_schema), "eval", 0, eval_days=2))
    cfg = load_config(overrides=["observations.ignore=[month]"])
    fewer = CentralAgentArrays(make_citylearn_env(cfg, Site.load(site_schema), "eval", 0, eval_days=2),
                               seen=cfg.observations)
    a, _ = full.reset()
    b, _ = fewer.reset()
    assert fewer.observation_space.shape == (a.size - 2,) == b.shape  # month's cosine and sine
    assert fewer.plan.names == full.plan.names  # the raw readings are CityLearn's still
    kept = [i for i, f in enumerate(full.plan.features) if f.observation != "month"]
    assert np.array_equal(a[kept], b)
    cfg = load_config(overrides=["observations.ignore=[monht]"])
    with pytest.raises(ConfigError, match=r"observations.ignore names 'monht', which this dataset does not observe"):
        CentralAgentArrays(make_citylearn_env(cfg, Site.load(site_schema), "eval", 0, eval_days=2),
                           seen=cfg.observations)


def _read(cfg, site) -> tuple[set[str], list[str]]:
    """The observations a policy on ``site`` reads (by CityLearn's name), and the raw list it is given."""
    env = make_sb3_env(cfg, site, "eval", 0, eval_days=2)
    try:
        env.reset()
        plan = central_arrays(env).plan
        return {f.observation for f in plan.features}, plan.names
    finally:
        env.close()


def test_a_dataset_of_one_period_is_read_without_its_month_and_weather_and_the_built_in_site_with_them(
        built_in, official_ev_schema):
    auto, every = load_config(), load_config(overrides=["observations.ignore=[]"])
    assert auto.observations.ignore == "auto"  # the default
    dataset = Site.load(official_ev_schema)
    read, raw = _read(auto, dataset)
    all_read, _ = _read(every, dataset)
    left_out = all_read - read
    assert left_out == {"month", "outdoor_dry_bulb_temperature", "outdoor_relative_humidity",
                        *(f"outdoor_{w}_predicted_{h}" for w in ("dry_bulb_temperature", "relative_humidity")
                          for h in (1, 2, 3))} == ONE_PERIOD_IGNORED
    assert {"hour", "day_type", "direct_solar_irradiance_predicted_1", "Building_4.electrical_storage_soc"} <= read
    assert left_out <= set(raw)  # still read from CityLearn (an export checks them), not given to the policy
    assert _read(auto, built_in)[0] == _read(every, built_in)[0]  # drawn years show every month: nothing left out
    assert "month" in _read(auto, built_in)[0]


def test_a_dataset_of_one_period_is_read_with_yesterday_s_loads_and_the_built_in_site_without(built_in,
                                                                                            official_ev_schema):
    alone = ["observations.forecast=false"]  # the forecast of the hours ahead comes after them: below
    auto, none = load_config(overrides=alone), load_config(overrides=["observations.load_ago_hours=[]", *alone])
    assert auto.observations.load_ago_hours == load_config().observations.load_ago_hours == "auto"  # the default
    dataset = Site.load(official_ev_schema)
    read, raw = _read(auto, dataset)
    added = read - _read(none, dataset)[0]
    buildings = [n.split(".")[0] for n in raw if n.endswith(".non_shiftable_load")]  # in the site's order
    assert len(buildings) == 14
    assert added == {f"{b}.non_shiftable_load_ago_{h}h" for b in buildings for h in ONE_PERIOD_LOAD_AGO}
    assert raw[-len(added):] == [f"{b}.non_shiftable_load_ago_{h}h" for b in buildings for h in ONE_PERIOD_LOAD_AGO]
    # With the forecast (auto: on a dataset of one period) the district's policy also reads each building's, and
    # the carbon intensity's, last; by default it reads none.
    forecast = forecast_names(buildings)
    with_forecast = load_config(overrides=["observations.forecast=auto"])
    assert len(forecast) == 14 * 4 + 4 and _read(with_forecast, dataset)[1] == raw + forecast
    assert _read(load_config(), dataset)[1] == raw
    assert _read(auto, built_in) == _read(none, built_in)  # the built-in site: nothing added
    hand = load_config(overrides=["observations.load_ago_hours=[48]"])  # a list is read as given, on any site
    assert _read(hand, built_in)[1][-1] == "non_shiftable_load_ago_48h"


class _Box(gymnasium.Env):
    """Random observations from the environment's own seeded generator (a space's would be shared)."""

    observation_space = gymnasium.spaces.Box(-1, 1, (12,), np.float32)
    action_space = gymnasium.spaces.Box(-1, 1, (3,), np.float32)

    def _obs(self):
        return self.np_random.uniform(-1, 1, 12).astype(np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), float(np.sum(action)), False, False, {}


def _sac(cls, **policy_kwargs):
    model = cls("MlpPolicy", _Box(), seed=3, batch_size=32, learning_starts=0, device="cpu",
                policy_kwargs={"net_arch": [32, 32], **policy_kwargs})
    model.learn(64)  # the same transitions for both: same seed, same environment
    return model


def test_fast_sac_updates_equal_sb3s_bit_for_bit():
    reference, fast = _sac(SAC), _sac(FastSAC)
    np.random.seed(7)
    torch.manual_seed(7)
    reference.train(gradient_steps=20, batch_size=32)
    np.random.seed(7)
    torch.manual_seed(7)
    fast.train(gradient_steps=20, batch_size=32)
    ref, new = reference.policy.state_dict(), fast.policy.state_dict()
    assert ref.keys() == new.keys()
    for key in ref:
        assert torch.equal(ref[key], new[key]), key
    assert torch.equal(reference.log_ent_coef, fast.log_ent_coef)
    assert reference.logger.name_to_value["train/critic_loss"] == pytest.approx(
        fast.logger.name_to_value["train/critic_loss"], rel=1e-6)


def test_fused_optimiser_stays_within_rounding_of_sb3():
    reference, fast = _sac(SAC), _sac(FastSAC, optimizer_kwargs={"fused": True})
    for model in (reference, fast):
        np.random.seed(7)
        torch.manual_seed(7)
        model.train(gradient_steps=20, batch_size=32)
    for key, value in reference.policy.state_dict().items():
        assert torch.allclose(value, fast.policy.state_dict()[key], rtol=1e-4, atol=1e-5), key


@pytest.mark.gpu
def test_fast_sac_on_cuda_stays_within_rounding_of_sb3():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    models = []
    for cls, extra in ((SAC, {}), (FastSAC, {"optimizer_kwargs": {"fused": True}})):
        model = cls("MlpPolicy", _Box(), seed=3, batch_size=32, learning_starts=0, device="cuda",
                    policy_kwargs={"net_arch": [32, 32], **extra})
        model.learn(64)
        torch.manual_seed(7)
        np.random.seed(7)
        model.train(gradient_steps=20, batch_size=32)
        models.append(model.policy.state_dict())
    for key, value in models[0].items():
        assert torch.allclose(value, models[1][key], rtol=1e-3, atol=1e-4), key


def test_a_fast_sac_model_loads_with_plain_sb3(tmp_path):
    fast = _sac(FastSAC, optimizer_kwargs={"fused": True})
    fast.save(tmp_path / "model.zip")
    plain = SAC.load(tmp_path / "model.zip", device="cpu")
    obs = np.linspace(-1, 1, 12, dtype=np.float32)
    assert np.array_equal(plain.predict(obs, deterministic=True)[0], fast.predict(obs, deterministic=True)[0])
    assert not hasattr(plain, "_pending_training")  # the deferral is not part of the saved model


def test_the_imitation_term_keeps_sacs_actor_near_its_demonstrations():
    # _Box rewards the sum of the actions: the critics pull every action to +1. Demonstrations at -0.5
    # hold the actor back with the regulariser (TD3+BC's alpha), and not without it.
    rng = np.random.default_rng(0)
    observations = rng.uniform(-1, 1, (256, 12)).astype(np.float32)
    demo_actions = np.full((256, 3), -0.5, dtype=np.float32)

    def distance(alpha: float) -> float:
        model = _sac(FastSAC)
        if alpha:
            model.fine_tune.attach(observations, demo_actions, alpha, model.device)
        torch.manual_seed(7)
        model.train(gradient_steps=200, batch_size=32)
        actions, _ = model.predict(observations, deterministic=True)
        return float(np.abs(actions - demo_actions).mean())

    free, held = distance(0.0), distance(0.1)
    assert free > 0.4 and held < free / 2
    assert _sac(FastSAC).fine_tune.imitation_loss(None, torch.ones(1), 8) == 0.0  # nothing attached: SB3's SAC


def test_sacs_critics_learn_alone_for_their_first_updates_then_the_actor_moves(tmp_path):
    # warm_start.sac_critic_updates: the actor and the temperature wait while the critics learn, counted in
    # SB3's _n_updates (a checkpoint restores it), so a call that straddles the boundary moves the actor after it.
    model = _sac(FastSAC)
    done = model._n_updates  # _sac's learn(64) trained already
    model.fine_tune.attach(np.zeros((8, 12), np.float32), np.zeros((8, 3), np.float32), 1.0, model.device,
                           critic_updates=done + 30)
    actor = {k: v.clone() for k, v in model.actor.state_dict().items()}
    critic = {k: v.clone() for k, v in model.critic.state_dict().items()}
    temperature = model.log_ent_coef.detach().clone()
    model.train(gradient_steps=30, batch_size=32)
    assert all(torch.equal(v, model.actor.state_dict()[k]) for k, v in actor.items())
    assert not all(torch.equal(v, model.critic.state_dict()[k]) for k, v in critic.items())
    assert torch.equal(temperature, model.log_ent_coef.detach())
    assert "train/critic_loss" in model.logger.name_to_value
    model.train(gradient_steps=5, batch_size=32)  # the actor's turn
    assert not all(torch.equal(v, model.actor.state_dict()[k]) for k, v in actor.items())
    assert not torch.equal(temperature, model.log_ent_coef.detach())
    assert [model.fine_tune.actor_learns(done + n) for n in (0, 29, 30)] == [False, False, True]
    assert _sac(FastSAC).fine_tune.actor_learns(0)  # nothing attached: SB3's SAC from the first update
    model.save(tmp_path / "model.zip")  # a checkpoint's model: a resumed stage counts on from where it was
    assert FastSAC.load(tmp_path / "model.zip", device="cpu")._n_updates == done + 35


def test_a_decaying_learning_rate_reaches_its_share_at_the_stage_s_last_step():
    model = _sac(FastSAC)  # 64 steps taken
    apply_sizes(model, None, None, 1e-3, 0.1)
    assert model.lr_schedule(1.0) == pytest.approx(1e-3) and model.lr_schedule(0.0) == pytest.approx(1e-4)
    model.learn(36, reset_num_timesteps=False)  # SB3's progress: steps taken over the stage's 100
    assert model.actor.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)
    apply_sizes(model, None, None, 1e-3)  # constant: SB3's own schedule
    assert model.lr_schedule(0.0) == pytest.approx(1e-3)


def test_deferred_update_runs_before_learn_returns():
    model = _sac(FastSAC)
    updates = model._n_updates
    model.defer_training = True
    model.learn(5, reset_num_timesteps=False)
    assert model._n_updates == updates + 5 and model._pending_training == []


@pytest.mark.parametrize("cores,agent,expected", [
    (1, "ppo", 4), (2, "ppo", 8), (2, "a2c", 8), (16, "ppo", 32), (16, "a2c", 32), (1, "sac", 1), (64, "ppo", 32),
])
def test_citylearn_workers_are_chosen_from_the_cores(cores, agent, expected, default_cfg):
    n = training_envs(default_cfg, agent, CITYLEARN, cores=cores)
    assert n == expected and n <= MAX_AUTO_ENVS
    assert agent == "sac" or default_cfg.agent(agent).n_steps % n == 0


@pytest.mark.parametrize("overrides,agent,expected", [
    ((), "ppo", 64), ((), "a2c", 64), ((), "sac", 16), (("train.sites=100",), "ppo", 64),
    (("train.sites=100", "a2c.n_steps=500"), "a2c", 100), (("sac.n_envs=4",), "sac", 4), (("ppo.n_envs=2",), "ppo", 2),
])
def test_simulated_sites_follow_train_sites_whatever_the_cores(overrides, agent, expected):
    cfg = load_config(overrides=list(overrides))
    assert training_envs(cfg, agent, VECTOR, cores=64) == training_envs(cfg, agent, VECTOR, cores=1) == expected


def test_configured_environments_must_divide_the_rollout():
    cfg = load_config(overrides=["ppo.n_envs=4"])
    assert training_envs(cfg, "ppo", CITYLEARN, cores=2) == training_envs(cfg, "ppo", VECTOR) == 4
    with pytest.raises(ConfigError, match=r"n_steps \(2048\) must be a multiple of n_envs \(3\)"):
        load_config(overrides=["ppo.n_envs=3"])


def test_torch_threads_follow_the_agent_unless_set(default_cfg, monkeypatch):
    from trainer.run.device import cpu_threads_for

    monkeypatch.setattr("trainer.run.device.cpu_cores", lambda: 6)
    monkeypatch.setattr("os.getloadavg", lambda: (1.0, 1.0, 1.0))  # this process alone: every core free
    monkeypatch.setattr("trainer.run.device.sampled_others", lambda *args, **kwargs: 0.0)
    assert default_cfg.gpu.cpu_threads == 0
    assert [cpu_threads_for(default_cfg, a) for a in ("sac", "ppo", "a2c")] == [1, 1, 1]  # workers beside each
    alone = load_config(overrides=["sac.learn_while_stepping=false"])
    assert [cpu_threads_for(alone, a) for a in ("sac", "ppo", "a2c")] == [6, 1, 1]
    simulated = [cpu_threads_for(default_cfg, a, in_process=True) for a in ("sac", "ppo", "a2c")]
    assert simulated == [6, 1, 1]  # no worker beside SAC on the training simulator
    fixed = load_config(overrides=["gpu.cpu_threads=3"])
    assert [cpu_threads_for(fixed, a) for a in ("sac", "ppo", "a2c")] == [3, 3, 3]
    # Beside other work (2.4 cores of others' work over the sample), SAC takes the cores left; on a machine others
    # keep busy, one; a set number stays as set.
    monkeypatch.setattr("trainer.run.device.sampled_others", lambda *args, **kwargs: 2.4)
    assert cpu_threads_for(alone, "sac") == 4 and cpu_threads_for(fixed, "sac") == 3
    monkeypatch.setattr("trainer.run.device.sampled_others", lambda *args, **kwargs: 5.5)
    assert cpu_threads_for(alone, "sac") == 1
    # What the cores do now, not the load average: a minute after the processes a stage before ran beside this one
    # ended, it still counts them (a night's SAC trained on one thread of two free).
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr("trainer.run.device.sampled_others", lambda *args, **kwargs: 0.0)
    assert cpu_threads_for(alone, "sac") == 6


def test_a_stage_s_threads_follow_the_cores_other_work_leaves_while_it_trains(monkeypatch):
    """SAC's threads, one per free core, are looked at again every half minute while it trains: what the cores did
    since the last look (this process's children counted as other work) sets them."""
    import torch

    from trainer.learn.callbacks import ThreadsFollowCores
    from trainer.run import device

    # The cores' busy seconds and this process's own, at each look: over the first 10 s the others used 10 s of CPU
    # (one core of two), over the next 10 s nothing.
    looks = iter([(0.0, 0.0, 0.0), (10.0, 20.0, 10.0), (20.0, 30.0, 20.0)])
    monkeypatch.setattr(device, "_cpu_now", lambda children=False: next(looks))
    monkeypatch.setattr(device, "cpu_cores", lambda: 2)
    clock = iter([0.0, 40.0, 40.0, 50.0, 80.0, 80.0])
    monkeypatch.setattr("trainer.learn.callbacks.time.monotonic", lambda: next(clock))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        follow = ThreadsFollowCores("sac")
        follow._on_training_start()  # the first look
        assert follow._on_step() and torch.get_num_threads() == 1  # 40 s on: the other core was busy
        assert follow._on_step() and torch.get_num_threads() == 1  # 50 s: not yet time to look
        assert follow._on_step() and torch.get_num_threads() == 2  # 80 s: it was free again
    finally:
        torch.set_num_threads(threads)


def test_the_cpu_others_used_leaves_this_process_and_its_children_out(monkeypatch):
    """sampled_others: the cores' busy time over the sample, less this process tree's own CPU time, per second."""
    from collections import namedtuple

    from trainer.run import device

    Times = namedtuple("Times", "user system idle iowait steal")
    # Two cores over 0.5 s: core 0 busy all of it (0.25 s of it this process's), core 1 idle but 0.1 s stolen;
    # core 2 is not this process's (its affinity) and is left out.
    readings = iter([[Times(10, 0, 5, 0, 0), Times(3, 0, 20, 0, 1), Times(0, 0, 0, 0, 0)],
                     [Times(10.5, 0, 5, 0, 0), Times(3, 0, 20.4, 0, 1.1), Times(0.5, 0, 0, 0, 0)]])
    clock, own = iter([100.0, 100.5]), iter([7.0, 7.25])
    monkeypatch.setattr("psutil.cpu_times", lambda percpu: next(readings))
    monkeypatch.setattr(device, "_own_cpu_s", lambda *args: next(own))
    monkeypatch.setattr(device, "_cores_of_this_process", lambda count: [0, 1])
    real = device._cpu_now
    monkeypatch.setattr(device, "_cpu_now", lambda *args: (next(clock), *real(*args)[1:]))
    assert device.sampled_others(seconds=0) == pytest.approx((0.5 + 0.1 - 0.25) / 0.5)
