"""The monitor's JSON-line record: a fixed, documented shape (docs/monitor.md).

Key names follow nvidia-smi's meaning with units in the name. Every metric may be null:
unsupported by the GPU, or the GPU was lost (``error`` says which).
"""

from __future__ import annotations

from typing import TypedDict


class ProcessRecord(TypedDict):
    pid: int
    used_memory_bytes: int | None


class GpuRecord(TypedDict):
    index: int
    name: str | None
    uuid: str | None
    utilization_gpu_pct: float | None
    utilization_memory_pct: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    clock_sm_mhz: float | None
    clock_mem_mhz: float | None
    fan_pct: float | None
    pcie_rx_kbps: float | None
    pcie_tx_kbps: float | None
    throttle_reasons: list[str] | None
    processes: list[ProcessRecord] | None
    error: str | None


class HostRecord(TypedDict):
    cpu_pct: float
    ram_used_bytes: int
    ram_total_bytes: int
    watched_pid: int | None
    watched_rss_bytes: int | None


class Record(TypedDict):
    time: str            # local ISO 8601 with offset
    unix_time: float
    kind: str            # "sample" or "warning"
    gpus: list[GpuRecord]
    gpu_error: str | None
    host: HostRecord
    warnings: list[str]
