"""FastPPO's numpy gradient step is SB3's PPO update: the same parameters, logs, files and resume."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure

from trainer.learn.fast_ppo import FastPPO, PolicyArrays, numpy_step_unsupported
from trainer.learn.warm_start import BehaviourCloningTerm

# 128-step rollouts in minibatches of 48 end each epoch on a short one, on purpose: SB3 warns of it.
pytestmark = pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")


class _Chase(gymnasium.Env):
    """A reward for matching part of the observation: PPO's ratios move, and clip, within a few updates."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (7,), np.float32)
    action_space = gymnasium.spaces.Box(-1, 1, (3,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.obs = self.np_random.standard_normal(7).astype(np.float32)
        return self.obs, {}

    def step(self, action):
        reward = -float(np.sum((action - self.obs[:3]) ** 2))
        self.t += 1
        self.obs = self.np_random.standard_normal(7).astype(np.float32)
        return self.obs, reward, False, self.t >= 20, {}


def _trained(cls, activation=torch.nn.Tanh, rollouts=3, before_learning=None, **kwargs) -> PPO:
    policy_kwargs = {"optimizer_kwargs": {"fused": True}, "net_arch": [16, 8], "activation_fn": activation}
    model = cls("MlpPolicy", _Chase(), n_steps=128, batch_size=48, n_epochs=4, seed=3, device="cpu",
                policy_kwargs=policy_kwargs, **kwargs)
    model.set_logger(configure(None, []))
    if before_learning is not None:
        before_learning(model)
    model.learn(128 * rollouts)
    return model


def _largest_difference(a: PPO, b: PPO) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.policy.parameters(), b.policy.parameters()))


@pytest.mark.parametrize("activation", [torch.nn.Tanh, torch.nn.ReLU])
@pytest.mark.parametrize("settings", [
    {"learning_rate": 0.02, "clip_range": 0.05},  # half the samples clipped: both branches of the surrogate
    {"learning_rate": 0.01, "ent_coef": 0.01, "normalize_advantage": False, "vf_coef": 0.7},
])
def test_numpy_update_equals_sb3s_within_float32_rounding(activation, settings):
    ours, theirs = _trained(FastPPO, activation, **settings), _trained(PPO, activation, **settings)
    assert numpy_step_unsupported(ours) is None
    # Three rollouts of 4 epochs of 3 minibatches (the last one short: 128 = 2 x 48 + 32), clipping active.
    assert theirs.logger.name_to_value["train/clip_fraction"] > 0.05
    # 36 Adam steps moved the weights by up to ~1; float32 rounding in another order stays near 1e-5 of that.
    assert _largest_difference(ours, theirs) < 2e-5
    assert _largest_difference(ours, _trained(PPO, activation, rollouts=0, **settings)) > 0.05
    for key in ("train/loss", "train/policy_gradient_loss", "train/value_loss", "train/entropy_loss",
                "train/approx_kl", "train/clip_fraction", "train/std", "train/explained_variance"):
        assert ours.logger.name_to_value[key] == pytest.approx(theirs.logger.name_to_value[key], rel=1e-4, abs=1e-6)
    assert ours.logger.name_to_value["train/n_updates"] == theirs.logger.name_to_value["train/n_updates"] == 12


@pytest.mark.parametrize("activation", [torch.nn.Tanh, torch.nn.ReLU])
def test_the_numpy_forward_pass_that_collects_rollouts_is_the_policy_s_own_with_the_same_noise(activation):
    model = _trained(FastPPO, activation, rollouts=1)  # weights moved from their start
    obs = torch.from_numpy(np.random.default_rng(1).standard_normal((64, 7)).astype(np.float32))
    for deterministic in (False, True):
        torch.manual_seed(5)
        with torch.no_grad():  # as SB3 collects
            theirs = model.policy.forward(obs, deterministic)
        torch.manual_seed(5)
        ours = PolicyArrays(model.policy, gradients=False).act(obs, deterministic)
        for mine, sb3 in zip(ours, theirs):
            assert mine.dtype == sb3.dtype == torch.float32 and mine.shape == sb3.shape
            assert float((mine - sb3).abs().max()) < 1e-5
        if not deterministic:  # the same draws of noise, not merely the same mean
            assert float(theirs[0].std()) > 0.5
    # During a rollout the policy's forward is the numpy one; after it, the class's own again.
    seen = []
    model.policy.register_forward_hook(lambda module, args, out: seen.append(module.forward.__name__))
    model.learn(128)
    assert seen and set(seen) == {"act"} and model.policy.forward.__name__ == "forward"


def test_a_behaviour_cloning_term_on_the_optimizer_adds_to_the_numpy_gradient():
    # The warm start's term (trainer.learn.imitation) is hooked before the optimizer's step; autograd must add to
    # the numpy arrays' torch views in place, or FastPPO's next minibatch would write gradients Adam never sees.
    rng = np.random.default_rng(0)
    observations = rng.standard_normal((200, 7)).astype(np.float32)
    actions = np.clip(-observations[:, 3:6], -1, 1)  # away from what the reward asks: the term pulls against it

    autograd_passes = []

    def attach(model):
        term = BehaviourCloningTerm(model.policy, observations, actions, weight=5.0, batch_size=32)
        torch_loss = term.loss
        term.loss = lambda index=None: autograd_passes.append(type(model).__name__) or torch_loss(index)

    settings = {"learning_rate": 0.01}
    ours, theirs = _trained(FastPPO, before_learning=attach, **settings), _trained(PPO, before_learning=attach,
                                                                                    **settings)
    assert numpy_step_unsupported(ours) is None
    # SB3's update adds the term by autograd at each of its 36 steps; FastPPO's in numpy (the same batches).
    assert autograd_passes == ["PPO"] * 36
    assert _largest_difference(ours, theirs) < 2e-5
    assert _largest_difference(ours, _trained(FastPPO, **settings)) > 0.05  # the term changed the update


def test_a_fast_ppo_model_is_an_sb3_ppo_file_both_ways(tmp_path):
    model = _trained(FastPPO, rollouts=1)
    model.save(tmp_path / "fast.zip")
    plain = PPO.load(tmp_path / "fast.zip", device="cpu")
    assert _largest_difference(model, plain) == 0.0

    # An SB3 file trains on with the numpy step: the gradients are bound to the loaded tensors.
    _trained(PPO, rollouts=1).save(tmp_path / "plain.zip")
    reloaded = FastPPO.load(tmp_path / "plain.zip", env=_Chase(), device="cpu")
    reloaded.set_logger(configure(None, []))
    before = [p.detach().clone() for p in reloaded.policy.parameters()]
    reloaded.learn(128)
    assert all(not torch.equal(b, p) for b, p in zip(before, reloaded.policy.parameters()))
    assert np.isfinite(reloaded.logger.name_to_value["train/loss"])


def test_what_the_numpy_step_does_not_cover_trains_with_sb3s_own():
    settings = {"learning_rate": 0.01, "target_kl": 0.01}  # SB3's early stop: not in the numpy step
    ours, theirs = _trained(FastPPO, **settings), _trained(PPO, **settings)
    assert numpy_step_unsupported(ours) == "clip_range_vf or target_kl is set"
    assert _largest_difference(ours, theirs) == 0.0
