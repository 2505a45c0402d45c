"""The training simulator as SB3's VecEnv gives what the product's CityLearn training environment gives."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.config.loading import load_config
from trainer.env.citylearn import make_sb3_env
from trainer.sim.vec_env import SimVecEnv
from trainer.site import Site

from .conftest import drop_ev_curves
from .test_sim import TWO_WEEKS, _v2g, variant


@pytest.fixture(scope="module")
def sites(site_schema, tmp_path_factory):
    root = tmp_path_factory.mktemp("vec-sites")
    return {"built-in": variant(site_schema, root / "built-in", steps=TWO_WEEKS),
            "v2g": variant(site_schema, root / "v2g", _v2g, steps=TWO_WEEKS),
            "random-curves": variant(site_schema, root / "random-curves", drop_ev_curves, steps=TWO_WEEKS)}


def drive_both(cfg, schema, steps: int, seed: int = 0):
    """The product's CityLearn environment (guard, reward, normalisation) and the simulator, same agent actions."""
    product = make_sb3_env(cfg, Site.load(schema), "eval", cfg.seed)
    sim = SimVecEnv(cfg, Site.load(schema), 1, cfg.seed)
    expected, _ = product.reset()
    got = sim.reset()[0]
    rng = np.random.default_rng(seed)
    worst_obs = worst_reward = 0.0
    for _ in range(steps):
        worst_obs = max(worst_obs, float(np.abs(expected - got).max()))
        action = rng.uniform(-1, 1, product.action_space.shape)
        expected, reward, _, _, _ = product.step(action)
        got, rewards, _, _ = sim.step(action[None])
        got = got[0]
        worst_reward = max(worst_reward, abs(reward - float(rewards[0])))
    guard = product.env.guard
    return worst_obs, worst_reward, (guard.interventions, guard.lowered), (sim.guard.interventions, sim.guard.lowered)


@pytest.mark.parametrize("site, overrides", [("built-in", ()), ("built-in", ("reward.storage=1.0",)),
                                             ("built-in", ("observations.ignore=[month,day_type]",)),
                                             ("built-in", ("observations.load_ago_hours=[1,24,48]",)),
                                             ("built-in", ("observations.forecast=true",)),
                                             ("v2g", ()), ("random-curves", ())],
                         ids=["built-in", "storage-credit", "calendar-ignored", "load-look-back", "forecast",
                              "v2g-curves", "charging-curves"])
def test_observations_rewards_and_the_guard_are_the_product_s(site, overrides, sites):
    cfg = load_config(overrides=list(overrides))
    worst_obs, worst_reward, (raised, lowered), sim_changes = drive_both(cfg, sites[site], TWO_WEEKS - 2)
    assert worst_obs < 1e-5 and worst_reward < 1e-5
    assert raised > 0 and sim_changes == (raised, lowered)  # the guard acted, and on the same steps
    # no car is filled past what it can use: a charge-only car past its goal, a V2G car past its goal plus what it
    # can still discharge before it leaves (near departure only): half the random actions charge past it
    assert lowered > 0 and (lowered < raised) == (site == "v2g")


def test_the_built_in_site_takes_the_closed_forms_and_the_v2g_variant_the_steps(sites):
    cfg = load_config()
    assert SimVecEnv(cfg, Site.load(sites["built-in"]), 1, 0).linear
    assert not SimVecEnv(cfg, Site.load(sites["v2g"]), 1, 0).linear


