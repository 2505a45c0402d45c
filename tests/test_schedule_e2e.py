"""The night end to end, as a user runs it (subprocesses): a timed quick schedule with its
report, and a stop in the middle of SAC followed by --resume to the same deadline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainer.judge.report import PLOTS

from .conftest import tiny_overrides
from .test_reliability import ROOT, events, trainer_with_fault

BUDGET = "schedule.quick_timesteps={sac: 150, ppo: 128, a2c: 96}"  # whole rollouts


def night_args(out, *extra: str) -> list[str]:
    sets = tiny_overrides(BUDGET, "schedule.eval_days=2", "schedule.curve_every_steps=50", "schedule.curve_eval_days=1",
                          "sac.checkpoint_freq_steps=50", f"output.root={out.parent / 'outputs'}", *extra)
    return ["schedule", "--quick", "--budget", "30m", "--out", str(out), "--device", "cpu",
            *[a for o in sets for a in ("--set", o)]]


@pytest.mark.slow
def test_timed_quick_schedule_writes_results_and_a_complete_report(tmp_path):
    out = tmp_path / "night"
    proc = subprocess.run([sys.executable, "-m", "trainer", *night_args(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("plan (") and any(" sac " in row and "train 150/150 steps" in row for row in lines[1:8])
    table = lines[lines.index(next(row for row in lines if row.startswith("agent "))):]
    assert [line.split()[0] for line in table[2:9]] == ["baseline", "rbc", "optimum", "planner", "sac", "ppo", "a2c"]
    results = json.loads((out / "results.json").read_text())
    assert [results[a]["timesteps"] for a in ("sac", "ppo", "a2c")] == [150, 128, 96]
    assert all(results[a]["ended_by"] == "target" for a in ("sac", "ppo", "a2c"))
    schedule = json.loads((out / "schedule.json").read_text())
    assert [s["status"] for s in schedule["stages"]] == ["done"] * 8
    assert all(s["planned_end"] <= schedule["deadline"] for s in schedule["stages"])
    for name in PLOTS:
        png = (out / "plots" / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, name
    report = (out / "report.md").read_text()
    assert report.startswith(f"# Night report: {out.name}")
    for name in PLOTS:
        assert f"(plots/{name})" in report
    assert "| sac | done |" in report
    assert "| report | this report |" in report and "| report | running |" not in report
    curve = (out / "sac" / "eval_curve.csv").read_text().splitlines()
    assert curve[0] == "step,co2_kg_per_year,ev_departure_soc_met_pct,seconds" and len(curve) >= 3


@pytest.mark.slow
def test_stop_mid_sac_then_resume_finishes_by_the_same_deadline(tmp_path):
    out = tmp_path / "night"
    stopped = trainer_with_fault(120, "SIGTERM", *night_args(out))
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert f"resume with: trainer night --resume {out}" in stopped.stderr.strip().splitlines()[-1]
    assert "note: `trainer schedule` runs the night now; its name is `trainer night`" in stopped.stderr
    before = json.loads((out / "schedule.json").read_text())
    assert [s["status"] for s in before["stages"]] == ["done"] * 4 + ["running", "pending", "pending", "pending"]
    stopped_span = before["stages"][4]["spans"]
    assert len(stopped_span) == 1 and stopped_span[0][1] is not None  # the stop signal ended its stretch

    # Other agents than the night's: refused before anything is touched (a resume runs its schedule's stages).
    other = subprocess.run([sys.executable, "-m", "trainer", "night", "--resume", str(out), "--quick", "--device",
                            "cpu", "--agents", "ppo"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert other.returncode == 2, other.stderr[-3000:]
    assert other.stderr.strip().splitlines()[-1] == (
        f"error: {out} is a night of sac, ppo, a2c, not --agents ppo: resume it without --agents, or start a new "
        "night (another --out) for ppo")
    assert json.loads((out / "schedule.json").read_text()) == before

    resumed = subprocess.run(
        [sys.executable, "-m", "trainer", "schedule", "--resume", str(out), "--quick", "--device", "cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = json.loads((out / "schedule.json").read_text())
    assert after["deadline"] == before["deadline"]
    assert [s["status"] for s in after["stages"]] == ["done"] * 8
    assert after["stages"][0]["actual_end"] == before["stages"][0]["actual_end"]  # finished stages not redone
    # The resumed stage: the stopped run's stretch kept, the resumed run's beside it.
    assert after["stages"][4]["spans"][0] == stopped_span[0] and len(after["stages"][4]["spans"]) == 2
    resume = next(e for e in events(out) if e["event"] == "resuming")
    # SIGTERM at step 120 saved the last consistent point, the rollout start at 119.
    assert resume["agent"] == "sac" and resume["step"] == 119
    assert json.loads((out / "results.json").read_text())["sac"]["timesteps"] == 150
    assert (out / "report.md").is_file()
