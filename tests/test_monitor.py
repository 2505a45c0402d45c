"""The sidecar monitor against a fake NVML: healthy, GPU lost mid-run, metric not supported, no driver."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from monitor.nvml import Nvml
from monitor.records import GpuRecord, Record
from monitor.sampler import Monitor, Thresholds
from monitor.summary import read_records, summarise

ROOT = Path(__file__).resolve().parents[1]
THRESHOLDS = Thresholds(util_low_pct=50, util_low_window_s=60, temp_high_c=75, memory_high_pct=90)


class NVMLError(Exception):
    def __init__(self, value: int, text: str):
        super().__init__(text)
        self.value = value


NOT_SUPPORTED, GPU_LOST, DRIVER_NOT_LOADED = 3, 15, 9


class FakeNvml:
    """The part of pynvml the monitor uses, with scenario switches."""

    def __init__(self, util=97.0, temp=64, used=3 * 2**30, total=8 * 2**30, throttle=0x4, unsupported=(), lost=False,
                 no_driver=False):
        self.util, self.temp, self.used, self.total, self.throttle = util, temp, used, total, throttle
        self.unsupported, self.lost, self.no_driver = set(unsupported), lost, no_driver
        self.shutdowns = 0

    def _call(self, name, value):
        if self.lost:
            raise NVMLError(GPU_LOST, "GPU is lost")
        if name in self.unsupported:
            raise NVMLError(NOT_SUPPORTED, "Not Supported")
        return value

    def nvmlInit(self):
        if self.no_driver:
            raise NVMLError(DRIVER_NOT_LOADED, "Driver Not Loaded")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return "550.54"

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return self._call("handle", f"gpu{i}")

    def nvmlDeviceGetName(self, h):
        return self._call("name", b"NVIDIA GeForce RTX 4060 Laptop GPU")

    def nvmlDeviceGetUUID(self, h):
        return self._call("uuid", "GPU-1234")

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._call("util", SimpleNamespace(gpu=self.util, memory=40))

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._call("memory", SimpleNamespace(used=self.used, total=self.total))

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._call("temperature", self.temp)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._call("power", 80_500)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._call("power_limit", 115_000)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._call("clock", 2505 if kind == 1 else 8001)

    def nvmlDeviceGetFanSpeed(self, h):
        return self._call("fan", 45)

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return self._call("pcie", 1200 if counter == 1 else 300)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._call("throttle", self.throttle)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._call("processes", [SimpleNamespace(pid=4242, usedGpuMemory=2 * 2**30)])


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.t += seconds

    slept: list = []


def make_monitor(tmp_path, fake, clock=None, **kw) -> tuple[Monitor, io.StringIO]:
    stderr = io.StringIO()
    clock = clock or Clock()
    kw.setdefault("max_bytes", 10**9)
    kw.setdefault("backups", 3)
    return Monitor(tmp_path / "monitor.jsonl", 5.0, THRESHOLDS, nvml=Nvml(lambda: fake), clock=clock, stderr=stderr,
                   **kw), stderr


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_healthy_gpu_fills_every_field(tmp_path):
    monitor, stderr = make_monitor(tmp_path, FakeNvml())
    record = monitor.step()
    assert set(record) == set(Record.__annotations__)
    gpu = record["gpus"][0]
    assert set(gpu) == set(GpuRecord.__annotations__)
    assert gpu["name"] == "NVIDIA GeForce RTX 4060 Laptop GPU" and gpu["error"] is None
    assert (gpu["utilization_gpu_pct"], gpu["memory_used_bytes"], gpu["temperature_c"]) == (97.0, 3 * 2**30, 64)
    assert (gpu["power_w"], gpu["power_limit_w"]) == pytest.approx((80.5, 115.0))
    assert (gpu["clock_sm_mhz"], gpu["clock_mem_mhz"], gpu["pcie_rx_kbps"], gpu["pcie_tx_kbps"]) == (2505, 8001, 1200,
                                                                                                     300)
    assert gpu["throttle_reasons"] == ["sw_power_cap"]
    assert gpu["processes"] == [{"pid": 4242, "used_memory_bytes": 2 * 2**30}]
    assert record["host"]["ram_total_bytes"] > 0 and record["gpu_error"] is None
    assert lines(tmp_path / "monitor.jsonl") == [record] and stderr.getvalue() == ""


def test_metric_not_supported_becomes_null(tmp_path):
    monitor, _ = make_monitor(tmp_path, FakeNvml(unsupported={"fan", "pcie", "processes"}))
    gpu = monitor.step()["gpus"][0]
    assert (gpu["fan_pct"], gpu["pcie_rx_kbps"], gpu["processes"]) == (None, None, None)
    assert gpu["temperature_c"] == 64 and gpu["error"] is None


def test_gpu_lost_mid_run_is_recorded_not_fatal(tmp_path):
    fake = FakeNvml()
    monitor, stderr = make_monitor(tmp_path, fake)
    monitor.step()
    fake.lost = True
    record = monitor.step()
    gpu = record["gpus"][0]
    assert gpu["error"] == "GPU lost: GPU is lost"
    assert gpu["utilization_gpu_pct"] is None and gpu["memory_used_bytes"] is None
    records = lines(tmp_path / "monitor.jsonl")
    assert [r["kind"] for r in records] == ["sample", "sample", "warning"]
    assert records[-1]["warnings"] == ["GPU 0: GPU lost: GPU is lost"]
    assert "[gpu-monitor] warning: GPU 0: GPU lost" in stderr.getvalue()


def test_no_driver_still_writes_host_records_and_exits_0(tmp_path):
    monitor, _ = make_monitor(tmp_path, FakeNvml(no_driver=True))
    assert monitor.run(once=True) == 0
    record = lines(tmp_path / "monitor.jsonl")[0]
    assert record["gpus"] == [] and record["gpu_error"] == "NVML could not start: Driver Not Loaded"
    assert record["host"]["cpu_pct"] >= 0


def test_thresholds_produce_warning_records_and_stderr_lines(tmp_path):
    monitor, stderr = make_monitor(tmp_path, FakeNvml(temp=81, used=7.5 * 2**30, throttle=0x40))
    monitor.step()
    warning = lines(tmp_path / "monitor.jsonl")[-1]
    assert warning["kind"] == "warning"
    assert warning["warnings"] == ["GPU 0 is throttled for heat (hw_thermal_slowdown) at 81 C",
                                   "GPU 0 memory 94% used is over 90%"]
    assert stderr.getvalue().count("[gpu-monitor] warning:") == 2


def test_heat_is_judged_by_throttle_reasons_and_by_temperature_only_without_them(tmp_path):
    hot_but_fine, _ = make_monitor(tmp_path / "a", FakeNvml(temp=81, throttle=0x4))  # power-capped, not thermal
    assert hot_but_fine.warnings(hot_but_fine.sample()) == []
    no_reasons, _ = make_monitor(tmp_path / "b", FakeNvml(temp=81, unsupported={"throttle"}))
    assert no_reasons.warnings(no_reasons.sample()) == ["GPU 0 temperature 81 C is over 75 C"]


def test_an_idle_gpu_during_a_cpu_stage_is_not_a_warning(tmp_path):
    clock = Clock()
    activity = tmp_path / "activity.json"
    monitor, stderr = make_monitor(tmp_path, FakeNvml(util=3), clock=clock, activity=activity)
    activity.write_text('{"stage": "ppo", "device": "cpu"}')
    for _ in range(20):  # 100 s of an idle GPU while PPO trains on the CPU, as its profile says
        monitor.step()
        clock.t += 5
    assert stderr.getvalue() == ""
    activity.write_text('{"stage": "sac", "device": "cuda"}')
    for _ in range(14):
        monitor.step()
        clock.t += 5
    assert "GPU 0 utilisation under 50% for 60 s" in stderr.getvalue()


def test_low_utilisation_warns_once_it_has_lasted_a_minute(tmp_path):
    clock = Clock()
    monitor, stderr = make_monitor(tmp_path, FakeNvml(util=12), clock=clock)
    for _ in range(12):  # 0, 5 .. 55 s: under a minute
        monitor.step()
        clock.t += 5
    assert stderr.getvalue() == ""
    monitor.step()  # 60 s
    monitor.step()  # still low: not repeated
    assert stderr.getvalue().strip().splitlines() == [
        "[gpu-monitor] warning: GPU 0 utilisation under 50% for 60 s (now 12%)"]


def test_the_loop_subtracts_the_query_time(tmp_path):
    clock = Clock()
    clock.slept = []

    class SlowFake(FakeNvml):
        def nvmlDeviceGetCount(self):
            clock.t += 2.0  # the query itself takes 2 s
            return 1

    monitor, _ = make_monitor(tmp_path, SlowFake(), clock=clock)
    monitor.run(max_samples=3, sleep=clock.sleep)
    # One second for the first sample's CPU figure, then each interval less the query's 2 s.
    assert clock.slept == [pytest.approx(1.0), pytest.approx(3.0), pytest.approx(3.0)]
    times = [r["unix_time"] for r in lines(tmp_path / "monitor.jsonl")]
    assert [b - a for a, b in zip(times, times[1:])] == [pytest.approx(5.0), pytest.approx(5.0)]


def test_the_first_sample_s_cpu_figure_covers_a_real_interval(tmp_path):
    clock = Clock()
    clock.slept = []
    monitor, _ = make_monitor(tmp_path, FakeNvml(), clock=clock)
    monitor.run(once=True, sleep=clock.sleep)
    assert clock.slept == [1.0]  # psutil primed, then a second before the --once sample


def test_watched_memory_counts_the_workers_too(tmp_path):
    import psutil

    worker = subprocess.Popen([sys.executable, "-c", "import sys, time; x = b\"x\" * (200 * 2**20); "
                               "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "ready"  # its 200 MB are resident now
        monitor, _ = make_monitor(tmp_path, FakeNvml(), watch_pid=os.getpid())
        own = psutil.Process().memory_info().rss
        assert monitor.sample()["host"]["watched_rss_bytes"] >= own + 150 * 2**20
    finally:
        worker.kill()
        worker.wait()


def test_watch_pid_exits_when_the_process_has_ended(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    monitor, _ = make_monitor(tmp_path, FakeNvml(), watch_pid=finished.pid)
    assert monitor.run() == 0
    assert len(lines(tmp_path / "monitor.jsonl")) == 1


def test_files_rotate_past_the_size_limit_and_are_read_back_in_order(tmp_path):
    clock = Clock()
    monitor, _ = make_monitor(tmp_path, FakeNvml(), clock=clock, max_bytes=2000, backups=2)
    for _ in range(12):
        monitor.step()
        clock.t += 5
    rotated = sorted(p.name for p in tmp_path.iterdir())
    assert rotated == ["monitor.jsonl", "monitor.jsonl.1", "monitor.jsonl.2"]
    times = [r["unix_time"] for r in read_records(tmp_path / "monitor.jsonl")]
    assert times == sorted(times) and len(times) < 12  # the oldest were rotated away


def test_summary_of_a_night(tmp_path):
    clock = Clock()
    fake = FakeNvml(util=80, temp=70)
    monitor, _ = make_monitor(tmp_path, fake, clock=clock)
    for util, temp, throttle in ((80, 70, 0x0), (100, 78, 0x40), (60, 72, 0x4), (90, 71, 0x1)):
        fake.util, fake.temp, fake.throttle = util, temp, throttle
        monitor.step()
        clock.t += 5
    summary = summarise(read_records(tmp_path / "monitor.jsonl"))
    gpu = summary["gpus"][0]
    assert (gpu["mean_utilization_pct"], gpu["peak_utilization_pct"], gpu["peak_temperature_c"]) == (82.5, 100, 78)
    assert gpu["throttled_s"] == 10.0  # hw thermal + sw power cap samples; idle does not count
    assert summary["warnings"] == ["GPU 0 is throttled for heat (hw_thermal_slowdown) at 78 C"]
    assert summary["samples"] == 4 and summary["duration_s"] == 15.0


def test_python_m_monitor_once_writes_a_valid_record_without_a_gpu(tmp_path):
    out = tmp_path / "X.jsonl"
    proc = subprocess.run([sys.executable, "-m", "monitor", "--once", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text().splitlines()[0])
    assert set(record) == set(Record.__annotations__) and record["kind"] == "sample"
    import torch

    if not torch.cuda.is_available():
        assert record["gpus"] == [] and record["gpu_error"]


def test_an_unwritable_out_is_one_line_not_a_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "monitor", "--once", "--out", str(blocker / "x.jsonl")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: cannot write {blocker / 'x.jsonl'}: ") and "choose a writable --out" in last
