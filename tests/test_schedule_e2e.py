"""One end-to-end quick schedule with a reduced budget, as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import tiny_overrides


@pytest.mark.slow
def test_quick_schedule_end_to_end(tmp_path):
    out = tmp_path / "night"
    budget = "schedule.quick_timesteps={sac: 150, ppo: 128, a2c: 100}"
    sets = [a for o in tiny_overrides(budget, "schedule.eval_days=2") for a in ("--set", o)]
    proc = subprocess.run([sys.executable, "-m", "trainer", "schedule", "--quick", "--out", str(out),
                           "--device", "cpu", *sets], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert list(results) == ["baseline", "rbc", "sac", "ppo", "a2c"]
    assert [results[a]["timesteps"] for a in ("sac", "ppo", "a2c")] == [150, 128, 100]
    table = proc.stdout.splitlines()
    assert table[0].split()[:3] == ["agent", "CO2", "kg/yr"]
    assert [line.split()[0] for line in table[2:7]] == ["baseline", "rbc", "sac", "ppo", "a2c"]
    assert (out / "results.csv").read_text().splitlines()[0].startswith("agent,")
    log_events = [json.loads(line)["event"] for line in (out / "logs" / "trainer.jsonl").read_text().splitlines()]
    assert log_events.count("trained") == 3 and "built-in site generated" in log_events
