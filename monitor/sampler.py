"""The sampling loop: one JSON object per line, warnings as their own records and on stderr."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

import psutil

from monitor.nvml import THERMAL, Nvml, NvmlUnavailable
from monitor.records import GpuRecord, HostRecord, Record


@dataclass(frozen=True)
class Thresholds:
    util_low_pct: float
    util_low_window_s: float
    temp_high_c: float
    memory_high_pct: float


# The first sample's CPU figure covers this long (a reading straight after priming says 0 % or 100 %).
CPU_WINDOW_S = 1.0


@dataclass
class Monitor:
    out: Path
    interval_s: float
    thresholds: Thresholds
    max_bytes: int
    backups: int
    watch_pid: int | None = None
    activity: Path | None = None  # the trainer's {"stage", "device"}: low-utilisation warnings only on GPU stages
    nvml: Nvml = field(default_factory=Nvml)
    clock: Callable[[], float] = time.time
    stderr: TextIO = sys.stderr
    _low_since: dict[int, float] = field(default_factory=dict)
    _low_warned: set[int] = field(default_factory=set)
    _stop: bool = False

    def __post_init__(self) -> None:
        self.file = JsonLinesFile(self.out, self.max_bytes, self.backups)

    # ------------------------------------------------------------------ one sample

    def sample(self) -> Record:
        now = self.clock()
        gpus: list[GpuRecord] = []
        gpu_error = None
        try:
            gpus = self.nvml.gpus()
            if not gpus:
                gpu_error = "NVML found no GPU"
        except NvmlUnavailable as exc:
            gpu_error = str(exc)
        memory = psutil.virtual_memory()
        host = HostRecord(
            cpu_pct=float(psutil.cpu_percent(interval=None)),
            ram_used_bytes=int(memory.total - memory.available),
            ram_total_bytes=int(memory.total),
            watched_pid=self.watch_pid,
            watched_rss_bytes=tree_rss_bytes(self.watch_pid),
        )
        return Record(
            time=datetime.fromtimestamp(now).astimezone().isoformat(timespec="seconds"),
            unix_time=round(now, 3),
            kind="sample",
            gpus=gpus,
            gpu_error=gpu_error,
            host=host,
            warnings=[],
        )

    def _gpu_stage(self) -> bool:
        """Whether the running stage uses the GPU (the trainer's activity file says; without one, assume so).
        A PPO or A2C stage on the CPU leaves the GPU idle by design: no low-utilisation warning then."""
        if self.activity is None or not self.activity.is_file():
            return True
        try:
            return json.loads(self.activity.read_text(encoding="utf-8")).get("device") != "cpu"
        except (OSError, ValueError):
            return True

    def warnings(self, record: Record) -> list[str]:
        """Threshold crossings in this sample (low utilisation only once it has lasted the window)."""
        t = self.thresholds
        found = []
        for gpu in record["gpus"]:
            i = gpu["index"]
            if gpu["error"]:
                found.append(f"GPU {i}: {gpu['error']}")
                continue
            heat = sorted(set(gpu["throttle_reasons"] or ()) & THERMAL)
            if heat:  # the driver's own word that heat is holding the GPU back
                found.append(f"GPU {i} is throttled for heat ({', '.join(heat)}) at {gpu['temperature_c']} C")
            elif gpu["throttle_reasons"] is None and gpu["temperature_c"] is not None \
                    and gpu["temperature_c"] > t.temp_high_c:  # no throttle reasons on this GPU: the threshold
                found.append(f"GPU {i} temperature {gpu['temperature_c']:.0f} C is over {t.temp_high_c:.0f} C")
            used, total = gpu["memory_used_bytes"], gpu["memory_total_bytes"]
            if used is not None and total and 100 * used / total > t.memory_high_pct:
                found.append(f"GPU {i} memory {100 * used / total:.0f}% used is over {t.memory_high_pct:.0f}%")
            util = gpu["utilization_gpu_pct"]
            if util is not None and util < t.util_low_pct and self._gpu_stage():
                since = self._low_since.setdefault(i, record["unix_time"])
                if record["unix_time"] - since >= t.util_low_window_s and i not in self._low_warned:
                    self._low_warned.add(i)
                    found.append(f"GPU {i} utilisation under {t.util_low_pct:.0f}% for "
                                 f"{record['unix_time'] - since:.0f} s (now {util:.0f}%)")
            elif util is not None:
                self._low_since.pop(i, None)
                self._low_warned.discard(i)
        return found

    # ------------------------------------------------------------------ the loop

    def watched_alive(self) -> bool:
        if self.watch_pid is None:
            return True

        try:
            return psutil.Process(self.watch_pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def step(self) -> Record:
        record = self.sample()
        self.file.append(record)
        found = self.warnings(record)
        if found:
            warning = Record(**{**record, "kind": "warning", "gpus": [], "warnings": found})
            self.file.append(warning)
            for message in found:
                print(f"[gpu-monitor] warning: {message}", file=self.stderr, flush=True)
        return record

    def run(
        self, once: bool = False, max_samples: int | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> int:
        psutil.cpu_percent(interval=None)  # CPU use is measured between two readings: prime it...
        sleep(min(self.interval_s, CPU_WINDOW_S))  # ...and let the first sample cover a real interval
        signal.signal(signal.SIGTERM, self._on_term) if _main_thread() else None
        start, taken = self.clock(), 0
        while not self._stop:
            self.step()
            taken += 1
            if once or (max_samples is not None and taken >= max_samples) or not self.watched_alive():
                break
            # The next sample is due at start + k x interval: the query's own time is subtracted.
            delay = start + taken * self.interval_s - self.clock()
            if delay > 0:
                sleep(delay)
        self.nvml.shutdown()
        return 0

    def _on_term(self, signum, frame) -> None:
        self._stop = True


def _main_thread() -> bool:

    return threading.current_thread() is threading.main_thread()


def tree_rss_bytes(pid: int | None) -> int | None:
    """Resident memory of process ``pid`` and all its children (the trainer's environment workers)."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    total = 0
    for proc in tree:
        try:
            total += int(proc.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # a worker that just ended
    return total


@dataclass
class JsonLinesFile:
    """Records appended one JSON object a line; past ``max_bytes`` the file becomes ``.1`` (``.1`` becomes
    ``.2``, and so on to ``backups``; the oldest is dropped) and a new one begins."""

    path: Path
    max_bytes: int
    backups: int

    def append(self, record: Record) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > self.max_bytes:
            self._rotate()
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")

    def _rotate(self) -> None:
        for k in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{k}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{k + 1}"))
        if self.backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()

