"""SAC with stable-baselines3's losses and updates, and less work per gradient step.

Measured on a 2-core CPU (docs/benchmarks.md), SB3's ``SAC.train`` spends about half of each
gradient step in matrix products and much of the rest in work the result does not need.
:class:`FastSAC` keeps the algorithm, the networks, the optimisers and SB3's save format (a
FastSAC ``model.zip`` loads with ``stable_baselines3.SAC.load``) and removes that work:

- the actor's loss no longer back-propagates into the critics' weights: SB3 computes those
  gradients and throws them away at the next ``zero_grad`` (about a tenth of the products);
- the optimisers step all tensors of a network in one fused kernel instead of a Python loop
  over parameters (``optimizer_kwargs``; see :func:`fast_optimizer_kwargs`);
- the target networks are updated with one multi-tensor operation per step instead of two per
  parameter, in the same arithmetic order, so the targets are bit-identical to SB3's;
- the policy is not switched between train and eval mode around every step when it has no
  module that the mode changes (no dropout, no batch norm);
- losses and the entropy coefficient stay on the device until the end of ``train``: one
  synchronisation per call instead of four per gradient step (what costs most on a GPU);
- with :class:`TrainWhileStepping` around an environment in a worker process, each update runs
  while the environment computes the next step (``sac.learn_while_stepping``).

After a warm start, :class:`FineTuning` changes the algorithm on purpose: the critics learn alone
for the first updates, then the actor's loss keeps it near the demonstrations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from stable_baselines3 import SAC
from stable_baselines3.common.utils import polyak_update
from stable_baselines3.common.vec_env import VecEnvWrapper


def fast_optimizer_kwargs(device: str) -> dict[str, bool]:
    """Adam's fused implementation where this torch has one for the device (CPU since 2.4, CUDA)."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return {"fused": True} if device == "cuda" or (major, minor) >= (2, 4) else {}


class FastSAC(SAC):
    """stable-baselines3 SAC with a leaner gradient step (see the module's docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.defer_training = False
        self._pending_training: list[tuple[int, int]] = []
        self.fine_tune = FineTuning()

    def _setup_model(self) -> None:
        super()._setup_model()
        # SB3 switches the policy between train and eval mode around every step, walking every
        # module (about 1 ms a step). The mode only changes dropout and batch norm, which an
        # MlpPolicy does not have; where a policy does, the switch is kept.
        if not any(
            isinstance(m, (torch.nn.Dropout, torch.nn.modules.batchnorm._BatchNorm)) for m in self.policy.modules()
        ):
            self.policy.set_training_mode = _unchanged_mode

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "defer_training", "_pending_training", "fine_tune"]

    def learn(self, *args, **kwargs):
        result = super().learn(*args, **kwargs)
        self.run_pending_training()  # the last step's update, deferred to the next step that never came
        return result

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        if self.defer_training:
            self._pending_training.append((gradient_steps, batch_size))
            return
        self._train_now(gradient_steps, batch_size)

    def run_pending_training(self) -> None:
        """Apply the updates deferred by :class:`TrainWhileStepping` (before a checkpoint, at the end)."""
        while self._pending_training:
            self._train_now(*self._pending_training.pop(0))

    def _train_now(self, gradient_steps: int, batch_size: int) -> None:
        self.policy.set_training_mode(True)
        optimizers = [self.actor.optimizer, self.critic.optimizer]
        if self.ent_coef_optimizer is not None:
            optimizers += [self.ent_coef_optimizer]
        self._update_learning_rate(optimizers)

        critic_params = list(self.critic.parameters())
        target_params = list(self.critic_target.parameters())
        ent_coef_losses, ent_coefs, actor_losses, critic_losses = [], [], [], []

        for gradient_step in range(gradient_steps):
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)  # type: ignore[union-attr]
            if self.use_sde:
                self.actor.reset_noise()

            actions_pi, log_prob = self.actor.action_log_prob(replay_data.observations)
            log_prob = log_prob.reshape(-1, 1)
            actor_learns = self.fine_tune.actor_learns(self._n_updates + gradient_step)

            if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:
                ent_coef = torch.exp(self.log_ent_coef.detach())
                if actor_learns:  # the temperature waits with the actor
                    ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()
                    ent_coef_losses.append(ent_coef_loss.detach())
                    self.ent_coef_optimizer.zero_grad()
                    ent_coef_loss.backward()
                    self.ent_coef_optimizer.step()
            else:
                ent_coef = self.ent_coef_tensor
            ent_coefs.append(ent_coef.detach())

            critic_losses.append(self._critic_step(replay_data, ent_coef))

            if actor_learns:
                actor_losses.append(self._actor_step(replay_data.observations, actions_pi, log_prob, ent_coef,
                                                     critic_params, batch_size))

            if gradient_step % self.target_update_interval == 0:
                with torch.no_grad():
                    # SB3's polyak_update, as one multi-tensor op per line: the same arithmetic.
                    torch._foreach_mul_(target_params, 1 - self.tau)
                    torch._foreach_add_(target_params, critic_params, alpha=self.tau)
                polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)

        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/ent_coef", _mean(ent_coefs))
        if actor_losses:  # none while the critics learn alone
            self.logger.record("train/actor_loss", _mean(actor_losses))
        self.logger.record("train/critic_loss", _mean(critic_losses))
        if ent_coef_losses:
            self.logger.record("train/ent_coef_loss", _mean(ent_coef_losses))

    def _critic_step(self, replay_data: Any, ent_coef: torch.Tensor) -> torch.Tensor:
        """SB3's SAC critic update (soft Bellman targets from the target critics); returns its loss, detached."""
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.action_log_prob(replay_data.next_observations)
            next_q_values = torch.cat(self.critic_target(replay_data.next_observations, next_actions), dim=1)
            next_q_values, _ = torch.min(next_q_values, dim=1, keepdim=True)
            next_q_values = next_q_values - ent_coef * next_log_prob.reshape(-1, 1)
            target_q_values = replay_data.rewards + (1 - replay_data.dones) * self.gamma * next_q_values

        current_q_values = self.critic(replay_data.observations, replay_data.actions)
        critic_loss = 0.5 * sum(F.mse_loss(current_q, target_q_values) for current_q in current_q_values)
        self.critic.optimizer.zero_grad()
        critic_loss.backward()
        self.critic.optimizer.step()
        return critic_loss.detach()

    def _actor_step(self, observations: torch.Tensor, actions_pi: torch.Tensor, log_prob: torch.Tensor,
                    ent_coef: torch.Tensor, critic_params: list[torch.Tensor], batch_size: int) -> torch.Tensor:
        """One step of the actor (SB3's loss plus FineTuning's term); returns its loss, on the device."""
        # The actor's gradient flows through the critics' activations, not into their weights.
        for param in critic_params:
            param.requires_grad_(False)
        try:
            q_values_pi = torch.cat(self.critic(observations, actions_pi), dim=1)
            min_qf_pi, _ = torch.min(q_values_pi, dim=1, keepdim=True)
            actor_loss = (ent_coef * log_prob - min_qf_pi).mean()
            actor_loss = actor_loss + self.fine_tune.imitation_loss(self.actor, min_qf_pi, batch_size)
            self.actor.optimizer.zero_grad()
            actor_loss.backward()
            self.actor.optimizer.step()
        finally:
            for param in critic_params:
                param.requires_grad_(True)
        return actor_loss.detach()


