"""`trainer doctor`: is this machine ready for a night? Each check passes, warns or fails,
and says how to fix it."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from monitor.nvml import Nvml, NvmlUnavailable
from trainer.base.checks import FAIL, PASS, WARN, Check
from trainer.base.errors import TrainerError
from trainer.config import profiles
from trainer.config.roster import AGENTS, off_policy_agents
from trainer.config.sections import Config
from trainer.env.citylearn import policy_sizes
from trainer.learn.agents import TENSORBOARD_FIX, tensorboard_installed
from trainer.learn.memory import GIB, Shapes, available_bytes, batch_bytes, host_available_bytes, replay_buffer_bytes
from trainer.run.session import site_for
from trainer.sim.simulators import simulator_check
from trainer.site import given_site

DISK_WARN_BYTES = 5 * GIB
DISK_FAIL_BYTES = 500 * 1024**2


def check_python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] == (3, 11):
        return Check("python", PASS, f"Python {version}")
    return Check("python", FAIL, f"Python {version}; pvbess-trainer needs 3.11 (citylearn 3.0.2 pins its stack)",
                 "install Python 3.11 and recreate .venv (PYTHON=/path/to/python3.11 ./launchers/launch.sh)")


def check_packages() -> Check:
    try:
        requirements = metadata.requires("pvbess-trainer") or []
    except metadata.PackageNotFoundError:  # imported from a source tree on PYTHONPATH: no pins to check against
        return Check("packages", WARN, "pvbess-trainer is not installed here (imported from its source tree), so "
                     "its dependencies' versions are unchecked", "install it: pip install -e . (or rerun the launcher)")
    problems = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{requirement.name} missing")
            continue
        if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
            problems.append(f"{requirement.name} {installed} (needs {requirement.specifier})")
    if problems:
        return Check(
            "packages", FAIL, "; ".join(problems), "reinstall: .venv/bin/pip install -e . (or rerun the launcher)"
        )
    return Check("packages", PASS, f"citylearn {metadata.version('citylearn')}, stable-baselines3 "
                                   f"{metadata.version('stable-baselines3')}, torch {metadata.version('torch')}")


def nvidia_gpu_present() -> bool:
    """Whether this machine (or container) has an NVIDIA GPU with its driver, whatever torch can use: the driver's
    device node or /proc entry on Linux (what --gpus all passes into a container), its nvidia-smi anywhere."""
    linux = Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia").exists()
    return linux or shutil.which("nvidia-smi") is not None


def check_torch_cuda(require_gpu: bool) -> list[Check]:
    import torch  # heavy: only the checks that need it pay for it

    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    checks = [Check("torch", PASS, f"torch {torch.__version__}, {build}")]
    if not torch.cuda.is_available() and not require_gpu and not nvidia_gpu_present():
        # The README's promise: no GPU needed. Nothing to fix on a machine without one.
        checks.append(Check("cuda", PASS, "no NVIDIA GPU here: training runs on the CPU"))
        return checks
    if not torch.cuda.is_available():
        why = "this torch has no CUDA" if not torch.version.cuda else "no NVIDIA GPU or driver visible"
        fix = (
            "install a CUDA build of torch (set PVBESS_TORCH for the launcher) and an NVIDIA driver"
            if not torch.version.cuda
            else "check the driver (nvidia-smi) and that the GPU is passed through (--gpus all)"
        )
        checks.append(
            Check("cuda", FAIL if require_gpu else WARN, f"CUDA not available: {why}; training runs on the CPU", fix)
        )
        return checks
    props = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability(0)
    free, total = torch.cuda.mem_get_info(0)
    checks.append(
        Check(
            "gpu",
            PASS,
            f"{props.name}, compute capability {major}.{minor}, "
            f"{free / GIB:.1f} of {total / GIB:.1f} GiB free, cuDNN {torch.backends.cudnn.version()}",
        )
    )
    return checks


def check_gpu_switches(cfg) -> list[Check]:
    import torch  # lazy: torch takes seconds to import

    checks = []
    if cfg.gpu.tf32 and torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] < 8:
        checks.append(
            Check(
                "tf32",
                WARN,
                "gpu.tf32 is on but this GPU (compute capability < 8.0) has no TF32: it does nothing",
                "set gpu.tf32: false, or use the t4-16gb profile",
            )
        )
    return checks


def check_memory(cfg: Config, obs_act: tuple[int, int], device: str) -> list[Check]:
    """The largest replay buffer against the host's RAM, the largest batch against the memory it may use."""

    def shapes(agent: str) -> Shapes:
        return Shapes(*obs_act, cfg.agent(agent).layers)

    checks = []
    have = host_available_bytes()
    buffers = [(replay_buffer_bytes(shapes(a), cfg.agent(a).buffer_size), a) for a in off_policy_agents()]
    if buffers:
        need, agent = max(buffers)
        status = PASS if need <= 0.5 * have else WARN if need <= have else FAIL
        checks.append(Check("host RAM", status, f"{agent} replay buffer {need / GIB:.2f} GiB of {have / GIB:.1f} GiB "
                            "available", "" if status == PASS else f"lower {agent}.buffer_size"))
    budget = available_bytes(device) * cfg.reliability.batch_memory_fraction
    worst = max((batch_bytes(a, getattr(cfg.agent(a), "batch_size", getattr(cfg.agent(a), "n_steps", 1)), shapes(a)),
                 a) for a in AGENTS)
    where = "GPU" if device == "cuda" else "host"
    status = PASS if worst[0] <= budget else WARN
    checks.append(Check(f"{where} memory", status, f"largest batch ({worst[1]}) needs ~{worst[0] / GIB:.2f} GiB of "
                        f"{budget / GIB:.1f} GiB allowed", "" if status == PASS else
                        f"it will be backed off before training; lower {worst[1]}.batch_size to avoid that"))
    return checks


