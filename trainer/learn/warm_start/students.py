"""The students of a night's later stages, imitated beside this stage's own.

A night's ensemble teaches every agent (``warm_start.teacher``: SAC's members): SAC's stage labels the members' mean
action and imitates it for its own policy (its student), then PPO's stage imitates the same labels for its policy
(A2C's is the same network from the same seed: it reuses PPO's). A student is minutes of one core (2,400 epochs at
a constant rate: SAC's 6 min, PPO's 7.4 on the 2-core VM, docs/benchmarks.md; the default 1,200 decaying, about
half), and PPO's needs nothing PPO's stage makes. So where a core is free, SAC's stage starts one process that
imitates the later stages' students from the same labels while it imitates its own, and keeps them in the run
folder (trainer.learn.warm_start.saved) under the keys those stages then ask for: each loads its student, or waits
for the process that holds it.

Only in an untimed stage (a timed one's student stops at its slot's end, and one cut short is not kept), on a CPU,
with a core free, and for a later stage that will imitate on one torch thread (the key names the threads: a stage on
two would not find it). The process outlives the stage that started it (the next one waits on it); it ends when it
has kept its students, when the night's process ends (it watches it), and is stopped with it (Ctrl+C, SIGTERM).
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from pathlib import Path

from trainer.base import logs
from trainer.base.beside import leave_with_the_parent
from trainer.config.roster import agent_spec
from trainer.config.sections import Config
from trainer.learn.warm_start.members import MIN_MINIBATCHES, fresh_model
from trainer.learn.warm_start.optimum_demonstrations import Demonstrations
from trainer.run.device import cpu_threads_for, free_cores_now
from trainer.sim.simulators import simulator_for
from trainer.site import Site

FREE_SAMPLE_S = 1.0  # how long the cores are watched before a process is started beside the stage (once a night)


def students_ahead(cfg: Config, site: Site, agent: str, later: tuple[str, ...], device: str, untimed: bool,
                   period_steps: int) -> list[str]:
    """Of the ``later`` stages, those whose student ``agent``'s stage can imitate beside its own (module doc): the
    same teacher's ensemble, a policy of their own (not picking a member), one torch thread, a student long enough
    to pay a process's start; none unless the stage is ``untimed``, on a CPU, with a second core free, and
    ``warm_start.member_processes`` is not 1 (every imitation in its stage's process)."""
    settings = cfg.warm_start
    minibatches = settings.student_epochs * period_steps / settings.batch_size  # full ones: a week's is not worth it
    if (not untimed or device != "cpu" or settings.ensemble <= 1 or settings.member_processes == 1
            or minibatches < MIN_MINIBATCHES or free_cores_now(FREE_SAMPLE_S) < 2):
        return []
    teacher, in_process = settings.teacher_of(agent), simulator_for(cfg, site).in_process
    return [a for a in dict.fromkeys(later)
            if a != agent and agent_spec(a).warm_start and settings.teacher_of(a) == teacher
            and not settings.picks_a_member(a) and cpu_threads_for(cfg, a, in_process) == 1]


def start_students(cfg: Config, site: Site, agents: list[str], labelled: Demonstrations, folder: Path) -> bool:
    """Start the process imitating ``agents``' students from ``labelled`` into ``folder``; whether it started (where
    it cannot, each stage imitates its own, as without it)."""
    context = multiprocessing.get_context("spawn")  # a fork of a process with torch's threads can hang
    process = context.Process(target=_imitate_students, name="warm-start-students", daemon=True,
                              args=(cfg, site, agents, labelled, str(folder)))
    try:
        process.start()
    except Exception as exc:  # any failure to start has the same remedy: each stage imitates its own
        logs.get().warning("the later stages' students could not be imitated beside this one: each imitates its own",
                           error=f"{type(exc).__name__}: {exc}")
        return False
    logs.get().info("warm start: the later stages' students imitated beside this one", agents=agents,
                    fix="--set warm_start.member_processes=1 keeps every imitation in its stage's process")
    return True


def _imitate_students(cfg: Config, site: Site, agents: list[str], labelled: Demonstrations, folder: str) -> None:
    """The process beside the stage: each agent's student, as its stage would imitate it (its model built from the
    night's seed, one torch thread), kept in the run folder."""
    import logging

    import torch  # lazy: torch takes seconds to import

    from trainer.env.citylearn import make_sb3_env
    from trainer.learn.warm_start.cloning import imitate_once
    from trainer.learn.warm_start.saved import SavedImitations

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the night's to handle: its end ends this process
    threading.Thread(target=leave_with_the_parent, daemon=True).start()
    logs.configure()
    logging.getLogger().setLevel(logging.WARNING)  # the stages log their students; this process what goes wrong
    torch.set_num_threads(1)
    settings = cfg.warm_start
    saved = SavedImitations(Path(folder))
    env = make_sb3_env(cfg, site, "eval", cfg.seed)
    try:
        for agent in agents:
            model = fresh_model(cfg, agent, env, "cpu", cfg.seed)
            imitate_once(model, labelled, settings.student_epochs, settings.learning_rate, settings.batch_size,
                         cfg.seed, saved=saved, critic_epochs=settings.student_critic_epochs,
                         decay=settings.student_decay)
    finally:
        env.close()
