"""Never deploy a regression: each agent deploys the best policy its stage saw on the validation window."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.learn.selection import BestPolicy, Candidate
from trainer.run.device import resolve_agent
from trainer.run.folder import AgentDir
from trainer.site import BUILT_IN, SCHEMA, Site, SiteKind

from .conftest import tiny_overrides

# The window's pick in the confirmation's tests: its step and figure as their `kept` says.
PICK = Candidate(4000, 44_210.4, 100.0)


class FakeModel:
    def __init__(self, name: str):
        self.name = name

    def save(self, path: str) -> None:
        Path(path).write_text(self.name)


def _unread(tmp_path):
    """A site whose schema these tests never read (the selection's figures are stubbed)."""
    return Site(SCHEMA, tmp_path / "schema.json", None, {})


def test_the_ev_target_comes_first_then_co2_and_ties_keep_the_earlier(tmp_path):
    best = BestPolicy(AgentDir(tmp_path), target_pct=98.0)
    assert best.offer(FakeModel("warm"), Candidate(0, 45_000.0, 100.0))
    assert not best.offer(FakeModel("cheaper but strands cars"), Candidate(1000, 40_000.0, 90.0))
    assert not best.offer(FakeModel("tie"), Candidate(2000, 45_000.0, 100.0))
    assert best.offer(FakeModel("better"), Candidate(3000, 44_000.0, 99.0))
    assert not best.offer(FakeModel("worse"), Candidate(4000, 47_000.0, 100.0))
    assert best.best == Candidate(3000, 44_000.0, 99.0) and best.last.step == 4000 and best.evaluated == 5
    assert best.model_path.read_text() == "better"
    # A resumed stage starts from what was kept: the selection goes on, it does not start again.
    resumed = BestPolicy(AgentDir(tmp_path), target_pct=98.0)
    assert resumed.best == best.best
    assert not resumed.offer(FakeModel("after the resume"), Candidate(5000, 44_500.0, 100.0))


def test_a_damaged_selection_starts_again_with_a_warning(tmp_path):
    from structlog.testing import capture_logs

    folder = tmp_path / "best"
    folder.mkdir()
    (folder / "model.zip").write_text("model")
    (folder / "best.json").write_text('{"step": "twelve"}')
    with capture_logs() as logged:
        assert BestPolicy(AgentDir(tmp_path), 98.0).best is None
    warning = next(e for e in logged if e["event"].startswith("the best policy so far is unreadable"))
    assert warning["path"] == str(folder / "best.json") and "ValueError" in warning["error"]


def test_the_window_keeps_its_best_and_the_runners_up_behind_it_for_the_years(tmp_path):
    from structlog.testing import capture_logs

    folder = AgentDir(tmp_path)
    best = BestPolicy(folder, target_pct=98.0, size=3)
    assert best.offer(FakeModel("warm"), Candidate(0, 45_000.0, 100.0))
    assert best.offer(FakeModel("1000"), Candidate(1000, 44_800.0, 100.0))  # the warm start is no runner-up
    assert not best.offer(FakeModel("2000"), Candidate(2000, 44_900.0, 100.0))
    assert best.offer(FakeModel("3000"), Candidate(3000, 44_700.0, 100.0))  # 1000 steps down to a runner-up
    assert not best.offer(FakeModel("4000"), Candidate(4000, 44_850.0, 100.0))  # 2000 let go
    assert not best.offer(FakeModel("5000"), Candidate(5000, 44_950.0, 100.0))  # behind both runners-up
    assert not best.offer(FakeModel("6000 strands cars"), Candidate(6000, 40_000.0, 90.0))
    shortlist = [(candidate.step, path.read_text()) for candidate, path in best.shortlist()]
    assert shortlist == [(3000, "3000"), (1000, "1000"), (4000, "4000")]
    assert sorted(path.name for path in folder.best.iterdir()) == [
        "best.json", "model.zip", "shortlist.json", "step_0000001000.zip", "step_0000004000.zip"]
    # A resumed stage reads them; a stage that keeps one policy (or a dataset's: train.shortlist is 1 there) does not.
    resumed = BestPolicy(folder, target_pct=98.0, size=3)
    assert resumed.shortlist() == best.shortlist()
    assert BestPolicy(folder, target_pct=98.0).shortlist() == [(best.best, folder.best_model)]
    # A curve point with a figure kept already, to the last digit, is the same policy (SAC's actor while its critics
    # learn alone): it takes no runner-up's place.
    same = BestPolicy(AgentDir(tmp_path / "same"), target_pct=98.0, size=4)
    for step, co2 in ((0, 45_000.0), (1000, 45_000.0), (2000, 44_800.0), (3000, 44_800.0), (4000, 44_900.0)):
        same.offer(FakeModel(str(step)), Candidate(step, co2, 100.0))
    assert [c.step for c, _ in same.shortlist()] == [2000, 4000]
    # A runner-up whose model is gone is dropped; a damaged list leaves the best to be judged alone, with a warning.
    folder.shortlisted(1000).unlink()
    assert [c.step for c, _ in BestPolicy(folder, target_pct=98.0, size=3).shortlist()] == [3000, 4000]
    folder.shortlist_state.write_text("[{\"step\": 4000}]")
    with capture_logs() as logged:
        assert [c.step for c, _ in BestPolicy(folder, target_pct=98.0, size=3).shortlist()] == [3000]
    warning = next(e for e in logged if e["event"].startswith("the runners-up so far are unreadable"))
    assert warning["path"] == str(folder.shortlist_state) and "KeyError" in warning["error"]


def test_the_shortlist_is_the_built_in_site_s_where_its_years_are_judged_on_the_simulator(tiny_cfg, built_in,
                                                                                       tmp_path):
    from trainer.learn.selection import shortlist_size

    assert tiny_cfg.train.shortlist == 10 and shortlist_size(tiny_cfg, built_in) == 10
    citylearn = tiny_cfg.model_copy(update={"train": tiny_cfg.train.model_copy(update={"choose_on": "citylearn"})})
    assert shortlist_size(citylearn, built_in) == 1  # each more policy a minute or two a year in CityLearn
    other = tmp_path / "dataset" / "schema.json"
    other.parent.mkdir()
    other.write_text(json.dumps({"simulation_start_time_step": 0, "simulation_end_time_step": 8759}))
    # A dataset's years are its validation part: the window itself has ranked its policies.
    assert shortlist_size(tiny_cfg, Site.load(other, SiteKind("one-period", "a dataset"))) == 1


def _train(tmp_path: Path, *extra: str) -> Path:
    run = tmp_path / "run"
    overrides = tiny_overrides("warm_start.epochs=3", "schedule.eval_days=3", "schedule.curve_every_steps=512",
                               "schedule.curve_eval_days=7", *extra)
    result = CliRunner().invoke(cli, ["train", "ppo", "--timesteps", "2048", "--out", str(run), "--device", "cpu",
                                      *[a for o in overrides for a in ("--set", o)]])
    assert result.exit_code == 0, result.output
    return run


def test_a_stage_that_unlearns_deploys_its_warm_start(tmp_path):
    # A learning rate of 0.5 wrecks the imitated policy within a few updates: the warm start stays the best.
    run = _train(tmp_path, "ppo.learning_rate=0.5")
    ppo = json.loads((run / "results.json").read_text())["ppo"]
    assert ppo["kept"]["step"] == 0 and ppo["kept"]["final_step"] == 2048 and ppo["kept"]["held_out"] is True
    # Its runners-up on the window (train.shortlist: the curve points after it, one a figure: a wrecked policy's
    # saturated actions can score alike at several points) were judged over the two held-out years too, and none
    # beat it there.
    points = [row.split(",") for row in (run / "ppo" / "eval_curve.csv").read_text().splitlines()[1:]]
    first_of_figure = {}
    for step, co2, *_ in points[1:]:
        if co2 != points[0][1]:  # the warm start's own figure: the same policy
            first_of_figure.setdefault(co2, int(step))
    runners_up = sorted(first_of_figure.values())
    assert runners_up and sorted(int(p.stem[5:]) for p in (run / "ppo" / "best").glob("step_*.zip")) == runners_up
    over = "over the first 3 days of the 2 held-out years together by more than 0.05% ("
    others = (f"the policy of step {runners_up[0]:,}" if len(runners_up) == 1 else
              f"any of the {len(runners_up)} best policies there after it")
    assert ppo["kept"]["why"].startswith(f"training never beat its warm start on the validation window, nor did "
                                         f"{others} {over}")
    if len(runners_up) > 1:  # each one's figures, in the window's order
        shortlist = ppo["kept"]["shortlist"]
        assert sorted(row["step"] for row in shortlist) == runners_up
        assert [row["validation_co2_kg_per_year"] for row in shortlist] == sorted(row["validation_co2_kg_per_year"]
                                                                                 for row in shortlist)
    assert ppo["kept"]["last_validation_co2_kg_per_year"] > ppo["kept"]["validation_co2_kg_per_year"]
    # The deployed policy is the warm start itself: the same figures to the last digit.
    assert ppo["warm_start"]["co2_kg"] == ppo["co2_kg"] and ppo["timesteps"] == 2048
    curve = (run / "ppo" / "eval_curve.csv").read_text().splitlines()
    assert curve[1].startswith("0,") and curve[-1].startswith("2048,")  # the warm start and the last policy
    assert (run / "validation-site" / "schema.json").is_file()  # a held-out draw of the built-in site
    references = json.loads((run / "validation-site" / "references.json").read_text())
    assert references["days"] == 7 and references["baseline"] > 0 and references["rbc"] > 0
    assert CliRunner().invoke(cli, ["report", str(run)]).exit_code == 0
    report = (run / "report.md").read_text()
    assert "- **ppo** deploys its warm start (step 0) of 2,048 steps" in report
    assert "(the validation window, in another year of the data: " in report and " t/yr, the last policy " in report
    assert (run / "plots" / "learning_curves.png").stat().st_size > 0


def test_a_flat_curve_ends_the_stage_early_and_a_resume_does_not_train_on(tmp_path):
    # The wrecked policy never beats its warm start (step 0): with a patience of 30 % of 2,048 steps (614), the
    # curve's point at step 1,024 is the first that far from the best, and the stage ends there.
    # Every curve point evaluated (curve_max_share 1: none skipped for the time it takes).
    run = _train(tmp_path, "ppo.learning_rate=0.5", "train.patience=0.3", "schedule.curve_max_share=1")
    ppo = json.loads((run / "results.json").read_text())["ppo"]
    steps = [int(line.split(",")[0]) for line in (run / "ppo" / "eval_curve.csv").read_text().splitlines()[1:]]
    assert steps == [0, 512, 1024]  # no evaluation after the one that found it flat
    assert ppo["ended_by"] == "flat curve" and 1024 < ppo["timesteps"] < 1024 + 128  # the step that returned False
    assert ppo["kept"]["step"] == 0 and ppo["kept"]["final_step"] == ppo["timesteps"]
    assert ppo["kept"]["ended_early"] == {"target": 2048, "patience_steps": 614}
    assert ppo["warm_start"]["co2_kg"] == ppo["co2_kg"]  # the warm start deployed, as a stage run to its end would
    events = [json.loads(line) for line in (run / "logs" / "trainer.jsonl").read_text().splitlines()]
    ended = next(e for e in events if e["event"].startswith("no better policy on the validation window"))
    assert (ended["step"], ended["best_step"], ended["target"]) == (1024, 0, 2048)
    assert "train.patience=0" in ended["fix"]
    assert CliRunner().invoke(cli, ["report", str(run)]).exit_code == 0
    report = (run / "report.md").read_text()
    assert (f"Its stage ended at step {ppo['timesteps']:,} of 2,048: no better policy on the window in 614 steps or "
            "more (train.patience).") in report
    # Resumed from its last checkpoint, the stage finds its curve as flat as it left it: it learns nothing more.
    result = CliRunner().invoke(cli, ["train", "ppo", "--resume", str(run), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    again = json.loads((run / "results.json").read_text())["ppo"]
    assert again["timesteps"] == ppo["timesteps"] and again["ended_by"] == "flat curve"
    assert [int(line.split(",")[0]) for line in (run / "ppo" / "eval_curve.csv").read_text().splitlines()[1:]] == steps
    # As a timed night's last stage (nothing after it could use the time), the same curve does not end it: resumed so,
    # it learns on to its target, evaluating the points it had skipped, and still deploys the best it saw.
    from trainer.night.stages import train_agent
    from trainer.run.session import reopen_run

    with reopen_run(run, "cpu") as ctx:
        last = train_agent(ctx, "ppo", 2048, resume=True, flat_ends=False)
    assert last["ended_by"] == "target" and 2048 <= last["timesteps"] < 2048 + 128 and "ended_early" not in last["kept"]
    assert last["kept"]["step"] == 0 and last["co2_kg"] == ppo["co2_kg"]
    points = [int(line.split(",")[0]) for line in (run / "ppo" / "eval_curve.csv").read_text().splitlines()[1:]]
    assert points[:3] == steps and 1024 < points[3] < points[-1] == last["timesteps"]
    events = [json.loads(line) for line in (run / "logs" / "trainer.jsonl").read_text().splitlines()]
    # The first run, the resume, and this one: only this one says its flat curve does not end it.
    assert [e.get("patience") for e in events if e["event"] == "training"] == [
        None, None, "off: the night's last stage learns to its slot's end or its target"]
    # Given time past its target (schedule.last_stage_past_target), it learns on to twice it, its learning rate held
    # at its end value (ppo.learning_rate_end of 0.5) past the target, and results.json says so.
    with reopen_run(run, "cpu") as ctx:
        on = train_agent(ctx, "ppo", 2048, resume=True, flat_ends=False, past_target=4096)
    assert on["ended_by"] == "target" and 4096 <= on["timesteps"] < 4096 + 128
    assert on["past_target"] == {"target": 2048, "up_to": 4096}
    progress = pd.read_csv(run / "ppo" / "progress.csv")
    past = progress[progress["time/total_timesteps"] > 2048 + 128]["train/learning_rate"].dropna()
    assert len(past) and all(rate == pytest.approx(0.5 * ctx.cfg.ppo.learning_rate_end) for rate in past)
    events = [json.loads(line) for line in (run / "logs" / "trainer.jsonl").read_text().splitlines()]
    assert "4,096 steps at most" in [e for e in events if e["event"] == "training"][-1]["past_target"]


def test_without_keep_best_the_last_policy_is_deployed(tmp_path):
    run = _train(tmp_path, "ppo.learning_rate=0.5", "train.keep_best=false")
    ppo = json.loads((run / "results.json").read_text())["ppo"]
    assert ppo["kept"] is None and not (run / "ppo" / "best").exists()
    assert ppo["warm_start"]["co2_kg"] != ppo["co2_kg"]


def test_a_damaged_validation_site_is_named_with_the_fix(tmp_path, built_in, tiny_cfg):
    import pytest

    from trainer.base.files import DamagedFile
    from trainer.learn.selection import validation_site
    from trainer.run.folder import RunContext, RunDir

    ctx = RunContext(tiny_cfg, RunDir(tmp_path / "run"), built_in, "cpu")
    site, held_out = validation_site(ctx)
    schema = site.schema
    assert held_out and schema == tmp_path / "run" / "validation-site" / "schema.json" and schema.is_file()
    assert (validation_site(ctx)[0].schema, validation_site(ctx)[1]) == (schema, True)  # built once
    schema.unlink()
    with pytest.raises(DamagedFile, match=r"validation-site holds no schema.json .*delete the folder"):
        validation_site(ctx)
    assert not list((tmp_path / "run").glob(".validation-site-*"))  # nothing left aside


def test_a_policy_must_beat_its_warm_start_over_two_held_out_years_too(monkeypatch, tiny_cfg, tmp_path):
    from trainer.learn import selection
    from trainer.run.folder import RunContext, RunDir

    class Env:
        def __init__(self, schema: Path) -> None:
            self.year = schema.parent.name

        def close(self) -> None:
            pass

    # Each policy's CO2 kg/yr and departures met over each held-out year.
    year: dict[tuple[str, str], tuple[float, float]] = {}
    years = [tmp_path / "first" / "schema.json", tmp_path / "second" / "schema.json"]
    monkeypatch.setattr(selection, "held_out_years", lambda ctx: years)
    monkeypatch.setattr(selection, "make_sb3_env", lambda cfg, schema, *args, **kwargs: Env(schema))
    monkeypatch.setattr(selection, "PolicyController", lambda agent, model: model)
    monkeypatch.setattr(selection, "run_episode", lambda model, env: dict(
        zip(("co2_kg_per_year", "ev_departure_soc_met_pct"), year[model.name, env.year])))
    # Confirmed in CityLearn (train.choose_on: citylearn), as a dataset the simulator does not step exactly is.
    cfg = tiny_cfg.model_copy(update={"schedule": tiny_cfg.schedule.model_copy(update={"eval_days": None}),
                                      "train": tiny_cfg.train.model_copy(update={"choose_on": "citylearn"})})
    ctx = RunContext(cfg, RunDir(tmp_path / "run"), replace(_unread(tmp_path), kind=BUILT_IN), "cpu")
    kept = {"step": 4000, "final_step": 9000, "why": "a later policy was worse on the validation window",
            "held_out": True, "validation_co2_kg_per_year": 44_210.4}
    chosen, warm = FakeModel("step 4000"), FakeModel("warm start")

    def confirm():
        return selection.confirm_over_the_years(ctx, "sac", [(PICK, chosen)], warm, kept, 98.0,
                                                warm_start_window=44_298.9)

    def pick(first: tuple[float, float], second: tuple[float, float]) -> None:
        year["step 4000", "first"], year["step 4000", "second"] = first, second

    year.update({("warm start", "first"): (44_480.0, 100.0), ("warm start", "second"): (44_100.0, 100.0)})
    # Better on the window and over the first year, worse over the two together (as seed 1's A2C measured): the
    # warm start is deployed, and the report says why.
    pick((44_300.0, 100.0), (44_350.0, 100.0))
    model, summary = confirm()
    assert model is warm and summary["step"] == 0 and summary["validation_co2_kg_per_year"] == 44_298.9
    assert summary["why"] == ("the policy of step 4,000 beat it on the validation window but not over the 2 whole "
                              "held-out years together by more than 0.05% (44.30 against 44.48 t/yr; 44.35 against "
                              "44.10 t/yr)")
    assert summary["years"] == [{"co2_kg_per_year": 44_300.0, "warm_start_co2_kg_per_year": 44_480.0},
                                {"co2_kg_per_year": 44_350.0, "warm_start_co2_kg_per_year": 44_100.0}]
    # A tie keeps the warm start, and so does a gain within the margin (0.05 %: 0.02 % here); cheaper CO2 that
    # strands cars does not beat it either.
    pick((44_480.0, 100.0), (44_100.0, 100.0))
    assert confirm()[0] is warm
    pick((44_460.0, 100.0), (44_100.0, 100.0))
    assert confirm()[0] is warm
    pick((43_000.0, 90.0), (43_000.0, 90.0))
    assert confirm()[0] is warm
    # Better over the two years together, if not over each (as seed 1's PPO measured): the window's pick stands.
    pick((44_300.0, 100.0), (44_150.0, 100.0))
    model, summary = confirm()
    assert model is chosen and summary["step"] == 4000 and summary["validation_co2_kg_per_year"] == 44_210.4
    assert summary["why"].endswith("and it beat its warm start over the 2 whole held-out years together by more "
                                   "than 0.05% (44.30 against 44.48 t/yr; 44.15 against 44.10 t/yr)")
    # A short evaluation (--quick) confirms over as many days of each year, and says so; a dataset's pick is
    # confirmed on its validation part, and said so.
    short = cfg.model_copy(update={"schedule": tiny_cfg.schedule})
    ctx = RunContext(short, RunDir(tmp_path / "run"), replace(_unread(tmp_path), kind=BUILT_IN), "cpu")
    summary = confirm()[1]
    assert "over the first 3 days of the 2 held-out years together by more than 0.05%" in summary["why"]
    assert summary["why_names_window"] is False  # the report names the window beside it
    ctx = RunContext(short, RunDir(tmp_path / "run"), _unread(tmp_path), "cpu")
    summary = confirm()[1]
    assert ("over the validation part (the last days of the part learnt from, which no stage trained on) by more "
            "than 0.05%") in summary["why"]
    assert summary["why_names_window"] is True


def test_the_years_choose_among_the_window_s_shortlist_and_the_warm_start_still_has_to_be_beaten(monkeypatch,
                                                                                                  tiny_cfg, tmp_path):
    from trainer.learn import selection
    from trainer.run.folder import RunContext, RunDir

    # Each policy's kg CO2 a year over the two held-out years on the training simulator: the window's pick, its
    # runners-up in the window's order, the warm start last.
    years: dict[str, tuple[float, float]] = {"warm start": (44_480.0, 44_100.0)}
    monkeypatch.setattr(selection, "held_out_years", lambda ctx: ["first", "second"])
    monkeypatch.setattr(selection, "chooses_on_simulator", lambda cfg, year: False)  # judged there as a short night
    monkeypatch.setattr(selection, "_on_the_simulator", lambda ctx, models, held_out: [
        [years[model.name][i] for model in models] for i in range(len(held_out))])
    cfg = tiny_cfg.model_copy(update={"schedule": tiny_cfg.schedule.model_copy(update={"eval_days": None})})
    ctx = RunContext(cfg, RunDir(tmp_path / "run"), replace(_unread(tmp_path), kind=BUILT_IN), "cpu")
    kept = {"step": 4000, "final_step": 9000, "why": "a later policy was worse on the validation window",
            "held_out": True, "validation_co2_kg_per_year": 44_210.4}
    shortlist = [(PICK, FakeModel("4000")), (Candidate(6000, 44_230.0, None), FakeModel("6000")),
                 (Candidate(2000, 44_260.0, None), FakeModel("2000"))]
    warm = FakeModel("warm start")

    def confirm(contenders=shortlist, summary=kept):
        return selection.confirm_over_the_years(ctx, "sac", contenders, warm, summary, 98.0, 44_298.9,
                                                on_simulator=True)

    # The window's second emits least over the years, and beats the warm start there: it is deployed.
    years.update({"4000": (44_300.0, 44_150.0), "6000": (44_200.0, 44_050.0), "2000": (44_400.0, 44_300.0)})
    model, summary = confirm()
    assert model.name == "6000" and summary["step"] == 6000 and summary["validation_co2_kg_per_year"] == 44_230.0
    assert summary["years"] == [{"co2_kg_per_year": 44_200.0, "warm_start_co2_kg_per_year": 44_480.0},
                                {"co2_kg_per_year": 44_050.0, "warm_start_co2_kg_per_year": 44_100.0}]
    assert summary["why"] == (
        "the validation window preferred step 4,000, but of the 3 best policies there the second emitted least over "
        "the 2 whole held-out years together and beat its warm start there by more than 0.05% (44.20 against 44.48 "
        "t/yr; 44.05 against 44.10 t/yr, on the training simulator: the night was short of time)")
    assert summary["shortlist"] == [
        {"step": 4000, "validation_co2_kg_per_year": 44_210.4, "years_co2_kg_per_year": [44_300.0, 44_150.0]},
        {"step": 6000, "validation_co2_kg_per_year": 44_230.0, "years_co2_kg_per_year": [44_200.0, 44_050.0]},
        {"step": 2000, "validation_co2_kg_per_year": 44_260.0, "years_co2_kg_per_year": [44_400.0, 44_300.0]}]
    # The window's own pick, the least there too: its reason, and that it was the least of the three.
    years["6000"] = (44_320.0, 44_200.0)
    model, summary = confirm()
    assert model.name == "4000" and summary["step"] == 4000
    assert summary["why"].startswith("a later policy was worse on the validation window, and it beat its warm start "
                                     "over the 2 whole held-out years together, the least there of the window's 3 "
                                     "best by more than 0.05%")
    # None of them beats the warm start by the margin: the warm start is deployed, as with the window's pick alone.
    years.update({"4000": (44_480.0, 44_100.0), "6000": (44_470.0, 44_090.0), "2000": (44_500.0, 44_200.0)})
    model, summary = confirm()
    assert model is warm and summary["step"] == 0 and summary["validation_co2_kg_per_year"] == 44_298.9
    assert summary["why"].startswith("the policy of step 4,000 beat it on the validation window, but none of the 3 "
                                     "best policies there did over the 2 whole held-out years together by more than "
                                     "0.05% (44.47 against 44.48 t/yr")
    # The window preferred the warm start: its runners-up are judged over the years all the same.
    start = {**kept, "step": 0, "why": "training never beat its warm start on the validation window",
             "validation_co2_kg_per_year": 44_298.9}
    model, summary = confirm(shortlist[1:], start)
    assert model is warm and summary["why"].startswith(
        "training never beat its warm start on the validation window, nor did any of the 2 best policies there after "
        "it over the 2 whole held-out years together by more than 0.05%")
    years["2000"] = (44_100.0, 43_900.0)
    model, summary = confirm(shortlist[1:], start)
    assert model.name == "2000" and summary["step"] == 2000 and summary["why"].startswith(
        "training never beat its warm start on the validation window, but of the 2 best policies there the second "
        "emitted least over the 2 whole held-out years together and beat its warm start there by more than 0.05%")


def test_the_held_out_years_are_two_draws_built_once_and_none_where_a_kind_draws_none(tiny_cfg, site_schema, built_in,
                                                                                     tmp_path):
    from trainer.learn.selection import held_out_years
    from trainer.run.folder import RunContext, RunDir

    ctx = RunContext(tiny_cfg, RunDir(tmp_path / "run"), built_in, "cpu")
    years = [year.schema for year in held_out_years(ctx)]
    assert years == [tmp_path / "run" / "validation-site" / "schema.json",
                     tmp_path / "run" / "validation-site-2" / "schema.json"]
    seeds = [json.loads(y.read_text())["pvbess_site"]["seed"] for y in years]
    own = json.loads(site_schema.read_text())["pvbess_site"]["seed"]
    assert seeds == [own + 1000, own + 1001]
    assert [year.schema for year in held_out_years(ctx)] == years  # built once
    other = tmp_path / "dataset" / "schema.json"
    other.parent.mkdir()
    other.write_text(json.dumps({"simulation_start_time_step": 0, "simulation_end_time_step": 8759}))
    # A dataset: its validation part, the last four weeks of what it learns from, whether or not its kind draws.
    one_period = SiteKind("one-period", "a dataset that draws no other year")
    (part,) = held_out_years(RunContext(tiny_cfg, RunDir(tmp_path / "run2"), Site.load(other, one_period), "cpu"))
    assert (part.start, part.end) == (8760 - 28 * 24, 8759)
    assert not (tmp_path / "run2" / "validation-site").exists()  # nothing drawn for it


def test_an_unreadable_warm_start_leaves_the_window_s_pick_deployed(monkeypatch, tiny_cfg, tmp_path):
    from types import SimpleNamespace

    from trainer.base.files import DamagedFile
    from trainer.night import stages
    from trainer.run.folder import RunContext, RunDir

    ctx = RunContext(tiny_cfg, RunDir(tmp_path / "run"), _unread(tmp_path), "cpu")
    folder = ctx.run.agent("sac")
    folder.root.mkdir(parents=True)
    folder.warm_start.write_text("not a model")
    best = BestPolicy(folder, target_pct=98.0)
    assert best.offer(FakeModel("pick"), Candidate(4000, 44_000.0, 100.0))

    def load(cfg, agent, path, device=None):
        if path == folder.warm_start:
            raise DamagedFile(f"{path} is not an SB3 model.zip")
        return "the window's pick"

    def confirm(*args, **kwargs):
        raise AssertionError("nothing to confirm against")

    monkeypatch.setattr(stages, "validation_site", lambda ctx: (tmp_path / "schema.json", True))
    monkeypatch.setattr(stages, "load_model", load)
    monkeypatch.setattr(stages, "confirm_over_the_years", confirm)
    sac = resolve_agent(tiny_cfg, "sac")
    model, kept = stages._best_policy(ctx, sac, SimpleNamespace(best=best, ended_flat=False),
                                      SimpleNamespace(num_timesteps=9000))
    assert model == "the window's pick" and kept["step"] == 4000 and "years" not in kept


def test_the_stage_offers_the_years_its_window_s_shortlist_without_the_warm_start_or_a_damaged_runner_up(
        monkeypatch, tiny_cfg, tmp_path):
    from types import SimpleNamespace

    from trainer.base.files import DamagedFile
    from trainer.night import stages
    from trainer.run.folder import RunContext, RunDir

    ctx = RunContext(tiny_cfg, RunDir(tmp_path / "run"), _unread(tmp_path), "cpu")
    folder = ctx.run.agent("sac")
    folder.root.mkdir(parents=True)
    folder.warm_start.write_text("warm start")
    best = BestPolicy(folder, target_pct=98.0, size=4)
    for step, co2 in ((0, 44_300.0), (2000, 44_250.0), (4000, 44_200.0), (6000, 44_260.0), (8000, 44_240.0)):
        best.offer(FakeModel(str(step)), Candidate(step, co2, 100.0))
    folder.shortlisted(6000).write_text("damaged")

    def load(cfg, agent, path, device=None):
        if path.read_text() == "damaged":
            raise DamagedFile(f"{path} is not an SB3 model.zip")
        return f"loaded {path.read_text()}"

    offered = {}

    def confirm(ctx, agent, contenders, warm, kept, *args, **kwargs):
        offered.update(contenders=[(c.step, m) for c, m in contenders], warm=warm)
        return contenders[0][1], kept

    monkeypatch.setattr(stages, "validation_site", lambda ctx: (tmp_path / "schema.json", True))
    monkeypatch.setattr(stages, "load_model", load)
    monkeypatch.setattr(stages, "confirm_over_the_years", confirm)
    stages._best_policy(ctx, resolve_agent(tiny_cfg, "sac"), SimpleNamespace(best=best, ended_flat=False),
                        SimpleNamespace(num_timesteps=9000))
    # The window's pick loaded once as the stage's model, then its runners-up; the damaged one is left out.
    assert offered == {"contenders": [(4000, "loaded 4000"), (8000, "loaded 8000"), (2000, "loaded 2000")],
                       "warm": "loaded warm start"}
    # A night short of time judges the window's pick alone, as its plan counted.
    stages._best_policy(ctx, resolve_agent(tiny_cfg, "sac"), SimpleNamespace(best=best, ended_flat=False),
                        SimpleNamespace(num_timesteps=9000), lean=True)
    assert offered["contenders"] == [(4000, "loaded 4000")]


def test_an_unreadable_warm_start_leaves_the_report_without_its_comparison(monkeypatch, tiny_cfg, tmp_path):
    from trainer.base.files import DamagedFile
    from trainer.night import stages
    from trainer.run.folder import RunContext, RunDir

    ctx = RunContext(tiny_cfg, RunDir(tmp_path / "run"), _unread(tmp_path), "cpu")
    folder = ctx.run.agent("sac")
    folder.root.mkdir(parents=True)
    folder.warm_start.write_text("not a model")

    def load(cfg, agent, path, device=None):
        raise DamagedFile(f"{path} is not an SB3 model.zip")

    def evaluate(*args, **kwargs):
        raise AssertionError("nothing to evaluate")

    monkeypatch.setattr(stages, "load_model", load)
    monkeypatch.setattr(stages, "_eval_env", evaluate)
    unreadable = {"unreadable": f"{folder.warm_start} is not an SB3 model.zip"}
    assert stages._evaluate_warm_start(ctx, resolve_agent(tiny_cfg, "sac")) == unreadable


def test_a_stage_its_time_slot_ends_offers_its_last_policy_too(monkeypatch, built_in, tmp_path):
    """The slot ends mid-rollout: the policy of the last checkpoint is evaluated and can be deployed."""
    from types import SimpleNamespace

    from trainer.config.loading import load_config
    from trainer.learn import guard
    from trainer.night.stages import train_agent
    from trainer.run.folder import RunContext, RunDir

    calls = [0]

    def monotonic() -> float:  # the guard's clock only: the slot is up at the 300th step of 4 sites (1,200)
        calls[0] += 1
        return 0.0 if calls[0] < 300 else float("inf")

    monkeypatch.setattr(guard, "time", SimpleNamespace(monotonic=monotonic))
    cfg = load_config(overrides=tiny_overrides("schedule.curve_every_steps=1000000", "ppo.n_envs=4"))
    metrics = train_agent(RunContext(cfg, RunDir(tmp_path / "run"), built_in, "cpu"), "ppo", 10_000,
                          time_limit_s=1e9)
    assert metrics["ended_by"] == "time slot" and metrics["timesteps"] == 9 * 128  # nine whole rollouts
    curve = (tmp_path / "run" / "ppo" / "eval_curve.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in curve[1:]] == ["0", "1152"]  # the first policy and the slot's last
    assert metrics["kept"]["final_step"] == 1152


def test_a_night_short_of_time_confirms_its_pick_on_the_simulator_as_citylearn_would(monkeypatch, tiny_cfg, week_site,
                                                                                      tmp_path):
    """The same two policies over the same held-out year: the training simulator's figures are CityLearn's (to a
    few hundredths of a percent on the built-in site), in seconds, and the summary says who judged."""
    from trainer.env.citylearn import make_sb3_env
    from trainer.learn import selection
    from trainer.learn.agents import build_model
    from trainer.run.folder import RunContext, RunDir

    # train.choose_on: citylearn, as on a dataset the simulator does not step exactly: CityLearn unless short of time
    cfg = tiny_cfg.model_copy(update={"schedule": tiny_cfg.schedule.model_copy(update={"eval_days": None}),
                                      "train": tiny_cfg.train.model_copy(update={"choose_on": "citylearn"})})
    env = make_sb3_env(cfg, week_site, "train", cfg.seed)
    chosen, warm = (build_model(cfg, "sac", env, "cpu", seed, 1000) for seed in (1, 2))
    monkeypatch.setattr(selection, "held_out_years", lambda ctx: [week_site])
    ctx = RunContext(cfg, RunDir(tmp_path / "run"), week_site, "cpu")
    kept = {"step": 4000, "final_step": 9000, "why": "the best on the validation window", "held_out": True,
            "validation_co2_kg_per_year": 44_210.4}
    in_citylearn = selection.confirm_over_the_years(ctx, "sac", [(PICK, chosen)], warm, kept, 98.0, None)[1]
    real_over_the_year = selection._over_the_year
    monkeypatch.setattr(selection, "_over_the_year", None)  # not CityLearn
    lean = selection.confirm_over_the_years(ctx, "sac", [(PICK, chosen)], warm, kept, 98.0, None, on_simulator=True)[1]
    assert in_citylearn["years_judged_by"] == "CityLearn" and lean["years_judged_by"] == "the training simulator"
    assert lean["why"].endswith("on the training simulator: the night was short of time)")
    for key in ("co2_kg_per_year", "warm_start_co2_kg_per_year"):
        assert lean["years"][0][key] == pytest.approx(in_citylearn["years"][0][key], rel=5e-4)
    assert lean["step"] == in_citylearn["step"]  # the same decision
    # The built-in site with train.choose_on: auto (the default) is judged on the simulator in any night: its
    # figures are CityLearn's to float roundings, and the summary says who judged, not that time was short.
    exact = RunContext(tiny_cfg.model_copy(update={"schedule": cfg.schedule}), RunDir(tmp_path / "run"), week_site,
                       "cpu")
    assert week_site.kind.simulated_exactly
    any_night = selection.confirm_over_the_years(exact, "sac", [(PICK, chosen)], warm, kept, 98.0, None)[1]
    assert any_night["years_judged_by"] == "the training simulator"
    assert any_night["why"].endswith("on the training simulator)")
    for key in ("co2_kg_per_year", "warm_start_co2_kg_per_year"):
        assert any_night["years"][0][key] == pytest.approx(in_citylearn["years"][0][key], rel=1e-6)
    # A site the simulator does not model is confirmed in CityLearn, as before.
    from trainer.sim.site import Unsupported

    def unsupported(*args):
        raise Unsupported("not modelled")

    monkeypatch.setattr(selection, "_over_the_year", real_over_the_year)
    monkeypatch.setattr("trainer.learn.warm_start.pick.co2_over_the_years", unsupported)
    assert selection.confirm_over_the_years(ctx, "sac", [(PICK, chosen)], warm, kept, 98.0, None,
                                            on_simulator=True)[1]["years_judged_by"] == "CityLearn"


def test_the_pick_s_later_held_out_years_are_judged_beside_this_process_to_the_same_figures(monkeypatch, tiny_cfg,
                                                                                             week_site, tmp_path):
    """Where a core is free, the later half of the held-out years run on the simulator in a process beside the
    stage's: the figures and the decision one process gives."""
    from trainer.base.beside import beside
    from trainer.env.citylearn import make_sb3_env
    from trainer.learn import selection
    from trainer.learn.agents import build_model
    from trainer.run.folder import RunContext, RunDir

    started = []

    def watched(*args, **kwargs):
        work = beside(*args, **kwargs)
        started.append(work.started)
        return work

    cfg = tiny_cfg.model_copy(update={"schedule": tiny_cfg.schedule.model_copy(update={"eval_days": None})})
    env = make_sb3_env(cfg, week_site, "train", cfg.seed)
    chosen, warm = (build_model(cfg, "sac", env, "cpu", seed, 1000) for seed in (1, 2))
    second = week_site.period(week_site.start, week_site.start + 95)
    monkeypatch.setattr(selection, "held_out_years", lambda ctx: [week_site, second])
    monkeypatch.setattr(selection, "beside", watched)
    monkeypatch.setattr(selection, "MIN_STEPS", 24)  # a few days are worth a process here
    ctx = RunContext(cfg, RunDir(tmp_path / "run"), week_site, "cpu")
    kept = {"step": 4000, "final_step": 9000, "why": "the best on the validation window", "held_out": True,
            "validation_co2_kg_per_year": 44_210.4}
    judged = {}
    for free in (2, 1):
        monkeypatch.setattr(selection, "free_cores_now", lambda free=free: free)
        judged[free] = selection.confirm_over_the_years(ctx, "sac", [(PICK, chosen)], warm, kept, 98.0, None)[1]
    assert started == [True, False]
    assert len(judged[2]["years"]) == 2 and judged[2]["years"][0] != judged[2]["years"][1]
    assert judged[2] == judged[1]


def test_the_learning_curve_on_the_built_in_site_is_judged_on_the_simulator_as_citylearn_would(tiny_cfg, built_in,
                                                                                              tmp_path):
    """train.choose_on: auto judges the curve's window on the training simulator where it steps the site as
    CityLearn does: the same CO2 (to float roundings), no EV column (the guard serves the cars there as in
    CityLearn); citylearn keeps CityLearn's."""
    from trainer.env.citylearn import make_sb3_env
    from trainer.learn.agents import build_model
    from trainer.learn.callbacks import EvalCurve
    from trainer.run.folder import RunContext, RunDir
    from trainer.sim.simulators import chooses_on_simulator
    from trainer.site.kinds import SCHEMA

    env = make_sb3_env(tiny_cfg, built_in, "train", tiny_cfg.seed)
    model = build_model(tiny_cfg, "sac", env, "cpu", 3, 1000)
    env.close()
    rows = {}
    for choose_on in ("auto", "citylearn"):
        cfg = tiny_cfg.model_copy(update={"train": tiny_cfg.train.model_copy(update={"choose_on": choose_on})})
        path = tmp_path / f"{choose_on}.csv"
        curve = EvalCurve(RunContext(cfg, RunDir(tmp_path / choose_on), built_in, "cpu"), "sac", path)
        curve.model, curve.num_timesteps = model, 0
        curve.evaluate()
        curve.close()
        assert curve._on_simulator is (choose_on == "auto")
        # A dataset the simulator does not step exactly (its cars' drift) keeps CityLearn whatever the setting.
        assert not chooses_on_simulator(cfg, replace(built_in, kind=SCHEMA))
        # Agents that train in CityLearn are chosen there: no site is read into the simulator for the choices alone.
        in_citylearn = cfg.model_copy(update={"train": cfg.train.model_copy(update={"simulator": "citylearn"})})
        assert not chooses_on_simulator(in_citylearn, built_in)
        rows[choose_on] = path.read_text().splitlines()[1].split(",")
    assert rows["auto"][2] == "" and rows["citylearn"][2] != ""
    assert float(rows["auto"][1]) == pytest.approx(float(rows["citylearn"][1]), rel=1e-6)


def test_a_warm_start_is_evaluated_once_a_run_whichever_stage_starts_from_it(monkeypatch, tiny_cfg, built_in,
                                                                             tmp_path):
    """A night's PPO and A2C start from the same imitation: the second stage's comparison is the first's, not two
    more years of CityLearn; a stage that deploys its warm start compares it with its own evaluation. Other weights
    are evaluated."""
    from trainer.env.citylearn import make_sb3_env
    from trainer.learn.agents import build_model
    from trainer.night import stages
    from trainer.run.folder import RunContext, RunDir

    ctx = RunContext(tiny_cfg, RunDir(tmp_path / "run"), built_in, "cpu")
    env = make_sb3_env(tiny_cfg, built_in, "train", tiny_cfg.seed)
    same, other = (build_model(tiny_cfg, "ppo", env, "cpu", seed, 1000) for seed in (1, 2))
    env.close()
    for agent, model in (("ppo", same), ("a2c", same), ("sac", other)):
        folder = ctx.run.agent(agent)
        folder.root.mkdir(parents=True)
        model.save(folder.warm_start)
    evaluated = []

    def judged(ctx, evaluate, timeseries=None, inside=None):
        evaluated.append(len(evaluated))
        return {"co2_kg": 10.0 + len(evaluated), "co2_kg_per_year": 20.0 + len(evaluated),
                "ev_departure_soc_met_pct": 100.0}

    monkeypatch.setattr(stages, "judged", judged)
    monkeypatch.setattr(stages, "load_model", lambda cfg, agent, path, device=None: type(same).load(path))
    first = stages._evaluate_warm_start(ctx, resolve_agent(tiny_cfg, "ppo"))
    assert stages._evaluate_warm_start(ctx, resolve_agent(tiny_cfg, "a2c")) == first and len(evaluated) == 1
    assert stages._evaluate_warm_start(ctx, resolve_agent(tiny_cfg, "sac")) != first and len(evaluated) == 2
    # Another run's stage of the same weights evaluates its own.
    again = RunContext(tiny_cfg, RunDir(tmp_path / "other"), built_in, "cpu")
    for agent, model in (("ppo", same), ("sac", other)):
        folder = again.run.agent(agent)
        folder.root.mkdir(parents=True)
        model.save(folder.warm_start)
    stages._evaluate_warm_start(again, resolve_agent(tiny_cfg, "ppo"))
    assert len(evaluated) == 3
    # A stage that deploys its warm start: the deployed policy's figures, no other evaluation.
    deployed = {"co2_kg": 1.0, "co2_kg_per_year": 2.0, "ev_departure_soc_met_pct": 99.0,
                "policy_digest": stages.weights_digest(other.policy, float(other.gamma), machine=False)[:16]}
    assert stages._evaluate_warm_start(again, resolve_agent(tiny_cfg, "sac"), deployed) == {
        "co2_kg": 1.0, "co2_kg_per_year": 2.0, "ev_departure_soc_met_pct": 99.0}
    assert len(evaluated) == 3


def test_the_confirmation_s_figures_read_apart_where_they_differ():
    """A 0.09 % margin on a building's 1.48 t a year read "1.48 against 1.48 t/yr"; decimals are added until the two
    figures read apart (at most 4), and larger figures keep 2."""
    from trainer.learn.selection import _versus

    assert _versus(1478.7, 1480.1) == "1.479 against 1.480 t/yr"
    assert _versus(44_300.0, 44_480.0) == "44.30 against 44.48 t/yr"
    assert _versus(1000.0, 1000.0) == "1.0000 against 1.0000 t/yr"
