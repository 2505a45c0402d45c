"""`trainer benchmark`: figures are produced, finite, and summarised as medians and ratios.

Speed itself is not asserted here (no timed assertions): the recorded figures live in
docs/benchmarks.md with the machine they came from.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from trainer.benchmark import Sizes, Trial, format_report, plan_trials, summarise


def test_pairs_are_interleaved_and_the_sweep_doubles_up_to_four_per_core():
    trials = plan_trials(["sac", "ppo"], Sizes(repeats=2), cores=3)
    kinds = [(t.kind, t.agent) for t in trials]
    one_round = [("env_plain", None), ("env_product", None), ("plain", "sac"), ("product", "sac"),
                 ("plain", "ppo"), ("product", "ppo"), ("imitation", "sac"), ("imitation", "ppo")]
    assert kinds[:16] == one_round * 2
    assert [t.n_envs for t in trials[16:] if t.kind == "sweep"] == [1, 2, 4, 8]  # up to 4 per core
    assert [t.n_envs for t in trials if t.kind == "simulator"] == [1, 64, 256, 1024]


def test_summary_takes_medians_and_ratios():
    def trial(kind, agent, rate, rss, pss, updates=None):
        result = {"steps_per_s": rate, "peak_rss_mb": rss, "tree_pss_mb": pss, "n_envs": 4 if kind == "product" else 1}
        if updates is not None:
            result["updates_per_s"] = updates
        return Trial(kind, agent, result=result)

    trials = [
        trial("plain", "ppo", 100, 500, 480), trial("product", "ppo", 210, 490, 700),
        trial("plain", "ppo", 120, 500, 480), trial("product", "ppo", 230, 510, 720),
        trial("plain", "ppo", 500, 500, 480), trial("product", "ppo", 250, 500, 710),  # one noisy plain run
        trial("plain", "sac", 40, 520, 500, updates=45), trial("product", "sac", 60, 515, 650, updates=70),
        Trial("env_plain", result={"steps_per_s": 250}), Trial("env_product", result={"steps_per_s": 425}),
        Trial("sweep", n_envs=2, result={"steps_per_s": 600.04}),
        Trial("simulator", n_envs=64, result={"steps_per_s": 35790.44}),
        Trial("plain", "a2c", result={"error": "plain a2c failed (exit 1): boom"}),
    ]
    summary = summarise(trials)
    ppo = summary["agents"]["ppo"]
    assert (ppo["plain_steps_per_s"], ppo["product_steps_per_s"], ppo["ratio"]) == (120, 230, 1.92)
    assert (ppo["rss_ratio"], ppo["pss_ratio"], ppo["product_n_envs"], ppo["samples"]) == (1.0, 1.48, 4, 3)
    assert summary["agents"]["sac"]["updates_ratio"] == 1.56
    assert summary["env"] == {"plain_steps_per_s": 250, "product_steps_per_s": 425, "ratio": 1.7}
    assert summary["sweep"] == {"2": 600.0} and summary["simulator"] == {"64": 35790.4}
    assert summary["errors"] == ["plain a2c failed (exit 1): boom"]
    report = {"machine": {"cpu": "Test CPU", "cores": 2, "gpu": None, "torch": "x"}, "device": "cpu",
              "sizes": {"repeats": 3}, "seconds": 12.0, "summary": summary}
    table = format_report(report)
    assert "ppo training steps/s (4 envs)" in table and "1.92x" in table
    assert "error: plain a2c failed (exit 1): boom" in table
    assert "training simulator" in table and "64: 35,790" in table


@pytest.mark.parametrize(("gradient_steps", "train_freq", "n_envs", "plain"), [
    (1, 1, 16, {"gradient_steps": 1, "train_freq": 16}),   # the default: one update a step of all 16 sites
    (16, 1, 16, {"gradient_steps": 1, "train_freq": 1}),   # the equal hyperparameters: one a step
    (3, 2, 1, {"gradient_steps": 3, "train_freq": 2}),
    (4, 1, 8, {"gradient_steps": 1, "train_freq": 2}),
])
def test_the_plain_sac_makes_the_products_updates_per_environment_step(gradient_steps, train_freq, n_envs, plain,
                                                                      default_cfg):
    from trainer.benchmark.trial import same_updates_per_step

    section = default_cfg.sac.model_copy(update={"gradient_steps": gradient_steps, "train_freq": train_freq})
    assert same_updates_per_step(section, n_envs) == plain


@pytest.mark.slow
def test_quick_benchmark_produces_every_figure(tmp_path, week):
    out = tmp_path / "bench.json"
    # On a week of the built-in site (the training simulator reads a week, not a year), SAC and PPO: an off-policy
    # and an on-policy agent, each trial a process forked from one that imported torch, SB3 and CityLearn; A2C takes
    # PPO's path.
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "benchmark", "--quick", "--device", "cpu", "--sweep", "3", "--agents",
         "sac,ppo", "--schema", str(week), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["errors"] == []
    figures = [summary["env"]["plain_steps_per_s"], summary["env"]["product_steps_per_s"], *summary["sweep"].values(),
               *summary["simulator"].values()]
    assert set(summary["agents"]) == set(summary["imitation"]) == {"sac", "ppo"}  # the agents asked for
    for agent in ("sac", "ppo"):
        row = summary["agents"][agent]
        figures += [row["plain_steps_per_s"], row["product_steps_per_s"], row["ratio"], row["plain_peak_rss_mb"],
                    row["product_peak_rss_mb"], row["plain_tree_pss_mb"], row["product_tree_pss_mb"]]
    figures += [summary["agents"]["sac"]["plain_updates_per_s"], summary["agents"]["sac"]["product_updates_per_s"]]
    # The warm start's members a second, each warm-started agent's policy (SAC's: the ensemble's members).
    for agent in ("sac", "ppo"):
        members = summary["imitation"][agent]
        assert members["members_per_s"] == pytest.approx(1 / members["member_s"], rel=0.02)
        figures += [members["members_per_s"], members["update_s"]]
    assert all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in figures), figures
    assert set(summary["sweep"]) == {"3"} and set(summary["simulator"]) == {"1", "8"}  # --sweep 3, not quick's 1,2
    assert report["machine"]["cores"] >= 1 and report["device"] == "cpu"
    assert "environment steps/s" in proc.stdout and "sac gradient updates/s" in proc.stdout
    assert "members/s" in proc.stdout


@pytest.mark.parametrize("sweep", ["0", "1,x", "", "512"])
def test_a_sweep_that_is_not_counts_is_refused_before_measuring(sweep):
    from click.testing import CliRunner

    from trainer.cli.main import cli

    result = CliRunner().invoke(cli, ["benchmark", "--quick", "--sweep", sweep])
    assert result.exit_code == 2
    assert "expected comma-separated counts from 1 to 256, e.g. 1,4,16; got" in result.output


@pytest.mark.parametrize("forkserver", [True, False], ids=["forked", "fresh interpreter"])
def test_a_failed_trial_is_an_error_that_names_it_and_its_last_line(forkserver, tmp_path, week_site, monkeypatch):
    """A trial's own failure (here a config the trial cannot read) comes back as its error, whichever way the
    platform starts it (no forkserver on Windows: a fresh interpreter)."""
    import multiprocessing

    from trainer.benchmark import TrialKind
    from trainer.benchmark.measure import measure

    if not forkserver:
        monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    config = tmp_path / "config.json"
    config.write_text('{"seed": "not a number"}')
    result = measure(Trial(TrialKind.SIMULATOR, n_envs=1), config, week_site, "cpu", Sizes.quick())
    assert list(result) == ["error"]
    assert result["error"].startswith("simulator failed (exit 1): ")
    assert "errors.pydantic.dev" in result["error"]  # the last line of the trial's own traceback
