"""The forecast the agents read on a dataset of one period (observations.forecast): causal, learnt from what came
before each period, the planner's own maths, and what an exported controller starts from."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainer.base.errors import ConfigError
from trainer.config.loading import load_config
from trainer.env.citylearn import central_arrays, make_sb3_env, site_forecast
from trainer.env.forecast import history, readings
from trainer.learn.warm_start.validation import imitation_parts
from trainer.references.planner import ProfileForecast
from trainer.shipped.controller import FORECAST_WINDOWS, HourlyForecast, forecast_names
from trainer.site import given_site
from trainer.site.holdout import hold_out

from .conftest import variant


@pytest.fixture(scope="module")
def one_year(site_schema, tmp_path_factory):
    """The built-in site's files as a dataset of one period (a user's year)."""
    schema = variant(site_schema, tmp_path_factory.mktemp("year"), edit=lambda data: data.pop("pvbess_site"))
    return given_site(str(schema), None)


def _series(seed: int, steps: int = 24 * 10, buildings: int = 2):
    rng = np.random.default_rng(seed)
    hours = np.arange(steps) % 24
    fixed = 1.0 + np.sin(hours / 24 * 2 * np.pi)[None, :] + 0.3 * rng.standard_normal((buildings, steps))
    carbon = 0.2 + 0.05 * np.cos(hours / 24 * 2 * np.pi) + 0.01 * rng.standard_normal(steps)
    return hours, fixed, carbon


def test_the_forecast_never_reads_an_hour_to_come_and_resumes_from_its_state():
    hours, fixed, carbon = _series(0)
    changed = fixed.copy()
    changed[:, 120:] += 5.0  # everything after hour 119 differs
    one, other = HourlyForecast(2), HourlyForecast(2)
    read = []
    for t in range(240):
        a = one.windows(int(hours[t]), fixed[:, t], float(carbon[t]))
        b = other.windows(int(hours[t]), changed[:, t], float(carbon[t]))
        read.append(a)
        assert a.shape == (2 * len(FORECAST_WINDOWS) + len(FORECAST_WINDOWS),)
        if t != 120:  # the hour read now counts from the next (at 120 only as far as deviations persist)
            assert np.array_equal(a, b) == (t < 120), t  # and a later one never does
        if t == 100:  # what an export keeps: a controller started again from it forecasts as this one went on
            resumed = HourlyForecast.from_state(json.loads(json.dumps(one.state())))
    for t in range(101, 240):
        np.testing.assert_array_equal(resumed.windows(int(hours[t]), fixed[:, t], float(carbon[t])), read[t])
    # The windows are means of the forecast the planner plans on, over the hours ahead (1 = the next).
    planner, shipped = ProfileForecast(hours, 2), HourlyForecast(2)
    for t in range(48):
        ahead_fixed, ahead_carbon = planner.ahead(t, 25, fixed[:, t], float(carbon[t]))
        got = shipped.windows(int(hours[t]), fixed[:, t], float(carbon[t]))
        expected = [ahead_fixed[b, first:last + 1].mean() for b in range(2) for first, last in FORECAST_WINDOWS]
        expected += [ahead_carbon[first:last + 1].mean() for first, last in FORECAST_WINDOWS]
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert forecast_names(["B1", "B2"])[:2] == ["B1.net_load_forecast_1_3h", "B1.net_load_forecast_4_8h"]
    assert forecast_names(["B1"])[-1] == "carbon_intensity_forecast_17_24h"


def test_each_period_starts_from_what_came_before_it(one_year, tiny_cfg, tmp_path):
    cfg = load_config(overrides=["observations.forecast=true"])
    site = hold_out(one_year, tiny_cfg.holdout, tmp_path)
    judged = site.held_out.site
    parts = imitation_parts(site, None)
    fit, check = parts.fit, parts.check
    assert history(site) is None and history(fit) is None  # the part learnt from starts from nothing
    assert (history(judged).start, history(judged).end) == (site.start, site.end)  # the part held out: all of it
    assert (history(check).start, history(check).end) == (site.start, check.start - 1)  # validation: days before
    learnt = site_forecast(cfg, site)
    assert not any(learnt.start["weight"]) and learnt.values.shape == (site.length, 8)
    # The part held out begins where the part learnt from left the forecast: its first rows are what a forecast
    # that read the whole part learnt from gives, not a fresh one's.
    env = make_sb3_env(cfg, site, "eval", 0)
    env.reset()
    slots, fixed, carbon, _ = readings(env.unwrapped)
    env.close()
    going = HourlyForecast(1)
    for t in range(len(slots)):
        going.observe(int(slots[t]), fixed[:, t], float(carbon[t]))
    ahead = site_forecast(cfg, judged)
    np.testing.assert_allclose(ahead.start["fixed_sum"], going.fixed_sum)
    assert ahead.start["previous"] is None  # the periods need not join: no deviation carries over
    # Both parts' policies read it, scaled by the part learnt from's range.
    env = make_sb3_env(cfg, judged, "eval", 0, eval_days=1)
    env.reset()
    plan = central_arrays(env).plan
    env.close()
    assert plan.names[-8:] == forecast_names(["any"]) and plan.forecast_names == plan.names[-8:]
    assert [(f.low, f.high) for f in plan.features[-8:]] == learnt.ranges


def test_auto_reads_it_on_a_dataset_of_one_period_only_and_a_site_without_a_load_reading_is_refused(
        one_year, built_in, site_schema, tmp_path):
    cfg = load_config(overrides=["observations.forecast=auto"])
    assert one_year.reads_forecast(cfg.observations) and not built_in.reads_forecast(cfg.observations)
    assert not one_year.reads_forecast(load_config().observations)  # off by default (docs/agent-quality.md)
    def no_load(data):
        data.pop("pvbess_site")
        data["observations"]["non_shiftable_load"]["active"] = False

    bare = variant(site_schema, tmp_path / "bare", edit=no_load)
    site = given_site(str(bare), None)
    assert not site.reads_forecast(cfg.observations)  # auto: nothing to learn it from
    forced = load_config(overrides=["observations.forecast=true", "observations.load_ago_hours=[]"])
    with pytest.raises(ConfigError, match="observations.forecast reads non_shiftable_load, which this dataset leaves "
                                          "inactive: activate them in the schema or set observations.forecast: false"):
        make_sb3_env(forced, site, "eval", 0, eval_days=1)
