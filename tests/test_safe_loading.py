"""Loading a run folder runs no code: a payload planted in each file a resume loads does not run."""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from trainer.cli.main import cli

from .conftest import tiny_overrides


class Payload:
    """Unpickling this creates the marker file: the proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _train(run: Path, site_schema: Path, *extra: str):
    sets = tiny_overrides("sac.learning_starts=20", "schedule.eval_days=1")
    return CliRunner().invoke(cli, ["train", "sac", "--timesteps", "120", "--schema", str(site_schema), "--out",
                                    str(run), "--device", "cpu", *extra, *[a for o in sets for a in ("--set", o)]])


def _replant(checkpoint: Path, name: str, data: bytes) -> None:
    """Replace a file and rewrite the manifest to match, as someone editing the folder would."""
    (checkpoint / name).write_bytes(data)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, site_schema) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    result = _train(run, site_schema)
    assert result.exit_code == 0, result.output
    return run


@pytest.mark.parametrize("name", ["rng.json", "replay_buffer.npz"])
def test_a_payload_in_a_checkpoint_file_does_not_run(name, trained, site_schema, tmp_path):
    run = tmp_path / "run"
    import shutil

    shutil.copytree(trained, run)
    checkpoint = sorted((run / "sac" / "checkpoints").iterdir())[-1]
    marker = tmp_path / "payload-ran"
    if name == "rng.json":
        _replant(checkpoint, name, pickle.dumps(Payload(marker)))
    else:
        with open(checkpoint / "planted.npz", "wb") as handle:
            np.savez(handle, observations=np.array([Payload(marker)], dtype=object), pos=np.asarray(0),
                     full=np.asarray(False))
        _replant(checkpoint, name, (checkpoint / "planted.npz").read_bytes())
        (checkpoint / "planted.npz").unlink()
    result = _train(run, site_schema, "--resume", str(run), "--timesteps", "240")
    assert not marker.exists(), "the planted payload ran"
    assert "Traceback" not in result.output
    if name == "rng.json":  # that checkpoint is skipped; the run resumes from the one before
        assert result.exit_code == 0, result.output
        skipped = [json.loads(line) for line in (run / "logs" / "trainer.jsonl").read_text().splitlines()
                   if '"checkpoint skipped"' in line]
        assert skipped and skipped[0]["reason"].startswith("rng.json is not JSON")
    else:  # an object array is refused, never unpickled
        assert result.exit_code == 2, result.output
        assert "is not a replay buffer this product wrote" in result.output.strip().splitlines()[-1]


def _rezip(model: Path, name: str, data: bytes) -> None:
    """Replace one entry of a model.zip, as someone crafting the file would."""
    with zipfile.ZipFile(model) as archive:
        entries = {info.filename: archive.read(info) for info in archive.infolist()}
    entries[name] = data
    with zipfile.ZipFile(model, "w") as archive:
        for entry, content in entries.items():
            archive.writestr(entry, content)


def _pickled_entry(marker: Path) -> dict[str, str]:
    """A value as SB3 writes a non-JSON one: base64 of a (cloud)pickle."""
    return {":type:": "<class 'function'>", ":serialized:": base64.b64encode(pickle.dumps(Payload(marker))).decode()}


def _plant_in_data(model: Path, key: str, marker: Path) -> None:
    with zipfile.ZipFile(model) as archive:
        data = json.loads(archive.read("data"))
    data[key] = _pickled_entry(marker)
    _rezip(model, "data", json.dumps(data).encode())


def _plant_in_weights(model: Path, name: str, marker: Path) -> None:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"weights": Payload(marker)}, buffer)
    _rezip(model, name, buffer.getvalue())


# Where a crafted model.zip can hide a payload, and what loading it gives: a pickled value the product
# replaces with its own (the model loads and evaluates), a weights file torch refuses to unpickle, an
# entry the product never writes.
MODEL_PLANTS = {
    "policy_class": (lambda m, marker: _plant_in_data(m, "policy_class", marker), 0, None),
    "lr_schedule": (lambda m, marker: _plant_in_data(m, "lr_schedule", marker), 0, None),
    "observation_space": (lambda m, marker: _plant_in_data(m, "observation_space", marker), 1,
                          "its observation_space is not a box of one dimension"),
    "policy.pth": (lambda m, marker: _plant_in_weights(m, "policy.pth", marker), 1, "holds objects other than tensors"),
    "pytorch_variables.pth": (lambda m, marker: _plant_in_weights(m, "pytorch_variables.pth", marker), 1,
                              "holds objects other than tensors"),
    "unknown entry": (lambda m, marker: _plant_in_data(m, "env", marker), 1,
                      "holds entries this product never writes (env)"),
}


@pytest.mark.parametrize("where", list(MODEL_PLANTS))
def test_a_payload_in_a_model_does_not_run_whoever_owns_it(where, trained, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    marker = tmp_path / "payload-ran"
    plant, exit_code, message = MODEL_PLANTS[where]
    plant(run / "sac" / "model.zip", marker)
    result = CliRunner().invoke(cli, ["evaluate", str(run)])
    assert not marker.exists(), "the planted payload ran"
    assert "Traceback" not in result.output
    assert result.exit_code == exit_code, result.output
    if message:
        last = result.output.strip().splitlines()[-1]
        assert f"{run / 'sac' / 'model.zip'}" in last and message in last, last
        assert "trainer train sac --resume" in last  # the fix: its checkpoints are intact


def test_a_payload_in_a_checkpoint_model_does_not_run_on_resume(trained, site_schema, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    marker = tmp_path / "payload-ran"
    checkpoint = sorted((run / "sac" / "checkpoints").iterdir())[-1]
    _plant_in_weights(checkpoint / "model.zip", "policy.pth", marker)
    _replant(checkpoint, "model.zip", (checkpoint / "model.zip").read_bytes())
    result = _train(run, site_schema, "--resume", str(run), "--timesteps", "240")
    assert not marker.exists(), "the planted payload ran"
    assert "Traceback" not in result.output
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert str(checkpoint / "model.zip") in last and "holds objects other than tensors" in last, last


@pytest.fixture
def planted_module(tmp_path, monkeypatch) -> tuple[str, Path]:
    """An importable module that leaves a marker when imported: what a crafted schema's class would run."""
    marker = tmp_path / "module-ran"
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "planted_site.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
                                            "class Building:\n    pass\n")
    monkeypatch.syspath_prepend(str(folder))
    return "planted_site.Building", marker