def test_auto_reset_windows_and_the_episode_cursor(sites):
    cfg = load_config()
    env = SimVecEnv(cfg, Site.load(sites["built-in"]), 3, seed=7, episode_steps=24)
    first = env.reset()
    assert first.shape == (3, env.observation_space.shape[0]) and env.episode_index() == [0, 0, 0]
    starts = [int(s) for s in env.site.start]
    assert len(set(starts)) > 1  # each environment in its own window
    zero = np.zeros((3, env.action_space.shape[0]))
    for _ in range(22):
        _, _, dones, infos = env.step(zero)
        assert not dones.any()
    before_last = env._observations().copy()
    obs, rewards, dones, infos = env.step(zero)
    assert dones.all() and env.episode_index() == [1, 1, 1]
    np.testing.assert_array_equal(infos[0]["terminal_observation"], before_last[0])  # CityLearn repeats it
    assert all(info["TimeLimit.truncated"] for info in infos)  # a window's end is a time limit: SB3 bootstraps
    assert infos[0]["episode"]["l"] == 23 and np.isfinite(infos[0]["episode"]["r"])
    # windows are a function of the seed, the environment and the episode: a resumed cursor walks the same ones
    again = SimVecEnv(cfg, Site.load(sites["built-in"]), 3, seed=7, episode_steps=24)
    again.env_method("set_next_episode", 1, indices=[0, 1, 2])
    again.reset()
    assert [int(s) for s in again.site.start] == [int(s) for s in env.site.start]
    assert again.env_method("episode_index") == [1, 1, 1]


def test_train_simulator_vector_refuses_a_dataset_it_cannot_model_and_auto_falls_back(site_schema, tmp_path):
    from trainer.base.errors import UsageError
    from trainer.sim.simulators import simulator_for

    from .test_sim import _thermal

    schema = variant(site_schema, tmp_path, _thermal, steps=48)
    with pytest.raises(UsageError, match="train.simulator is vector, but .* dhw_storage"):
        simulator_for(load_config(overrides=["train.simulator=vector"]), Site.load(schema))
    auto = load_config(overrides=["train.simulator=auto"])
    simulator = simulator_for(auto, Site.load(schema))
    env = simulator.training_env(auto, Site.load(schema), 1)
    try:
        assert simulator.name == "citylearn"
    finally:
        env.close()


def test_the_site_is_read_once_into_the_cache_and_a_damaged_file_is_read_again(sites, tmp_path, monkeypatch):
    from trainer.sim import cache, vec_env

    monkeypatch.setenv("PVBESS_CACHE", str(tmp_path))
    monkeypatch.setattr(vec_env, "_TABLES", {})  # an earlier test in this process may hold the site already
    cfg = load_config()
    first = SimVecEnv(cfg, Site.load(sites["v2g"]), 1, 0)
    files = list((tmp_path / "pvbess-trainer" / "sim").glob("*.npz"))
    assert len(files) == 1
    vec_env._TABLES.clear()  # another process: only the disk is left
    reads = []
    monkeypatch.setattr(cache.SiteTables, "read", lambda env: reads.append(env) or pytest.fail("read again"))
    again = SimVecEnv(cfg, Site.load(sites["v2g"]), 1, 0)
    for name in ("raw", "fixed_net", "connected", "incoming_soc", "carbon"):
        np.testing.assert_array_equal(getattr(again.tables, name), getattr(first.tables, name))
    assert again.tables.chargers.charge_curves[0] is not None  # the optional curves survive the round trip
    np.testing.assert_array_equal(again.tables.chargers.charge_curves[0], first.tables.chargers.charge_curves[0])
    assert again.tables.hours == first.tables.hours and again.tables.steps == first.tables.steps
    monkeypatch.undo()
    monkeypatch.setenv("PVBESS_CACHE", str(tmp_path))
    files[0].write_bytes(b"not an archive")
    vec_env._TABLES.clear()
    SimVecEnv(cfg, Site.load(sites["v2g"]), 1, 0)  # read from CityLearn again, and the file replaced
    with np.load(files[0], allow_pickle=False) as data:
        assert "raw" in data


