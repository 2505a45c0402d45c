"""Sweeps over variants: a new producer of variants is one row, and its sweep runs, records and resumes as a seed
sweep does."""

from __future__ import annotations

import json

import pytest

from trainer.base.files import DamagedFile
from trainer.config.loading import load_config
from trainer.night import sweep
from trainer.night.sweep import PRODUCERS, SEEDS, Producer, Sweep, Variant, read_variants, run_sweep
from trainer.run.session import night_plan

from .conftest import tiny_overrides


def _gamma_variants(text: str) -> list[Variant]:
    """A stand-in for a hyperparameter search: one night per A2C discount factor of ``text``."""
    return [Variant(f"gamma-{value}", value, (f"a2c.gamma={value}",)) for value in text.split(",")]


GAMMAS = Producer("gammas", "one night per A2C discount factor", _gamma_variants,
                  lambda variants: "A2C's discount: " + ", ".join(v.label for v in variants))


def test_seed_variants_set_the_seed_and_name_their_folders():
    variants = SEEDS.variants("3,4")
    assert [v.name for v in variants] == ["seed-3", "seed-4"]
    assert [v.config(load_config()).seed for v in variants] == [3, 4]


@pytest.mark.slow
def test_a_new_producer_is_one_row_and_its_sweep_runs_records_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setitem(PRODUCERS, GAMMAS.name, GAMMAS)
    base = load_config(overrides=tiny_overrides("schedule.quick_timesteps={a2c: 200}", "schedule.quick_eval_days=1",
                                                "gpu.device=cpu"))
    cfg, agents, deadline = night_plan(base, True, "a2c", None, None)
    folder = tmp_path / "search"
    said: list[str] = []
    planned = Sweep(folder, GAMMAS, GAMMAS.variants("0.9,0.99"))
    summary, states = run_sweep(cfg, planned, None, None, agents, True, deadline, False, "local", {}, said.append)
    assert sorted(p.name for p in folder.iterdir()) == ["gamma-0.9", "gamma-0.99", "sweep.json", "sweep.md"]
    assert [json.loads((folder / v / "results.json").read_text())["a2c"]["timesteps"] > 0
            for v in ("gamma-0.9", "gamma-0.99")] == [True, True]
    assert "gamma: 0.9\n" in (folder / "gamma-0.9" / "config.yaml").read_text()
    assert summary.read_text().startswith("# A2C's discount: 0.9, 0.99") and "| a2c | 2 |" in summary.read_text()
    assert not any(state.failed() for state in states) and said[0].startswith("gammas 0.9: ")
    # sweep.json names the producer and each variant's overrides: a resume makes the same nights.
    producer, variants = read_variants(folder)
    assert producer is GAMMAS and variants == planned.variants
    assert "seeds" not in json.loads((folder / "sweep.json").read_text())


def test_a_sweep_json_of_the_version_before_resumes_as_a_seed_sweep(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({"seeds": [1, 2], "runs": ["seed-1", "seed-2"],
                                                     "backend": "local"}))
    producer, variants = read_variants(tmp_path)
    assert producer is SEEDS and [v.name for v in variants] == ["seed-1", "seed-2"]


def test_a_damaged_variant_list_is_named_with_the_fix(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({"producer": "nobody", "variants": [{"name": "a"}]}))
    with pytest.raises(DamagedFile, match=r"sweep.json: expected \{\"producer\": one of seeds, \"variants\".*"
                                          r"start the sweep again"):
        read_variants(tmp_path)
    assert sweep.is_sweep(tmp_path)
