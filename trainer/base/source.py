"""Which source of the product is running: its digest (what caches key on) and, from a git checkout, its commit.

A run folder records both in ``versions.json`` so that a figure can be traced to the code that produced it; the
digest alone says whether two runs ran the same program (an installed copy has no commit), the commit says which
one to check out to run it again.
"""

from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import trainer

PACKAGE = Path(trainer.__file__).resolve().parent
GIT_TIMEOUT_S = 10  # git answers in milliseconds; a hung network filesystem must not hold a night's start


@lru_cache(maxsize=1)
def program_digest() -> str:
    """The product's own source (and CityLearn's version): another version may judge differently, so every cache of
    figures or demonstrations is keyed by it. Computed once a process: the source does not change under it."""
    digest = hashlib.sha256(metadata.version("citylearn").encode())
    for source in sorted(PACKAGE.rglob("*.py")):
        digest.update(source.relative_to(PACKAGE).as_posix().encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _git(checkout: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):  # no git on this machine, or it hung: the digest still says it
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(checkout: Path | None = None) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the product's checkout, ``(None, None)`` where it is not one (an installed wheel, a
    container without ``.git``). ``dirty``: the product's tracked files differ from that commit."""
    checkout = PACKAGE.parent if checkout is None else checkout
    if not (checkout / ".git").exists():  # an install inside some other repository is not its checkout
        return None, None
    commit = _git(checkout, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    changes = _git(checkout, "status", "--porcelain", "--untracked-files=no", "--", PACKAGE.name)
    return commit, None if changes is None else bool(changes)


def source_record() -> dict[str, Any]:
    """``versions.json``'s ``trainer``: the product's version, source digest and, from a checkout, commit."""
    commit, dirty = git_state()
    return {"version": trainer.__version__, "source_sha256": program_digest(), "git_commit": commit,
            "git_dirty": dirty}
