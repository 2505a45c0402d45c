"""The roster is where an agent is registered: a fourth agent is its section, its row and its YAML block.

TD3 (stable-baselines3's) is added here as a plugin would add it, before the config is built, and trained
in a quick night end to end: the night, its plan, the RAM preflight, checkpoints, the learning curve and
the report all take it from its row.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import yaml

from trainer.config.agents import OffPolicyConfig
from trainer.config.roster import AGENTS, ROSTER, agent_spec, off_policy_agents
from trainer.learn.memory import Shapes, batch_bytes

from .conftest import tiny_overrides
from .test_reliability import ROOT

# What a developer adding TD3 writes: its section (agent_config.py) and its row (roster.py), and, below, its YAML.
TD3_PLUGIN = textwrap.dedent('''
    import sys

    from trainer.config import roster
    from trainer.config.agents import OffPolicyConfig
    from trainer.config.section import doc


    class Td3Config(OffPolicyConfig):
        policy_delay: int = doc("Critic updates per actor update.", ge=1)

        def sb3_kwargs(self, n_envs=1):
            return {**super().sb3_kwargs(n_envs), "policy_delay": self.policy_delay}


    roster.ROSTER["td3"] = roster.AgentSpec(
        "td3", Td3Config, "stable_baselines3:TD3", "#8c564b", "stable_baselines3:TD3", critics=4, actors=2,
        warm_start=False,  # a deterministic actor: the warm start's imitation is for stochastic ones
        saved_keys=frozenset({"policy_delay", "target_noise_clip", "target_policy_noise", "actor_batch_norm_stats",
                              "actor_batch_norm_stats_target", "critic_batch_norm_stats",
                              "critic_batch_norm_stats_target"}))
    roster.AGENTS = tuple(roster.ROSTER)

    from trainer.cli.main import main

    sys.exit(main())
''')
TD3_YAML = {
    "td3": {"device": None, "learning_rate": 0.001, "learning_rate_end": 1.0, "gamma": 0.99, "net_arch": [64, 64],
            "timesteps": 400, "episodes": None, "checkpoint_freq_steps": 100, "log_interval": 1, "batch_size": 32,
            "buffer_size": 2000, "gradient_steps": 1, "train_freq": 1, "learning_starts": 50, "tau": 0.005,
            "n_envs": 2, "policy_delay": 2},
    "schedule": {"agents": ["td3"], "quick_timesteps": {"td3": 120}},
}


def test_every_question_about_an_agent_is_its_row():
    assert AGENTS == ("sac", "ppo", "a2c")
    assert off_policy_agents() == ["sac"] and isinstance(agent_spec("sac").section(**_sac_fields()), OffPolicyConfig)
    shapes = Shapes(48, 5, (256, 256))
    # The batch back-off counts the networks a gradient step runs: SAC's five against PPO's two.
    assert batch_bytes("sac", 256, shapes) > 2 * batch_bytes("ppo", 256, shapes)
    assert {spec.colour for spec in ROSTER.values()} == {"#1f77b4", "#ff7f0e", "#2ca02c"}


def _sac_fields():
    from trainer.config.loading import load_config

    return load_config().sac.model_dump()


@pytest.mark.slow
def test_a_fourth_agent_trains_in_a_quick_night_from_its_row_alone(tmp_path):
    plugin = tmp_path / "td3_plugin.py"
    plugin.write_text(TD3_PLUGIN)
    config = tmp_path / "td3.yaml"
    config.write_text(yaml.safe_dump(TD3_YAML))
    out = tmp_path / "night"
    sets = tiny_overrides("schedule.eval_days=2", "schedule.curve_every_steps=40", f"output.root={tmp_path / 'o'}",
                          "warm_start.epochs=30")  # on, for the other agents: TD3's row turns it off for TD3
    proc = subprocess.run([sys.executable, str(plugin), "night", "--quick", "--config", str(config), "--out", str(out),
                           "--device", "cpu", *[a for s in sets for a in ("--set", s)]],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"baseline", "rbc", "optimum", "planner", "td3"}
    td3 = results["td3"]
    assert td3["timesteps"] == 120 and td3["ended_by"] == "target" and td3["co2_kg_per_year"] > 0
    assert (out / "td3" / "model.zip").is_file()
    assert list((out / "td3" / "checkpoints").glob("step_*/replay_buffer.npz"))  # an off-policy agent's buffer
    report = (out / "report.md").read_text()
    assert "td3" in report and (out / "plots" / "learning_curves.png").is_file()
    log = (out / "logs" / "trainer.jsonl").read_text()
    assert "warm start skipped" in log  # its row says its policy cannot imitate
