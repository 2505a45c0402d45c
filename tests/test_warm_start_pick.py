"""The warm start's pick: the ensemble's member (or distilled mean) that emits least CO2 over the held-out years."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.env.citylearn import make_sb3_env
from trainer.judge.metrics import run_episode
from trainer.learn.agents import build_model
from trainer.learn.warm_start import demonstrations, warm_start
from trainer.learn.warm_start.cloning import imitate
from trainer.learn.warm_start.pick import co2_over_the_years, pick_the_best
from trainer.references.controllers import PolicyController
from trainer.site import Site

from .conftest import built_in_config


@pytest.fixture(scope="module")
def cfg():
    return built_in_config("warm_start.epochs=3", "warm_start.ensemble=1", "warm_start.pick_best=true")


@pytest.fixture(scope="module")
def policies(cfg, week_site):
    """Two untrained policies and one that imitated the optimum for a few epochs: CO2 apart."""
    env = make_sb3_env(cfg, week_site, "train", cfg.seed)
    models = [build_model(cfg, "ppo", env, "cpu", seed, 1000) for seed in (1, 2, 3)]
    imitate(models[2], demonstrations(cfg, week_site, cfg.seed), 3, cfg.warm_start.learning_rate,
            cfg.warm_start.batch_size, cfg.seed)
    return models


def _citylearn_co2(cfg, schema, model) -> float:
    return run_episode(PolicyController("ppo", model), make_sb3_env(cfg, Site.load(schema), "eval", cfg.seed))["co2_kg"]


def test_the_simulator_counts_a_policy_s_co2_as_citylearn_does(cfg, week, week_site, policies):
    simulated = co2_over_the_years(cfg, [week_site, week_site], [m.policy for m in policies])
    citylearn = [_citylearn_co2(cfg, week, m) for m in policies]
    np.testing.assert_allclose(simulated, 2 * np.asarray(citylearn), rtol=1e-4)
    assert len(set(np.round(citylearn, 1))) == 3  # three different policies: the check compares something


def test_the_stage_starts_from_the_member_that_emits_least(cfg, week, week_site, policies):
    import torch

    # The candidates: the stage's model (the distilled mean; here policies[0]'s weights), then two members.
    model = build_model(cfg, "ppo", make_sb3_env(cfg, week_site, "train", cfg.seed), "cpu", 1, 1000)
    model.policy.load_state_dict(policies[0].policy.state_dict())
    members = [m.policy for m in policies[1:]]
    citylearn = [_citylearn_co2(cfg, week, m) for m in policies]
    pick = pick_the_best(cfg, "ppo", model, members, [week_site])
    assert pick["member"] == int(np.argmin(citylearn))  # the simulator's choice is CityLearn's
    assert pick["held_out_co2_kg"] == pytest.approx(citylearn, rel=1e-4)
    chosen = policies[pick["member"]].policy.state_dict()
    assert all(torch.equal(t, chosen[name]) for name, t in model.policy.state_dict().items())
    assert _citylearn_co2(cfg, week, model) == pytest.approx(min(citylearn))


def test_without_a_held_out_year_the_distilled_mean_stays(cfg, week_site, policies):
    import torch

    model = build_model(cfg, "ppo", make_sb3_env(cfg, week_site, "train", cfg.seed), "cpu", 1, 1000)
    before = {name: t.clone() for name, t in model.policy.state_dict().items()}
    assert pick_the_best(cfg, "ppo", model, [policies[2].policy], []) is None
    assert all(torch.equal(t, before[name]) for name, t in model.policy.state_dict().items())


def test_the_warm_start_records_its_pick_and_the_chosen_fit(cfg, week, week_site):
    several = cfg.model_copy(update={"warm_start": cfg.warm_start.model_copy(update={"ensemble": 2,
                                                                                      "teacher": "own"})})
    env = make_sb3_env(several, week_site, "train", several.seed)
    model = build_model(several, "ppo", env, "cpu", several.seed, 1000)
    summary = warm_start(several, week_site, "ppo", model, held_out=[week_site])
    ensemble, pick = summary["ensemble"], summary["ensemble"]["pick"]
    assert pick["member"] in (0, 1, 2) and len(pick["held_out_co2_kg"]) == 3
    # the least emitter (the record rounds to 0.1 kg, so two members may read alike)
    assert pick["held_out_co2_kg"][pick["member"]] == min(pick["held_out_co2_kg"])
    if pick["member"]:
        assert summary["actor_mse"] == ensemble["members_actor_mse"][pick["member"] - 1]
    assert _citylearn_co2(several, week, model) == pytest.approx(min(pick["held_out_co2_kg"]), rel=1e-4)
    off = several.model_copy(update={"warm_start": several.warm_start.model_copy(update={"pick_best": False})})
    fresh = build_model(off, "ppo", make_sb3_env(off, week_site, "train", off.seed), "cpu", off.seed, 1000)
    assert "pick" not in warm_start(off, week_site, "ppo", fresh, held_out=[week_site])["ensemble"]
    # Taught by SAC's members, PPO cannot start from one of them: its start is the student.
    taught = several.model_copy(update={"warm_start": several.warm_start.model_copy(update={"teacher": "sac"})})
    assert not taught.warm_start.picks_a_member("ppo") and taught.warm_start.picks_a_member("sac")
    env = make_sb3_env(taught, week_site, "train", taught.seed)
    student = build_model(taught, "ppo", env, "cpu", taught.seed, 1000)
    assert "pick" not in warm_start(taught, week_site, "ppo", student, held_out=[week_site])["ensemble"]


def test_a_second_agent_with_the_same_imitations_picks_alike_without_running_them(cfg, week_site, policies,
                                                                                 monkeypatch):
    from trainer.learn.warm_start import pick as warm_start_pick

    monkeypatch.setattr(warm_start_pick, "_PICKED", {})
    model = build_model(cfg, "ppo", make_sb3_env(cfg, week_site, "train", cfg.seed), "cpu", 1, 1000)
    first = pick_the_best(cfg, "ppo", model, [policies[2].policy], [week_site])
    again = build_model(cfg, "a2c", make_sb3_env(cfg, week_site, "train", cfg.seed), "cpu", 1, 1000)
    monkeypatch.setattr(warm_start_pick, "co2_over_the_years", None)  # would raise if called
    assert pick_the_best(cfg, "a2c", again, [policies[2].policy], [week_site]) == first
