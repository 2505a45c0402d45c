"""Held-out parts: what a run judges on is never what it learns from, and every figure says which it is."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from trainer.base.errors import DatasetError
from trainer.base.files import write_json_atomic as write_json
from trainer.cli.main import cli
from trainer.config.loading import load_config
from trainer.config.sections import ONE_PERIOD_DRAWS, ONE_PERIOD_IGNORED, ONE_PERIOD_LOAD_AGO
from trainer.env.citylearn import central_arrays, make_sb3_env
from trainer.judge.metrics import compare_to_baseline
from trainer.judge.report import write_report
from trainer.learn.warm_start.validation import KeepBest, imitation_parts
from trainer.run.folder import RunDir
from trainer.site import BUILT_IN, Site, given_site
from trainer.site.holdout import hold_out

from .conftest import tiny_overrides, variant


@pytest.fixture(scope="module")
def one_year(site_schema, tmp_path_factory) -> Site:
    """The built-in site's files as a dataset of one period (a user's year: no other years to draw)."""
    schema = variant(site_schema, tmp_path_factory.mktemp("year"), edit=lambda data: data.pop("pvbess_site"))
    return given_site(str(schema), None)


def test_sac_s_network_is_settled_on_the_site_once_as_the_run_opens(one_year, built_in, tmp_path):
    """sac.net_arch: auto is 64x64 on a dataset of one period and 256x256 on the built-in site, settled as the run
    opens: its checks, config.yaml (which a resume and Ray's workers read) and every stage hold the size; a size given
    by hand is kept; PPO's and A2C's are their own."""
    from trainer.run.folder import RunContext
    from trainer.run.session import open_run, reopen_run

    cfg = load_config(overrides=tiny_overrides())
    assert cfg.sac.net_arch == "auto"
    with pytest.raises(TypeError, match="net_arch is still 'auto': settle the config on the run's site"):
        cfg.sac.sb3_kwargs()
    checked = []
    with open_run(cfg, "train", tmp_path / "dataset", str(one_year.schema),
                  checks=[lambda settled, site: checked.append(settled.sac.net_arch)]) as ctx:
        assert ctx.cfg.sac.layers == (64, 64) and ctx.cfg.ppo.layers == ctx.cfg.a2c.layers == (256, 256)
    assert checked == [[64, 64]]
    assert yaml.safe_load((tmp_path / "dataset" / "config.yaml").read_text())["sac"]["net_arch"] == [64, 64]
    with reopen_run(tmp_path / "dataset", "cpu") as ctx:
        assert ctx.cfg.sac.layers == (64, 64)
    # A context made by hand (a benchmark's trial, a Ray worker) is settled by its site too.
    assert RunContext(cfg, RunDir(tmp_path / "other"), built_in, "cpu").cfg.sac.layers == (256, 256)
    assert cfg.on_site(one_period=True).on_site(one_period=False).sac.layers == (64, 64)  # once settled, it stays
    given = load_config(overrides=tiny_overrides("sac.net_arch=[32,32]"))
    assert given.on_site(one_period=True).sac.layers == given.on_site(one_period=False).sac.layers == (32, 32)


def test_a_year_is_learnt_from_its_first_months_and_judged_on_its_last(one_year, tmp_path):
    holdout = load_config().holdout
    site = hold_out(one_year, holdout, tmp_path / "draws")
    held = site.held_out
    assert held is not None and holdout.share == 0.25
    # Whole days: 274 to learn from, 91 held out, nothing of one in the other.
    assert (site.start, site.end) == (0, 274 * 24 - 1) and site.length == 274 * 24
    assert (held.site.start, held.site.end) == (274 * 24, 8759)
    assert held.site.schema == site.schema == one_year.schema and held.site.held_out is None
    assert held.what.startswith("the last 91 days of the period (October-December, steps 6,576-8,759)")
    assert held.learnt_from == "the first 274 days (January-October, steps 0-6,575)"
    assert not (tmp_path / "draws").exists()  # a dataset of one period draws nothing to hold out


def test_nothing_is_held_out_on_request_or_from_a_period_too_short_to_split(one_year, site_schema, tmp_path):
    none = load_config(overrides=["holdout.share=0"]).holdout
    assert hold_out(one_year, none, tmp_path) is one_year
    week = given_site(str(variant(site_schema, tmp_path / "week", edit=lambda d: d.pop("pvbess_site"), steps=168)),
                      None)
    assert hold_out(week, load_config().holdout, tmp_path).held_out is None


def test_the_built_in_site_holds_out_another_year_of_its_climate(built_in, tmp_path):
    site = hold_out(built_in, load_config().holdout, tmp_path / "unseen")
    assert site.held_out is not None and site.length == 8760  # it learns from its whole year
    drawn = json.loads((tmp_path / "unseen" / "schema.json").read_text())
    assert drawn["pvbess_site"]["seed"] == built_in.scenario.seed + 3000


def test_a_dataset_to_judge_on_needs_the_same_devices(one_year, site_schema, tmp_path):
    def without_chargers(data: dict) -> None:
        data.pop("pvbess_site")
        data["buildings"]["Building_1"].pop("chargers")

    other = variant(site_schema, tmp_path / "other", edit=without_chargers)
    holdout = load_config(overrides=[f"holdout.eval_schema={other}"]).holdout
    with pytest.raises(DatasetError, match=r"other/schema.json: its buildings \(battery, chargers\) differ .*\[\(True, "
                                           r"0\)\] against \[\(True, 4\)\]"):
        hold_out(one_year, holdout, tmp_path)
    same = variant(site_schema, tmp_path / "same", edit=lambda data: data.pop("pvbess_site"), steps=24 * 30)
    site = hold_out(one_year, load_config(overrides=[f"holdout.eval_schema={same}"]).holdout, tmp_path)
    assert site.length == 8760 and site.held_out.site.schema == same and site.held_out.site.length == 720
    assert "another dataset given with --eval-schema" in site.held_out.what


def test_a_part_held_out_is_read_as_the_policy_learnt(one_year, tiny_cfg, tmp_path):
    site = hold_out(one_year, tiny_cfg.holdout, tmp_path)
    judged = site.held_out.site
    assert judged.scaled_as is not None and judged.scaled_as.length == site.length
    learnt, own, judged = (make_sb3_env(tiny_cfg, s, "eval", 0, eval_days=1) for s in (
        site, replace(judged, scaled_as=None), judged))
    plans = []
    for env in (learnt, own, judged):
        env.reset()
        plans.append(central_arrays(env).plan)
        env.close()
    lows = [np.asarray([f.low for f in p.features]) for p in plans]
    highs = [np.asarray([f.high for f in p.features]) for p in plans]
    assert not np.allclose(highs[0], highs[1])  # the two parts' own ranges differ (CityLearn scales by the period)
    np.testing.assert_array_equal(lows[2], lows[0])  # the part judged on is scaled as the policy learnt
    np.testing.assert_array_equal(highs[2], highs[0])


def test_results_are_held_out_figures_with_the_in_sample_ones_beside(one_year, tmp_path):
    out = tmp_path / "run"
    sets = [a for o in tiny_overrides() for a in ("--set", o)]
    result = CliRunner().invoke(cli, ["baseline", "--schema", str(one_year.schema), "--out", str(out), *sets])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    record = json.loads((out / "held-out.json").read_text())
    assert (record["first_step"], record["last_step"]) == (6576, 8759)
    # A dataset of one period: the policy does not read its month and weather (observations.ignore: auto).
    assert "month" in record["unread"] and record["unread"] == sorted(ONE_PERIOD_IGNORED & one_year.observed)
    assert record["load_ago_hours"] == list(ONE_PERIOD_LOAD_AGO)  # and it reads yesterday's loads (auto)
    for name in ("baseline", "rbc", "optimum"):
        assert results[name]["in_sample"]["co2_kg"] != results[name]["co2_kg"]  # two periods, two figures
    # Each part's share is against its own optimum: the optimum's replay of each reaches about all of its bound.
    assert results["optimum"]["co2_share_of_optimum_pct"] == pytest.approx(100, abs=2)
    assert results["optimum"]["in_sample"]["co2_share_of_optimum_pct"] == pytest.approx(100, abs=2)
    assert "figures on the part of the data held out from training (held-out.json)" in result.output
    assert "evaluated on the first 3 days of the part held out (and of the part learnt from)" in result.output

    # --holdout none: one period, in-sample figures, and the report says so
    flat = tmp_path / "flat"
    result = CliRunner().invoke(cli, ["baseline", "--schema", str(one_year.schema), "--out", str(flat),
                                      "--holdout", "none", *sets])
    assert result.exit_code == 0, result.output
    assert not any("in_sample" in m for m in json.loads((flat / "results.json").read_text()).values())
    assert yaml.safe_load((flat / "config.yaml").read_text())["holdout"]["share"] == 0
    report = write_report(RunDir(flat)).read_text()
    assert "Every figure here is in-sample" in report and "The agents do not read `month`, " in report


@pytest.mark.parametrize("value", ["70%", "half", "-5%"])
def test_a_holdout_that_is_not_a_share_is_refused_before_anything_is_written(value, one_year, tmp_path):
    result = CliRunner().invoke(cli, ["baseline", "--schema", str(one_year.schema), "--out", str(tmp_path / "run"),
                                      "--holdout", value])
    assert result.exit_code == 2
    assert f"--holdout expects a share of the period up to 50%, such as 25%, or none; got {value!r}" in result.output
    assert not (tmp_path / "run").exists()


def _results(held_out: bool) -> dict:
    def entry(co2: float, inside: float, **extra) -> dict:
        out = {"co2_kg": co2, "co2_kg_per_year": co2, "ev_departure_soc_met_pct": 100.0, **extra}
        if held_out:
            out["in_sample"] = {"co2_kg": inside, "co2_kg_per_year": inside, "ev_departure_soc_met_pct": 100.0,
                                **({"lp_co2_kg": extra["lp_co2_kg"] - 100} if "lp_co2_kg" in extra else {})}
        return out

    results = {"baseline": entry(3000, 3200), "rbc": entry(2500, 2650), "optimum": entry(1900, 2000, lp_co2_kg=1800),
               "ppo": entry(2600, 1800)}
    compare_to_baseline(results)
    return results


def test_held_out_json_says_how_a_datasets_imitated_years_vary_and_the_built_in_sites_do_not(one_year, site_schema,
                                                                                                tmp_path):
    from trainer.run.session import record_held_out

    cfg = load_config()
    for name, site, varied in (("dataset", hold_out(one_year, cfg.holdout, tmp_path / "draws"), True),
                               ("built-in", Site.load(site_schema, BUILT_IN), False)):
        run = RunDir(tmp_path / name)
        run.root.mkdir()
        record_held_out(run, site, cfg)
        record = json.loads(run.held_out.read_text())
        assert (record.get("varied_years") == {"years": ONE_PERIOD_DRAWS, "load_scale": [0.35, 1.3],
                                               "solar_scale": [0.8, 1.4],
                                               "load_shape": cfg.warm_start.draw_load_shape}) is varied, name
    run = RunDir(tmp_path / "unvaried")
    run.root.mkdir()
    record_held_out(run, one_year, load_config(overrides=["warm_start.draw_load_scale=[1,1]",
                                                          "warm_start.draw_solar_scale=[1,1]",
                                                          "warm_start.draw_load_shape=0"]))
    assert "varied_years" not in json.loads(run.held_out.read_text()) and run.varied_years() is None


def test_the_report_leads_with_held_out_figures_and_names_what_falls_below_rbc(tmp_path):
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    (run.root / "results.json").write_text(json.dumps(_results(True)))
    (run.root / "held-out.json").write_text(json.dumps({"held_out": "the last 91 days (May-July)",
                                                        "learnt_from": "the first 274 days",
                                                        "unread": ["month", "outdoor_relative_humidity"],
                                                        "load_ago_hours": [24, 21],
                                                        "varied_years": {"years": 3, "load_scale": [0.35, 1.3],
                                                                         "solar_scale": [0.8, 1.4]}}))
    text = write_report(run).read_text()
    headline = text.split("## Results")[0]
    assert "**Best agent: ppo**, 2,600 kg CO2/year (-13.3% against the uncontrolled baseline, 33% of the optimum's" \
           in headline
    assert "**On the held-out data it does worse than the rule-based controller** (2,600 against 2,500" in headline
    assert "*Every figure here is held out: judged on the last 91 days (May-July); the agents learnt from the first " \
           "274 days." in headline
    assert "The agents do not read `month`, `outdoor_relative_humidity` (`observations.ignore`)" in headline
    assert "The agents read each building's loads 24 and 21 hours before (`observations.load_ago_hours`)" in headline
    assert ("Their warm start imitated the optimum of the part learnt from and of 3 years of its days resampled, each "
            "week's loads scaled by 0.35-1.3 and its PV by 0.8-1.4") in headline
    section = text.split("## Held out and in-sample")[1]
    # ppo: 400 of the held-out 1,200 kg cut, 1,400 of the in-sample 1,500; rbc 500 of 1,200, 550 of 1,500
    assert "| ppo | 33% | 93% | +60 |" in section and "| rbc | 42% | 37% | -5 |" in section
    assert "**Held out, ppo (+60 points; rbc -5) lose more than 5 points" in section


def test_the_report_says_how_many_years_each_agents_warm_start_imitated(tmp_path):
    # held-out.json keeps the plan's count; a stage short of time imitates fewer (Building_7 seed 0: SAC 8, PPO 3),
    # and results.json's warm_start.periods (the part learnt from and its years) says how many each did.
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    varied = {"years": 16, "load_scale": [0.35, 1.3], "solar_scale": [0.8, 1.4]}
    (run.root / "held-out.json").write_text(json.dumps({"held_out": "the last 91 days (May-July)",
                                                        "learnt_from": "the first 274 days", "varied_years": varied}))
    results = _results(True)
    results["sac"], results["a2c"] = dict(results["ppo"]), dict(results["ppo"])
    for name, periods in (("sac", 9), ("ppo", 4), ("a2c", 4)):
        results[name]["warm_start"] = {"periods": periods}
    (run.root / "results.json").write_text(json.dumps(results))
    headline = write_report(run).read_text().split("## Results")[0]
    assert "imitated the optimum of the part learnt from and of SAC's 8, PPO's and A2C's 3 years of its days" \
        in headline
    for name in ("sac", "a2c"):
        results[name]["warm_start"] = {"periods": 4}
    (run.root / "results.json").write_text(json.dumps(results))
    assert "of the part learnt from and of 3 years of its days" in write_report(run).read_text()
    for name in ("sac", "ppo", "a2c"):  # a run before the count per agent: the plan's
        del results[name]["warm_start"]
    (run.root / "results.json").write_text(json.dumps(results))
    assert "of the part learnt from and of 16 years of its days" in write_report(run).read_text()


def test_the_report_says_the_imitated_years_loads_were_reshaped_where_they_were(tmp_path):
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    (run.root / "results.json").write_text(json.dumps(_results(True)))
    varied = {"years": 3, "load_scale": [0.35, 1.3], "solar_scale": [0.8, 1.4], "load_shape": 0.6}
    (run.root / "held-out.json").write_text(json.dumps({"held_out": "the last 91 days (May-July)",
                                                        "learnt_from": "the first 274 days", "varied_years": varied}))
    assert run.varied_years() == varied
    headline = write_report(run).read_text().split("## Results")[0]
    assert ("each week's loads scaled by 0.35-1.3 and its PV by 0.8-1.4 (`warm_start.draw_load_scale`, "
            "`draw_solar_scale`) and its loads' daily course reshaped by up to 60% (`warm_start.draw_load_shape`): "
            "weeks lighter and sunnier than the data's, and days whose peaks fall at other hours.") in headline


def test_an_agent_that_loses_little_held_out_is_not_named_because_the_rbc_gains_there():
    from trainer.judge.report import _in_sample

    # Building_4 seed 1's night: SAC 80 % in-sample and 79 % held out, the RBC 44 % and 52 % (each part's own optimum).
    results = {"rbc": {"co2_share_of_optimum_pct": 52.0, "in_sample": {"co2_share_of_optimum_pct": 44.0}},
               "sac": {"co2_share_of_optimum_pct": 79.0, "in_sample": {"co2_share_of_optimum_pct": 80.0}},
               "ppo": {"co2_share_of_optimum_pct": 70.0, "in_sample": {"co2_share_of_optimum_pct": 81.0}}}
    text = "\n".join(_in_sample(results))
    assert "| sac | 79% | 80% | +1 |" in text and "| rbc | 52% | 44% | -8 |" in text
    assert "**Held out, ppo (+11 points; rbc -8) lose more than 5 points, and more than 5 beyond" in text
    assert "sac (" not in text


def test_a_run_from_before_held_out_periods_resumes_and_is_re_evaluated_with_nothing_held_out(tmp_path):
    from trainer.learn.preflight import config_diff, training_view
    from trainer.run.session import as_it_was_made, resolve_for_resume

    run = RunDir(tmp_path / "old-run")
    run.root.mkdir()
    old = load_config().to_dict()
    del old["holdout"]  # as a version before held-out periods wrote config.yaml and its checkpoints' config
    del old["observations"]["load_ago_hours"]  # and one before the loads of hours before
    del old["warm_start"]["draw_load_scale"], old["warm_start"]["draw_solar_scale"]  # and one before varied years
    run.config.write_text(yaml.safe_dump(old))
    assert as_it_was_made(run) == ["holdout.share=0", "observations.load_ago_hours=[]",
                                   "warm_start.draw_load_scale=[1,1]", "warm_start.draw_solar_scale=[1,1]"]
    cfg, out = resolve_for_resume(str(run.root), None, "config.yaml", [], [])
    assert out == str(run.root) and cfg.holdout.share == 0  # it goes on learning from all of its data
    assert cfg.observations.load_ago_hours == []  # and its policy reads what it read
    assert cfg.warm_start.draw_load_scale == (1, 1)  # and a warm start still to come imitates the years it would have
    assert config_diff(training_view(old, "ppo"), training_view(cfg.to_dict(), "ppo")) == []  # so no refusal
    # A new run's config has them all, and their defaults hold a part out and read the loads of yesterday.
    run.config.write_text(yaml.safe_dump(load_config().to_dict()))
    assert as_it_was_made(run) == []
    cfg = resolve_for_resume(str(run.root), None, "config.yaml", [], [])[0]
    assert cfg.holdout.share and cfg.observations.load_ago_hours == "auto"


def test_a_dataset_to_judge_on_that_the_policy_could_not_drive_is_refused_before_the_run_folder(one_year, site_schema,
                                                                                                 tmp_path):
    def without_chargers(data: dict) -> None:
        data.pop("pvbess_site")
        data["buildings"]["Building_1"].pop("chargers")

    other = variant(site_schema, tmp_path / "other", edit=without_chargers)
    result = CliRunner().invoke(cli, ["baseline", "--schema", str(one_year.schema), "--out", str(tmp_path / "run"),
                                      "--eval-schema", str(other)])
    assert result.exit_code == 2 and "its buildings (battery, chargers) differ" in result.output
    assert "judge it on a dataset with the same devices" in result.output and not (tmp_path / "run").exists()
    result = CliRunner().invoke(cli, ["baseline", "--schema", str(one_year.schema), "--out", str(tmp_path / "run"),
                                      "--eval-schema", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "CityLearn schema not found" in result.output and not (tmp_path / "run").exists()


def test_the_imitation_is_checked_on_the_last_four_weeks_of_what_a_dataset_learns_from(one_year, built_in, tmp_path):
    site = hold_out(one_year, load_config().holdout, tmp_path / "draws")
    parts = imitation_parts(site, tmp_path / "demos")
    assert parts.check is not None and (parts.check.start, parts.check.end) == (246 * 24, 274 * 24 - 1)
    assert (parts.fit.start, parts.fit.end) == (0, 246 * 24 - 1)  # its demonstrations stop before the check
    assert parts.fit.scaled_as is site and parts.check.scaled_as is site  # read as the policy learns: the run's part
    assert parts.draws == tmp_path / "demos" / "before-validation"  # other years of the fit part alone
    # The built-in site keeps its epochs (its years are drawn), as does a part too short to split.
    assert imitation_parts(built_in, tmp_path).check is None
    short = site.period(0, 40 * 24 - 1)
    assert imitation_parts(short, tmp_path).check is None and imitation_parts(short, tmp_path).fit is short


def test_an_imitation_keeps_its_best_checked_epochs_and_stops_when_checks_stop_improving():
    import torch

    net = torch.nn.Linear(1, 1)
    scores = iter([5.0, 3.0, 4.0, 4.5, 1.0])  # the best at 50 epochs, then two checks no better: it stops at 200
    keep = KeepBest(net, lambda: next(scores), 400)
    stopped_at = None
    for epoch in range(1, 401):
        with torch.no_grad():
            net.weight.fill_(epoch)
        if keep.after(epoch, (epoch / 1000, 0.0)):
            stopped_at = epoch
            break
    assert stopped_at == 200
    assert keep.restore(stopped_at) == (0.05, 0.0) and float(net.weight.detach()) == 50.0


def test_the_part_learnt_from_is_judged_beside_the_part_held_out_to_the_same_figures(one_year, tmp_path, monkeypatch):
    """Where a core is free, the in-sample evaluation runs in a process beside the held-out one (the two years at
    once); its figures are those the stage's own process gives."""
    from trainer.base.beside import beside
    from trainer.night import stages
    from trainer.run.session import open_run

    started = []

    def watched(*args, **kwargs):
        work = beside(*args, **kwargs)
        started.append(work.started)
        return work

    monkeypatch.setattr(stages, "beside", watched)
    monkeypatch.setattr(stages, "MIN_STEPS", 24)  # three days are worth a process here
    cfg = load_config(overrides=tiny_overrides())
    figures = {}
    for free in (2, 1):
        monkeypatch.setattr(stages, "free_cores_now", lambda free=free: free)
        with open_run(cfg, "baseline", tmp_path / f"run{free}", str(one_year.schema)) as ctx:
            figures[free] = stages.evaluate_reference(ctx, "rbc", reuse=False)
    assert started == [True, False]
    assert figures[2]["in_sample"] == figures[1]["in_sample"]
    assert figures[2]["co2_kg"] == figures[1]["co2_kg"] and figures[2]["in_sample"]["co2_kg"] != figures[2]["co2_kg"]


def test_a_warm_start_a_stage_deployed_is_not_judged_again_for_a_later_stage_of_the_same_weights(one_year, tmp_path,
                                                                                              monkeypatch):
    """PPO's stage deploys its warm start where learning did not beat it; A2C's starts from the same weights: its
    warm start's figures are the deployed policy's, not another two years of CityLearn."""
    from trainer.learn.agents import build_model
    from trainer.learn.trainer import save_warm_start
    from trainer.learn.warm_start.cloning import weights_digest
    from trainer.night import stages
    from trainer.run.device import resolve_agent
    from trainer.run.session import open_run

    monkeypatch.setattr(stages, "_WARM_STARTS", {})
    cfg = load_config(overrides=tiny_overrides())
    with open_run(cfg, "train", tmp_path / "run", str(one_year.schema)) as ctx:
        env = make_sb3_env(cfg, ctx.site, "train", cfg.seed)
        ppo = build_model(cfg, "ppo", env, "cpu", cfg.seed, 1000)
        a2c = build_model(cfg, "a2c", env, "cpu", cfg.seed, 1000)
        a2c.policy.load_state_dict(ppo.policy.state_dict())
        save_warm_start(ppo, ctx.run.agent("ppo"))
        save_warm_start(a2c, ctx.run.agent("a2c"))
        digest = weights_digest(ppo.policy, float(ppo.gamma), machine=False)
        deployed = {"policy_digest": digest[:16], "co2_kg": 1.5, "co2_kg_per_year": 2.5,
                    "ev_departure_soc_met_pct": 100.0, "in_sample": {"co2_kg": 3.5, "co2_kg_per_year": 4.5,
                                                                    "ev_departure_soc_met_pct": 99.0}}
        monkeypatch.setattr(stages, "judged", lambda *args, **kwargs: pytest.fail("judged again"))
        ppo_start = stages._evaluate_warm_start(ctx, resolve_agent(cfg, "ppo"), deployed)
        a2c_start = stages._evaluate_warm_start(ctx, resolve_agent(cfg, "a2c"), {"policy_digest": "another"})
    assert ppo_start == a2c_start == {"co2_kg": 1.5, "co2_kg_per_year": 2.5, "ev_departure_soc_met_pct": 100.0,
                                      "in_sample": {"co2_kg": 3.5, "co2_kg_per_year": 4.5,
                                                    "ev_departure_soc_met_pct": 99.0}}


def test_a_night_short_of_time_leaves_its_warm_start_s_evaluation_to_trainer_evaluate(one_year, tmp_path, monkeypatch):
    """Short of time (lean), a stage does not spend two years of CityLearn on its warm start, a comparison for the
    report (74 s an agent in a busy 20-minute night): results.json and the report say so and how to add it; the
    warm start a stage deployed keeps its figures (they cost nothing)."""
    from trainer.judge.report import _deployed
    from trainer.learn.agents import build_model
    from trainer.learn.trainer import save_warm_start
    from trainer.night import stages
    from trainer.run.device import resolve_agent
    from trainer.run.session import open_run

    monkeypatch.setattr(stages, "_WARM_STARTS", {})
    monkeypatch.setattr(stages, "judged", lambda *args, **kwargs: pytest.fail("evaluated in a lean night"))
    cfg = load_config(overrides=tiny_overrides())
    with open_run(cfg, "train", tmp_path / "run", str(one_year.schema)) as ctx:
        env = make_sb3_env(cfg, ctx.site, "train", cfg.seed)
        save_warm_start(build_model(cfg, "ppo", env, "cpu", cfg.seed, 1000), ctx.run.agent("ppo"))
        warm = stages._evaluate_warm_start(ctx, resolve_agent(cfg, "ppo"), {"policy_digest": "another"}, lean=True)
        root = ctx.run.root
    assert warm == {"not_evaluated": f"the night was short of time; `trainer evaluate {root}` evaluates it"}
    metrics = {"co2_kg_per_year": 30_000.0, "warm_start": warm,
               "kept": {"step": 800, "final_step": 1000, "why": "it did best", "validation_co2_kg_per_year": 29_000.0}}
    [line] = [row for row in _deployed({"ppo": metrics}) if row.startswith("- **ppo**")]
    assert line.endswith(f"Warm start alone: not evaluated (the night was short of time; `trainer evaluate {root}` "
                         "evaluates it).")


def _left_unevaluated(ctx, cfg, agents: dict[str, float]) -> None:
    """Each of ``agents`` (name -> its policy's CO2) trained as a lean night leaves it: metrics.json and results.json
    with its warm start ``not_evaluated``, whose judging took 60 s; PPO's and A2C's warm starts the same weights."""
    from trainer.learn.agents import build_model
    from trainer.learn.trainer import save_warm_start
    from trainer.night.stages import record_results

    env = make_sb3_env(cfg, ctx.site, "train", cfg.seed)
    ppo = build_model(cfg, "ppo", env, "cpu", cfg.seed, 1000)
    models = {"ppo": ppo, "a2c": build_model(cfg, "a2c", env, "cpu", cfg.seed, 1000),
              "sac": build_model(cfg, "sac", env, "cpu", cfg.seed, 1000)}
    models["a2c"].policy.load_state_dict(ppo.policy.state_dict())
    results = {}
    for agent, co2 in agents.items():
        save_warm_start(models[agent], ctx.run.agent(agent))
        results[agent] = {"co2_kg_per_year": co2, "judged_s": 60.0, "timesteps": 1000,
                          "warm_start": {"epochs": 4, "not_evaluated": "the night was short of time"}}
        write_json(ctx.run.agent(agent).metrics, results[agent])
    record_results(ctx.run, results)


def test_the_time_a_night_has_left_evaluates_the_warm_starts_it_left_unevaluated_best_agent_first(one_year, tmp_path,
                                                                                                 monkeypatch):
    """A lean night's stages ended before its deadline: the warm starts they left to `trainer evaluate` are judged
    in the time left, the agent of least CO2 first, each where what its agent's judging took (padded) still fits;
    one of weights already judged (A2C's, PPO's imitation) is taken at no cost. results.json, metrics.json and the
    report then carry the figures; one that does not fit stays `not_evaluated`."""
    from trainer.judge.report import _deployed
    from trainer.night import stages
    from trainer.run.session import open_run

    monkeypatch.setattr(stages, "_WARM_STARTS", {})
    judged = []

    def judging(ctx, evaluate, timeseries=None, inside=None):
        judged.append(len(judged))
        return {"co2_kg": 10.0 + len(judged), "co2_kg_per_year": 20.0 + len(judged), "ev_departure_soc_met_pct": 100.0,
                "in_sample": {"co2_kg": 5.0, "co2_kg_per_year": 6.0, "ev_departure_soc_met_pct": 99.0}}

    monkeypatch.setattr(stages, "judged", judging)
    cfg = load_config(overrides=tiny_overrides())
    with open_run(cfg, "train", tmp_path / "run", str(one_year.schema)) as ctx:
        _left_unevaluated(ctx, ctx.cfg, {"sac": 31_000.0, "ppo": 30_000.0, "a2c": 30_500.0})
        # What a night's last stage learning on past its target keeps for them: three judgings of 60 s, padded, and
        # one more where that stage (in a night short of time) leaves its own too.
        assert stages.left_warm_starts_s(ctx, own=False) == pytest.approx(3 * 60.0 * stages.SAFETY)
        assert stages.left_warm_starts_s(ctx, own=True) == pytest.approx(4 * 60.0 * stages.SAFETY)
        # 100 s left: PPO's (least CO2) fits at 69 s padded; SAC's would not after it; A2C's has PPO's weights
        now = [1_000.0]

        def clock() -> float:
            return now[0] + 50.0 * len(judged)  # each judging takes 50 s

        done = stages.evaluate_left_warm_starts(ctx, until=1_100.0, clock=clock)
        results = ctx.run.results()
    assert done == ["ppo", "a2c"] and judged == [0]
    assert results["ppo"]["warm_start"] == results["a2c"]["warm_start"] == {
        "epochs": 4, "co2_kg": 11.0, "co2_kg_per_year": 21.0, "ev_departure_soc_met_pct": 100.0,
        "in_sample": {"co2_kg": 5.0, "co2_kg_per_year": 6.0, "ev_departure_soc_met_pct": 99.0}}
    assert json.loads(RunDir(tmp_path / "run").agent("ppo").metrics.read_text())["warm_start"]["co2_kg_per_year"] == 21
    assert results["sac"]["warm_start"]["not_evaluated"] == "the night was short of time"
    rows = _deployed({name: {**results[name], "kept": {"step": 800, "final_step": 1000, "why": "it did best",
                                                      "validation_co2_kg_per_year": 29_000.0}}
                      for name in ("ppo", "sac")})
    assert any(row.startswith("- **ppo**") and row.endswith("Warm start alone: 21 kg/yr; deployed: 30,000 kg/yr.")
               for row in rows)
    assert any(row.startswith("- **sac**") and "not evaluated (the night was short of time)" in row for row in rows)
    # A night's last stage that learnt on past its target says so; one that stopped short of it does not.
    past = {"past_target": {"target": 800, "up_to": 6_400}}

    def a2c_row(step: int, final_step: int) -> str:
        kept = {"step": step, "final_step": final_step, "why": "it did best", "validation_co2_kg_per_year": 29_000.0}
        rows = _deployed({"a2c": {**results["a2c"], **past, "kept": kept}})
        return next(row for row in rows if row.startswith("- **a2c**"))

    assert ("As the night's last stage it learnt on past its target of 800 steps, in time no stage after it could use "
            "(6,400 at most, schedule.last_stage_past_target).") in a2c_row(800, 1000)
    assert "past its target" not in a2c_row(700, 700)
