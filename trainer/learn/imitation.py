"""Warm start: before it learns from the reward, each agent's policy imitates the optimum.

Reinforcement learning alone, in a night's budget on a laptop, finds the easy half of the
problem (shift EV charging within each car's slack) and misses the battery's daily cycle: charging
costs imports at once and pays back hours later, and an untrained policy learns first never to
charge it (measured: PPO at 150k steps left the battery empty all year; docs/agent-quality.md).

The perfect-foresight optimum (trainer.optimum) knows the whole training period in advance, so its
dispatch is not a policy an agent can run; but replayed through the training site it is a set of
demonstrations, (observation, action) pairs, that a policy can imitate from what it sees at each
step. Imitated by supervised regression (behaviour cloning), a policy captures most of the
optimum's cut, and the cloned policy is a causal controller: on a year it has never seen (another
draw of the built-in site) it keeps that share (measured). On the built-in site it also imitates
the optimum of other years of the same climate (``warm_start.extra_draws``): one year is a single
trajectory, and a policy fitted to it alone drifts off it in closed loop by as much as its
initialisation decides (docs/agent-quality.md). Reinforcement learning then goes on from there
with the reward.

Which policy the regression ends with depends on its initial weights and minibatches as much as on the
demonstrations: five SAC imitations of one night, alike but for their seed, ranged from 87.3 to 93.0 % of the
optimum's cut, each drifting off the demonstrations in its own way, and the mean of their actions reached 93.8 %.
So the warm start is a distilled ensemble (``warm_start.ensemble``): that many imitations, from the seed and from
seed + MEMBER_SEED_STEP, + 2 x MEMBER_SEED_STEP...; their mean action, run in closed loop over each year of the
demonstrations, labels the states it meets as well as the demonstrations' own; and the agent's policy imitates
those labels (one network: the one reinforcement learning goes on with). Each label is a function of what the
policy observes, so the labels agree with each other, and the states are those the ensemble reaches (measured:
93.7 % there, where labels that pull a policy back to the optimum's trajectory, which it cannot see, made it
worse). The student must fit them far closer than an imitation fits the optimum (``warm_start.student_epochs``):
over three seeds the mean of ten imitations reached 94.1 %, its student fitted for an imitation's 400 epochs
91.9 %, for 2,400 epochs 93.9 % (docs/agent-quality.md).

The members are one agent's policies for every agent of the night (``warm_start.teacher``, SAC's): SAC's squashed
actor imitates the optimum closest, and PPO's 256x256 network taught by SAC's ten members' mean deployed 94.2 % of
the optimum's cut over three seeds, where its own ensemble (64x64) started it at 89.9 % and its night ended at
91.3 %. The members are imitated once in a process, by the first stage that needs them (docs/agent-quality.md).

Only a fresh stage is warm-started (a resumed one loads its checkpoint). The demonstrations are
computed once per process for a dataset and config (a second agent of the night reuses them), and so
is an imitation whose every input is the same: a night's PPO and A2C build the same policy from the
same seed, and the second copies the first's imitated weights (half a minute of a 20-minute night).
"""

from __future__ import annotations

import hashlib
import math
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer import logs
from trainer.config import Config
from trainer.env import make_sb3_env
from trainer.learn.saved_imitations import SavedImitations
from trainer.optimum import OptimumReplay, solve
from trainer.optimum_model import OptimumUnavailable, site_model
from trainer.roster import agent_spec
from trainer.scenario import DRAW_SEED_OFFSET
from trainer.signals import STOP
from trainer.site import Site


