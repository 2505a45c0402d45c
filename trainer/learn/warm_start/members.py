"""An ensemble's members: their seeds, the models they start from, and processes that imitate them beside the stage,
one a free core.

The ten members of a night's ensemble depend on nothing but their seed and the demonstrations, and each is a few
minutes of one core. The stage imitates them from the first; each process beside it from the last. They share them
through the run folder (trainer.learn.warm_start.saved): a process holds a member's key while it imitates it, skips a
member another holds, and the stage loads what the others saved, so a member is imitated once whichever process gets
to it (the keys leave out the machine: a member imitated on one torch thread acts as one imitated on two, to float
roundings).

Measured on the 2-core VM (docs/benchmarks.md): SAC's actor alone fits a minibatch in 3.7 ms on one thread and 3.1 ms
on two, so two processes of one thread each imitate the ten members in ~60 % of the time one process on both cores
takes. A process costs its start (~10 s: torch, SB3 and CityLearn imported) and ~0.5 GB of memory: short imitations
(a test's, ``--quick``'s) and GPUs (one CUDA context a process) stay in the stage's process.

A process beside ends with the members' part of the warm start (the stage stops it), with its stage (Ctrl+C and a
service manager's SIGTERM are the stage's to handle), and when the stage's process dies (it watches its parent).
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer.base import logs
from trainer.base.beside import leave_with_the_parent
from trainer.config.sections import Config, WarmStartConfig
from trainer.learn.warm_start.cloning import imitate_once, imitation_key
from trainer.learn.warm_start.optimum_demonstrations import Demonstrations
from trainer.learn.warm_start.saved import SavedImitations
from trainer.learn.warm_start.validation import ImitationParts
from trainer.site import Site

MAX_PROCESSES = 4  # the stage's and three beside it: ten members in three rounds, ~2 GB of memory in all
# A member of fewer minibatches than this (a test's, --quick's 25 epochs) is not worth a process's ~10 s start.
MIN_MINIBATCHES = 2_000
# The seeds of an ensemble's members: the night's, then this far apart (the other years' draws use + 1000 to + 3000
# of the site's seed; these seed weights and minibatches, not sites).
MEMBER_SEED_STEP = 1000
STOP_WAIT_S = 5.0  # how long a process beside is given to end when the stage stops it, before it is killed


def processes_beside(settings: WarmStartConfig, members: int, minibatches: int, device: str, free: int) -> int:
    """How many processes imitate ``members`` beside the stage's own (each member ``minibatches`` long):
    ``warm_start.member_processes`` less one, or with 0 one a ``free`` core (at most MAX_PROCESSES in all) on a CPU
    where a member is long enough to pay a process's start; none on a GPU."""
    if members <= 1 or device != "cpu":
        return 0
    if settings.member_processes:
        return min(settings.member_processes, members) - 1
    if minibatches < MIN_MINIBATCHES:
        return 0
    return max(0, min(free, MAX_PROCESSES, members) - 1)


@contextmanager
def members_beside(count: int, cfg: Config, site: Site, teacher: str, demos: Demonstrations,
                   parts: ImitationParts, folder: Path, critic_epochs: int | None) -> Iterator[int]:
    """Run ``count`` processes imitating the ensemble's members from the last while the body imitates them from the
    first (each process one torch thread); stopped, and killed if need be, when the body ends. Yields how many
    started (a machine where none can start imitates them all in this process, with a warning)."""
    started: list[Any] = []
    if count > 0:
        context = multiprocessing.get_context("spawn")  # a fork of a process with torch's threads can hang
        members = cfg.warm_start.ensemble
        try:
            for index in range(count):
                # Each from another member, all toward the first: they meet the stage's process in the middle.
                order = list(range(members - 1 - index, 0, -1))
                process = context.Process(
                    target=_imitate_members, name=f"warm-start-members-{index + 1}", daemon=True,
                    args=(cfg, site, teacher, demos, parts, str(folder), order, critic_epochs))
                process.start()
                started.append(process)
        except Exception as exc:  # any failure to start one has the same remedy: imitate them here
            logs.get().warning("processes beside the warm start could not start: its members are imitated here",
                               error=f"{type(exc).__name__}: {exc}", started=len(started))
        if started:
            logs.get().info("warm start: members imitated beside this stage too", processes=len(started),
                            fix="--set warm_start.member_processes=1 keeps them in this process")
    try:
        yield len(started)
    finally:
        for process in started:
            if process.is_alive():
                process.terminate()
        for process in started:
            process.join(STOP_WAIT_S)
            if process.is_alive():
                process.kill()
                process.join()


def _imitate_members(cfg: Config, site: Site, teacher: str, demos: Demonstrations, parts: ImitationParts,
                     folder: str, order: list[int], critic_epochs: int | None) -> None:
    """A process beside the stage: imitate the members in ``order`` that no process holds or has saved."""
    import logging

    import torch  # lazy: torch takes seconds to import

    from trainer.env.citylearn import make_sb3_env
    from trainer.learn.warm_start.validation import policy_check

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the stage's to handle: it stops this process
    threading.Thread(target=leave_with_the_parent, daemon=True).start()
    logs.configure()
    logging.getLogger().setLevel(logging.WARNING)  # the stage logs each member; this process only what goes wrong
    torch.set_num_threads(1)
    settings = cfg.warm_start
    fit = (settings.epochs, settings.learning_rate, settings.batch_size)
    saved = SavedImitations(Path(folder))
    env = make_sb3_env(cfg, site, "eval", cfg.seed)
    try:
        for k in order:
            member, member_seed, key = member_and_key(cfg, k, teacher, env, "cpu", demos, parts, critic_epochs)
            if saved.busy(key) or saved.path(key).is_file():
                continue
            imitate_once(member, demos, *fit, member_seed, machine=False, saved=saved,
                         check=policy_check(cfg, parts, teacher, member), checked=parts.label,
                         critic_epochs=critic_epochs)
    finally:
        env.close()


def member_and_key(cfg: Config, k: int, teacher: str, env: Any, device: str, demos: Demonstrations,
                   parts: ImitationParts, critic_epochs: int | None) -> tuple[Any, int, str]:
    """Member ``k`` of the ensemble as it starts (the teacher's model from its seed), its seed and the key its
    imitation is kept under (the same on any device and threads: trainer.learn.warm_start.cloning)."""
    settings = cfg.warm_start
    member_seed = cfg.seed + k * MEMBER_SEED_STEP
    member = fresh_model(cfg, teacher, env, device, member_seed)
    key = imitation_key(member, demos, settings.epochs, settings.learning_rate, settings.batch_size, member_seed,
                        machine=False, checked=parts.label, critic_epochs=critic_epochs)
    return member, member_seed, key


def fresh_model(cfg: Config, agent: str, env: Any, device: str, seed: int) -> Any:
    """``agent``'s model as its stage builds it from ``seed``: a member's starting weights."""
    from trainer.learn.agents import build_model  # lazy: SB3 and torch

    # Any length: it sizes a rollout, which only a training would use.
    return build_model(cfg, agent, env, device, seed, 1 << 30)
