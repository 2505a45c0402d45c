"""After the warm start: what keeps fine-tuning near the demonstrations (SAC's TD3+BC term, PPO's and A2C's
behaviour-cloning term) and how the imitated policy starts to explore."""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from trainer.base import logs
from trainer.config.roster import agent_spec
from trainer.config.sections import Config
from trainer.learn.warm_start.optimum_demonstrations import training_demonstrations
from trainer.learn.warm_start.validation import imitation_parts
from trainer.references.optimum_model import OptimumUnavailable
from trainer.site import Site


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


# Each optimizer's hook handle and a weak reference to its term (the term holds the policy, which would keep the
# key alive; the optimizer's hook keeps the term).
_ATTACHED: weakref.WeakKeyDictionary[Any, tuple[Any, weakref.ref]] = weakref.WeakKeyDictionary()


def attached_term(optimizer: Any) -> BehaviourCloningTerm | None:
    """The behaviour-cloning term hooked on ``optimizer``, if any."""
    entry = _ATTACHED.get(optimizer)
    return entry[1]() if entry is not None else None


class BehaviourCloningTerm:
    """Adds ``weight`` x the mean squared distance of a Gaussian policy's mean to the demonstrations' actions to
    every gradient step of its optimizer (a behaviour-cloning term beside the policy gradient, as DAPG adds).

    A2C takes one unclipped step per rollout along a noisy gradient; on two seeds of three it left its warm
    start from the first 100k steps on, whatever the learning rate; with this term (weight 10) it held or
    improved it on all three. PPO with it improved on its warm start where without it the selection kept
    the warm start (docs/agent-quality.md). Hooked before torch's ``Optimizer.step`` (after SB3 or
    FastPPO has clipped the policy gradient; FastPPO's gradients are torch views of its numpy arrays, and
    autograd adds to them in place), so neither loop is touched; batches are drawn with torch's global
    generator, which a checkpoint saves: a resume draws the same ones. During FastPPO's numpy update
    (:meth:`in_numpy`) the term's gradient is added in numpy too: in torch it cost as much as the rest of that
    update (6.3 of 13.9 s of PPO's updates on Building_5, per-operation overhead; docs/benchmarks.md).
    """

    def __init__(self, policy: Any, observations: np.ndarray, actions: np.ndarray, weight: float,
                 batch_size: int) -> None:
        import torch  # lazy: torch takes seconds to import

        self.policy = policy
        self.observations = torch.as_tensor(observations, device=policy.device)
        self.actions = torch.as_tensor(actions, device=policy.device)
        self.weight = weight
        self.batch_size = min(batch_size, len(observations))
        self._arrays: Any = None  # FastPPO's PolicyArrays while its numpy update runs (in_numpy)
        previous = _ATTACHED.get(policy.optimizer)
        if previous is not None:  # attached again to the same optimizer: this term replaces that one
            previous[0].remove()
        _ATTACHED[policy.optimizer] = (policy.optimizer.register_step_pre_hook(self._before_step), weakref.ref(self))

    @contextmanager
    def in_numpy(self, arrays: Any) -> Iterator[None]:
        """While inside, add the term's gradient with ``arrays`` (trainer.learn.fast_ppo.PolicyArrays, whose gradients
        are the policy's) instead of torch's autograd: the same batches, the same gradient within float32 rounding."""
        self._arrays = arrays
        try:
            yield
        finally:
            self._arrays = None

    def loss(self, index: Any = None) -> Any:
        """The term on a batch of the demonstrations (``index``: drawn when not given), as a torch loss."""
        policy = self.policy
        index = self._draw() if index is None else index
        features = policy.extract_features(self.observations[index], policy.pi_features_extractor)
        mean = policy.action_net(policy.mlp_extractor.forward_actor(features))
        return self.weight * ((mean - self.actions[index]) ** 2).mean()

    def _draw(self) -> Any:
        import torch  # lazy: torch takes seconds to import

        return torch.randint(len(self.observations), (self.batch_size,)).to(self.observations.device)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # Adds to the gradients the step is about to apply.
        index = self._draw()
        if self._arrays is None:
            self.loss(index).backward()
            return
        rows = index.numpy()
        self._arrays.add_imitation_gradient(self.observations.numpy()[rows], self.actions.numpy()[rows], self.weight)


def term_strength(cfg: Config, agent: str) -> float:
    """The strength of the term that keeps ``agent`` near its demonstrations (its roster row's key; 0 = none)."""
    key = agent_spec(agent).fine_tune_key
    return float(getattr(cfg.warm_start, key)) if key and cfg.warm_start.epochs > 0 else 0.0


def time_with_the_term(cfg: Config, agent: str, model: Any) -> None:
    """Hook a behaviour-cloning term on stand-in demonstrations onto an on-policy ``model`` whose stage will carry
    one, so that a calibration times the update the stage runs (the term adds about half of PPO's numpy gradient
    to each minibatch, A2C's torch pass more; docs/benchmarks.md)."""
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
        parts = imitation_parts(site, draws)  # the warm start's own demonstrations (computed once a process)
        demos = training_demonstrations(cfg, parts.fit, cfg.seed, parts.draws, replayed_only=True)
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
