"""Sidecar GPU monitor: NVML (trainer-independent) sampling into JSON lines.

`python -m monitor --out FILE` or `gpu-monitor --out FILE`; nothing runs at import.
"""
