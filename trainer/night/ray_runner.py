"""`trainer night --backend ray`: the night's stages as Ray tasks, side by side where their resources fit.

:class:`RayBackend` is a row of ``trainer.night.backends``: the night's driver (``state.drive``, in this
process) plans the night as on the local backend, hands it one job per stage, and alone writes
``schedule.json``, ``results.json`` and the report; the backend submits one Ray task per stage
(`ray.num_cpus`, `ray.num_gpus`, an off-policy agent's memory from its replay buffer) and reports each
outcome back. Each task runs in a fresh worker process
(``max_calls=1``), logs to ``logs/<stage>.jsonl`` and records each attempt (node, pid) in
``<stage>/attempts.jsonl``. A task whose worker dies (SIGKILL, a lost node) is run again by Ray
(``ray.max_retries``) and resumes from its newest checkpoint; SIGTERM to a worker saves a
checkpoint, then the stage is run again. Ctrl+C or SIGTERM to the driver cancels the running
stages, which save their checkpoints, and leaves the night resumable on either backend.

Facts found by trying Ray 2.60 here are in ../shared/docs/ray-notes.md: exceptions with several
arguments do not cross Ray (tasks return a StageOutcome), ``address="local"`` so a stale cluster
is never joined, stages sized from the resources Ray assigned them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

from trainer.base import logs
from trainer.base.checks import FAIL, PASS, Check
from trainer.base.errors import TrainerError, UsageError
from trainer.base.signals import Stopped, handle_stop_signals
from trainer.config.agents import OffPolicyConfig
from trainer.config.loading import load_config
from trainer.config.roster import agent_spec
from trainer.config.sections import Config
from trainer.env.citylearn import policy_sizes
from trainer.learn.memory import Shapes, replay_buffer_bytes
from trainer.learn.recovery import TrainingInterrupted
from trainer.night.budget import StageKind
from trainer.night.plan import REPORT_S
from trainer.night.ray_cluster import INSTALL, RAY_VERSION, check_backend, check_fits, import_ray, ray_session
from trainer.night.stages import run_job
from trainer.night.state import Night, StageEvent, StageJob, StageOutcome
from trainer.run.device import ASSIGNED_CPUS_ENV
from trainer.run.folder import RunContext, RunDir
from trainer.run.schedule_file import FINISHED, StageRecord


class StageRetry(Exception):
    """Raised in a task to have Ray run the stage again (it resumes from its checkpoint). One plain argument,
    so it crosses Ray intact."""


class NightStopped(Stopped):
    """Ctrl+C or SIGTERM to the driver: the running stages saved their checkpoints; the night is resumable."""

    def __init__(self, signal_name: str, exit_code: int, running: list[str]):
        self.exit_code = exit_code
        stages = ", ".join(running) or "none"
        Exception.__init__(self, f"stopped by {signal_name}: the stages running on Ray ({stages}) saved their "
                                 "checkpoints")


# ------------------------------------------------------------------------------ inside a worker


def stage_device(assigned: dict[str, float]) -> str:
    """A stage given no GPU runs on the CPU, even on a GPU node (Ray 2.60 no longer hides the GPU from it)."""
    return "cuda" if assigned.get("GPU", 0) > 0 else "cpu"


def run_stage(job: StageJob) -> StageOutcome:
    """One stage in a fresh Ray worker: its outcome, never an exception Ray cannot carry back."""
    import ray  # optional extra: imported where it runs

    run = RunDir(Path(job.run))
    assigned = ray.get_runtime_context().get_assigned_resources()
    device = stage_device(assigned)
    os.environ[ASSIGNED_CPUS_ENV] = str(max(int(assigned.get("CPU", 1)), 1))
    logs.configure(run.logs / f"{job.name}.jsonl")
    cfg = load_config([run.config])
    if job.kind == StageKind.TRAIN:
        cfg.agent(job.name).device = device
    attempt = {"node": socket.gethostname(), "pid": os.getpid(),
               "started": datetime.now().isoformat(timespec="seconds"), "resources": assigned}
    folder = run.agent(job.name)
    folder.root.mkdir(parents=True, exist_ok=True)
    with open(folder.attempts, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(attempt) + "\n")
    retried = folder.checkpoints.is_dir()  # an attempt after a killed one goes on from its checkpoint
    try:
        with handle_stop_signals():
            return run_job(RunContext(cfg, run, job.site, device), replace(job, resume=job.resume or retried))
    except TrainingInterrupted as exc:
        if exc.signal_name == "SIGTERM":
            raise StageRetry(f"{job.name}: stopped by SIGTERM at step {exc.step}; run again from its "
                             "checkpoint") from None
        return StageOutcome(stopped=str(exc))
    except Stopped as exc:
        return StageOutcome(stopped=str(exc))


# ------------------------------------------------------------------------------ the driver


def stage_resources(cfg: Config, record: StageRecord, obs_act: tuple[int, int]) -> dict[str, Any]:
    """Ray resources of one stage from the `ray` config: CPUs, GPUs, and an off-policy agent's memory from its
    replay buffer."""
    key = record.name if record.kind == StageKind.TRAIN else "eval"
    memory = cfg.ray.memory_headroom_gb * 1e9
    section = cfg.agent(record.name) if record.kind == StageKind.TRAIN else None
    if isinstance(section, OffPolicyConfig):
        memory += replay_buffer_bytes(Shapes(*obs_act, section.layers), section.buffer_size)
    return {"num_cpus": cfg.ray.num_cpus.get(key, 1.0), "num_gpus": cfg.ray.num_gpus.get(key, 0.0),
            "memory": int(memory)}


class RayBackend:
    """The nights' stages as Ray tasks, side by side where their resources fit; one queue for a seed sweep."""

    summary = "side by side on Ray (docs/ray.md)"
    options: ClassVar[dict[str, tuple[str, str]]] = {
        "address": ("HOST:PORT", "an existing Ray cluster (default: a local Ray sized to this machine)")}
    concurrent_nights = True
    one_process = False  # a fresh worker process per stage attempt (max_calls=1)
    parallel = True

    def __init__(self, ray: Any, nights: list[Night], obs_act: tuple[int, int], say: Callable[[str], None] = print):
        self.ray, self.nights, self.obs_act, self.say = ray, nights, obs_act, say
        self.running: dict[Any, tuple[StageJob, Night]] = {}
        self.attempts: dict[StageJob, tuple[dict[str, Any], ...]] = {}
        self.stop_signal: int | None = None
        self.log = logs.get()

    @classmethod
    def check(cls, cfg: Config, options: dict[str, Any]) -> None:
        check_backend(options.get("address"), cfg)

    @classmethod
    def doctor(cls, options: dict[str, Any]) -> Check:
        """Ray installed at the pinned version; with an address, the cluster's preflight."""
        address = options.get("address")
        try:
            import_ray()
            if address:
                with ray_session(address):
                    pass
        except TrainerError as exc:
            return Check("ray", FAIL, str(exc), INSTALL if "needs Ray" in str(exc) else "")
        except Exception as exc:  # a cluster that cannot be reached: say so with Ray's own words
            return Check("ray", FAIL, f"cannot use the Ray cluster at {address}: {str(exc).splitlines()[0]}",
                         "start it (ray start --head), check the address and RAY_AUTH_TOKEN (docs/ray.md)")
        where = f"the cluster at {address} matches" if address else "a local Ray starts with the night"
        return Check("ray", PASS, f"Ray {RAY_VERSION}; {where}")

    @classmethod
    @contextmanager
    def open(cls, nights: list[Night], options: dict[str, Any], say: Callable[[str], None]) -> Iterator[RayBackend]:
        first = nights[0].ctx
        with ray_session(options.get("address"), shared=first.run.root) as ray:
            executor = cls(ray, nights, policy_sizes(first.cfg, first.site), say)
            executor.fit()
            previous = {s: signal.signal(s, executor._on_stop) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield executor
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    def fit(self) -> None:
        """Refuse a stage the cluster could never start, then say when each stage should run."""
        resources = self.ray.cluster_resources()
        cpus, gpus = resources.get("CPU", 1.0), resources.get("GPU", 0.0)
        for night in self.nights:
            check_fits(night.ctx.cfg, cpus, gpus, "the Ray cluster")
            for record in night.state.stages:
                needs = stage_resources(night.ctx.cfg, record, self.obs_act)["memory"]
                if needs > resources.get("memory", float("inf")):
                    buffer = record.kind == StageKind.TRAIN and agent_spec(record.name).off_policy
                    raise UsageError(
                        f"stage {record.name} needs {needs / 1e9:,.1f} GB of memory (ray.memory_headroom_gb"
                        f"{', plus the replay buffer' if buffer else ''}) but the Ray cluster has "
                        f"{resources['memory'] / 1e9:,.1f} GB; Ray would never start it: lower ray.memory_headroom_gb"
                        f"{f' or {record.name}.buffer_size' if buffer else ''}")
        placed = lanes(self.nights, self.obs_act, cpus, gpus, datetime.now())
        self.say(render_lanes(placed, self.nights[0].state.deadline_dt(), cpus, gpus) + "\n")

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.stop_signal = signum

    def has_room(self) -> bool:
        return True  # Ray queues what its resources cannot start yet

    def submit(self, job: StageJob, night: Night) -> None:
        cfg = night.ctx.cfg
        record = next(r for r in night.state.stages if r.name == job.name)
        resources = stage_resources(cfg, record, self.obs_act)
        task = self.ray.remote(max_calls=1)(run_stage).options(  # a fresh worker per attempt: no stale globals
            max_retries=cfg.ray.max_retries, retry_exceptions=[StageRetry], **resources)
        self.running[task.remote(job)] = (job, night)
        self.log.info("stage submitted to Ray", run=night.ctx.run.root.name, stage=job.name, **resources)

    def wait(self) -> list[StageEvent]:
        """Finished stages and news of the attempts of running ones, within a second; a stop signal cancels every
        running stage (each saves its checkpoint) and raises, the night resumable."""
        if self.stop_signal is not None:
            self._stop()
        done, _ = self.ray.wait(list(self.running), num_returns=1, timeout=1.0)
        events = [self._outcome(ref) for ref in done]
        for job, night in self.running.values():
            attempts = _read_attempts(night.ctx.run, job.name)
            if attempts != self.attempts.get(job, ()):
                self.attempts[job] = attempts
                events.append(StageEvent(job, attempts=attempts))
        return [e for e in events if e is not None]

    def _outcome(self, ref: Any) -> StageEvent | None:
        job, night = self.running.pop(ref)
        attempts = _read_attempts(night.ctx.run, job.name)
        try:
            return StageEvent(job, self.ray.get(ref), attempts)
        except Exception as exc:  # retries used up, or cancelled
            if self.stop_signal is not None:
                return None  # stopped by the driver: it stays running, resumable
            cause = getattr(exc, "cause", None) or exc  # a RayTaskError carries the task's own exception
            return StageEvent(job, StageOutcome(error=f"{type(cause).__name__}: {cause}"), attempts)

    def _stop(self) -> None:
        name = signal.Signals(self.stop_signal).name
        running = [job.name for job, _ in self.running.values()]
        self.say(f"[ray] {name}: the running stages save their checkpoints ({', '.join(running)})")
        refs = list(self.running)
        for ref in refs:
            self.ray.cancel(ref)
        limit = max(night.ctx.cfg.ray.stop_timeout_s for night in self.nights)
        self.ray.wait(refs, num_returns=len(refs), timeout=limit)
        for night in self.nights:
            night.state.save()
        raise NightStopped(name, 128 + int(self.stop_signal), running)


def _read_attempts(run: RunDir, name: str) -> tuple[dict[str, Any], ...]:
    """Each attempt Ray made of a stage (node, pid, start), as its workers wrote them."""
    path = run.agent(name).attempts
    if not path.is_file():
        return ()
    return tuple(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


# ------------------------------------------------------------------------------ the plan, side by side


def lanes(nights: list[Night], obs_act: tuple[int, int], cpus: float, gpus: float,
          now: datetime) -> list[tuple[str, str, datetime, datetime]]:
    """When each stage would run on Ray: in order, each as soon as its CPUs and GPUs are free (list scheduling),
    for the estimated time (training to its target, capped by the deadline, plus its evaluation)."""
    busy: list[tuple[float, float, float]] = []  # (end, cpus, gpus) of the stages placed so far
    placed = []
    for night in nights:
        deadline = night.state.deadline_dt()
        for record in night.state.stages:
            if record.status in FINISHED or record.kind == StageKind.REPORT:
                continue
            spec, res = night.specs[record.name], stage_resources(night.ctx.cfg, record, obs_act)
            start = 0.0
            while True:  # the earliest moment (a stage's end) its resources fit beside the running ones
                running = [b for b in busy if b[0] > start]
                if sum(b[1] for b in running) + res["num_cpus"] <= cpus + 1e-9 and \
                        sum(b[2] for b in running) + res["num_gpus"] <= gpus + 1e-9:
                    break
                start = min(b[0] for b in running)
            train = spec.needed_train_s if spec.needed_train_s != float("inf") else 0.0
            if deadline is not None:
                train = min(train, max((deadline - now).total_seconds() - start - spec.setup_s - spec.fixed_s
                                       - REPORT_S, 0.0))
            end = start + spec.setup_s + train + spec.fixed_s
            busy.append((end, res["num_cpus"], res["num_gpus"]))
            placed.append((night.ctx.run.root.name, record.name, now + _seconds(start), now + _seconds(end)))
    return placed


def render_lanes(placed: list[tuple[str, str, datetime, datetime]], deadline: datetime | None, cpus: float,
                 gpus: float) -> str:
    several = len({run for run, *_ in placed}) > 1
    lines = [f"on Ray ({cpus:g} CPUs, {gpus:g} GPUs), stages side by side where their resources fit:"]
    for run, name, start, end in placed:
        lines.append(f"  {start:%H:%M:%S}-{end:%H:%M:%S}  {run + ' ' if several else ''}{name}")
    if placed:
        last = max(end for *_, end in placed)
        lines.append(f"  then the report; planned end {last:%a %H:%M}" +
                     (f", deadline {deadline:%a %H:%M}" if deadline else ""))
    return "\n".join(lines)


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)
