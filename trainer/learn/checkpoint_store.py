"""Checkpoints that survive a crash at any instant.

A checkpoint is a folder ``checkpoints/step_<N>/`` holding

- ``model.zip``: the SB3 model with its optimizers (SB3's own format, loadable by SB3),
- ``replay_buffer.npz``: SAC's replay buffer, as plain arrays,
- ``rng.json``: Python, NumPy, torch, CUDA and action-space generator states,
- ``state.json``: step and episode counters, current batch and rollout sizes, learning
  rate, retry counters and the resolved config with its hash,
- ``manifest.json``: size and SHA-256 of each file above, written last.

Each file is written to a temporary name in the same folder, flushed, fsynced and renamed
into place, so a file is either whole or absent; the manifest is written only once every
file is in place, so a checkpoint without a valid manifest is incomplete and ignored.
Older checkpoints are pruned only after a new one is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.base import logs
from trainer.base.errors import UsageError
from trainer.base.files import fsync_dir, fsync_file, write_bytes_atomic

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

MANIFEST = "manifest.json"
MODEL = "model.zip"
# No pickle in a checkpoint: loading a folder someone else wrote must not run their code.
REPLAY = "replay_buffer.npz"
RNG = "rng.json"
STATE = "state.json"
PREFIX = "step_"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def model(self) -> Path:
        return self.path / MODEL

    @property
    def replay_buffer(self) -> Path | None:
        path = self.path / REPLAY
        return path if path.is_file() else None

    def rng(self) -> dict[str, Any]:
        return json.loads((self.path / RNG).read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- RNG


def capture_rng(model: BaseAlgorithm) -> dict[str, Any]:
    """Every generator's state as plain JSON values (lists of integers), so it reloads without pickle."""
    import torch  # heavy: only training needs it

    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(words), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
        "cuda": [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else None,
        "action_space": None,
    }
    generator = getattr(model.action_space, "_np_random", None)
    if generator is not None:
        state["action_space"] = generator.bit_generator.state  # a dict of strings and integers
    return state


def restore_rng(model: BaseAlgorithm, state: dict[str, Any]) -> None:
    import torch  # lazy: torch takes seconds to import

    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])
    if state.get("action_space") is not None:
        model.action_space.np_random.bit_generator.state = state["action_space"]


# ----------------------------------------------------------------------------- the replay buffer

REPLAY_ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def save_replay(model: BaseAlgorithm, path: Path) -> None:
    """SAC's replay buffer as plain arrays (npz), not SB3's pickle."""
    buffer = model.replay_buffer
    arrays = {name: getattr(buffer, name) for name in REPLAY_ARRAYS if getattr(buffer, name, None) is not None}
    with open(path, "wb") as handle:
        np.savez(handle, pos=np.asarray(buffer.pos), full=np.asarray(buffer.full), **arrays)
        handle.flush()
        os.fsync(handle.fileno())


def load_replay(model: BaseAlgorithm, path: Path) -> None:
    """Fill the model's replay buffer from :func:`save_replay`'s arrays; no object arrays are accepted."""
    buffer = model.replay_buffer
    try:
        with np.load(path, allow_pickle=False) as data:
            for name in REPLAY_ARRAYS:
                if name in data.files:
                    current = getattr(buffer, name)
                    if current.shape != data[name].shape:
                        raise ValueError(f"{name} has shape {data[name].shape}, the buffer {current.shape}")
                    setattr(buffer, name, data[name].astype(current.dtype, copy=True))
            buffer.pos, buffer.full = int(data["pos"]), bool(data["full"])
    except (ValueError, KeyError, OSError) as exc:  # object arrays (pickle) are refused, never loaded
        raise UsageError(f"{path} is not a replay buffer this product wrote ({exc}); it was not loaded: delete "
                         "that checkpoint folder to resume from the one before") from None


# ----------------------------------------------------------------------------- files


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _place(tmp: Path, final: Path) -> None:
    fsync_file(tmp)
    os.replace(tmp, final)


