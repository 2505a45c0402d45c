"""A stable-baselines3 policy's deterministic action as an ONNX graph: normalised observations in, actions
in [-1, 1] out (before the clip SB3's ``predict`` applies, which the controller applies too).

Each policy class the product trains has a small module that computes what ``predict(deterministic=True)``
computes, written out as plain layers so that the exporter traces arithmetic, not distributions.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from stable_baselines3.common.policies import ActorCriticPolicy, BaseModel
from stable_baselines3.sac.policies import SACPolicy
from stable_baselines3.td3.policies import TD3Policy

from trainer.base.errors import TrainerError

INPUT = "observation"
OUTPUT = "action"


class _GaussianMean(torch.nn.Module):
    """PPO and A2C: the Gaussian's mean (squashed by tanh where the policy squashes its output)."""

    def __init__(self, policy: ActorCriticPolicy):
        super().__init__()
        self.policy = policy

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        policy = self.policy
        features = BaseModel.extract_features(policy, observation, policy.pi_features_extractor)
        mean = policy.action_net(policy.mlp_extractor.forward_actor(features))
        return torch.tanh(mean) if policy.squash_output else mean


class _SquashedMean(torch.nn.Module):
    """SAC: tanh of the actor's mean."""

    def __init__(self, policy: SACPolicy):
        super().__init__()
        self.actor = policy.actor

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        actor = self.actor
        features = actor.extract_features(observation, actor.features_extractor)
        return torch.tanh(actor.mu(actor.latent_pi(features)))


class _DeterministicActor(torch.nn.Module):
    """TD3 (and DDPG): the actor is the action."""

    def __init__(self, policy: TD3Policy):
        super().__init__()
        self.actor = policy.actor

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.actor(observation)


# Policy class -> the module that computes its deterministic action; the first that matches serves.
DETERMINISTIC: tuple[tuple[type, Callable[..., torch.nn.Module]], ...] = (
    (ActorCriticPolicy, _GaussianMean),
    (SACPolicy, _SquashedMean),
    (TD3Policy, _DeterministicActor),
)


def deterministic_module(policy: BaseModel) -> torch.nn.Module:
    if getattr(policy, "use_sde", False):
        raise TrainerError(f"cannot export a {type(policy).__name__} trained with gSDE: its deterministic action "
                           "is not a plain network; train it with use_sde: false to export it")
    for cls, module in DETERMINISTIC:
        if isinstance(policy, cls):
            return module(policy).eval()
    known = ", ".join(cls.__name__ for cls, _ in DETERMINISTIC)
    raise TrainerError(f"cannot export a {type(policy).__name__}: expected one of {known}")


def write_onnx(policy: BaseModel, features: int, path: Path) -> None:
    """``policy``'s deterministic action for a batch of ``features``-wide observations, as ONNX at ``path``."""
    module = deterministic_module(policy).to("cpu")
    example = torch.zeros(1, features, dtype=torch.float32)
    batch = torch.export.Dim("batch", min=1)
    quiet = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "torch.onnx")]
    levels = [logger.level for logger in quiet]
    with torch.no_grad(), warnings.catch_warnings():
        # The exporter warns of features the product does not use (dynamic shapes' names, opset upgrades) and
        # logs each pass of its optimiser at INFO: a user exporting a policy needs neither.
        warnings.simplefilter("ignore")
        for logger in quiet:
            logger.setLevel(logging.WARNING)
        try:
            program = torch.onnx.export(module, (example,), input_names=[INPUT], output_names=[OUTPUT],
                                        dynamic_shapes=({0: batch},), dynamo=True, verbose=False)
        finally:
            for logger, level in zip(quiet, levels):
                logger.setLevel(level)
    program.save(str(path))
