"""Ray itself for `--backend ray`: the pinned version, a session (a local Ray sized to this machine, or a
cluster), and the checks before a night: the head answers, the auth token is there, every node runs the
driver's Ray and Python, loads the product and sees the run folder, every stage fits the machine.

Facts found by trying Ray 2.60 here are in ../shared/docs/ray-notes.md.
"""

from __future__ import annotations

import os
import platform
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer.base.errors import UsageError
from trainer.config.loading import load_config
from trainer.config.sections import Config
from trainer.run.device import cpu_cores

RAY_VERSION = "2.60.0"
INSTALL = "pip install 'pvbess-trainer[ray]'"


def import_ray() -> Any:
    """Ray, or exit 2 with the install command (Ray is an optional extra, pinned: driver and cluster must match)."""
    try:
        import ray  # optional extra, and seconds to import
    except ImportError:
        raise UsageError(f"--backend ray needs Ray {RAY_VERSION}: {INSTALL}") from None
    if ray.__version__ != RAY_VERSION:
        raise UsageError(f"--backend ray needs Ray {RAY_VERSION}, this environment has {ray.__version__}: {INSTALL}")
    return ray


@contextmanager
def ray_session(address: str | None, num_gpus: float | None = None, shared: Path | None = None) -> Iterator[Any]:
    """A local Ray sized to this machine (never a stale cluster), or the cluster at ``address`` (checked: every
    node runs the driver's Ray and Python, can load the product's config and sees ``shared``, the run folder)."""
    ray = import_ray()
    if address:
        _reachable(address)  # Ray itself would retry for minutes before saying so
        ray.init(address=address, log_to_driver=False)
        preflight(ray, shared)
    else:
        gpus = num_gpus if num_gpus is not None else _local_gpus()
        ray.init(address="local", num_cpus=cpu_cores(), num_gpus=gpus, include_dashboard=False,
                 object_store_memory=128 * 2**20, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def check_backend(address: str | None, cfg: Config | None = None) -> None:
    """Before anything is written: Ray installed at the pinned version, and a head answering at ``address``; on
    a local Ray, each stage's CPUs and GPUs (``cfg``) within this machine's."""
    import_ray()
    if address:
        _reachable(address)
        _token_present()
    elif cfg is not None:
        check_fits(cfg, cpu_cores(), _local_gpus(), "this machine")


def check_fits(cfg: Config, cpus: float, gpus: float, where: str) -> None:
    """Refuse a stage asking for more CPUs or GPUs than ``where`` has: Ray would wait for them forever."""
    for kind, asked, have in (("num_cpus", cfg.ray.num_cpus, cpus), ("num_gpus", cfg.ray.num_gpus, gpus)):
        for stage, value in asked.items():
            if value > have + 1e-9:
                raise UsageError(f"ray.{kind}.{stage}={value:g} asks for more than {where} has ({have:g}); Ray would "
                                 f"never start that stage: set ray.{kind}.{stage} to at most {have:g}")


def _reachable(address: str) -> None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except (OSError, ValueError):
        raise UsageError(f"--address {address}: no Ray head answers there; start one (ray start --head --port "
                         f"{port or 6379}) or check the address (docs/ray.md)") from None


def _token_present() -> None:
    """Ray 2.60 authenticates with a token by default: without it a driver gets InvalidAuthToken, then a
    connection error. Said here, with the fix."""
    if os.environ.get("RAY_AUTH_MODE", "token") == "disabled" or os.environ.get("RAY_AUTH_TOKEN"):
        return
    if not (Path.home() / ".ray" / "auth_token").is_file():
        raise UsageError("--address: Ray's auth token is missing: copy ~/.ray/auth_token from the head node, or set "
                         "RAY_AUTH_TOKEN (or RAY_AUTH_MODE=disabled on a private network; docs/ray.md)")


def _local_gpus() -> int:
    import torch  # heavy: only to count this machine's GPUs for a local Ray

    return torch.cuda.device_count()


def _probe(shared: str | None, token: str) -> dict[str, Any]:
    """On one node: its versions, whether the product's config loads, and whether it reads the driver's file."""
    import platform as node_platform  # on the Ray node the probe runs on

    import ray as node_ray

    found: dict[str, Any] = {"ray": node_ray.__version__, "python": node_platform.python_version(),
                             "host": socket.gethostname(), "config": "", "shared": True}
    try:
        load_config()
    except Exception as exc:  # a node without the product, or with another version of it
        found["config"] = f"{type(exc).__name__}: {exc}"
    if shared is not None:
        try:
            found["shared"] = (Path(shared) / f".ray-probe-{token}").read_text() == token
        except OSError:
            found["shared"] = False
    return found


def preflight(ray: Any, shared: Path | None = None) -> None:
    """An existing cluster: Ray and Python match the driver's, the product loads on every node, and every node
    sees ``shared`` (a probe file written here, read back there). One line per problem, with the fix."""
    token = uuid.uuid4().hex
    probe_file = shared / f".ray-probe-{token}" if shared is not None else None
    if probe_file is not None:
        probe_file.parent.mkdir(parents=True, exist_ok=True)
        probe_file.write_text(token)
    strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    task = ray.remote(num_cpus=0)(_probe)
    problems = []
    try:
        for node in (n for n in ray.nodes() if n.get("Alive")):
            found = ray.get(task.options(scheduling_strategy=strategy(node["NodeID"], soft=False)).remote(
                str(shared) if shared is not None else None, token))
            host = found["host"]
            if found["ray"] != RAY_VERSION or found["python"] != platform.python_version():
                problems.append(f"node {host} has Ray {found['ray']} and Python {found['python']}, the driver Ray "
                                f"{RAY_VERSION} and Python {platform.python_version()}: install the same venv there")
            if found["config"]:
                problems.append(f"node {host} cannot load the product's config ({found['config']}): install this "
                                "checkout's venv there")
            if not found["shared"]:
                problems.append(f"node {host} does not see {shared}: mount the run folders at the same path on "
                                "every node (docs/ray.md)")
    finally:
        if probe_file is not None:
            probe_file.unlink(missing_ok=True)
    if problems:
        raise UsageError("; ".join(problems))
