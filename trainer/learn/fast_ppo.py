"""PPO with stable-baselines3's losses, rollouts, optimiser and save format, its gradient step in numpy.

Why: on the training simulator PPO is bound by its own update, not by the environment. One minibatch
of SB3's ``PPO.train`` (64 samples, two 64x64 networks) costs ~0.8 ms on one core of the development
machine, nearly all of it torch's per-operation overhead on tensors this small: building the Normal
distribution and checking its arguments, autograd's graph, four ``.item()`` calls, gradient clipping
tensor by tensor. The same arithmetic written out as numpy on the CPU, with the gradients derived by
hand, costs ~0.15 ms (docs/benchmarks.md has the figures). The optimiser step stays torch's own (the
policy's Adam, fused where torch has the kernel), so a checkpoint, ``PPO.load`` and resume see SB3's
objects unchanged.

What :class:`FastPPO` keeps of SB3's ``PPO.train`` exactly: the epochs, the minibatch order (one
``np.random.permutation`` per epoch from NumPy's global generator, as SB3's ``RolloutBuffer.get``
draws it, so a resume replays it), advantage normalisation, the clipped surrogate, the value loss, the
entropy term, gradient clipping by global norm, the logged values. Its parameters after an update equal
SB3's within float32 rounding (``tests/test_fast_ppo.py``).

The numpy step covers what the product builds: an ``MlpPolicy`` (flattened 1-D observations, Tanh or
ReLU layers, separate policy and value networks) with a diagonal Gaussian on a CPU, no gSDE, no value
clipping, no KL early stop. Any other model trains with SB3's own ``train`` (logged once, with why).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.distributions import DiagGaussianDistribution
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import FlattenExtractor
from stable_baselines3.common.utils import explained_variance
from stable_baselines3.common.vec_env import VecEnv

from trainer.base import logs
from trainer.learn.warm_start.fine_tune import attached_term

_ACTIVATIONS = (torch.nn.Tanh, torch.nn.ReLU)
_HALF_LOG_2PI = np.float32(0.5 * math.log(2 * math.pi))


class FastPPO(PPO):
    """stable-baselines3 PPO whose gradient step runs in numpy on the CPU (see the module's docstring)."""

    def _setup_model(self) -> None:
        super()._setup_model()
        self._said_why_not: str | None = None

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_said_why_not"]

    def collect_rollouts(self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer,
                         n_rollout_steps: int) -> bool:
        # SB3's loop, with the policy's forward pass during collection in numpy too: in torch it cost ~1 ms a step
        # of 64 sites (per-operation overhead again), a ninth of PPO's time on an official EV building. The noise
        # is still drawn by torch, one normal_() of the actions' shape as torch's Normal.rsample draws it, so the
        # random stream, checkpoints and resume are SB3's. predict_values (truncated episodes, the last step) stays
        # torch's: a few calls a rollout.
        if numpy_step_unsupported(self) is not None:
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        self.policy.forward = PolicyArrays(self.policy, gradients=False).act  # type: ignore[method-assign]
        try:
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        finally:
            del self.policy.forward  # back to the class's own

    def train(self) -> None:
        reason = numpy_step_unsupported(self)
        if reason is not None:
            if reason != self._said_why_not:
                logs.get().info("PPO's update runs in torch", reason=reason)
                self._said_why_not = reason
            super().train()
            return
        self._train_numpy()

    def _train_numpy(self) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        clip_range = float(self.clip_range(self._current_progress_remaining))  # type: ignore[operator]
        net = PolicyArrays(self.policy)
        term = attached_term(self.policy.optimizer)  # the warm start's behaviour-cloning term, in numpy too
        with term.in_numpy(net) if term is not None else nullcontext():
            self._update(net, clip_range)

    def _update(self, net: PolicyArrays, clip_range: float) -> None:
        buffer = self.rollout_buffer
        names = ("observations", "actions", "log_probs", "advantages", "returns")
        pg_losses, value_losses, entropy_losses, clip_fractions, approx_kls = [], [], [], [], []
        loss = float("nan")
        for _ in range(self.n_epochs):
            # SB3's RolloutBuffer.get: the same draw from NumPy's global generator, the same flattening.
            order = np.random.permutation(buffer.buffer_size * buffer.n_envs)
            if not buffer.generator_ready:
                for name in (*names, "values"):
                    buffer.__dict__[name] = buffer.swap_and_flatten(buffer.__dict__[name])
                buffer.generator_ready = True
            obs, actions, old_log_prob, advantages, returns = (
                buffer.__dict__[name][order].reshape(len(order), -1) for name in names)
            approx_kls = []
            for start in range(0, len(order), self.batch_size):
                rows = slice(start, start + self.batch_size)
                terms = net.gradient(obs[rows], actions[rows], old_log_prob[rows, 0], advantages[rows, 0],
                                     returns[rows, 0], clip_range, float(self.ent_coef), float(self.vf_coef),
                                     self.normalize_advantage)
                pg_losses.append(terms.policy_loss)
                value_losses.append(terms.value_loss)
                entropy_losses.append(terms.entropy_loss)
                clip_fractions.append(terms.clip_fraction)
                approx_kls.append(terms.approx_kl)
                loss = terms.loss
                net.clip_gradients(self.max_grad_norm)
                self.policy.optimizer.step()
            self._n_updates += 1

        explained_var = explained_variance(buffer.values.flatten(), buffer.returns.flatten())
        self.logger.record("train/entropy_loss", np.mean(entropy_losses))
        self.logger.record("train/policy_gradient_loss", np.mean(pg_losses))
        self.logger.record("train/value_loss", np.mean(value_losses))
        self.logger.record("train/approx_kl", np.mean(approx_kls))
        self.logger.record("train/clip_fraction", np.mean(clip_fractions))
        self.logger.record("train/loss", loss)
        self.logger.record("train/explained_variance", explained_var)
        self.logger.record("train/std", float(np.exp(net.log_std).mean()))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)


