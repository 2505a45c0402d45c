"""The distilled ensemble: several imitations from other seeds, their mean action labelling the states it reaches
in closed loop, and the agent's one policy imitating those labels."""

from __future__ import annotations

import hashlib
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.base import logs
from trainer.base.beside import beside, in_turn
from trainer.base.durations import TimeBox
from trainer.base.signals import STOP
from trainer.config.sections import Config
from trainer.env.citylearn import make_sb3_env
from trainer.learn.warm_start.cloning import already_imitated, imitate_once, imitation_key, weights_digest
from trainer.learn.warm_start.members import member_and_key, members_beside, processes_beside
from trainer.learn.warm_start.optimum_demonstrations import Demonstrations, demonstration_years
from trainer.learn.warm_start.saved import SavedImitations
from trainer.learn.warm_start.students import start_students, students_ahead
from trainer.learn.warm_start.validation import ImitationParts, policy_check
from trainer.references.controllers import Actor
from trainer.run.device import free_cores_now
from trainer.sim.simulators import chooses_on_simulator, judging_env
from trainer.site import Site

# An ensemble's labels by the digest of its members, its demonstrations and its config: a night's PPO and A2C distil
# the same ensemble, and the second need not run it again.
_DISTILLED: dict[str, Demonstrations] = {}
# Each member's CO2 over the validation part by its weights (best_members): the night's later stages distil the same.
_SCORED: dict[str, float] = {}



# An epoch fitting the critic too, in epochs of the actor alone: SAC's two Q networks make a minibatch 3.2 times one of
# its actor (11.8 against 3.7 ms on one core of the 2-core Xeon VM), PPO's value network 2.1 times.
CRITIC_EPOCH_COST = 3.0


def distil_an_ensemble(
    cfg: Config, site: Site, agent: str, model: Any, demos: Demonstrations, parts: ImitationParts,
    saved: SavedImitations | None = None, box: TimeBox | None = None, later: tuple[str, ...] = (),
) -> tuple[dict[str, Any], tuple[float, float], bool, list[Any]]:
    """Leave in ``model`` the imitation of ``warm_start.ensemble`` imitations' mean action (module docstring), each
    member a policy of the agent's teacher (``warm_start.teacher``: SAC's for every agent by default).

    Returns what results.json records of it (each member's errors, its labelled steps), the student's errors,
    whether an earlier stage's identical student was reused (as :func:`imitate_once`) and the members' policies.
    The global random state is put back as it was (building a member reseeds it): the stage then trains as with
    one imitation. Each member is checked on the validation part of ``parts`` where it has one (its best epochs
    kept); the student fits the members' mean for ``warm_start.student_epochs``. With a ``box``, the members take
    their share of it by epochs (no member starts after it; the first always does) and the student the rest. The
    ``later`` stages' students (the night's, one after another) are imitated beside this one's where a core is free
    (trainer.learn.warm_start.students).
    """
    import random

    import torch  # lazy: torch takes seconds to import

    settings, seed = cfg.warm_start, cfg.seed
    teacher = settings.teacher_of(agent)
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    fit = (settings.epochs, settings.learning_rate, settings.batch_size)
    # A user sees progress through what takes minutes, and how to make it one imitation.
    log = logs.get().bind(agent=agent, members=settings.ensemble, teacher=teacher)
    log.info("warm start: imitating the optimum from several initial weights, then their mean action "
             "(--set warm_start.ensemble=1 for one imitation)")
    try:
        box = box or TimeBox()
        # By epochs, one fitting a critic too as CRITIC_EPOCH_COST of the actor's alone.
        member_epoch = CRITIC_EPOCH_COST if settings.members_fit_critics else 1.0
        members_cost = settings.ensemble * settings.epochs * member_epoch
        critic_epochs = min(settings.student_critic_epochs, settings.student_epochs)
        student_cost = settings.student_epochs + (CRITIC_EPOCH_COST - 1.0) * critic_epochs
        members_share = members_cost / (members_cost + student_cost)
        members, errors = _imitate_members(cfg, site, teacher, str(model.device), demos, parts, saved, log,
                                           box.part(members_share))
        started = time.perf_counter()
        kept, scores = best_members(cfg, parts, teacher, members)
        if scores:
            log.info("warm start: the members that did best on the validation part make the mean",
                     kept=[k + 1 for k in kept], of=len(members), seconds=round(time.perf_counter() - started, 1),
                     validation_co2_kg_per_year=[round(score, 1) for score in scores])
        started = time.perf_counter()
        labelled = _ensemble_labels(cfg, parts.fit, [members[k] for k in kept], demos, parts.draws)
        log.info("warm start: the members' mean action labelled", steps=len(labelled.actions),
                 seconds=round(time.perf_counter() - started, 1))
        student_fit = (settings.student_epochs, *fit[1:], seed)
        # A stage whose own student an earlier one made (A2C's is PPO's) has none to imitate beside the later ones'.
        mine = imitation_key(model, labelled, *student_fit, critic_epochs=settings.student_critic_epochs,
                             decay=settings.student_decay)
        ahead = [] if saved is None or already_imitated(mine, saved) else students_ahead(
            cfg, site, agent, later, str(model.device), box.until is None, demos.period_steps)
        beside = bool(ahead) and start_students(cfg, site, ahead, labelled, saved.folder)
        threads = torch.get_num_threads()
        if beside:
            torch.set_num_threads(1)  # a core a process: threads on a core another uses wait for each other
        try:
            # The student starts where a single imitation would: the stage's model, as it was built. Its labels
            # agree with each other (one function of the observation), so it can fit them far closer than an
            # imitation fits the optimum's, and must: in closed loop a small miss costs points
            # (docs/agent-quality.md).
            student, reused = imitate_once(model, labelled, *student_fit, saved=saved, box=box,
                                           critic_epochs=settings.student_critic_epochs, decay=settings.student_decay)
        finally:
            torch.set_num_threads(threads)
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
    summary = {"members": len(members), "teacher": teacher, "members_actor_mse": [round(e[0], 5) for e in errors],
               "labelled_steps": len(labelled.actions), "student_epochs": settings.student_epochs,
               **({"members_kept": [k + 1 for k in kept],
                   "members_validation_co2_kg_per_year": [round(score, 1) for score in scores]} if scores else {}),
               "student_critic_epochs": min(settings.student_critic_epochs, settings.student_epochs)}
    if settings.members_fit_critics:
        summary["members_critic_mse"] = [round(e[1], 4) for e in errors]
    if beside:
        summary["students_beside"] = ahead  # the later stages' students, imitated in a process beside this one's
    return (summary,
            student, reused, members)


