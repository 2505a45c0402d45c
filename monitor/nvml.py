"""Every NVML call lives here (nvidia-ml-py's ``pynvml``).

Initialised lazily on first use, shut down at exit; nothing happens at import. Each metric
falls back to ``None`` when the GPU does not support it, and a GPU that is lost becomes a
record with an ``error`` rather than a crash.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any

from monitor.records import GpuRecord, ProcessRecord

# NVML's clock-throttle reason bits (stable across driver versions), decoded to names.
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
# Reasons that mean the GPU is being held back (idle and sync boost are not).
LIMITING = {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
# Reasons that mean heat is the limit (hw_slowdown includes the driver's thermal protection).
THERMAL = {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"}


class NvmlUnavailable(RuntimeError):
    """No driver, no library, or no GPU: the reason goes into the record."""


def _load():
    """The pynvml module (a seam the tests replace with a fake)."""
    import pynvml  # lazy: the seam the tests replace; absent where no NVIDIA driver is

    return pynvml


class Nvml:
    def __init__(self, loader: Callable[[], Any] = _load):
        self._loader = loader
        self._lib = None

    @property
    def lib(self):
        if self._lib is None:
            try:
                lib = self._loader()
                lib.nvmlInit()
            except ImportError as exc:
                raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from None
            except Exception as exc:  # pynvml.NVMLError and friends: no driver, no libnvidia-ml
                raise NvmlUnavailable(f"NVML could not start: {_describe(exc)}") from None
            self._lib = lib
            atexit.register(self.shutdown)
        return self._lib

    def shutdown(self) -> None:
        if self._lib is not None:
            try:
                self._lib.nvmlShutdown()
            except Exception:  # already gone is fine at exit
                pass
            self._lib = None

    def driver_version(self) -> str | None:
        return _text(self._metric(self.lib.nvmlSystemGetDriverVersion))

    def gpus(self) -> list[GpuRecord]:
        lib = self.lib
        try:
            count = lib.nvmlDeviceGetCount()
        except Exception as exc:
            raise NvmlUnavailable(f"NVML could not count GPUs: {_describe(exc)}") from None
        return [self._gpu(index) for index in range(count)]

    def _metric(self, fn: Callable, *args: Any, scale: float | None = None) -> Any:
        try:
            value = fn(*args)
        except Exception as exc:  # unsupported or lost: a null field
            if _is_lost(exc):
                raise
            return None
        return value * scale if scale is not None and value is not None else value

    def _gpu(self, index: int) -> GpuRecord:
        lib = self.lib
        record = empty_gpu(index)
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            record["name"] = _text(self._metric(lib.nvmlDeviceGetName, handle))
            record["uuid"] = _text(self._metric(lib.nvmlDeviceGetUUID, handle))
            util = self._metric(lib.nvmlDeviceGetUtilizationRates, handle)
            if util is not None:
                record["utilization_gpu_pct"] = float(util.gpu)
                record["utilization_memory_pct"] = float(util.memory)
            memory = self._metric(lib.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                record["memory_used_bytes"] = int(memory.used)
                record["memory_total_bytes"] = int(memory.total)
            record["temperature_c"] = self._metric(lib.nvmlDeviceGetTemperature, handle, 0)  # NVML_TEMPERATURE_GPU
            record["power_w"] = self._metric(lib.nvmlDeviceGetPowerUsage, handle, scale=1e-3)
            record["power_limit_w"] = self._metric(lib.nvmlDeviceGetEnforcedPowerLimit, handle, scale=1e-3)
            record["clock_sm_mhz"] = self._metric(lib.nvmlDeviceGetClockInfo, handle, 1)  # NVML_CLOCK_SM
            record["clock_mem_mhz"] = self._metric(lib.nvmlDeviceGetClockInfo, handle, 2)  # NVML_CLOCK_MEM
            record["fan_pct"] = self._metric(lib.nvmlDeviceGetFanSpeed, handle)
            record["pcie_rx_kbps"] = self._metric(lib.nvmlDeviceGetPcieThroughput, handle, 1)  # NVML_PCIE_UTIL_RX_BYTES
            record["pcie_tx_kbps"] = self._metric(lib.nvmlDeviceGetPcieThroughput, handle, 0)  # NVML_PCIE_UTIL_TX_BYTES
            reasons = self._metric(lib.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
            record["throttle_reasons"] = (
                None if reasons is None else [n for bit, n in THROTTLE_REASONS.items() if reasons & bit]
            )
            processes = self._metric(lib.nvmlDeviceGetComputeRunningProcesses, handle)
            record["processes"] = None if processes is None else [
                ProcessRecord(pid=int(p.pid), used_memory_bytes=_int_or_none(getattr(p, "usedGpuMemory", None)))
                for p in processes]
        except Exception as exc:  # the GPU fell off the bus, or its handle failed
            lost = empty_gpu(index)
            lost["name"], lost["uuid"] = record["name"], record["uuid"]
            lost["error"] = f"GPU lost: {_describe(exc)}" if _is_lost(exc) else _describe(exc)
            return lost
        return record


def empty_gpu(index: int) -> GpuRecord:
    return GpuRecord(
        index=index, name=None, uuid=None, utilization_gpu_pct=None, utilization_memory_pct=None,
        memory_used_bytes=None, memory_total_bytes=None, temperature_c=None, power_w=None, power_limit_w=None,
        clock_sm_mhz=None, clock_mem_mhz=None, fan_pct=None, pcie_rx_kbps=None, pcie_tx_kbps=None,
        throttle_reasons=None, processes=None, error=None)


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _is_lost(exc: BaseException) -> bool:
    return "lost" in str(exc).lower() or getattr(exc, "value", None) == 15  # NVML_ERROR_GPU_IS_LOST


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