@dataclass(frozen=True)
class Demonstrations:
    observations: np.ndarray  # (steps, observation size), float32
    actions: np.ndarray  # (steps, action size) in the agents' [-1, 1] space
    rewards: np.ndarray  # (steps,) the product's reward for each step
    seconds: float
    periods: tuple[int, ...] = ()  # steps of each period, in order (the dataset's, then each draw's); () = one

    @property
    def period_steps(self) -> int:
        """Steps of the dataset's own period (an epoch of imitation draws this many samples)."""
        return self.periods[0] if self.periods else len(self.actions)

    def returns(self, gamma: float) -> np.ndarray:
        """Discounted return from each step to its period's end (what a critic of this policy should say)."""
        out = np.empty(len(self.rewards), dtype=np.float64)
        ends = set(np.cumsum(self.periods).tolist()) if self.periods else set()
        running = 0.0
        for t in range(len(self.rewards) - 1, -1, -1):
            if t + 1 in ends:
                running = 0.0
            running = self.rewards[t] + gamma * running
            out[t] = running
        return out.astype(np.float32)

    @classmethod
    def joined(cls, parts: list[Demonstrations]) -> Demonstrations:
        return cls(np.concatenate([p.observations for p in parts]), np.concatenate([p.actions for p in parts]),
                   np.concatenate([p.rewards for p in parts]), sum(p.seconds for p in parts),
                   tuple(len(p.actions) for p in parts))


_CACHE: dict[tuple[str, str, int], Demonstrations] = {}
_UNAVAILABLE: dict[tuple[str, str, int], str] = {}  # why not, for a dataset the optimum does not model


def demonstrations(cfg: Config, site: Site, seed: int) -> Demonstrations:
    """The optimum's dispatch over the dataset's whole period, replayed: what the agent would have seen and done."""
    key = (str(site.schema), cfg.digest(), seed)
    if key in _CACHE:
        return _CACHE[key]
    if key in _UNAVAILABLE:
        raise OptimumUnavailable(_UNAVAILABLE[key])
    started = time.perf_counter()
    env = make_sb3_env(cfg, site, "eval", seed)
    try:
        env.reset()
        try:
            solution = solve(site_model(env.unwrapped, cfg.ev.margin_soc))
        except OptimumUnavailable as exc:
            _UNAVAILABLE[key] = str(exc)
            raise
        replay = OptimumReplay(solution)
        obs, _ = env.reset()
        observations, actions, rewards, done = [], [], [], False
        while not done:
            action = replay.act(obs, env.unwrapped)
            observations.append(obs)
            actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            done = terminated or truncated
    finally:
        env.close()
    result = Demonstrations(np.asarray(observations, dtype=np.float32),
                            np.clip(np.asarray(actions, dtype=np.float32), -1.0, 1.0),
                            np.asarray(rewards, dtype=np.float32), time.perf_counter() - started)
    _CACHE[key] = result
    return result


def training_demonstrations(cfg: Config, site: Site, seed: int, draws: Path | None) -> Demonstrations:
    """The dataset's demonstrations and, on the built-in site, those of ``warm_start.extra_draws`` other years of its
    climate (built once under ``draws``; None: the dataset's alone).

    One year's demonstrations are a single trajectory: a policy fitted to them drifts off it in closed loop, and how
    far depends on its initialisation (measured: SAC's imitation of one year reached 85.8-91.9 % of the optimum's cut
    over three seeds; with three more years 91.2-93.7 %; docs/agent-quality.md).
    """
    parts = [demonstrations(cfg, year, seed) for year in demonstration_years(cfg, site, draws)]
    return parts[0] if len(parts) == 1 else Demonstrations.joined(parts)


def demonstration_years(cfg: Config, site: Site, draws: Path | None) -> list[Site]:
    """The years the warm start learns from: the dataset and, where its kind draws other years (the built-in site),
    ``warm_start.extra_draws`` of them, built once under ``draws``."""
    years = [site]
    if draws is not None and site.kind.draws:
        years += [site.draw(draws / f"draw-{k + 1}", DRAW_SEED_OFFSET + k) for k in range(cfg.warm_start.extra_draws)]
    return years