def best_members(cfg: Config, parts: ImitationParts, agent: str, members: list[Any]) -> tuple[list[int], list[float]]:
    """The indexes of the ensemble's ``members`` (``agent``'s policies) whose mean action the student imitates, and
    each member's CO2 over the validation part (kg a year; [] where none was driven): on a dataset with a validation
    part, the ``warm_start.members_kept`` share of them that did best there (at least one), else all.

    Imitations from other initial weights generalise unequally (Building_5 seed 1's ten kept 73.6-82.8 % of the
    held-out optimum's cut one by one), and on eleven nights of the official EV Buildings 4, 5, 7 and 10 the mean of
    the five 256x256 members best on the validation part beat the student of all ten's by 0.59 points on average, on
    ten (docs/agent-quality.md, "The members that did best on the validation part")."""
    everyone = list(range(len(members)))
    count = cfg.warm_start.members_meaned(len(members), ranked=parts.check is not None)
    if count == len(members):
        return everyone, []
    scores = []
    for member in members:
        # A night's later stages distil the same members: each is driven once a process.
        key = f"{cfg.digest()} {parts.label} {agent} {weights_digest(member, 0.0, machine=False)}"
        if key not in _SCORED:
            score = policy_check(cfg, parts, agent, _Held(member))
            assert score is not None  # parts.check is not None
            _SCORED[key] = score()
        scores.append(_SCORED[key])
    return sorted(sorted(everyone, key=lambda k: scores[k])[:count]), scores


@dataclass(frozen=True)
class _Held:
    """A member's policy where :func:`policy_check` takes a model."""

    policy: Any


