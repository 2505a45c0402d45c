"""Device profiles: config overlays for the hardware users have (trainer/configs/profiles/)."""

from __future__ import annotations

from pathlib import Path

from trainer.config import CONFIG_DIR
from trainer.errors import UsageError

PROFILE_DIR = CONFIG_DIR / "profiles"
AUTO = "auto"


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def detect() -> tuple[str, str]:
    """(profile, why) from the visible device and its memory."""
    import torch

    if not torch.cuda.is_available():
        return "cpu", "no CUDA device"
    props = torch.cuda.get_device_properties(0)
    gib = props.total_memory / 1024**3
    major, _ = torch.cuda.get_device_capability(0)
    if gib < 12:
        name = "rtx4060-laptop-8gb"
    elif gib < 24:
        name = "t4-16gb" if major < 8 else "rtx4060-laptop-8gb"
    elif gib < 48:
        name = "rtx5090-32gb"
    else:
        name = "h100-80gb"
    return name, f"{props.name} with {gib:.0f} GiB"


def resolve(name: str | None) -> tuple[Path | None, str | None]:
    """The overlay file for ``--profile`` (None: no profile) and a line saying which and why."""
    if name is None:
        return None, None
    if name == AUTO:
        name, why = detect()
        return PROFILE_DIR / f"{name}.yaml", f"profile {name} (auto: {why})"
    path = PROFILE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UsageError(f"unknown profile {name!r}: choose auto or one of {', '.join(available())}")
    return path, f"profile {name}"