def imitate(model: Any, demos: Demonstrations, epochs: int, learning_rate: float, batch_size: int,
            seed: int) -> tuple[float, float]:
    """Regress the actor onto the demonstrations' actions and the critic onto their returns.

    Returns the last epoch's mean squared errors (actor, critic). SAC's actor acts with tanh of its
    mean; PPO's and A2C's Gaussian policy with its mean (SB3 clips it to the action box). The critic
    (PPO's and A2C's value, SAC's two Q networks and their targets) learns the demonstrations'
    discounted returns: an untrained critic would judge the imitated policy's first steps at random,
    and the first updates would undo the imitation (measured: PPO fell from 83 % to 49 % of the
    optimum's cut in 60k steps with the actor alone warm-started).
    """
    import torch  # lazy: torch takes seconds to import

    policy = model.policy
    sac = hasattr(policy, "actor") and hasattr(policy.actor, "get_action_dist_params")
    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    device = policy.device
    observations = torch.as_tensor(demos.observations, device=device)
    actions = torch.as_tensor(demos.actions, device=device)
    returns = torch.as_tensor(demos.returns(float(model.gamma)), device=device).unsqueeze(1)
    generator = torch.Generator().manual_seed(seed)
    policy.set_training_mode(True)
    errors = (float("nan"), float("nan"))
    for _ in range(epochs):
        STOP.check("the warm start")
        # An epoch is as many samples as the dataset's period, drawn from all the demonstrations: the imitation takes
        # as long with extra draws as without.
        order = torch.randperm(len(observations), generator=generator)[:demos.period_steps].to(device)
        actor_total = critic_total = 0.0
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            obs, target_action, target_return = observations[batch], actions[batch], returns[batch]
            if sac:
                mean, _, _ = policy.actor.get_action_dist_params(obs)
                actor_loss = ((torch.tanh(mean) - target_action) ** 2).mean()
                critic_loss = sum(((q - target_return) ** 2).mean() for q in policy.critic(obs, target_action))
            else:
                actor_loss = ((policy.get_distribution(obs).distribution.mean - target_action) ** 2).mean()
                critic_loss = ((policy.predict_values(obs) - target_return) ** 2).mean()
            optimizer.zero_grad()
            (actor_loss + critic_loss).backward()
            optimizer.step()
            actor_total += actor_loss.item() * len(batch)
            critic_total += critic_loss.item() * len(batch)
        errors = (actor_total / len(order), critic_total / len(order))
    if sac:
        policy.critic_target.load_state_dict(policy.critic.state_dict())
    policy.set_training_mode(False)
    return errors


# Imitated weights and errors by imitation_key: each member of a night's ensembles and their students, each a policy's
# weights (a SAC policy's are ~1 MB).
_IMITATED: dict[str, tuple[dict[str, Any], tuple[float, float]]] = {}
_IMITATED_KEPT = 32
# An ensemble's labels by the digest of its members, its demonstrations and its config: a night's PPO and A2C distil
# the same ensemble, and the second need not run it again.
_DISTILLED: dict[str, Demonstrations] = {}
# The seeds of an ensemble's members: the night's, then this far apart (the other years' draws use + 1000 to + 3000
# of the site's seed; these seed weights and minibatches, not sites).
MEMBER_SEED_STEP = 1000


def policy_digest(model: Any) -> str:
    """A digest of what :func:`imitate` reads of ``model``: its policy's class, device, threads and weights, and
    its discount (the critic's targets). Two agents with the same digest imitate to the same weights."""
    return weights_digest(model.policy, float(model.gamma))


