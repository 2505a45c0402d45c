"""Torch device choice and the `gpu` switches: CUDA flags only on CUDA, CPU threads everywhere; always logged."""

from __future__ import annotations

import os

from trainer.base import logs
from trainer.base.errors import UsageError
from trainer.config.agents import OffPolicyConfig
from trainer.config.roster import Agent, agent_spec
from trainer.config.sections import Config, GpuConfig

# Set in a Ray stage to the CPUs Ray gave it: its environments and torch threads follow that, not the machine.
ASSIGNED_CPUS_ENV = "PVBESS_CPUS"


def cpu_cores() -> int:
    """Cores this process may use: those a scheduler assigned it, else the affinity mask where the OS has one."""
    if os.environ.get(ASSIGNED_CPUS_ENV):
        return max(int(float(os.environ[ASSIGNED_CPUS_ENV])), 1)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # Windows and macOS
        return os.cpu_count() or 1


def others_load() -> float:
    """Cores' worth of other work running now: the larger of the one-minute load average less this process (0 where
    the OS keeps none, as Windows) and the CPU time others used over the last moment (:func:`sampled_others`). The
    load average lags: half a minute after another CPU-bound process started it still reads half of it, and a stage
    that trusted it took two torch threads beside that process and ran ten times slower (issue 56)."""
    try:
        averaged = max(os.getloadavg()[0] - 1.0, 0.0)
    except (AttributeError, OSError):
        averaged = 0.0
    return max(averaged, sampled_others())


SAMPLE_S = 0.25


def sampled_others(seconds: float = SAMPLE_S, children: bool = False) -> float:
    """Cores' worth of CPU that other processes used (and a hypervisor stole) on this process's cores over the next
    ``seconds``, this process and (unless ``children``) its children left out: what the next minutes will most
    likely have free."""
    import time

    import psutil  # lazy: only a stage start samples

    try:
        t0, busy0, own0 = _cpu_now(children)
        time.sleep(seconds)
        t1, busy1, own1 = _cpu_now(children)
    except (psutil.Error, OSError):
        return 0.0
    return max((busy1 - busy0) - (own1 - own0), 0.0) / max(t1 - t0, 1e-3)


def _cpu_now(children: bool = False) -> tuple[float, float, float]:
    """(a monotonic clock, the CPU seconds this process's cores spent busy or stolen, this process tree's CPU
    seconds: this process's alone where its ``children`` count as other work)."""
    import time

    import psutil  # lazy: only a stage start samples

    cores = psutil.cpu_times(percpu=True)
    mine = _cores_of_this_process(len(cores))
    total = sum(sum(cores[i]) for i in mine)
    idle = sum(cores[i].idle + getattr(cores[i], "iowait", 0.0) for i in mine)
    return time.monotonic(), total - idle, _own_cpu_s(children)


def _cores_of_this_process(count: int) -> list[int]:
    try:
        return sorted(i for i in os.sched_getaffinity(0) if i < count) or list(range(count))
    except AttributeError:  # Windows and macOS
        return list(range(count))


def _own_cpu_s(children_apart: bool = False) -> float:
    import psutil  # lazy: only a stage start samples

    total = 0.0
    this = psutil.Process()
    for process in (this, *([] if children_apart else this.children(recursive=True))):
        try:
            times = process.cpu_times()
        except psutil.Error:  # a child that ended between the listing and the read
            continue
        total += times.user + times.system
    return total


def free_cores_now(seconds: float = SAMPLE_S) -> int:
    """Cores free for a process beside this one, from what the cores did over the next ``seconds`` alone (not the
    load average: a minute after this process's own processes beside it ended, it still counts them), this
    process's children counted as busy: at least one."""
    cores = cpu_cores()
    return max(1, min(cores, round(cores - sampled_others(seconds, children=True))))


class CoresWatch:
    """Cores free of other work over the time since the last look (this process's children counted as other work),
    without waiting: a stage that adjusts its threads while it trains looks every half minute at what the cores did
    since (trainer.learn.callbacks.ThreadsFollowCores)."""

    def __init__(self) -> None:
        self._last: tuple[float, float, float] | None = self._now()

    def free(self) -> int | None:
        """Cores free since the last look (at least one), or None where this machine does not say."""
        now, last = self._now(), self._last
        self._last = now
        if now is None or last is None or now[0] - last[0] <= 0:
            return None
        others = max((now[1] - last[1]) - (now[2] - last[2]), 0.0) / (now[0] - last[0])
        return max(1, min(cpu_cores(), round(cpu_cores() - others)))

    @staticmethod
    def _now() -> tuple[float, float, float] | None:
        import psutil  # lazy: only a stage start samples

        try:
            return _cpu_now(children=True)
        except (psutil.Error, OSError):
            return None