def numpy_step_unsupported(model: PPO) -> str | None:
    """Why ``model``'s update cannot run in numpy, or None when it can."""
    policy = model.policy
    if model.device.type != "cpu":
        return f"the policy is on {model.device.type}, not the CPU"
    if type(policy) is not ActorCriticPolicy or not isinstance(policy.features_extractor, FlattenExtractor):
        extractor = type(policy.features_extractor).__name__
        return f"the policy is {type(policy).__name__} with {extractor}, not an MlpPolicy"
    if len(model.observation_space.shape or ()) != 1:
        return "observations are not a flat vector"
    if model.use_sde or not isinstance(policy.action_dist, DiagGaussianDistribution):
        return "actions are not a diagonal Gaussian without gSDE"
    if policy.activation_fn not in _ACTIVATIONS:
        return f"the activation is {policy.activation_fn.__name__}, not Tanh or ReLU"
    if model.clip_range_vf is not None or model.target_kl is not None:
        return "clip_range_vf or target_kl is set"
    if any(p.dtype != torch.float32 for p in policy.parameters()):
        return "the parameters are not float32"
    return None


@dataclass(frozen=True, slots=True)
class StepTerms:
    """The losses and statistics of one minibatch, as SB3's ``PPO.train`` logs them."""

    policy_loss: float
    value_loss: float
    entropy_loss: float
    clip_fraction: float
    approx_kl: float
    loss: float