def weights_digest(policy: Any, gamma: float, machine: bool = True) -> str:
    """A digest of ``policy``'s class, weights and ``gamma`` and, with ``machine``, its device and torch's threads:
    two policies with the same digest act alike (an ensemble's members and the warm start's candidates are keyed by
    it). Without ``machine`` it names the same policy on any device and threads, whose imitation ends a few float
    roundings apart from this one's."""
    import torch  # lazy: torch takes seconds to import

    where = f" {policy.device} {torch.get_num_threads()}" if machine else ""
    digest = hashlib.sha256(f"{type(policy).__module__}.{type(policy).__qualname__}{where} {gamma}".encode())
    for name, tensor in policy.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def imitation_key(model: Any, demos: Demonstrations, epochs: int, learning_rate: float, batch_size: int,
                  seed: int, machine: bool = True) -> str:
    """A digest of everything :func:`imitate` reads: the policy (:func:`weights_digest`, with or without the
    ``machine``), the demonstrations, the settings and the seed (its minibatches come from a generator of its own)."""
    policy = weights_digest(model.policy, float(model.gamma), machine)
    digest = hashlib.sha256(f"{policy} {epochs} {learning_rate} {batch_size} {seed} {demos.periods}".encode())
    for array in (demos.observations, demos.actions, demos.rewards):
        digest.update(array.tobytes())
    return digest.hexdigest()


def imitate_once(model: Any, demos: Demonstrations, epochs: int, learning_rate: float, batch_size: int,
                 seed: int, machine: bool = True,
                 saved: SavedImitations | None = None) -> tuple[tuple[float, float], bool]:
    """:func:`imitate`, or the weights an identical imitation ended with earlier in this process or, with ``saved``,
    in any process of the run (the same result to the bit: the key holds every input; without ``machine``, the
    weights of the same imitation on any device and threads). Where another process is imitating the same, it waits
    for that one's weights (trainer.learn.saved_imitations). Returns the errors and whether they were reused."""
    key = imitation_key(model, demos, epochs, learning_rate, batch_size, seed, machine)
    found = _IMITATED.get(key)
    if saved is not None:
        if found is None:
            with saved.claim(key):  # one process imitates it; one beside it waits, then loads it
                found = saved.load(key)
                if found is None:
                    errors = _imitate_and_keep(model, demos, epochs, learning_rate, batch_size, seed, key)
                    saved.save(key, _IMITATED[key][0], errors)
                    return errors, False
        elif not saved.path(key).is_file():  # imitated in this process without a run folder to keep it in
            saved.save(key, *found)
    if found is None:
        return _imitate_and_keep(model, demos, epochs, learning_rate, batch_size, seed, key), False
    weights, errors = found
    _keep(key, weights, errors)
    model.policy.load_state_dict(weights)
    model.policy.set_training_mode(False)  # as imitate leaves it
    return errors, True


def _imitate_and_keep(model: Any, demos: Demonstrations, epochs: int, learning_rate: float, batch_size: int,
                      seed: int, key: str) -> tuple[float, float]:
    errors = imitate(model, demos, epochs, learning_rate, batch_size, seed)
    _keep(key, {name: t.detach().clone() for name, t in model.policy.state_dict().items()}, errors)
    return errors


def _keep(key: str, weights: dict[str, Any], errors: tuple[float, float]) -> None:
    if key not in _IMITATED and len(_IMITATED) >= _IMITATED_KEPT:
        del _IMITATED[next(iter(_IMITATED))]
    _IMITATED[key] = (weights, errors)