def test_a_window_judged_from_the_start_reads_only_that_window(sites, tmp_path, monkeypatch):
    """The learning curve's copies from the period's start over its window read the site's first steps alone (a
    year's pass took 20 s of a 48-step window): the same arrays as the whole period's first steps, kept apart."""
    from trainer.sim import vec_env

    monkeypatch.setenv("PVBESS_CACHE", str(tmp_path))
    monkeypatch.setattr(vec_env, "_TABLES", {})
    cfg, site = load_config(), Site.load(sites["v2g"])
    whole = SimVecEnv(cfg, site, 1, 0).tables
    window = SimVecEnv(cfg, site, 2, 0, episode_steps=48, from_start=True)
    assert (window.tables.steps, window.length, whole.steps) == (48, 48, TWO_WEEKS)
    for name in ("raw", "fixed_net", "connected", "arrival_soc", "incoming_soc", "carbon", "price"):
        np.testing.assert_array_equal(getattr(window.tables, name), getattr(whole, name)[:48], err_msg=name)
    assert sorted(p.name.endswith("-first48.npz") for p in (tmp_path / "pvbess-trainer" / "sim").glob("*.npz")) == [
        False, True]
    window.reset()
    for _ in range(47):
        window.step(np.zeros((2, window.action_space.shape[0])))


def test_a_part_of_a_dataset_is_simulated_on_its_own_days_after_the_whole(sites, tmp_path, monkeypatch):
    """A dataset's parts are one schema file over other steps (the part learnt from, its validation part): each is
    simulated on its own days, whatever part this process simulated before (a part once took the whole period's
    tables, and a pick was confirmed on the wrong days)."""
    from trainer.sim import vec_env

    monkeypatch.setenv("PVBESS_CACHE", str(tmp_path))
    monkeypatch.setattr(vec_env, "_TABLES", {})
    cfg, site = load_config(), Site.load(sites["v2g"])
    later_days = site.period(site.start + 96, site.start + 191)
    alone = SimVecEnv(cfg, later_days, 1, 0).tables
    monkeypatch.setenv("PVBESS_CACHE", str(tmp_path / "another-machine"))
    vec_env._TABLES.clear()
    whole = SimVecEnv(cfg, site, 1, 0).tables
    after_the_whole = SimVecEnv(cfg, later_days, 1, 0).tables
    assert (whole.steps, after_the_whole.steps) == (TWO_WEEKS, 96)
    for name in ("raw", "fixed_net", "connected", "incoming_soc", "carbon", "price"):
        np.testing.assert_array_equal(getattr(after_the_whole, name), getattr(alone, name), err_msg=name)


def test_the_reach_table_gives_the_guard_stepping_through_the_curves_gives(sites):
    """On curved paths the guard walks a tabulated full-power step back from the goal and bisects one step: its
    actions are those of stepping every hour left through the curves, within 1e-5."""
    from trainer.sim.battery import BatteryBank
    from trainer.sim.ev import Sessions

    sim = SimVecEnv(load_config(), Site.load(sites["random-curves"]), 256, 0)
    assert sim.reach_table is not None
    tables, rng = sim.tables, np.random.default_rng(3)
    connected = np.flatnonzero((tables.connected >= 0).any(axis=1))
    t = rng.choice(connected, 256)
    cars = BatteryBank(tables.cars, 256)
    cars.soc[...] = rng.uniform(0.05, 0.95, cars.soc.shape).astype(np.float32)
    wanted = rng.uniform(-1.0, 1.0, (256, tables.connected.shape[1]))
    margin = 0.005 * tables.cars.capacity[0]
    stepped = Sessions(tables, t, cars, False, None)
    tabled = Sessions(tables, t, cars, False, sim.reach_table)
    exact, fast = stepped.minimum_action(wanted, margin), tabled.minimum_action(wanted, margin)
    assert stepped.valid.sum() > 300 and (exact > wanted + 1e-4).sum() > 50  # many cars, many of them raised
    np.testing.assert_allclose(fast, exact, atol=1e-5)
    stored = stepped.stored()
    np.testing.assert_allclose(tabled.reachable(stored, stepped.steps_left),
                               stepped.reachable(stored, stepped.steps_left), atol=1e-4)
