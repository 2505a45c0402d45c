"""One trainer per run folder: an OS file lock (released by the OS when its process dies,
so a killed run never blocks its own resume) plus a note of who holds it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import datetime
from pathlib import Path

from filelock import FileLock, Timeout

from trainer.base.errors import TrainerError, UsageError
from trainer.run.folder import RunDir

LOCK_FILE = ".lock"
HOLDER_FILE = ".lock.json"


class RunLockedError(TrainerError):
    """Another live trainer holds this run folder."""


class RunLock:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._lock = FileLock(str(run_dir / LOCK_FILE), timeout=0)

    def acquire(self) -> RunLock:
        RunDir(self.run_dir).refuse_links_out()  # the lock file and its note are the first writes
        try:
            self._lock.acquire()
        except Timeout:
            raise RunLockedError(f"run folder {self.run_dir} is in use by {self.holder()}; "
                                 "wait for that run to finish or stop it, or use another --out") from None
        except OSError as exc:  # a read-only folder, or one of another user's
            raise UsageError(f"cannot write in run folder {self.run_dir}: {exc.strerror} (make it writable, or copy "
                             "the run folder somewhere you can write and pass that)") from None
        (self.run_dir / HOLDER_FILE).write_text(json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "since": datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
        }))
        return self

    def holder(self) -> str:
        try:
            info = json.loads((self.run_dir / HOLDER_FILE).read_text())
            return f"PID {info['pid']} on host {info['host']} (since {info['since']})"
        except (OSError, ValueError, KeyError):
            return "another process"

    def release(self) -> None:
        if self._lock.is_locked:
            (self.run_dir / HOLDER_FILE).unlink(missing_ok=True)
            self._lock.release()