def distil_an_ensemble(
    cfg: Config, site: Site, agent: str, model: Any, demos: Demonstrations, draws: Path | None,
    saved: SavedImitations | None = None,
) -> tuple[dict[str, Any], tuple[float, float], bool, list[Any]]:
    """Leave in ``model`` the imitation of ``warm_start.ensemble`` imitations' mean action (module docstring), each
    member a policy of the agent's teacher (``warm_start.teacher``: SAC's for every agent by default).

    Returns what results.json records of it (each member's errors, its labelled steps), the student's errors,
    whether an earlier stage's identical student was reused (as :func:`imitate_once`) and the members' policies.
    The global random state is put back as it was (building a member reseeds it): the stage then trains as with
    one imitation.
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
        imitated: dict[int, tuple[Any, tuple[float, float]]] = {}  # member index: its policy and errors
        env = make_sb3_env(cfg, site, "eval", seed)
        try:
            wait = False  # a first pass imitates the members no other process is imitating
            while len(imitated) < settings.ensemble:
                for k in range(settings.ensemble):  # the first is the seed's own imitation
                    if k in imitated:
                        continue
                    STOP.check("the warm start's ensemble")
                    started = time.perf_counter()
                    # The teacher's policy, and the night's members whichever stage imitated them first: a stage
                    # with other threads, on another device or in another process distils the same ones.
                    member_seed = seed + k * MEMBER_SEED_STEP
                    member = _fresh(cfg, teacher, env, str(model.device), member_seed)
                    if (not wait and saved is not None
                            and saved.busy(imitation_key(member, demos, *fit, member_seed, machine=False))):
                        continue  # a stage beside this one is imitating it: the next one first
                    member_errors, reused = imitate_once(member, demos, *fit, member_seed, machine=False, saved=saved)
                    imitated[k] = (member.policy, member_errors)
                    log.info("warm start: ensemble member imitated", member=f"{k + 1}/{settings.ensemble}",
                             actor_mse=round(member_errors[0], 5), seconds=round(time.perf_counter() - started, 1),
                             reused=reused)
                wait = True  # those left are other processes' to finish: wait for each in turn
        finally:
            env.close()
        members = [imitated[k][0] for k in range(settings.ensemble)]
        errors = [imitated[k][1] for k in range(settings.ensemble)]
        started = time.perf_counter()
        labelled = _ensemble_labels(cfg, site, members, demos, draws)
        log.info("warm start: the members' mean action labelled", steps=len(labelled.actions),
                 seconds=round(time.perf_counter() - started, 1))
        # The student starts where a single imitation would: the stage's model, as it was built. Its labels agree
        # with each other (one function of the observation), so it can fit them far closer than an imitation fits
        # the optimum's, and must: in closed loop a small miss costs points (docs/agent-quality.md).
        student, reused = imitate_once(model, labelled, settings.student_epochs, *fit[1:], seed, saved=saved)
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
    return ({"members": settings.ensemble, "teacher": teacher, "members_actor_mse": [round(e[0], 5) for e in errors],
             "members_critic_mse": [round(e[1], 4) for e in errors], "labelled_steps": len(labelled.actions),
             "student_epochs": settings.student_epochs},
            student, reused, members)


def _fresh(cfg: Config, agent: str, env: Any, device: str, seed: int) -> Any:
    from trainer.learn.agents import build_model  # lazy: SB3 and torch

    # Any length: it sizes a rollout, which only a training would use.
    return build_model(cfg, agent, env, device, seed, 1 << 30)


def _ensemble_labels(cfg: Config, site: Site, members: list[Any], demos: Demonstrations,
                     draws: Path | None) -> Demonstrations:
    """The demonstrations' states and the states the members' mean action reaches in closed loop over each year of
    the demonstrations, each labelled with that mean action; the rewards it earned there (the critic's returns)."""
    digest = hashlib.sha256(f"{cfg.digest()} {site.schema} {draws}".encode())
    for member in members:  # the same members on any device and threads act alike
        digest.update(weights_digest(member, 0.0, machine=False).encode())
    digest.update(demos.observations.tobytes())
    key = digest.hexdigest()
    if key in _DISTILLED:
        return _DISTILLED[key]

    def mean_action(observations: np.ndarray) -> np.ndarray:
        actions = [member.predict(observations, deterministic=True)[0] for member in members]
        return np.clip(np.mean(actions, axis=0), -1.0, 1.0).astype(np.float32)

    parts = [Demonstrations(demos.observations, mean_action(demos.observations), demos.rewards, 0.0)]
    # The years side by side, so that each member acts on all of them at once (a policy's call costs as much for a
    # few states as for one).
    envs = [make_sb3_env(cfg, year, "eval", cfg.seed) for year in demonstration_years(cfg, site, draws)]
    try:
        obs = [env.reset()[0] for env in envs]
        runs: list[tuple[list, list, list]] = [([], [], []) for _ in envs]
        running = list(range(len(envs)))
        while running:
            STOP.check("the warm start's ensemble")
            actions = mean_action(np.stack([obs[i] for i in running]))
            for i, action in zip(list(running), actions):
                runs[i][0].append(obs[i])
                runs[i][1].append(action)
                obs[i], reward, terminated, truncated, _ = envs[i].step(action)
                runs[i][2].append(reward)
                if terminated or truncated:
                    running.remove(i)
    finally:
        for env in envs:
            env.close()
    parts += [Demonstrations(np.asarray(o, np.float32), np.asarray(a, np.float32), np.asarray(r, np.float32), 0.0)
              for o, a, r in runs]
    joined = Demonstrations.joined(parts)
    # The demonstrations' own periods first (an epoch draws as many samples as the dataset's period), then the
    # ensemble's years.
    labelled = Demonstrations(joined.observations, joined.actions, joined.rewards, 0.0,
                              (*(demos.periods or (len(demos.actions),)), *joined.periods[1:]))
    if len(_DISTILLED) >= 2:
        del _DISTILLED[next(iter(_DISTILLED))]
    _DISTILLED[key] = labelled
    return labelled


def imitation_update_s(model: Any, batch_size: int, updates: int = 10) -> float:
    """Seconds one minibatch of the imitation takes for ``model`` on this machine (the night's plan counts the
    warm start with it). Trains ``model`` on zeros: call it on a model built to be measured."""
    obs_size, action_size = model.observation_space.shape[0], model.action_space.shape[0]
    samples = batch_size * updates
    zeros = Demonstrations(np.zeros((samples, obs_size), np.float32), np.zeros((samples, action_size), np.float32),
                           np.zeros(samples, np.float32), 0.0)
    imitate(model, zeros, 1, 1e-4, batch_size, 0)  # warm-up: the first minibatches allocate
    started = time.perf_counter()
    imitate(model, zeros, 1, 1e-4, batch_size, 0)
    return (time.perf_counter() - started) / updates


def narrow_exploration(model: Any, std: float) -> None:
    """Start PPO's and A2C's Gaussian exploration at ``std`` (SB3 starts it at 1).

    With a standard deviation of 1 on a [-1, 1] box, most exploratory actions are clipped to the
    bounds, far from the imitated policy, and the first updates undo the imitation (measured: 78 %
    of the optimum's cut fell to 36 % after 60k PPO steps; with 0.1 it kept 73 %). SAC is left as
    SB3 makes it: narrowing its spread and temperature the same way made it worse, not better
    (from 79 % to below the uncontrolled site in 10k steps; docs/agent-quality.md).
    """
    import torch  # lazy: torch takes seconds to import

    log_std = getattr(model.policy, "log_std", None)
    if isinstance(log_std, torch.nn.Parameter):
        with torch.no_grad():
            log_std.fill_(math.log(std))


def start_temperature(model: Any, temperature: float) -> None:
    """Start SAC's learned entropy temperature at ``temperature`` (SB3 starts it at 1).

    This reward is about 0.05 a step; at 1 the entropy bonus outweighs it ~100 times, and the
    bonus of a tanh-squashed policy is largest with its mean in the middle of the range: the
    imitated policy is pulled to doing nothing (measured: 80 % of the optimum's cut to 10 % in 20k
    steps; docs/agent-quality.md). The temperature is then learned as SB3 does.
    """
    import torch  # lazy: torch takes seconds to import

    log_temperature = getattr(model, "log_ent_coef", None)
    if isinstance(log_temperature, torch.Tensor):
        with torch.no_grad():
            log_temperature.fill_(math.log(temperature))


# Each optimizer's hook handle (not the term: the term holds the policy, which would keep the key alive).
_ATTACHED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class BehaviourCloningTerm:
    """Adds ``weight`` x the mean squared distance of a Gaussian policy's mean to the demonstrations' actions to
    every gradient step of its optimizer (a behaviour-cloning term beside the policy gradient, as DAPG adds).

    A2C takes one unclipped step per rollout along a noisy gradient; on two seeds of three it left its warm
    start from the first 100k steps on, whatever the learning rate; with this term (weight 10) it held or
    improved it on all three. PPO with it improved on its warm start where without it the selection kept
    the warm start (docs/agent-quality.md). Hooked before torch's ``Optimizer.step`` (after SB3 or
    FastPPO has clipped the policy gradient; FastPPO's gradients are torch views of its numpy arrays, and
    autograd adds to them in place), so neither loop is touched; batches are drawn with torch's global
    generator, which a checkpoint saves: a resume draws the same ones.
    """

    def __init__(self, policy: Any, observations: np.ndarray, actions: np.ndarray, weight: float,
                 batch_size: int) -> None:
        import torch  # lazy: torch takes seconds to import

        self.policy = policy
        self.observations = torch.as_tensor(observations, device=policy.device)
        self.actions = torch.as_tensor(actions, device=policy.device)
        self.weight = weight
        self.batch_size = min(batch_size, len(observations))
        previous = _ATTACHED.get(policy.optimizer)
        if previous is not None:  # attached again to the same optimizer: this term replaces that one
            previous.remove()
        _ATTACHED[policy.optimizer] = policy.optimizer.register_step_pre_hook(self._before_step)

    def loss(self) -> Any:
        import torch  # lazy: torch takes seconds to import

        index = torch.randint(len(self.observations), (self.batch_size,)).to(self.observations.device)
        policy = self.policy
        features = policy.extract_features(self.observations[index], policy.pi_features_extractor)
        mean = policy.action_net(policy.mlp_extractor.forward_actor(features))
        return self.weight * ((mean - self.actions[index]) ** 2).mean()

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.loss().backward()  # adds to the gradients the step is about to apply


def term_strength(cfg: Config, agent: str) -> float:
    """The strength of the term that keeps ``agent`` near its demonstrations (its roster row's key; 0 = none)."""
    key = agent_spec(agent).fine_tune_key
    return float(getattr(cfg.warm_start, key)) if key and cfg.warm_start.epochs > 0 else 0.0


def time_with_the_term(cfg: Config, agent: str, model: Any) -> None:
    """Hook a behaviour-cloning term on stand-in demonstrations onto an on-policy ``model`` whose stage will carry
    one, so that a calibration times the update the stage runs (on PPO's numpy minibatch the term's torch pass
    costs ~70 % more update; docs/benchmarks.md)."""
    strength = term_strength(cfg, agent)
    if strength <= 0 or agent_spec(agent).off_policy:
        return
    rows = cfg.warm_start.batch_size
    zeros = np.zeros((rows, *model.observation_space.shape), np.float32)
    BehaviourCloningTerm(model.policy, zeros, np.zeros((rows, *model.action_space.shape), np.float32), strength, rows)


def keep_near_demonstrations(cfg: Config, site: Site, agent: str, model: Any, draws: Path | None = None) -> bool:
    """Keep the agent's fine-tuning near the demonstrations it was warm-started on: SAC's TD3+BC term
    (``warm_start.sac_bc_alpha``) after its critics' first updates alone (``warm_start.sac_critic_updates``),
    PPO's and A2C's behaviour-cloning term (``warm_start.ppo_bc_weight``, ``warm_start.a2c_bc_weight``).

    Called for a fresh and for a resumed stage alike (the demonstrations are not in a checkpoint;
    they are recomputed, or reused within a process). False where there is nothing to attach.
    """
    settings, spec = cfg.warm_start, agent_spec(agent)
    strength = term_strength(cfg, agent)
    fine_tune = getattr(model, "fine_tune", None)  # an off-policy learner's own term (FastSAC's TD3+BC)
    critic_updates = settings.sac_critic_updates if fine_tune is not None else 0
    if settings.epochs <= 0 or (strength <= 0 and critic_updates <= 0) or (spec.off_policy and fine_tune is None):
        return False
    try:
        demos = training_demonstrations(cfg, site, cfg.seed, draws)
    except OptimumUnavailable:
        return False  # the warm start said so
    log = logs.get().bind(agent=agent, strength=strength, steps=len(demos.actions))
    if fine_tune is not None:
        fine_tune.attach(demos.observations, demos.actions, strength, model.device, critic_updates)
        log = log.bind(critic_first_updates=critic_updates)
    else:  # the optimizer's hook keeps the term (a model attribute would be pickled into every checkpoint)
        BehaviourCloningTerm(model.policy, demos.observations, demos.actions, strength, settings.batch_size)
    log.info("fine-tuning keeps the policy near the demonstrations")
    return True


def warm_start(cfg: Config, site: Site, agent: str, model: Any, draws: Path | None = None,
               held_out: list[Site] | None = None, saved: SavedImitations | None = None) -> dict[str, Any] | None:
    """Imitate the optimum before learning (``warm_start.epochs`` > 0); None where it is off or not possible. With
    ``warm_start.ensemble`` > 1, the imitation of that many imitations' mean (:func:`distil_an_ensemble`), or with
    ``warm_start.pick_best`` whichever of it and the members does best over the ``held_out`` years
    (trainer.learn.warm_start_pick). With ``saved``, the imitations other processes of the run made are reused and
    this one's kept for them (trainer.learn.saved_imitations)."""
    settings = cfg.warm_start
    log = logs.get().bind(agent=agent)
    if settings.epochs <= 0:
        return None
    if not agent_spec(agent).warm_start:
        log.info("warm start skipped: this agent's policy cannot imitate (its roster row)")
        return None
    try:
        demos = training_demonstrations(cfg, site, cfg.seed, draws)
    except OptimumUnavailable as exc:
        log.warning("warm start skipped: the optimum is not available for this dataset", reason=str(exc))
        return None
    started = time.perf_counter()
    ensemble = None
    if settings.ensemble > 1:
        ensemble, (actor_error, critic_error), reused, members = distil_an_ensemble(cfg, site, agent, model, demos,
                                                                                    draws, saved)
        from trainer.learn.warm_start_pick import pick_the_best  # lazy: the simulator's VecEnv imports SB3

        pick = pick_the_best(cfg, agent, model, members, held_out or []) if settings.picks_a_member(agent) else None
        if pick is not None:
            ensemble["pick"] = pick
            if pick["member"]:  # the stage starts from that member: its fit is the warm start's
                actor_error = ensemble["members_actor_mse"][pick["member"] - 1]
                critic_error = ensemble["members_critic_mse"][pick["member"] - 1]
    else:
        (actor_error, critic_error), reused = imitate_once(model, demos, settings.epochs, settings.learning_rate,
                                                           settings.batch_size, cfg.seed, saved=saved)
    narrow_exploration(model, settings.policy_std)
    start_temperature(model, settings.sac_temperature)
    summary = {"steps": len(demos.actions), "periods": len(demos.periods) or 1, "epochs": settings.epochs,
               "actor_mse": round(actor_error, 5),
               "critic_mse": round(critic_error, 4),
               "demonstrations_s": round(demos.seconds, 1), "imitation_s": round(time.perf_counter() - started, 1)}
    if ensemble is not None:
        summary["ensemble"] = ensemble
    what = "the optimum"
    if ensemble is not None:
        member = (ensemble.get("pick") or {}).get("member", 0)
        what = (f"the mean of {settings.ensemble} {ensemble['teacher'].upper()} imitations of the optimum"
                if not member else
                f"the optimum: member {member} of {settings.ensemble} imitations, the best over the held-out years")
    log.info(f"warm start: the policy imitates {what}"
             + (" (the same imitation as an earlier stage's: its weights reused)" if reused else ""), **summary)
    return summary
