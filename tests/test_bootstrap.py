"""Other years of a user's dataset: its own days resampled in blocks, never a stay cut, never a day held out."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from trainer.base.errors import ConfigError
from trainer.config.loading import load_config
from trainer.env.citylearn import make_sb3_env
from trainer.judge.metrics import run_episode
from trainer.references.controllers import UncontrolledBaseline
from trainer.site import Site, given_site
from trainer.site.bootstrap import BLOCK_DAYS, SEASON_DAYS, Variation, resampled_steps
from trainer.site.holdout import hold_out

from .conftest import variant


@pytest.fixture(scope="module")
def learning(site_schema, tmp_path_factory) -> Site:
    """The built-in site's files as a user's year, narrowed to the part a run learns from (its first 274 days)."""
    schema = variant(site_schema, tmp_path_factory.mktemp("year"), edit=lambda data: data.pop("pvbess_site"))
    return hold_out(given_site(str(schema), None), load_config().holdout, tmp_path_factory.mktemp("draws"))


def _states(site: Site) -> np.ndarray:
    """(steps of the files, chargers) charger states."""
    chargers = site.data["buildings"]["Building_1"]["chargers"].values()
    return np.stack([pd.read_csv(site.root / c["charger_simulation"])["electric_vehicle_charger_state"].to_numpy()
                     for c in chargers], axis=1)


def test_a_drawn_year_is_blocks_of_the_part_learnt_from_cut_where_every_charger_is_free(learning):
    steps = resampled_steps(learning, np.random.default_rng(7))
    assert len(steps) == learning.length == 274 * 24
    assert steps.min() >= learning.start and steps.max() <= learning.end  # nothing of the part held out
    seams = np.flatnonzero(np.diff(steps) != 1) + 1
    assert len(seams) >= 274 // (2 * BLOCK_DAYS)  # resampled, not the period again
    states = _states(learning)
    assert not (states[steps[seams]] == 1).any()  # every block starts with no car plugged in: no stay is cut
    # It follows the period's course: each step reads a day near its own place in the period.
    drift = np.abs(steps - learning.start - np.arange(len(steps)))
    assert drift.max() <= (SEASON_DAYS + BLOCK_DAYS + 3) * 24
    # Another draw is another year; the same seed the same one.
    assert not np.array_equal(steps, resampled_steps(learning, np.random.default_rng(8)))
    np.testing.assert_array_equal(steps, resampled_steps(learning, np.random.default_rng(7)))


def test_every_file_is_resampled_alike_and_citylearn_runs_the_year_serving_every_car(learning, tmp_path):
    drawn = learning.draw(tmp_path / "draw", 1000)
    data = json.loads(drawn.schema.read_text())
    assert (data["simulation_start_time_step"], data["simulation_end_time_step"]) == (0, learning.length - 1)
    assert drawn.scaled_as is learning  # a policy reads it scaled as where it learnt
    # Every file's row i is the data's row of the same step: the weather, loads, tariff and cars of one moment.
    steps = resampled_steps(learning, np.random.default_rng([int(learning.data["random_seed"]), 1000]))
    for name in ("Building_1.csv", "weather.csv", "carbon_intensity.csv", "pricing.csv", "charger_1_1.csv",
                 "charger_1_4.csv"):
        header, *rows = (drawn.root / name).read_text().splitlines()
        original = (learning.root / name).read_text().splitlines()
        assert header == original[0] and len(rows) == len(steps)
        assert rows == [original[1 + t] for t in steps], name
    cfg = load_config(overrides=["schedule.eval_days=28"])
    env = make_sb3_env(cfg, drawn, "eval", 0, eval_days=28)
    try:
        metrics = run_episode(UncontrolledBaseline(), env)
    finally:
        env.close()
    assert metrics["ev_departure_soc_met_pct"] == 100.0  # every car arrives and leaves as it did in the data


def test_a_varied_year_scales_each_blocks_loads_and_pv_within_its_range_and_nothing_else(learning, tmp_path):
    plain = learning.draw(tmp_path / "plain", 1002)
    varied = learning.draw(tmp_path / "varied", 1002, Variation(load=(0.35, 1.3), solar=(0.8, 1.4)))
    assert json.loads(varied.schema.read_text())["pvbess_bootstrap"]["load_scale"] == [0.35, 1.3]
    before, after = (pd.read_csv(s.root / "Building_1.csv") for s in (plain, varied))
    assert list(after.columns) == list(before.columns) and len(after) == len(before)
    # The same days (the same steps as without a variation), their loads and PV scaled by one factor a block.
    steps = resampled_steps(learning, np.random.default_rng([int(learning.data["random_seed"]), 1002]))
    blocks = np.concatenate([[0], np.cumsum(np.diff(steps) != 1)])
    assert blocks[-1] >= 274 // (2 * BLOCK_DAYS)
    for column, (low, high) in (("non_shiftable_load", (0.35, 1.3)), ("solar_generation", (0.8, 1.4))):
        lit = before[column].to_numpy() > 0.01
        factor = after[column].to_numpy()[lit] / before[column].to_numpy()[lit]
        assert factor.min() >= low * 0.999 and factor.max() <= high * 1.001, column
        for block in np.unique(blocks[lit]):  # one factor per block
            within = factor[blocks[lit] == block]
            np.testing.assert_allclose(within, within[0], rtol=1e-4)
        assert np.unique(np.round(factor, 3)).size > 5  # and blocks differ
    for column in ("month", "hour", "dhw_demand", "cooling_demand", "heating_demand"):
        pd.testing.assert_series_equal(after[column], before[column])
    # The sun the policy reads, now and forecast, is scaled with the PV it makes; the rest of the weather is not.
    weather_before, weather_after = (pd.read_csv(s.root / "weather.csv") for s in (plain, varied))
    pv_before, pv_after = before["solar_generation"].to_numpy(), after["solar_generation"].to_numpy()
    lit_pv = pv_before > 0.01
    pv_factor = pv_after / np.where(lit_pv, pv_before, 1.0)
    irradiance = [c for c in weather_before.columns if "solar_irradiance" in c]
    assert len(irradiance) >= 2
    for column in weather_before.columns:
        if column in irradiance:
            sunny = lit_pv & (weather_before[column].to_numpy() > 1.0)
            assert sunny.sum() > 100, column
            np.testing.assert_allclose(weather_after[column].to_numpy()[sunny],
                                       weather_before[column].to_numpy()[sunny] * pv_factor[sunny], rtol=1e-4)
        else:
            pd.testing.assert_series_equal(weather_after[column], weather_before[column])
    # The other files and a variation of [1, 1] are the data's rows as they were.
    assert (varied.root / "charger_1_1.csv").read_text() == (plain.root / "charger_1_1.csv").read_text()
    assert (varied.root / "carbon_intensity.csv").read_text() == (plain.root / "carbon_intensity.csv").read_text()
    same = learning.draw(tmp_path / "same", 1002, Variation())
    assert (same.root / "Building_1.csv").read_text() == (plain.root / "Building_1.csv").read_text()


def test_a_reshaped_year_moves_each_blocks_daily_peaks_and_keeps_its_days_energy(learning, tmp_path):
    plain = learning.draw(tmp_path / "plain", 1003)
    shaped = learning.draw(tmp_path / "shaped", 1003, Variation(shape=0.6))
    assert json.loads(shaped.schema.read_text())["pvbess_bootstrap"]["load_shape"] == 0.6
    before, after = (pd.read_csv(s.root / "Building_1.csv") for s in (plain, shaped))
    pd.testing.assert_series_equal(after["solar_generation"], before["solar_generation"])  # the PV as it was
    steps = resampled_steps(learning, np.random.default_rng([int(learning.data["random_seed"]), 1003]))
    blocks = np.concatenate([[0], np.cumsum(np.diff(steps) != 1)])
    load = before["non_shiftable_load"].to_numpy()
    lit = load > 0.01
    factor = np.where(lit, after["non_shiftable_load"].to_numpy() / np.where(lit, load, 1.0), np.nan)
    assert np.nanmin(factor) >= 0.4 - 1e-3 and np.nanmax(factor) <= 1.6 + 1e-3
    peaks = []
    for block in np.unique(blocks):
        within = factor[blocks == block]
        days = len(within) // 24
        if days < 2 or np.isnan(within[:days * 24]).any():
            continue
        daily = within[:days * 24].reshape(days, 24)
        np.testing.assert_allclose(daily, np.broadcast_to(daily[0], daily.shape), rtol=1e-4)  # one profile a block
        assert abs(daily[0].mean() - 1.0) < 1e-3  # a day's energy at the data's level (a cosine's mean is 0)
        peaks.append((int(np.argmax(daily[0])) + int(steps[blocks == block][0])) % 24)
    assert len(peaks) > 10 and len(set(peaks)) > 6  # the peak at other hours of the day from block to block


def test_a_scale_range_given_high_then_low_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"draw_load_scale is \[low, high\]; got \[1.3, 0.35\]: swap them"):
        load_config(overrides=["warm_start.draw_load_scale=[1.3,0.35]"])


def test_a_draw_is_built_once_and_a_damaged_folder_is_named(learning, tmp_path):
    first = learning.draw(tmp_path / "draw", 1001)
    before = (first.root / "Building_1.csv").stat().st_mtime_ns
    again = learning.draw(tmp_path / "draw", 1001)
    assert (again.root / "Building_1.csv").stat().st_mtime_ns == before
    (tmp_path / "draw" / "schema.json").unlink()
    (tmp_path / "draw" / "Building_1.csv").write_text("damaged")
    from trainer.base.files import DamagedFile

    with pytest.raises(DamagedFile, match="holds no schema.json .* delete the folder and run again"):
        learning.draw(tmp_path / "draw", 1001)
