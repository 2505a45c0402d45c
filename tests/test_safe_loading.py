"""Loading a run folder runs no code: a payload planted in each file a resume loads does not run."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from trainer.cli import cli

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


def test_a_model_written_by_another_user_is_not_loaded(trained, site_schema, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    os.chown(run / "sac" / "model.zip", 65534, 65534)
    result = CliRunner().invoke(cli, ["evaluate", str(run)])
    assert result.exit_code == 2
    assert f"{run / 'sac' / 'model.zip'} belongs to another user (uid 65534)" in result.output
    assert "chown -R" in result.output
