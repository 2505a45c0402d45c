"""The atomic writer: whole files or none, readable by other users as the umask allows."""

from __future__ import annotations

import os
import stat

import pytest

from trainer.base.files import read_json, write_json_atomic, write_text_atomic


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_files_honour_the_umask(tmp_path, umask_022):
    write_text_atomic(tmp_path / "report.md", "# report\n")
    write_json_atomic(tmp_path / "results.json", {"a": 1})
    for name in ("report.md", "results.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    assert read_json(tmp_path / "results.json") == {"a": 1}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    write_json_atomic(target, {"kept": True})
    with pytest.raises(ValueError):
        write_json_atomic(target, {"nan": float("nan")})  # JSON has no NaN: refused before anything is written

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_json_atomic(target, {"new": True})
    monkeypatch.undo()
    assert read_json(target) == {"kept": True}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
