"""Writing files so that a crash, a kill or a full disk never leaves half a file behind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer.base.errors import TrainerError, UsageError


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
    "eval_timeseries.csv": "rebuild it with: trainer evaluate RUN_DIR",
    "eval_curve.csv": "delete it: the report then leaves that agent's learning curve out",
}


class DamagedFile(TrainerError):
    """A state file that is not the JSON this product wrote (truncated, edited, or from a full disk)."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        fix = FIXES.get(path.name, "restore it from a backup or delete it")
        what = "JSON nested deeper than Python reads" if isinstance(exc, RecursionError) else \
            f"{type(exc).__name__}: {exc}"
        raise DamagedFile(f"{path} is damaged ({what}); {fix}") from None


def cache_root() -> Path:
    """Where the product keeps what it measured or built once for this machine (the training simulator's sites,
    the night's calibration): ``$PVBESS_CACHE``, else the user's cache folder, under ``pvbess-trainer/``; never the
    folder a command was started in."""
    root = os.environ.get("PVBESS_CACHE") or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "pvbess-trainer"


def read_typed(path: Path, shape: Any, extra: dict[str, Any] | None = None) -> Any:
    """A state file read and validated as ``shape`` (a dataclass or a typing form pydantic reads), with ``extra``
    fields added; a file of the wrong shape is named with the first key that is wrong, what it should be, what it
    holds, and the fix (:data:`FIXES`)."""
    from pydantic import TypeAdapter, ValidationError  # lazy: pydantic's validators build on first use

    data = read_json(path)
    fix = FIXES.get(path.name, "restore it from a backup or delete it")
    if extra is not None and not isinstance(data, dict):
        raise DamagedFile(f"{path} is damaged: a JSON {type(data).__name__} where an object belongs; {fix}")
    try:
        return TypeAdapter(shape).validate_python({**data, **extra} if extra is not None else data)
    except ValidationError as exc:
        raise DamagedFile(f"{path} is damaged: {first_problem(exc)}; {fix}") from None


def first_problem(exc: Any) -> str:
    """A pydantic ValidationError's first error as a person reads it: where, what it should be, what it holds."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "the top level"
    if error["type"] == "missing":
        return f"{where} is missing"
    found = json.dumps(error.get("input"), default=str)[:60]
    return f"at {where}, {error['msg'][0].lower()}{error['msg'][1:]}, found {found}"


def refuse_links_out(folder: Path, what: str) -> None:
    """Refuse ``folder`` (``what`` it is, for the message) when it holds a symbolic link to anything outside it.

    A link planted there (a crafted tarball, a shared folder) would send the trainer's writes to a file
    elsewhere. Links that stay inside are harmless; ``folder`` itself may be a link (an outputs/ on
    another disk). Called before the first write.
    """
    if not folder.is_dir():
        return
    top = folder.resolve()
    for parent, dirs, files in os.walk(folder):  # never descends a linked folder
        for name in (*dirs, *files):
            path = Path(parent) / name
            if path.is_symlink() and not path.resolve().is_relative_to(top):
                raise UsageError(f"{path} is a symbolic link to {path.resolve()}, outside {what}; the trainer writes "
                                 f"only inside {folder}: remove the link (copy what it points to into the folder if "
                                 "it is needed)")


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
