"""A night's monitor file, summarised: utilisation, memory, temperature, throttling, warnings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

from monitor.nvml import LIMITING
from monitor.records import Record


class GpuSummary(TypedDict):
    index: int
    name: str | None
    mean_utilization_pct: float | None
    peak_utilization_pct: float | None
    peak_memory_bytes: int | None
    peak_memory_pct: float | None
    peak_temperature_c: float | None
    throttled_s: float
    lost_samples: int


class Summary(TypedDict):
    samples: int
    duration_s: float
    gpu_error: str | None
    gpus: list[GpuSummary]
    peak_rss_bytes: int | None
    mean_cpu_pct: float | None
    warnings: list[str]


def read_records(path: Path) -> list[Record]:
    """The file and its rotated predecessors, oldest first; a torn last line is skipped."""
    files = sorted(
        path.parent.glob(f"{path.name}.*"), key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0
    )
    records = []
    for file in [*[f for f in files if f.suffix[1:].isdigit()], path]:
        if not file.is_file():
            continue
        for line in file.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def summarise(records: list[Record]) -> Summary:
    samples = [r for r in records if r.get("kind") == "sample"]
    warnings = [w for r in records if r.get("kind") == "warning" for w in r.get("warnings", [])]
    gpus: dict[int, dict[str, Any]] = {}
    for previous, record in zip([None, *samples[:-1]], samples):
        dt = record["unix_time"] - previous["unix_time"] if previous else 0.0
        for gpu in record["gpus"]:
            g = gpus.setdefault(
                gpu["index"],
                {
                    "name": gpu["name"],
                    "util": [],
                    "mem_used": [],
                    "mem_pct": [],
                    "temp": [],
                    "throttled_s": 0.0,
                    "lost_samples": 0,
                },
            )
            if gpu["error"]:
                g["lost_samples"] += 1
                continue
            if gpu["utilization_gpu_pct"] is not None:
                g["util"].append(gpu["utilization_gpu_pct"])
            if gpu["memory_used_bytes"] is not None:
                g["mem_used"].append(gpu["memory_used_bytes"])
                if gpu["memory_total_bytes"]:
                    g["mem_pct"].append(100 * gpu["memory_used_bytes"] / gpu["memory_total_bytes"])
            if gpu["temperature_c"] is not None:
                g["temp"].append(gpu["temperature_c"])
            if set(gpu["throttle_reasons"] or ()) & LIMITING:
                g["throttled_s"] += dt
    out: Summary = {
        "samples": len(samples),
        "duration_s": samples[-1]["unix_time"] - samples[0]["unix_time"] if len(samples) > 1 else 0.0,
        "gpu_error": next((r["gpu_error"] for r in samples if r.get("gpu_error")), None),
        "gpus": [],
        "peak_rss_bytes": max((r["host"]["watched_rss_bytes"] or 0 for r in samples), default=None) or None,
        "mean_cpu_pct": sum(r["host"]["cpu_pct"] for r in samples) / len(samples) if samples else None,
        "warnings": warnings,
    }
    for index, g in sorted(gpus.items()):
        out["gpus"].append({
            "index": index, "name": g["name"],
            "mean_utilization_pct": sum(g["util"]) / len(g["util"]) if g["util"] else None,
            "peak_utilization_pct": max(g["util"], default=None),
            "peak_memory_bytes": max(g["mem_used"], default=None),
            "peak_memory_pct": max(g["mem_pct"], default=None),
            "peak_temperature_c": max(g["temp"], default=None),
            "throttled_s": round(g["throttled_s"], 1),
            "lost_samples": g["lost_samples"],
        })
    return out


def format_summary(summary: Summary) -> str:
    lines = [f"{summary['samples']} samples over {summary['duration_s'] / 60:.1f} min"]
    if summary["gpu_error"]:
        lines.append(f"no GPU data: {summary['gpu_error']}")
    for g in summary["gpus"]:
        def f(v, spec):
            return "-" if v is None else format(v, spec)
        lines.append(
            f"GPU {g['index']} {g['name'] or ''}: utilisation mean {f(g['mean_utilization_pct'], '.0f')}% / peak "
            f"{f(g['peak_utilization_pct'], '.0f')}%, "
            f"memory peak {f((g['peak_memory_bytes'] or 0) / 2**30, '.1f')} GiB "
            f"({f(g['peak_memory_pct'], '.0f')}%), temperature peak {f(g['peak_temperature_c'], '.0f')} C, "
            f"throttled {g['throttled_s']:.0f} s"
            + (f", lost in {g['lost_samples']} samples" if g["lost_samples"] else "")
        )
    if summary["mean_cpu_pct"] is not None:
        lines.append(
            f"host CPU mean {summary['mean_cpu_pct']:.0f}%"
            + (f", trainer peak RSS {summary['peak_rss_bytes'] / 2**30:.2f} GiB" if summary["peak_rss_bytes"] else "")
        )
    lines.append(f"{len(summary['warnings'])} warnings" + "".join(f"\n  - {w}" for w in summary["warnings"][:20]))
    return "\n".join(lines)