class FineTuning:
    """Keeps SAC's actor near the demonstrations it was warm-started on (TD3+BC's regulariser; off: SB3's SAC).

    The actor's loss adds the mean squared distance of its action to the demonstrations' on a batch
    of them, weighted by the critics' mean |Q| divided by ``alpha`` (TD3+BC, Fujimoto & Gu 2021):
    scale-free, so one alpha fits any reward's scale; a larger alpha imitates less. Without it the
    critics, which have only seen the demonstrations' actions, pull the actor off them before they
    know better (measured: from 80 % of the optimum's cut to 35 % in 20k steps; docs/agent-quality.md).
    The batches are drawn with torch's global generator, which a checkpoint saves: a resume draws
    the same ones.

    Before the actor moves, the critics learn alone for ``critic_updates`` gradient updates (the
    temperature waits too). The imitation fitted them to the demonstrations' returns at the
    demonstrations' actions only, so their slope in the action, which is all the actor follows,
    is arbitrary until they have seen the warm start's own exploring rollouts (measured, seed 42:
    with 2,000 such updates SAC's validation curve stayed better than its warm start, without them
    it drifted worse; on other seeds the gain is smaller; docs/agent-quality.md). Counted in SB3's
    ``_n_updates``, which a checkpoint restores.
    """

    def __init__(self) -> None:
        self.alpha = 0.0
        self.critic_updates = 0
        self.observations: torch.Tensor | None = None
        self.actions: torch.Tensor | None = None

    def attach(self, observations: np.ndarray, actions: np.ndarray, alpha: float, device: torch.device,
               critic_updates: int = 0) -> None:
        self.observations = torch.as_tensor(observations, device=device)
        self.actions = torch.as_tensor(actions, device=device)
        self.alpha = alpha
        self.critic_updates = critic_updates

    def actor_learns(self, update: int) -> bool:
        """Whether gradient update ``update`` (0 = the first of the stage) moves the actor, or the critics alone."""
        return update >= self.critic_updates

    def imitation_loss(self, actor, q_values: torch.Tensor, batch_size: int) -> torch.Tensor | float:
        if self.alpha <= 0 or self.observations is None:
            return 0.0
        index = torch.randint(len(self.observations), (batch_size,)).to(self.observations.device)
        mean, _, _ = actor.get_action_dist_params(self.observations[index])
        distance = ((torch.tanh(mean) - self.actions[index]) ** 2).mean()
        return q_values.abs().mean().detach() / self.alpha * distance


def _unchanged_mode(mode: bool) -> None:
    """``set_training_mode`` for a policy whose modules behave the same in both modes."""


def _mean(values: list[torch.Tensor]) -> float:
    return float(np.mean(torch.stack(values).float().cpu().numpy())) if values else float("nan")


class TrainWhileStepping(VecEnvWrapper):
    """Runs the model's pending update after the actions are sent and before the results are read.

    With the environment in a worker process, the update and the environment step then run at the
    same time. The action of each step is chosen by the policy before that step's update (one update
    of lag), the only difference from SB3's order.
    """

    def __init__(self, venv):
        super().__init__(venv)
        self.model: FastSAC | None = None

    def attach(self, model: FastSAC) -> None:
        self.model = model
        model.defer_training = True

    def step_async(self, actions: np.ndarray) -> None:
        self.venv.step_async(actions)
        if self.model is None:
            return
        try:
            self.model.run_pending_training()
        except BaseException:
            self.venv.step_wait()  # read the step's result, so the worker's pipe stays in order
            raise

    def step_wait(self):
        return self.venv.step_wait()

    def reset(self):
        return self.venv.reset()
