"""Device profiles: config overlays for the hardware users have (trainer/configs/profiles/)."""

from __future__ import annotations

import re
from pathlib import Path

from trainer.base.errors import UsageError
from trainer.config.sections import CONFIG_DIR

PROFILE_DIR = CONFIG_DIR / "profiles"
AUTO = "auto"


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


# The GPU's own name decides first; memory only for a card no pattern knows.
BY_NAME = (
    (re.compile(r"\b(H100|H200|H800|GH200|B100|B200|A100)\b", re.I), "h100-80gb"),
    (re.compile(r"RTX (50[89]0|4090|3090)|RTX A6000|\bL40", re.I), "rtx5090-32gb"),
    (re.compile(r"\b(T4|V100|P100)\b", re.I), "t4-16gb"),
    (re.compile(r"RTX (40[5-8]0|30[5-8]0|20[6-8]0)|Laptop", re.I), "rtx4060-laptop-8gb"),
)


def choose(name: str, total_bytes: int, compute_major: int) -> tuple[str, str]:
    """(profile, why) for a GPU: by its name, else by its memory (in GB, as cards are sold) and architecture."""
    for pattern, profile in BY_NAME:
        if pattern.search(name):
            return profile, f"{name}: matched by name"
    gb = round(total_bytes / 1e9)
    if gb >= 40:
        profile = "h100-80gb"
    elif gb >= 20:
        profile = "rtx5090-32gb"
    else:
        profile = "t4-16gb" if compute_major < 8 else "rtx4060-laptop-8gb"
    return profile, f"{name} ({gb} GB, compute capability {compute_major}.x): matched by memory"


def detect() -> tuple[str, str]:
    """(profile, why) from the visible device."""
    import torch  # heavy: only `--profile auto` needs it

    if not torch.cuda.is_available():
        return "cpu", "no CUDA device"
    props = torch.cuda.get_device_properties(0)
    return choose(props.name, props.total_memory, props.major)


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