def free_cores(others: float | None = None) -> int:
    """Cores not already busy with other work: :func:`cpu_cores` less the run queue beyond this process (the
    one-minute load average, where the OS keeps one; or ``others``, cores' worth measured earlier), at least one.
    A second torch thread on a core another process is using costs far more than it gives (issue 56: SAC's
    imitation 7x slower on 2 threads beside another CPU-bound process than on one)."""
    cores = cpu_cores()
    return max(1, min(cores, round(cores - (others_load() if others is None else others))))


def resolve_agent(cfg: Config, name: str) -> Agent:
    """The agent ``name`` as a stage trains it: its roster row, its config section and its device, resolved once."""
    return Agent(agent_spec(name), cfg.agent(name), agent_device(cfg, name))


def agent_device(cfg: Config, agent: str) -> str:
    """The device an agent trains on: its own `device` key, else gpu.device."""
    return resolve_device(cfg.agent(agent).device or cfg.gpu.device)


def resolve_device(requested: str) -> str:
    """'auto' → 'cuda' when torch sees a GPU, else 'cpu'; 'cuda' without one is a usage error."""
    import torch  # lazy: torch takes seconds to import

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "--device cuda was requested but torch sees no CUDA device "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); use --device cpu or auto"
        )
    return requested


def cpu_threads_for(cfg: Config, agent: str, in_process: bool = False) -> int:
    """torch's intra-op threads for a stage: ``gpu.cpu_threads``, or with 0 one per core for an off-policy
    agent (SAC) stepping its environments itself (an ``in_process`` simulator's, or CityLearn's without learning
    while stepping), and one thread otherwise.

    Measured on 2 cores (docs/benchmarks.md): SAC's update alone ran 1.3x faster on 2 threads, but
    with a CityLearn worker stepping beside it training ran ~20% slower than on one thread; on 16
    simulated sites 2 threads train 1.27x faster. PPO's and A2C's small networks lose from a second
    thread (PPO on 64 simulated sites: 10,600 steps/s on one, 8,300 on two). One per core means one per free core
    (:func:`free_cores_now`, the cores' own use over a moment, this process's children counted busy: the load
    average still counts for a minute the processes a stage before ran beside it, and a night's SAC trained on one
    thread where two were free): on cores other work keeps busy, threads wait for each other.
    """
    if cfg.gpu.cpu_threads:
        return cfg.gpu.cpu_threads
    return free_cores_now() if follows_free_cores(cfg, agent, in_process) else 1


def follows_free_cores(cfg: Config, agent: str, in_process: bool = False) -> bool:
    """Whether ``agent``'s torch threads are one per free core (:func:`cpu_threads_for`), and so follow them while it
    trains: an off-policy agent (SAC) stepping its environments itself, threads not set (``gpu.cpu_threads: 0``)."""
    section = cfg.agent(agent)
    alone = in_process or not section.learns_while_stepping
    return not cfg.gpu.cpu_threads and isinstance(section, OffPolicyConfig) and alone


def apply_cpu_threads(cfg: Config, agent: str, in_process: bool = False) -> int:
    import torch  # lazy: torch takes seconds to import

    threads = cpu_threads_for(cfg, agent, in_process)
    torch.set_num_threads(threads)
    return threads


def apply_gpu_flags(gpu: GpuConfig, device: str) -> dict[str, object]:
    """Set torch backend flags from `gpu` on CUDA; on CPU they do nothing, and the log says so."""
    import torch  # lazy: torch takes seconds to import

    log = logs.get()
    if gpu.cpu_threads:
        torch.set_num_threads(gpu.cpu_threads)  # 0: each stage sets its own (apply_cpu_threads)
    if device != "cuda":
        log.info(
            "gpu flags not applied", device=device, reason="not a CUDA device", cpu_threads=torch.get_num_threads()
        )
        return {"applied": False, "device": device, "cpu_threads": torch.get_num_threads()}
    torch.backends.cuda.matmul.allow_tf32 = gpu.tf32
    torch.backends.cudnn.allow_tf32 = gpu.tf32
    torch.backends.cudnn.benchmark = gpu.cudnn_benchmark
    torch.use_deterministic_algorithms(gpu.deterministic, warn_only=True)
    flags = {
        "applied": True, "device": device, "gpu_name": torch.cuda.get_device_name(0),
        "tf32": gpu.tf32, "cudnn_benchmark": gpu.cudnn_benchmark, "deterministic": gpu.deterministic,
    }
    log.info("gpu flags applied", **flags)
    return flags