class CheckpointStore:
    """The checkpoints of one training stage."""

    def __init__(self, folder: Path, keep: int):
        self.folder = folder
        self.keep = keep
        self.failures = 0

    def save(
        self, model: BaseAlgorithm, state: dict[str, Any], rng: dict[str, Any], with_replay_buffer: bool
    ) -> Checkpoint | None:
        """Write a checkpoint; on a disk error, log it, count it and return None (training goes on)."""
        step = int(state["step"])
        path = self.folder / f"{PREFIX}{step:010d}"
        start = time.perf_counter()
        try:
            if path.exists():  # a stale or partial one for the same step: replace it
                shutil.rmtree(path)
            path.mkdir(parents=True)
            tmp_model = path / f".tmp-{MODEL}"  # SB3 adds ".zip" to any other suffix
            model.save(str(tmp_model))
            _place(tmp_model, path / MODEL)
            if with_replay_buffer:
                tmp_replay = path / f".tmp-{REPLAY}"
                save_replay(model, tmp_replay)
                os.replace(tmp_replay, path / REPLAY)
            write_bytes_atomic(path / RNG, json.dumps(rng).encode())
            write_bytes_atomic(path / STATE, json.dumps(state, indent=2).encode())
            files = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
            manifest = {
                "step": step,
                "files": {n: {"bytes": (path / n).stat().st_size, "sha256": _sha256(path / n)} for n in files},
            }
            write_bytes_atomic(path / MANIFEST, json.dumps(manifest, indent=2).encode())
            fsync_dir(path)
            fsync_dir(self.folder)
        except OSError as exc:
            self.failures += 1
            free = _free_bytes(self.folder)
            logs.get().error(
                "checkpoint write failed",
                path=str(path),
                error=str(exc),
                free_bytes=free,
                failures=self.failures,
                hint="free disk space or make the run folder writable; training goes on",
            )
            shutil.rmtree(path, ignore_errors=True)
            return None
        size = sum(f.stat().st_size for f in path.iterdir())
        logs.get().info(
            "checkpoint saved", step=step, path=str(path), seconds=round(time.perf_counter() - start, 3), bytes=size
        )
        self._prune()
        return Checkpoint(path, state)

    def _prune(self) -> None:
        complete = [c for c in self._candidates() if (c / MANIFEST).is_file()]
        for old in complete[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def _candidates(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if p.is_dir() and p.name.startswith(PREFIX))

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that passes its checksums; broken newer ones are reported and skipped."""
        found, broken = self.survey()
        for path, problem in broken:
            logs.get().warning("checkpoint skipped", path=str(path), reason=problem, action="using the one before")
        return found

    def survey(self) -> tuple[Checkpoint | None, list[tuple[Path, str]]]:
        """The newest checkpoint that passes its checksums and, newest first, the broken ones newer than it (all of
        them where none passes), with what is wrong with each; logs nothing (a refusal names them itself)."""
        broken = []
        for path in reversed(self._candidates()):
            problem = verify(path)
            if problem is None:
                return Checkpoint(path, json.loads((path / STATE).read_text())), broken
            broken.append((path, problem))
        return None, broken


def verify(path: Path) -> str | None:
    """None if the checkpoint is complete and intact, else what is wrong with it."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return "incomplete (no manifest)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = {str(name): (int(e["bytes"]), str(e["sha256"])) for name, e in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # never raises: skip this one
        return f"unreadable manifest: {type(exc).__name__}: {exc}"
    if STATE not in files:
        return f"the manifest lists no {STATE}"
    if RNG not in files or any(name.endswith(".pkl") for name in files):
        return f"written by an older version (pickle files, no {RNG}): it cannot be loaded safely"
    for name, (size, digest) in files.items():
        file = path / name
        if "/" in name or "\\" in name or not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} is truncated ({file.stat().st_size} of {size} bytes)"
        if _sha256(file) != digest:
            return f"{name} fails its checksum"
    for name in (STATE, RNG):
        try:
            data = json.loads((path / name).read_text(encoding="utf-8"))
        except ValueError as exc:
            return f"{name} is not JSON: {exc}"
        if name == STATE and not (isinstance(data, dict) and type(data.get("step")) is int and data["step"] >= 0
                                  and isinstance(data.get("config", {}), dict)):
            return f"{STATE} is not a checkpoint's state (an object with a whole-number step and a config object)"
    return None


def _free_bytes(folder: Path) -> int | None:
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return None
