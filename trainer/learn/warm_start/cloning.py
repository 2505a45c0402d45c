"""Behaviour cloning: a policy regressed onto demonstrations (its actor onto their actions, its critic onto their
returns), and an imitation whose every input is the same reused to the bit (in a process, or from the run folder)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from trainer.base import logs
from trainer.base.durations import TimeBox
from trainer.base.progress import Progress
from trainer.base.signals import STOP
from trainer.learn.warm_start.optimum_demonstrations import Demonstrations
from trainer.learn.warm_start.saved import SavedImitations
from trainer.learn.warm_start.validation import KeepBest

PROGRESS_FROM_EPOCHS = 50


def imitate(model: Any, demos: Demonstrations, epochs: int, learning_rate: float, batch_size: int,
            seed: int, check: Callable[[], float] | None = None, box: TimeBox | None = None,
            critic_epochs: int | None = None, decay: bool = False) -> tuple[float, float]:
    """Regress the actor onto the demonstrations' actions and the critic onto their returns.

    Returns the last epoch's mean squared errors (actor, critic; the critic's of the last epoch that fitted it).
    ``critic_epochs`` (None: all of them) fits the critic in the first that many epochs only, 0 not at all: the
    actor and the critic are separate networks with their own Adam moments, so the actor ends with the very same
    weights either way, and a minibatch of SAC's actor alone costs a third of one with its two Q networks (an
    ensemble's members need no critic: only their mean action is used). With a ``check`` (the policy's CO2 over a
    validation part, trainer.learn.warm_start.validation), the policy is checked at its epochs and the weights of the
    best check are kept, with their errors; it stops early after checks that do no better. With a ``box`` it stops
    after the epoch that reaches its end (at least one), checked there too: the best it has by then. With ``decay``
    the learning rate falls from ``learning_rate`` to 0 over the epochs (a cosine): a student fitting labels that
    are one function of the observation ends far closer to them in as many epochs (a constant rate leaves Adam's
    steps as large at the end as at the start; docs/agent-quality.md). SAC's actor
    acts with tanh of its mean; PPO's and A2C's Gaussian policy with its mean (SB3 clips it to the action box). The
    critic (PPO's and A2C's value, SAC's two Q networks and their targets) learns the demonstrations' discounted
    returns: an untrained critic would judge the imitated policy's first steps at random,
    and the first updates would undo the imitation (measured: PPO fell from 83 % to 49 % of the
    optimum's cut in 60k steps with the actor alone warm-started).
    """
    import torch  # lazy: torch takes seconds to import

    policy = model.policy
    sac = hasattr(policy, "actor") and hasattr(policy.actor, "get_action_dist_params")
    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs) if decay else None
    device = policy.device
    observations = torch.as_tensor(demos.observations, device=device)
    actions = torch.as_tensor(demos.actions, device=device)
    returns = torch.as_tensor(demos.returns(float(model.gamma)), device=device).unsqueeze(1)
    generator = torch.Generator().manual_seed(seed)
    policy.set_training_mode(True)
    errors = (float("nan"), float("nan"))
    critic_epochs = epochs if critic_epochs is None else critic_epochs
    critic_error = float("nan")
    keep = None if check is None else KeepBest(policy, check, epochs)
    # A long imitation says how far it is (SAC's 400 epochs take minutes on a busy machine); a short one speaks only
    # when it runs past half a minute (25 epochs took 3 minutes beside other work with too many threads: issue 56).
    progress = Progress("warm start: imitating", epochs, unit="epoch", every_s=30,
                        every=0.25 if epochs >= PROGRESS_FROM_EPOCHS else None)
    for epoch in range(1, epochs + 1):
        STOP.check("the warm start")
        # An epoch is as many samples as the dataset's period, drawn from all the demonstrations: the imitation takes
        # as long with extra draws as without.
        order = torch.randperm(len(observations), generator=generator)[:demos.period_steps].to(device)
        actor_total = critic_total = 0.0
        fit_critic = epoch <= critic_epochs
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            obs, target_action, target_return = observations[batch], actions[batch], returns[batch]
            if sac:
                mean, _, _ = policy.actor.get_action_dist_params(obs)
                loss = actor_loss = ((torch.tanh(mean) - target_action) ** 2).mean()
                if fit_critic:
                    critic_loss = sum(((q - target_return) ** 2).mean() for q in policy.critic(obs, target_action))
            else:
                loss = actor_loss = ((policy.get_distribution(obs).distribution.mean - target_action) ** 2).mean()
                if fit_critic:
                    critic_loss = ((policy.predict_values(obs) - target_return) ** 2).mean()
            if fit_critic:
                loss = actor_loss + critic_loss
                critic_total += critic_loss.item() * len(batch)
            optimizer.zero_grad()  # the critic's gradients None when it does not fit: Adam leaves it as it is
            loss.backward()
            optimizer.step()
            actor_total += actor_loss.item() * len(batch)
        if schedule is not None:
            schedule.step()
        if fit_critic:
            critic_error = critic_total / len(order)
        errors = (actor_total / len(order), critic_error)
        progress.update(epoch)
        out_of_time = box is not None and epoch < epochs and box.passed()
        if keep is not None and keep.after(epoch, errors, last=out_of_time):
            break
        if out_of_time:
            logs.get().info("warm start: the imitation stopped at the end of its time", epoch=epoch, of=epochs)
            break
    progress.close()
    if keep is not None:
        errors = keep.restore(epoch)
    if sac:
        policy.critic_target.load_state_dict(policy.critic.state_dict())
    policy.set_training_mode(False)
    return errors


# Imitated weights and errors by imitation_key: each member of a night's ensembles and their students, each a policy's
# weights (a SAC policy's are ~1 MB).
_IMITATED: dict[str, tuple[dict[str, Any], tuple[float, float]]] = {}


_IMITATED_KEPT = 32


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
                  seed: int, machine: bool = True, checked: str = "", critic_epochs: int | None = None,
                  decay: bool = False) -> str:
    """A digest of everything :func:`imitate` reads: the policy (:func:`weights_digest`, with or without the
    ``machine``), the demonstrations, the settings, the seed (its minibatches come from a generator of its own),
    what it is ``checked`` on (trainer.learn.warm_start.validation.ImitationParts.label) and the critic's epochs
    where they are fewer than the actor's and the ``decay`` where it decays (an imitation without either keeps the
    key it always had)."""
    policy = weights_digest(model.policy, float(model.gamma), machine)
    critic = "" if critic_epochs is None or critic_epochs >= epochs else f" critic {critic_epochs}"
    critic += " cosine" if decay else ""
    digest = hashlib.sha256(f"{policy} {epochs} {learning_rate} {batch_size} {seed} {demos.periods} {checked}"
                            f"{critic}".encode())
    for array in (demos.observations, demos.actions, demos.rewards):
        digest.update(array.tobytes())
    return digest.hexdigest()


def imitate_once(model: Any, demos: Demonstrations, epochs: int, learning_rate: float, batch_size: int,
                 seed: int, machine: bool = True, saved: SavedImitations | None = None,
                 check: Callable[[], float] | None = None, checked: str = "",
                 box: TimeBox | None = None, critic_epochs: int | None = None,
                 decay: bool = False) -> tuple[tuple[float, float], bool]:
    """:func:`imitate`, or the weights an identical imitation ended with earlier in this process or, with ``saved``,
    in any process of the run (the same result to the bit: the key holds every input; without ``machine``, the
    weights of the same imitation on any device and threads). Where another process is imitating the same, it waits
    for that one's weights (trainer.learn.warm_start.saved). Returns the errors and whether they were reused. One
    cut short by its ``box`` is neither kept nor saved: it is not the imitation its key names."""
    key = imitation_key(model, demos, epochs, learning_rate, batch_size, seed, machine, checked, critic_epochs, decay)
    found = _IMITATED.get(key)
    if saved is not None:
        if found is None:
            with saved.claim(key):  # one process imitates it; one beside it waits, then loads it
                found = saved.load(key, like=model.policy.state_dict())
                if found is None:
                    errors = _imitate_and_keep(model, demos, epochs, learning_rate, batch_size, seed, key, check, box,
                                               critic_epochs, decay)
                    if key in _IMITATED:
                        saved.save(key, _IMITATED[key][0], errors)
                    return errors, False
        elif not saved.path(key).is_file():  # imitated in this process without a run folder to keep it in
            saved.save(key, *found)
    if found is None:
        return _imitate_and_keep(model, demos, epochs, learning_rate, batch_size, seed, key, check, box,
                                 critic_epochs, decay), False
    weights, errors = found
    _keep(key, weights, errors)
    model.policy.load_state_dict(weights)
    model.policy.set_training_mode(False)  # as imitate leaves it
    return errors, True


def already_imitated(key: str, saved: SavedImitations | None) -> bool:
    """Whether the imitation ``key`` names ended earlier in this process or, with ``saved``, in any of the run's."""
    return key in _IMITATED or (saved is not None and saved.path(key).is_file())


def _imitate_and_keep(model: Any, demos: Demonstrations, epochs: int, learning_rate: float, batch_size: int,
                      seed: int, key: str, check: Callable[[], float] | None = None,
                      box: TimeBox | None = None, critic_epochs: int | None = None,
                      decay: bool = False) -> tuple[float, float]:
    errors = imitate(model, demos, epochs, learning_rate, batch_size, seed, check, box, critic_epochs, decay)
    if box is None or not box.reached:
        _keep(key, {name: t.detach().clone() for name, t in model.policy.state_dict().items()}, errors)
    return errors


def _keep(key: str, weights: dict[str, Any], errors: tuple[float, float]) -> None:
    if key not in _IMITATED and len(_IMITATED) >= _IMITATED_KEPT:
        del _IMITATED[next(iter(_IMITATED))]
    _IMITATED[key] = (weights, errors)


def imitation_update_s(model: Any, batch_size: int, updates: int = 10, critic: bool = True,
                       repeats: int = 1) -> float:
    """Seconds one minibatch of the imitation takes for ``model`` on this machine, its critic fitted too or (not
    ``critic``) the actor alone, as an ensemble's members fit (the night's plan counts the warm start with it): the
    median of ``repeats`` timings of ``updates`` minibatches, so that one stall of a busy machine does not pass for
    its pace. Trains ``model`` on zeros: call it on a model built to be measured."""
    obs_size, action_size = model.observation_space.shape[0], model.action_space.shape[0]
    samples = batch_size * updates
    zeros = Demonstrations(np.zeros((samples, obs_size), np.float32), np.zeros((samples, action_size), np.float32),
                           np.zeros(samples, np.float32), 0.0)
    critic_epochs = None if critic else 0
    # A warm-up first: the first minibatches allocate.
    imitate(model, zeros, 1, 1e-4, batch_size, 0, critic_epochs=critic_epochs)
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        imitate(model, zeros, 1, 1e-4, batch_size, 0, critic_epochs=critic_epochs)
        timings.append((time.perf_counter() - started) / updates)
    return float(np.median(timings))
