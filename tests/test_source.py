"""versions.json says which source produced a run: its digest always, its commit from a git checkout."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from trainer.base.source import git_state, program_digest, source_record

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(folder, *args):
    subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_a_folder_that_is_not_a_checkout_has_no_commit(tmp_path):
    (tmp_path / "trainer").mkdir()
    assert git_state(tmp_path) == (None, None)


@needs_git
def test_a_checkout_gives_its_commit_and_whether_the_product_s_files_differ_from_it(tmp_path):
    (tmp_path / "trainer").mkdir()
    source = tmp_path / "trainer" / "a.py"
    source.write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert git_state(tmp_path) == (head, False)
    (tmp_path / "notes.txt").write_text("untracked, outside the product\n")
    assert git_state(tmp_path) == (head, False)
    source.write_text("x = 2\n")
    assert git_state(tmp_path) == (head, True)


def test_the_record_carries_the_digest_the_caches_key_on():
    record = source_record()
    assert record["source_sha256"] == program_digest()
    assert len(record["source_sha256"]) == 64
    assert set(record) == {"version", "source_sha256", "git_commit", "git_dirty"}
