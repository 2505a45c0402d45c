"""Imitations kept in the run folder (``<run>/imitations/``), so that another process reuses them.

A night's warm start imitates its teacher's ten members once in a process, and the student of their mean once a
policy (trainer.learn.warm_start). A process that did not imitate them could not reuse them: each stage on Ray (a
worker of its own) imitated the ten members again, most of SAC's 40-minute warm start on 2 cores, and a night killed
during the warm start began it again on ``--resume``. Here each imitation is a file named by its key
(:func:`.cloning.imitation_key`, a digest of everything the imitation reads), holding the weights it
ended with and its errors, so any process with the same inputs loads it instead.

While a process imitates a key it holds an OS lock on it (released by the OS when the process dies, as the run
folder's own lock): stages side by side split an ensemble's members between them rather than each imitating all
of them, and one that needs an imitation another process holds waits for it rather than doing it twice.

A file is read with torch's ``weights_only`` (tensors and numbers: nothing in a run folder is unpickled, as
trainer.learn.model_file). A damaged one is set aside with a warning and imitated again; one that cannot be written
(a full disk) costs the next process an imitation, nothing more.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from trainer.base import logs
from trainer.base.files import write_bytes_atomic
from trainer.base.signals import STOP

SUFFIX = ".pt"  # an imitation's file: its key, then this
FORMAT = 1  # of the file's contents: another is imitated again, not misread
WAIT_CHECK_S = 1.0  # how often a process waiting for another's imitation looks for a stop request

Weights = dict[str, Any]
Errors = tuple[float, float]


class SavedImitations:
    """The imitations under ``folder``, one file a key (see the module's doc)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{SUFFIX}"

    def holds_any(self) -> bool:
        """Whether a warm start kept an imitation here: a stage stopped in its warm start goes on from them."""
        return any(self.folder.glob(f"*{SUFFIX}"))

    def load(self, key: str, like: Weights | None = None) -> tuple[Weights, Errors] | None:
        """The weights (on the CPU) and errors saved under ``key``; None where there are none or they are damaged: not
        finite, or (given the policy's own, ``like``) of other names or shapes."""
        import torch  # lazy: torch takes seconds to import

        path = self.path(key)
        if not path.is_file():
            return None
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
            if data["format"] != FORMAT:
                raise ValueError(f"format {data['format']}, this version reads {FORMAT}")
            weights, errors = dict(data["weights"]), tuple(float(e) for e in data["errors"])
            if len(errors) != 2 or not all(isinstance(t, torch.Tensor) for t in weights.values()):
                raise ValueError("not an imitation's weights and two errors")
            if not all(bool(torch.isfinite(t).all()) for t in weights.values() if t.is_floating_point()):
                raise ValueError("weights that are not finite")
            if like is not None and {k: tuple(t.shape) for k, t in weights.items()} != {
                    k: tuple(t.shape) for k, t in like.items()}:
                raise ValueError("weights of another network's shape")
        except Exception as exc:  # any damage has one remedy: imitate again
            logs.get().warning("a saved imitation is unreadable: imitating it again", path=str(path),
                               error=f"{type(exc).__name__}: {exc}")
            self._set_aside(path)
            return None
        return weights, (errors[0], errors[1])

    def save(self, key: str, weights: Weights, errors: Errors) -> None:
        """Keep an imitation for other processes (atomically: a reader sees all of it or nothing)."""
        import torch  # lazy: torch takes seconds to import

        buffer = io.BytesIO()
        torch.save({"format": FORMAT, "weights": {name: t.detach().cpu() for name, t in weights.items()},
                    "errors": [float(errors[0]), float(errors[1])]}, buffer)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(self.path(key), buffer.getvalue())
        except OSError as exc:
            logs.get().warning("an imitation could not be kept in the run folder: another process imitates it again",
                               path=str(self.path(key)), error=exc.strerror or str(exc))

    @contextmanager
    def claim(self, key: str) -> Iterator[None]:
        """Hold ``key`` while this process imitates it, once another process that holds it has saved it or died. A
        folder that takes no lock (read-only) holds nothing, and the imitation goes on unshared."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(self._lock_path(key)), timeout=WAIT_CHECK_S)
            while True:
                try:
                    lock.acquire()
                    break
                except Timeout:  # another process is imitating it: a stop request still ends the wait
                    STOP.check("the wait for another stage's imitation")
        except OSError:
            yield
            return
        try:
            yield
        finally:
            lock.release()

    def busy(self, key: str) -> bool:
        """Whether another process is imitating ``key`` now (its lock is held)."""
        if not self._lock_path(key).exists():
            return False
        lock = FileLock(str(self._lock_path(key)), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            return True
        except OSError:
            return False
        lock.release()
        return False

    def _lock_path(self, key: str) -> Path:
        return self.folder / f"{key}.lock"

    @staticmethod
    def _set_aside(path: Path) -> None:
        try:
            path.replace(path.with_suffix(".damaged"))
        except OSError:
            pass  # gone already, or read-only: it is not read again in this process (the weights are kept in memory)