def check_disk(root: Path) -> Check:
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(existing).free
    try:
        # A root not made yet is checked where the first run will make it: the doctor leaves no folder behind.
        with tempfile.NamedTemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return Check(
            "disk", FAIL, f"cannot write to {root}: {exc.strerror or exc}", "set output.root to a writable folder"
        )
    status = PASS if free >= DISK_WARN_BYTES else WARN if free >= DISK_FAIL_BYTES else FAIL
    return Check(
        "disk",
        status,
        f"{free / GIB:.1f} GiB free in {root}",
        "" if status == PASS else "free disk space: each SAC checkpoint holds its replay buffer (~45 MB by default)",
    )


def check_tensorboard(cfg: Config) -> Check:
    if not cfg.output.tensorboard:
        return Check("tensorboard", PASS, "off (output.tensorboard: false): curves in progress.csv only")
    if tensorboard_installed():
        return Check("tensorboard", PASS, "curves written for TensorBoard beside progress.csv")
    if cfg.output.tensorboard == "auto":
        return Check("tensorboard", PASS, "off: the tensorboard package is not installed (curves in progress.csv; "
                     "install it for TensorBoard's)")
    return Check("tensorboard", WARN, "output.tensorboard is on but the tensorboard package is not installed: "
                 "curves go to progress.csv only", TENSORBOARD_FIX)


def check_profile() -> Check:
    name, why = profiles.detect()
    return Check("profile", PASS, f"--profile auto picks {name} ({why})")


def check_nvml() -> Check:
    nvml = Nvml()
    try:
        gpus = nvml.gpus()
        return Check("nvml", PASS, f"the monitor sees {len(gpus)} GPU(s), driver {nvml.driver_version()}")
    except NvmlUnavailable as exc:
        if not nvidia_gpu_present():
            return Check("nvml", PASS, "no NVIDIA GPU here: the monitor records host CPU and memory")
        return Check("nvml", WARN, f"the GPU monitor will record host metrics only: {exc}",
                     "install the NVIDIA driver for GPU metrics")
    finally:
        nvml.shutdown()


def run_checks(load: Callable[[], Config], schema: str | None, dataset: str | None, require_gpu: bool,
               backend: str = "local", backend_options: dict[str, Any] | None = None) -> list[Check]:
    """Every check; a config or dataset that fails stops only the checks that need it."""
    from trainer.night.backends import backend as backend_row  # the night's modules: only when a check runs

    checks = [check_python(), check_packages(), *check_torch_cuda(require_gpu), check_nvml(), check_profile()]
    backend_check = backend_row(backend).doctor(backend_options or {})
    if backend_check is not None:
        checks.append(backend_check)
    try:
        cfg = load()
        checks.append(Check("config", PASS, "valid"))
    except TrainerError as exc:
        checks.append(Check("config", FAIL, str(exc), "fix the key named (trainer config show --doc)"))
        return checks
    checks += [*check_gpu_switches(cfg), check_tensorboard(cfg)]
    checks.append(check_disk(Path(cfg.output.root)))
    try:
        cfg, obs_act, simulator = _dataset_checks(cfg, schema, dataset)
        checks.append(Check("dataset", PASS, f"{schema or dataset or 'built-in site'} loads offline "
                                             f"({obs_act[0]} observations, {obs_act[1]} actions)"))
    except TrainerError as exc:
        checks.append(Check("dataset", FAIL, str(exc), "pass --schema PATH or set CITYLEARN_LOCAL_DATASETS_PATH"))
        return checks
    checks.append(simulator)
    import torch  # lazy: torch takes seconds to import

    checks += check_memory(cfg, obs_act, "cuda" if torch.cuda.is_available() and cfg.gpu.device != "cpu" else "cpu")
    return checks


def _dataset_checks(cfg: Config, schema: str | None, dataset: str | None) -> tuple[Config, tuple[int, int], Check]:
    """The config settled on the dataset (its networks' sizes), its (observations, actions), and what agents will
    train on there."""
    with site_for(cfg, given_site(schema, dataset)) as site:
        cfg = site.settled(cfg)
        return cfg, policy_sizes(cfg, site), simulator_check(cfg, site)


def format_table(checks: list[Check]) -> str:
    marks = {PASS: "ok  ", WARN: "warn", FAIL: "FAIL"}
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{marks[c.status]}  {c.name.ljust(width)}  {c.detail}")
        if c.fix:
            lines.append(f"      {' ' * width}  fix: {c.fix}")
    failed = sum(c.status == FAIL for c in checks)
    warned = sum(c.status == WARN for c in checks)
    lines.append(f"\n{len(checks)} checks: {failed} failed, {warned} warnings")
    return "\n".join(lines)


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]

