"""Sidecar GPU monitor (NVML). Filled in by the monitor issue; nothing runs at import."""
