"""Print the pinned runtime closure of pvbess-trainer from this environment (torch and its CUDA wheels left
to the Dockerfile's build arguments): `python docker/freeze.py > docker/constraints.txt`."""

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(root: str) -> dict[str, str]:
    seen: dict[str, str] = {}
    stack = [Requirement(r) for r in metadata.requires(root) or [] if "extra" not in r]
    while stack:
        requirement = stack.pop()
        name = canonicalize_name(requirement.name)
        if name in seen or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist.version
        stack += [Requirement(r) for r in dist.requires or []]
    return seen


if __name__ == "__main__":
    print("# What the image installs besides torch, pinned so two builds of one commit get the same packages.")
    print("# Regenerate from a working .venv with: python docker/freeze.py > docker/constraints.txt")
    for name, version in sorted(closure("pvbess-trainer").items()):
        if not (name.startswith("nvidia-") or name in ("torch", "torchvision", "triton")):
            print(f"{name}=={version}")
