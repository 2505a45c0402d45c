"""A second run on the same data and settings copies the references' figures instead of evaluating them again."""

from __future__ import annotations

import json

from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.judge.report import write_report
from trainer.references.roster import REFERENCES
from trainer.run.folder import RunDir


def _baseline(week, out, *sets):
    options = [a for o in ("schedule.eval_days=2", *sets) for a in ("--set", o)]
    result = CliRunner().invoke(cli, ["baseline", "--schema", str(week), "--holdout", "none", "--out", str(out),
                                      *options])
    assert result.exit_code == 0, result.output
    return result.output, json.loads((out / "results.json").read_text())


def test_a_second_run_reuses_the_references_and_says_so(tmp_path, week, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr("trainer.references.reuse.cache_folder", lambda: cache)
    _, first = _baseline(week, tmp_path / "first")
    assert not any("reused_from" in m for m in first.values())
    output, second = _baseline(week, tmp_path / "second")
    for name in REFERENCES:  # the same figures, said to be the first run's, and the same timeseries
        assert second[name]["reused_from"] == str(tmp_path / "first")
        assert second[name]["co2_kg"] == first[name]["co2_kg"]
        assert (tmp_path / "second" / name / "eval_timeseries.csv").read_bytes() == \
            (tmp_path / "first" / name / "eval_timeseries.csv").read_bytes()
    assert output.count("reference reused") == len(REFERENCES) and "evaluating reference" not in output
    report = write_report(RunDir(tmp_path / "second")).read_text()
    assert f"figures of an earlier run on the same data and settings ({tmp_path / 'first'})" in report

    # Another setting the references read: evaluated again. One they do not read (an agent's): reused.
    _, changed = _baseline(week, tmp_path / "margin", "ev.margin_soc=0.02")
    assert not any("reused_from" in m for m in changed.values())
    _, agents_only = _baseline(week, tmp_path / "agents", "ppo.batch_size=32")
    assert all(agents_only[name].get("reused_from") for name in REFERENCES)
    # What the policies read: no reference acts on the observation, so none is evaluated again.
    _, policy_reads = _baseline(week, tmp_path / "reads", "observations.load_ago_hours=[24]",
                                "observations.carbon_ahead_hours=[1]")
    assert all(policy_reads[name].get("reused_from") for name in REFERENCES)

    # A damaged kept file is evaluated again, with a warning; turned off, nothing is reused.
    for kept in cache.glob("*/optimum/metrics.json"):
        kept.write_text('{"run": "x", "metri')
    output, damaged = _baseline(week, tmp_path / "damaged")
    assert "kept reference not reused" in output and "reused_from" not in damaged["optimum"]
    assert damaged["optimum"]["co2_kg"] == first["optimum"]["co2_kg"]  # the same figure, evaluated again
    _, off = _baseline(week, tmp_path / "off", "schedule.reuse_references=false")
    assert not any("reused_from" in m for m in off.values())
