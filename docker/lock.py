"""The image's lock, docker/constraints.txt: every package the image installs besides torch's own, pinned.

    python docker/lock.py freeze pyproject.toml     print the lock of this environment (docker/lock.sh runs it
                                                    inside the image's Python stage, after `pip install .`)
    python docker/lock.py verify constraints.txt    in the image: the lock is installed whole, consistent and
                                                    importable, on the Python it was frozen for
    python docker/lock.py drift constraints.txt pyproject.toml
                                                    the lock still matches pyproject.toml's dependencies

Stdlib and packaging only (pip vendors it), so it runs before anything else is installed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import pkgutil
import platform
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare venv: pip's vendored copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ROOT = "pvbess-trainer"
# Installed by the torch step, from torch's own index: its closure (CUDA wheels, triton, sympy...) follows the
# TORCH/TORCHVISION build arguments, not the lock.
TORCH = {"torch", "torchvision"}
# CityLearn requires these for its EnergyPlus building generator (citylearn.end_use_load_profiles), which the
# product never imports: left out, they are 55 packages and ~400 MB (openstudio alone is 300 MB).
OMITTED = {"doe-xstock", "openstudio"}
# Imported at run time but not declared by the package that imports it (citylearn.data imports platformdirs,
# which CityLearn's own install gets only through doe-xstock): locked as if pyproject.toml named them.
UNDECLARED = {"platformdirs"}
# Whose every module must import in the image (the parts the product never uses left out).
PACKAGES = ("trainer", "monitor", "citylearn")
NEVER_IMPORTED = ("citylearn.end_use_load_profiles",)
REGENERATE = "regenerate it with docker/lock.sh (it freezes the lock in the image's own Python)"


def dependencies_digest(pyproject: Path) -> str:
    """What the lock was frozen from: pyproject.toml's runtime dependencies, as a short digest."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return hashlib.sha256("\n".join(sorted(deps)).encode()).hexdigest()[:16]


def closure(root: str) -> dict[str, str]:
    """Name -> version of everything `root` needs, extras included, torch's and the omitted subtrees left out."""
    seen: dict[str, str] = {}
    stack = [Requirement(r) for r in metadata.requires(root) or [] if "extra ==" not in r]
    stack += [Requirement(name) for name in UNDECLARED]
    while stack:
        requirement = stack.pop()
        name = canonicalize_name(requirement.name)
        if name in seen or name in TORCH or name in OMITTED:
            continue
        seen[name] = metadata.version(name)  # PackageNotFoundError here means `pip install .` did not run
        extras = [{"extra": e} for e in ("", *requirement.extras)]
        for text in metadata.requires(name) or []:
            needed = Requirement(text)
            if needed.marker is None or any(needed.marker.evaluate(e) for e in extras):
                stack.append(needed)
    return seen


def freeze(pyproject: Path) -> str:
    lines = [
        "# The image's lock: every package it installs besides torch's own, pinned. Generated; do not edit.",
        f"# {REGENERATE}.",
        f"# python: {platform.python_version()}",
        f"# pyproject-dependencies: {dependencies_digest(pyproject)}",
        f"# omitted: {' '.join(sorted(OMITTED))} (CityLearn's building generator, never imported)",
        f"# undeclared: {' '.join(sorted(UNDECLARED))} (imported by CityLearn without being declared)",
    ]
    return "\n".join(lines + [f"{n}=={v}" for n, v in sorted(closure(ROOT).items())]) + "\n"


def read_lock(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(header fields, pins) of a lock file."""
    header, pins = {}, {}
    for line in path.read_text().splitlines():
        if m := re.fullmatch(r"# ([a-z-]+): (.+)", line):
            header[m[1]] = m[2]
        elif line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return header, pins


def drift(lock: Path, pyproject: Path) -> list[str]:
    """Why the lock no longer matches pyproject.toml (empty: it does)."""
    header, pins = read_lock(lock)
    problems = []
    if header.get("pyproject-dependencies") != dependencies_digest(pyproject):
        problems.append(f"{lock}: pyproject.toml's dependencies changed since the lock was frozen")
    for text in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name in TORCH:
            continue
        if name not in pins:
            problems.append(f"{lock}: {name} ({text} in pyproject.toml) is not pinned")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{lock}: {name}=={pins[name]} does not satisfy pyproject.toml's {text}")
    return problems


def top_level_modules(pins: dict[str, str]) -> dict[str, list[str]]:
    by_dist: dict[str, list[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            if canonicalize_name(dist) in pins and not module.startswith("_") and module.isidentifier():
                by_dist.setdefault(canonicalize_name(dist), []).append(module)
    return by_dist


def unimportable_modules() -> list[str]:
    """Every module of the product and CityLearn that fails to import here (those installed so far)."""
    problems = []
    for package in PACKAGES:
        if importlib.util.find_spec(package) is None:
            continue
        root = importlib.import_module(package)
        for module in pkgutil.walk_packages(root.__path__, f"{package}.", onerror=lambda name: None):
            if module.name.endswith("__main__") or module.name.startswith(NEVER_IMPORTED):
                continue
            try:
                importlib.import_module(module.name)
            except Exception as exc:  # noqa: BLE001 - any failure means a package the product needs is missing
                problems.append(f"import {module.name} fails: {type(exc).__name__}: {exc}"[:300])
    return problems


def verify(lock: Path) -> list[str]:
    """Why this environment is not the lock, installed whole, consistent and importable (empty: it is)."""
    header, pins = read_lock(lock)
    problems = []
    if header.get("python") != platform.python_version():
        problems.append(f"{lock} was frozen for Python {header.get('python')}, this is {platform.python_version()}: "
                        f"{REGENERATE}")
    for name, version in pins.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            problems.append(f"{name}=={version} is locked but {installed or 'nothing'} is installed")
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    problems += [line for line in check.stdout.splitlines()
                 if line.strip() and "No broken requirements" not in line
                 and not any(f"requires {name}," in line for name in OMITTED)]
    for dist, modules in sorted(top_level_modules(pins).items()):
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - any failure means the pinned package is unusable
                problems.append(f"{dist}=={pins[dist]}: import {module} fails: {type(exc).__name__}: {exc}"[:300])
    return problems + unimportable_modules()


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "freeze":
        sys.stdout.write(freeze(Path(argv[1])))
        return 0
    if len(argv) in (2, 3) and argv[0] in ("verify", "drift"):
        problems = verify(Path(argv[1])) if argv[0] == "verify" else drift(Path(argv[1]), Path(argv[2]))
        for problem in problems:
            print(f"lock: {problem}", file=sys.stderr)
        if problems:
            print(f"lock: {len(problems)} problem(s); {REGENERATE}", file=sys.stderr)
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
