"""Where a night's stages run: one table of backends, each a class that places stage jobs.

``BACKENDS`` is the only list of them: ``--backend``'s choices, ``trainer doctor --backend``, the night
and seed sweeps all read it. A backend owns its command-line options (Ray's ``--address``), its checks
before anything is written, its line in the doctor, and the executor that the night's driver
(:func:`trainer.night.state.drive`) hands its jobs to: the driver alone decides what becomes of a stage.
Adding a backend (SLURM through submitit, say) is a module with its class and a row here
(docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from trainer.base.checks import Check
from trainer.base.errors import UsageError
from trainer.base.files import write_json_atomic
from trainer.base.signals import Stopped
from trainer.learn.recovery import TrainingInterrupted
from trainer.night.budget import StageKind
from trainer.night.ray_runner import RayBackend
from trainer.night.stages import run_job
from trainer.night.state import Executor, Night, StageEvent, StageJob, StageOutcome
from trainer.run.device import agent_device

if TYPE_CHECKING:
    from trainer.config.sections import Config


class Backend(Protocol):
    """A row of :data:`BACKENDS`: a class whose instances are a night's executor."""

    summary: ClassVar[str]                         # what it does, for --backend's help
    options: ClassVar[dict[str, tuple[str, str]]]  # its own options: name -> (metavar, help)
    concurrent_nights: ClassVar[bool]              # a sweep's nights share it at once (else one after another)
    one_process: ClassVar[bool]                    # every stage in this process: a stage reuses an earlier one's
                                                   # demonstrations and imitation, and the plan counts them once

    @classmethod
    def check(cls, cfg: Config, options: dict[str, Any]) -> None: ...  # before any folder: UsageError to refuse

    @classmethod
    def doctor(cls, options: dict[str, Any]) -> Check | None: ...  # its line in `trainer doctor`, if any

    @classmethod
    def open(cls, nights: list[Night], options: dict[str, Any],
             say: Callable[[str], None]) -> Iterator[Executor]: ...  # a context manager


class LocalBackend:
    """Each stage in this process, one after another: the default."""

    summary = "one after another in this process"
    options: ClassVar[dict[str, tuple[str, str]]] = {}
    concurrent_nights = False
    one_process = True
    parallel = False

    def __init__(self) -> None:
        self.pending: tuple[StageJob, Night] | None = None

    @classmethod
    def check(cls, cfg: Config, options: dict[str, Any]) -> None:
        return None

    @classmethod
    def doctor(cls, options: dict[str, Any]) -> Check | None:
        return None

    @classmethod
    @contextmanager
    def open(cls, nights: list[Night], options: dict[str, Any], say: Callable[[str], None]) -> Iterator[LocalBackend]:
        yield cls()

    def has_room(self) -> bool:
        return self.pending is None

    def submit(self, job: StageJob, night: Night) -> None:
        self.pending = (job, night)

    def wait(self) -> list[StageEvent]:
        """Run the stage now; a stop signal propagates, any other failure is the stage's."""
        assert self.pending is not None, "wait() without a submitted stage"
        (job, night), self.pending = self.pending, None
        ctx = night.ctx
        # The GPU monitor (a separate process) warns of an idle GPU only while a stage uses one.
        device = agent_device(ctx.cfg, job.name) if job.kind == StageKind.TRAIN else "cpu"
        write_json_atomic(ctx.run.activity, {"stage": job.name, "device": device})
        try:
            outcome = run_job(ctx, job)
        except (TrainingInterrupted, Stopped):
            raise
        except Exception as exc:  # a failed stage must not end the night
            outcome = StageOutcome(error=f"{type(exc).__name__}: {exc}")
        return [StageEvent(job, outcome)]


BACKENDS: dict[str, type[Backend]] = {"local": LocalBackend, "ray": RayBackend}


def backend(name: str) -> type[Backend]:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r}: expected one of {', '.join(BACKENDS)}") from None


def own_options(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The options of backend ``name`` among ``given`` (every backend's, None where not passed); another
    backend's option passed is refused with the backend it belongs to."""
    chosen = backend(name)
    for option, value in given.items():
        if value is not None and option not in chosen.options:
            owner = next(n for n, b in BACKENDS.items() if option in b.options)
            raise UsageError(f"--{option.replace('_', '-')} is an option of --backend {owner}, not {name}: add "
                             f"--backend {owner} or leave it out")
    return {option: given.get(option) for option in chosen.options}