class PolicyArrays:
    """An SB3 ``MlpPolicy``'s parameters as numpy views of its own tensors, and its gradients.

    The gradients live in one flat array (clipping by global norm is then one dot product); each
    parameter's ``.grad`` is a torch view of its slice, so the policy's optimizer steps from them.
    Built at the start of each rollout (for :meth:`act`, ``gradients=False``: the policy's ``.grad`` left as it is)
    and each ``train`` call: a load or a resume may have replaced the tensors.
    """

    def __init__(self, policy: ActorCriticPolicy, gradients: bool = True):
        params = list(policy.parameters())
        self.grads = np.zeros(sum(p.numel() for p in params) if gradients else 0, np.float32)
        grad_of: dict[int, np.ndarray | None] = {id(param): None for param in params}
        offset = 0
        for param in params if gradients else ():
            view = self.grads[offset:offset + param.numel()].reshape(tuple(param.shape))
            param.grad = torch.from_numpy(view)
            grad_of[id(param)] = view
            offset += param.numel()

        def pair(linear: torch.nn.Linear) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
            return (linear.weight.detach().numpy(), linear.bias.detach().numpy(),
                    grad_of[id(linear.weight)], grad_of[id(linear.bias)])

        extractor = policy.mlp_extractor
        self.pi_layers = [pair(m) for m in extractor.policy_net if isinstance(m, torch.nn.Linear)]
        self.vf_layers = [pair(m) for m in extractor.value_net if isinstance(m, torch.nn.Linear)]
        self.action_head = pair(policy.action_net)
        self.value_head = pair(policy.value_net)
        self.log_std = policy.log_std.detach().numpy()
        self.log_std_grad = grad_of[id(policy.log_std)]
        self.tanh = policy.activation_fn is torch.nn.Tanh

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ActorCriticPolicy.forward`` in numpy: (actions, values, log-probabilities) as torch tensors, the
        Gaussian's noise drawn from torch's generator as SB3's distribution draws it."""
        x = obs.float().reshape(len(obs), -1).numpy()
        mean = self._head(self.action_head, self._forward(self.pi_layers, x)[-1])
        values = self._head(self.value_head, self._forward(self.vf_layers, x)[-1])
        if deterministic:
            actions = mean
        else:
            noise = torch.empty(mean.shape, dtype=torch.float32).normal_().numpy()
            actions = mean + noise * np.exp(self.log_std)
        diff = actions - mean
        log_prob = (-0.5 * (diff * diff * np.exp(-2 * self.log_std)).sum(axis=1)
                    - (self.log_std.sum() + mean.shape[1] * _HALF_LOG_2PI))
        return torch.from_numpy(actions), torch.from_numpy(values), torch.from_numpy(log_prob.astype(np.float32))

    @staticmethod
    def _head(head: tuple, x: np.ndarray) -> np.ndarray:
        weight, bias, _, _ = head
        out = x @ weight.T
        out += bias
        return out

    def gradient(self, obs: np.ndarray, actions: np.ndarray, old_log_prob: np.ndarray, advantages: np.ndarray,
                 returns: np.ndarray, clip_range: float, ent_coef: float, vf_coef: float,
                 normalize_advantage: bool) -> StepTerms:
        """PPO's loss on one minibatch, its gradient written into the parameters' ``.grad``."""
        n, dims = len(obs), actions.shape[1]
        pi = self._forward(self.pi_layers, obs)
        vf = self._forward(self.vf_layers, obs)
        mean = self._head(self.action_head, pi[-1])
        values = self._head(self.value_head, vf[-1])[:, 0]

        # The diagonal Gaussian's log-probability and entropy (torch.distributions.Normal, summed over actions).
        inv_var = np.exp(-2 * self.log_std)
        diff = actions - mean
        scaled_sq = diff * diff * inv_var
        log_prob = -0.5 * scaled_sq.sum(axis=1) - (self.log_std.sum() + dims * _HALF_LOG_2PI)
        entropy = float((0.5 + _HALF_LOG_2PI + self.log_std).sum())

        if normalize_advantage and n > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
        log_ratio = log_prob - old_log_prob
        ratio = np.exp(log_ratio)
        surrogate = advantages * ratio
        clipped = advantages * np.clip(ratio, 1 - clip_range, 1 + clip_range)
        unclipped = surrogate <= clipped  # where min() takes the surrogate, whose gradient flows
        policy_loss = -float(np.minimum(surrogate, clipped).mean())
        value_error = values - returns
        value_loss = float((value_error * value_error).mean())
        entropy_loss = -entropy
        loss = policy_loss + ent_coef * entropy_loss + vf_coef * value_loss

        # d loss / d log_prob: only the unclipped samples; d log_prob / d mean = diff / var.
        d_log_prob = np.where(unclipped, surrogate, 0).astype(np.float32, copy=False) * np.float32(-1 / n)
        d_mean = diff * inv_var
        d_mean *= d_log_prob[:, None]
        self.log_std_grad[:] = (d_log_prob[:, None] * (scaled_sq - 1)).sum(axis=0) - ent_coef
        self._backward(self.pi_layers, self.action_head, pi, d_mean)
        d_values = (value_error * np.float32(2 * vf_coef / n))[:, None]
        self._backward(self.vf_layers, self.value_head, vf, d_values)

        return StepTerms(policy_loss, value_loss, entropy_loss,
                         clip_fraction=float((np.abs(ratio - 1) > clip_range).mean()),
                         approx_kl=float(((ratio - 1) - log_ratio).mean()), loss=loss)

    def clip_gradients(self, max_norm: float) -> None:
        """torch's ``clip_grad_norm_`` over every gradient at once."""
        scale = max_norm / (math.sqrt(float(np.dot(self.grads, self.grads))) + 1e-6)
        if scale < 1.0:
            self.grads *= np.float32(scale)

    def _forward(self, layers: list, x: np.ndarray) -> list[np.ndarray]:
        """Each layer's output after its activation, the input first."""
        outputs = [x]
        for weight, bias, _, _ in layers:
            z = outputs[-1] @ weight.T
            z += bias
            outputs.append(np.tanh(z, out=z) if self.tanh else np.maximum(z, 0, out=z))
        return outputs

    def add_imitation_gradient(self, obs: np.ndarray, target: np.ndarray, weight: float) -> None:
        """Add the gradient of ``weight`` x the mean squared distance of the policy's mean action to ``target`` (the
        warm start's behaviour-cloning term, trainer.learn.warm_start.BehaviourCloningTerm) to the gradients."""
        pi = self._forward(self.pi_layers, obs.reshape(len(obs), -1).astype(np.float32, copy=False))
        mean = self._head(self.action_head, pi[-1])
        d_mean = (mean - target.astype(np.float32, copy=False)) * np.float32(2 * weight / mean.size)
        self._backward(self.pi_layers, self.action_head, pi, d_mean, add=True)

    def _backward(self, layers: list, head: tuple, outputs: list[np.ndarray], d_out: np.ndarray,
                  add: bool = False) -> None:
        """Back-propagate ``d_out`` (d loss / d the head's output) into every gradient of the head and layers: written
        over them, or with ``add`` added to them."""
        def put(d_weight: np.ndarray, d_bias: np.ndarray, grad: np.ndarray, inputs: np.ndarray) -> None:
            if add:
                d_weight += grad.T @ inputs
                d_bias += grad.sum(axis=0)
            else:
                np.matmul(grad.T, inputs, out=d_weight)
                grad.sum(axis=0, out=d_bias)

        weight, _, d_weight, d_bias = head
        put(d_weight, d_bias, d_out, outputs[-1])
        grad = d_out @ weight
        for i in range(len(layers) - 1, -1, -1):
            activation = outputs[i + 1]
            grad *= (1 - activation * activation) if self.tanh else (activation > 0)
            weight, _, d_weight, d_bias = layers[i]
            put(d_weight, d_bias, grad, outputs[i])
            if i:
                grad = grad @ weight
