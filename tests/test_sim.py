"""The training simulator against CityLearn: the same actions give the same observations and net consumption.

Sites: the built-in one (a year, and two weeks of every policy), a V2G variant with charger deadbands and
efficiency curves and a battery with curved power and efficiency and a standby loss, a two-building
variant, and the official 2022 dataset (17 buildings, batteries and PV).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainer.config.loading import load_config
from trainer.env.citylearn import make_citylearn_env
from trainer.sim.battery import curve_at
from trainer.sim.parity import POLICIES, TOLERANCE, ParityCheck
from trainer.sim.simulators import SIMULATORS
from trainer.sim.site import SiteTables, Unsupported, VectorSite
from trainer.site import Site

from .conftest import variant

TWO_WEEKS = 14 * 24


def _v2g(data: dict) -> None:
    building = next(iter(data["buildings"].values()))
    for charger in building["chargers"].values():
        charger["attributes"].update({
            "max_discharging_power": 7.2, "min_discharging_power": 1.0, "min_charging_power": 1.4,
            # (power fraction, efficiency) pairs, as CityLearn's Charger takes them
            "charge_efficiency_curve": [[0.0, 0.88], [0.5, 0.95], [1.0, 0.92]],
            "discharge_efficiency_curve": [[0.0, 0.9], [1.0, 0.94]],
        })
    building["electrical_storage"]["attributes"].update({
        "capacity_power_curve": [[0.0, 1.0], [0.8, 1.0], [1.0, 0.3]],  # (soc, power fraction) pairs
        "power_efficiency_curve": [[0.0, 0.83], [0.3, 0.95], [0.7, 0.93], [1.0, 0.88]],
        "loss_coefficient": 0.002,
    })


def _two_buildings(data: dict) -> None:
    (name, first), = data["buildings"].items()
    second = json.loads(json.dumps(first))
    second.pop("chargers", None)  # a car cannot be at two buildings at once
    second["pv"]["attributes"]["nominal_power"] = 40.0
    second["electrical_storage"]["attributes"].update({"capacity": 60.0, "nominal_power": 20.0, "initial_soc": 0.1,
                                                       "depth_of_discharge": 0.8})
    data["buildings"]["Building_2"] = second


@pytest.fixture(scope="module")
def cfg():
    return load_config()


@pytest.fixture(scope="module")
def short_sites(site_schema, tmp_path_factory):
    root = tmp_path_factory.mktemp("sim-sites")
    return {
        "built-in": variant(site_schema, root / "built-in", steps=TWO_WEEKS),
        "v2g": variant(site_schema, root / "v2g", _v2g, steps=TWO_WEEKS),
        "two buildings": variant(site_schema, root / "two", _two_buildings, steps=TWO_WEEKS),
    }


@pytest.mark.parametrize("simulator", [row for row in SIMULATORS.values() if row.physics is not None],
                         ids=lambda row: row.name)
@pytest.mark.parametrize("site", ["built-in", "v2g", "two buildings"])
def test_every_policy_gives_citylearn_s_observations_and_net_consumption(site, simulator, short_sites, cfg):
    check = ParityCheck(cfg, Site.load(short_sites[site]), simulator)
    for policy in POLICIES:
        result = check.run(policy)
        assert result.ok, f"{site}, {policy}: {result.line()}"
        assert result.steps == TWO_WEEKS - 1
        assert result.max_observation_diff <= TOLERANCE


def test_v2g_cars_discharge_and_the_variant_exercises_its_limits(short_sites, cfg):
    check = ParityCheck(cfg, Site.load(short_sites["v2g"]))
    sim = VectorSite(check.model, 2)
    sim.reset(np.ones(2, dtype=bool), np.zeros(2, dtype=int))
    tables = check.model
    connected = np.flatnonzero((tables.connected >= 0).any(axis=1))
    t = int(connected[5])
    sim.reset(np.ones(2, dtype=bool), np.full(2, t))
    actions = np.zeros((2, tables.n_actions))
    actions[0, tables.chargers.action] = -1.0  # env 0: every connected car gives back power
    actions[1, tables.chargers.action] = 1.0  # env 1: every connected car charges
    net = sim.step(actions)
    assert net[0, 0] < tables.fixed_net[t, 0] < net[1, 0]


@pytest.mark.slow
def test_the_optimum_s_whole_year_on_the_built_in_site(built_in, cfg):
    result = ParityCheck(cfg, built_in).run("optimum")
    assert result.ok and result.steps == 8759, result.line()


def test_the_official_dataset_s_seventeen_buildings(official_schema, tmp_path, cfg):
    check = ParityCheck(cfg, Site.load(variant(official_schema, tmp_path, steps=7 * 24)))
    assert check.model.n_buildings == 17
    for policy in ("random", "extreme"):
        result = check.run(policy)
        assert result.ok, result.line()


def test_many_environments_in_their_own_windows_step_as_one_each(short_sites, cfg):
    env = make_citylearn_env(cfg, Site.load(short_sites["built-in"]), "eval", 0)
    tables = SiteTables.read(env)
    starts = np.asarray([0, 30, 100])
    sim = VectorSite(tables, 3)
    sim.reset(np.ones(3, dtype=bool), starts, np.full(3, 48))
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1, 1, (47, 3, tables.n_actions))
    batch = [sim.observe().copy()] + [(sim.step(a), sim.observe().copy())[1] for a in actions]
    for i in range(len(starts)):
        one = VectorSite(tables, 1)
        one.reset(np.ones(1, dtype=bool), starts[i:i + 1], np.asarray([48]))
        alone = [one.observe().copy()] + [(one.step(a[i:i + 1]), one.observe().copy())[1] for a in actions]
        np.testing.assert_array_equal(np.stack(batch)[:, i], np.stack(alone)[:, 0])
    assert np.array_equal(batch[-1], batch[-2])  # the episode's last observation repeats the one before


def _thermal(data: dict) -> None:
    data["actions"]["dhw_storage"] = {"active": True}
    next(iter(data["buildings"].values()))["dhw_storage"] = {
        "type": "citylearn.energy_model.StorageTank", "autosize": False,
        "attributes": {"capacity": 10.0, "loss_coefficient": 0.0}}


def test_a_thermal_storage_action_is_refused_with_the_reason(site_schema, tmp_path, cfg):
    env = make_citylearn_env(cfg, Site.load(variant(site_schema, tmp_path, _thermal, steps=48)), "eval", 0)
    with pytest.raises(Unsupported, match="actions the simulator does not model: dhw_storage"):
        SiteTables.read(env)


def test_curves_are_read_as_citylearn_reads_them():
    xs, ys = np.asarray([[0.0, 0.5, 1.0]]), np.asarray([[0.8, 1.0, 0.6]])
    values = np.asarray([[-0.5], [0.0], [0.25], [0.5], [0.75], [1.0], [1.5]])
    # the first and last segments extend linearly beyond the ends; 'left' puts a knot in the segment before it
    expected = [0.6, 0.8, 0.9, 1.0, 0.8, 0.6, 0.2]
    np.testing.assert_allclose(curve_at(values, xs, ys)[:, 0], expected)


def test_sim_check_says_whether_the_simulator_matches_and_refuses_what_it_cannot_model(short_sites, site_schema,
                                                                                       tmp_path):
    from click.testing import CliRunner

    from trainer.cli.main import cli

    result = CliRunner().invoke(cli, ["sim", "check", "--schema", str(short_sites["v2g"]), "--policy", "extreme",
                                      "--steps", "100"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1].split()[:3] == ["extreme", "100", "steps"]
    assert "matches CityLearn on" in result.output

    refused = CliRunner().invoke(cli, ["sim", "check", "--schema", str(variant(site_schema, tmp_path, _thermal, 48))])
    assert refused.exit_code == 2
    assert "does not model this dataset" in refused.output and "dhw_storage" in refused.output
    assert "Traceback" not in refused.output


def test_train_simulator_offers_every_row_of_the_table_and_auto():
    from typing import get_args

    from trainer.config.sections import Config

    choices = get_args(Config.model_fields["train"].annotation.model_fields["simulator"].annotation)
    assert set(choices) == {"auto", *SIMULATORS}


def test_a_new_simulator_is_one_row_chosen_by_auto_and_held_to_parity(short_sites, cfg, monkeypatch):
    from dataclasses import replace

    from trainer.sim.simulators import VECTOR, simulator_for

    # A stand-in for a simulator of its own (on torch tensors, say): its maker, what it cannot model, its physics.
    made = []

    def make(cfg, site, n_envs, seed, episode_steps, subprocesses):
        made.append(n_envs)
        return VECTOR.make(cfg, site, n_envs, seed, episode_steps, subprocesses)

    tensors = replace(VECTOR, name="tensors", title="the tensor simulator", make=make)
    monkeypatch.setattr("trainer.sim.simulators.SIMULATORS", {"tensors": tensors, **SIMULATORS})
    site = Site.load(short_sites["built-in"])
    chosen = simulator_for(cfg, site)  # train.simulator: auto takes the first row that models the site
    assert chosen is tensors
    env = chosen.training_env(cfg, site, 3)
    try:
        assert made == [3] and env.num_envs == 3
    finally:
        env.close()
    assert ParityCheck(cfg, site, chosen).run("random").ok
