"""Writing files so that a crash, a kill or a full disk never leaves half a file behind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer.errors import TrainerError


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, fsync, then rename over ``path``.

    The file is created with the process's umask (0644 typically), so other users and the
    host of a container can read the morning report.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


# What to do about a damaged state file, by its name.
FIXES = {
    "results.json": "rebuild it from the saved models with: trainer evaluate RUN_DIR",
    "schedule.json": "move it away to plan the night again (finished agents keep their models and checkpoints)",
    "run.json": "delete it and pass --schema or --dataset again",
    "metrics.json": "rebuild it with: trainer evaluate RUN_DIR",
}


class DamagedFile(TrainerError):
    """A state file that is not the JSON this product wrote (truncated, edited, or from a full disk)."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        fix = FIXES.get(path.name, "restore it from a backup or delete it")
        raise DamagedFile(f"{path} is damaged ({type(exc).__name__}: {exc}); {fix}") from None


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (Windows cannot open a folder to fsync it)."""
    if os.name == "nt":
        return
    fsync_file(path)