@pytest.mark.parametrize("command", ["evaluate", "resume"])
def test_a_schema_a_run_points_to_runs_no_code(command, planted_module, trained, site_schema, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    site = run / "site"  # a crafted copy of its site inside the run folder, and run.json pointing to it
    shutil.copytree(site_schema.parent, site)
    data = json.loads((site / "schema.json").read_text())
    data["buildings"]["Building_1"]["type"] = planted_module[0]
    (site / "schema.json").write_text(json.dumps(data))
    (run / "run.json").write_text(json.dumps({"schema": str(site / "schema.json"), "label": "site"}))
    if command == "evaluate":
        result = CliRunner().invoke(cli, ["evaluate", str(run)])
    else:
        result = CliRunner().invoke(cli, ["train", "sac", "--resume", str(run), "--timesteps", "240"])
    assert not planted_module[1].exists(), "the schema's class was imported"
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"error: {site / 'schema.json'}: buildings.Building_1.type names the class 'planted_site.Building', which this "
        "product does not load (CityLearn would import and run any class a schema names); use a CityLearn class "
        "listed in docs/scenario.md ('Classes a schema may name') or remove the key")


def test_every_class_a_schema_may_name_is_a_citylearn_class():
    import importlib

    from trainer.site.datasets import SCHEMA_CLASSES

    for name in SCHEMA_CLASSES:
        module, _, attribute = name.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), attribute), type), name