def _imitate_members(cfg: Config, site: Site, teacher: str, device: str, demos: Demonstrations,
                     parts: ImitationParts, saved: SavedImitations | None,
                     log: Any, box: TimeBox) -> tuple[list[Any], list[tuple[float, float]]]:
    """The ensemble's members, each the teacher's policy imitating ``demos`` from its own seed, and their errors;
    members another process of the night is imitating are left to it until the others are done. Those imitated
    when the ``box`` ends (at least one) are the ensemble."""
    import torch  # lazy: torch takes seconds to import

    settings = cfg.warm_start
    critic_epochs = None if settings.members_fit_critics else 0
    imitated: dict[int, tuple[Any, tuple[float, float]]] = {}  # member index: its policy and errors
    minibatches = settings.epochs * -(-demos.period_steps // settings.batch_size)
    threads = torch.get_num_threads()
    env = make_sb3_env(cfg, site, "eval", cfg.seed)
    try:
        # None where an earlier stage (or run) kept them all: a process's start (~10 s) would find nothing to do.
        # The cores free now, not the load average: a minute after the references' processes beside them ended, it
        # still counted them, and a night imitated its ten members in one process (6.7 min where two took 4.6).
        beside = 0 if saved is None or _all_kept(cfg, teacher, device, demos, parts, saved, env, critic_epochs) else \
            processes_beside(settings, settings.ensemble, minibatches, device, free_cores_now())
        with ExitStack() as stack:
            if saved is not None and beside and stack.enter_context(
                    members_beside(beside, cfg, site, teacher, demos, parts, saved.folder, critic_epochs)):
                torch.set_num_threads(1)  # a core a process: threads on a core another uses wait for each other
            _imitate_members_here(cfg, teacher, device, demos, parts, saved, log, box, env, critic_epochs, imitated)
    finally:
        torch.set_num_threads(threads)
        env.close()
    members = [imitated[k][0] for k in sorted(imitated)]
    errors = [imitated[k][1] for k in sorted(imitated)]
    return members, errors


def _all_kept(cfg: Config, teacher: str, device: str, demos: Demonstrations, parts: ImitationParts,
              saved: SavedImitations, env: Any, critic_epochs: int | None) -> bool:
    """Whether every member of the ensemble is kept in the run folder already."""
    return all(already_imitated(member_and_key(cfg, k, teacher, env, device, demos, parts, critic_epochs)[2], saved)
               for k in range(cfg.warm_start.ensemble))


def _imitate_members_here(cfg: Config, teacher: str, device: str, demos: Demonstrations, parts: ImitationParts,
                          saved: SavedImitations | None, log: Any, box: TimeBox, env: Any,
                          critic_epochs: int | None, imitated: dict[int, tuple[Any, tuple[float, float]]]) -> None:
    """The members in order into ``imitated``: this process imitates those no other process holds, then loads (or
    imitates) the rest in turn."""
    settings = cfg.warm_start
    fit = (settings.epochs, settings.learning_rate, settings.batch_size)
    wait = False  # a first pass imitates the members no other process is imitating
    while len(imitated) < settings.ensemble:
        for k in range(settings.ensemble):  # the first is the seed's own imitation
            if k in imitated:
                continue
            if imitated and box.passed():
                break
            STOP.check("the warm start's ensemble")
            started = time.perf_counter()
            # The teacher's policy, and the night's members whichever stage imitated them first: a stage
            # with other threads, on another device or in another process distils the same ones.
            member, member_seed, key = member_and_key(cfg, k, teacher, env, device, demos, parts, critic_epochs)
            if not wait and saved is not None and saved.busy(key):
                continue  # a stage beside this one is imitating it: the next one first
            member_errors, reused = imitate_once(member, demos, *fit, member_seed, machine=False, saved=saved,
                                                 check=policy_check(cfg, parts, teacher, member),
                                                 checked=parts.label, box=box, critic_epochs=critic_epochs)
            imitated[k] = (member.policy, member_errors)
            log.info("warm start: ensemble member imitated", member=f"{k + 1}/{settings.ensemble}",
                     actor_mse=round(member_errors[0], 5), seconds=round(time.perf_counter() - started, 1),
                     reused=reused)
        if imitated and box.reached:
            log.info("warm start: the members' time is up: their mean is of those imitated",
                     imitated=len(imitated), of=settings.ensemble)
            break
        wait = True  # those left are other processes' to finish: wait for each in turn


def _ensemble_labels(cfg: Config, site: Site, members: list[Any], demos: Demonstrations,
                     draws: Path | None) -> Demonstrations:
    """The demonstrations' states and the states the members' mean action reaches in closed loop over each year of
    the demonstrations, each labelled with that mean action; the rewards it earned there (the critic's returns)."""
    digest = hashlib.sha256(f"{cfg.digest()} {site.schema} {site.start}-{site.end} {draws}".encode())
    for member in members:  # the same members on any device and threads act alike
        digest.update(weights_digest(member, 0.0, machine=False).encode())
    digest.update(demos.observations.tobytes())
    key = digest.hexdigest()
    if key in _DISTILLED:
        return _DISTILLED[key]

    parts = [Demonstrations(demos.observations, _mean_action([Actor(m) for m in members], demos.observations),
                          demos.rewards, 0.0)]
    years = demonstration_years(cfg, site, draws)[:len(demos.periods) or 1]  # those imitated (a timed slot: fewer)
    # Each year's closed loop is a core's Python: where a core is free, half of them run in a process beside this one.
    half = in_turn(len(years), site.length, free_cores_now())
    if half < len(years):
        pending = beside(_closed_loop, cfg, years[half:], members, free=2)
        try:
            runs = _closed_loop(cfg, years[:half], members) + pending.result("the warm start's ensemble")
        finally:
            pending.cancel()
    else:
        runs = _closed_loop(cfg, years, members)
    parts += runs
    joined = Demonstrations.joined(parts)
    # The demonstrations' own periods first (an epoch draws as many samples as the dataset's period), then the
    # ensemble's years.
    labelled = Demonstrations(joined.observations, joined.actions, joined.rewards, 0.0,
                              (*(demos.periods or (len(demos.actions),)), *joined.periods[1:]))
    if len(_DISTILLED) >= 2:
        del _DISTILLED[next(iter(_DISTILLED))]
    _DISTILLED[key] = labelled
    return labelled


def _mean_action(actors: list[Actor], observations: np.ndarray) -> np.ndarray:
    """The mean deterministic action of the members (each an :class:`Actor` of an SB3 policy) for each of
    ``observations``, each member's clipped to the action box as its ``predict`` clips it. They are called directly,
    in evaluation mode once: ``predict`` checks and converts its input and walks every module for each call, and for
    ten members that was 5.8 ms of a closed-loop step where the ten networks take 1.7 (docs/benchmarks.md)."""
    return np.clip(np.mean([act(observations) for act in actors], axis=0), -1.0, 1.0).astype(np.float32)


def _closed_loop(cfg: Config, years: list[Site], members: list[Any]) -> list[Demonstrations]:
    """The members' mean action run over each of ``years`` from its start: each state it meets, labelled with that
    action, and the reward it earned there. The years side by side, so that each member acts on all of them at once
    (a policy's call costs as much for a few states as for one). On one torch thread: a call on a few states gains
    nothing from a second, and where the other core runs the other half of the years, a second thread waits on it
    (a profile of a stage on two threads: the members' calls 57 % of its closed loop)."""
    import torch  # lazy: torch takes seconds to import

    envs = [_Year(cfg, year) for year in years]
    actors = [Actor(member) for member in members]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        obs = [env.reset() for env in envs]
        runs: list[tuple[list, list, list]] = [([], [], []) for _ in envs]
        running = list(range(len(envs)))
        while running:
            STOP.check("the warm start's ensemble")
            actions = _mean_action(actors, np.stack([obs[i] for i in running]))
            for i, action in zip(list(running), actions):
                runs[i][0].append(obs[i])
                runs[i][1].append(action)
                obs[i], reward, done = envs[i].step(action)
                runs[i][2].append(reward)
                if done:
                    running.remove(i)
    finally:
        torch.set_num_threads(threads)
        for env in envs:
            env.close()
    return [Demonstrations(np.asarray(o, np.float32), np.asarray(a, np.float32), np.asarray(r, np.float32), 0.0)
            for o, a, r in runs]


class _Year:
    """One year of the labels' closed loop from its start: on the training simulator where it steps the year as
    CityLearn does (trainer.sim.simulators.chooses_on_simulator: observations and rewards the same to float
    roundings, 3.1 ms a step on 2 cores where CityLearn takes 4.0), else in CityLearn."""

    def __init__(self, cfg: Config, year: Site) -> None:
        self.simulated = judging_env(cfg, year, 1) if chooses_on_simulator(cfg, year) else None
        self.citylearn = None if self.simulated is not None else make_sb3_env(cfg, year, "eval", cfg.seed)

    def reset(self) -> np.ndarray:
        if self.simulated is not None:
            return self.simulated.reset()[0]
        return self.citylearn.reset()[0]

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        """The next observation, the step's reward and whether the year has ended."""
        if self.simulated is not None:
            # At the year's end the simulator starts it again: the observation then is unused.
            observations, rewards, dones, _ = self.simulated.step(action[None])
            return observations[0], float(rewards[0]), bool(dones[0])
        observation, reward, terminated, truncated, _ = self.citylearn.step(action)
        return observation, reward, terminated or truncated

    def close(self) -> None:
        (self.simulated or self.citylearn).close()
