"""The agents' config sections: the fields every agent shares, off-policy and on-policy families,
and one section per agent, each knowing its stable-baselines3 constructor arguments.

Which section belongs to which agent is ``trainer.config.roster``; the config (``cfg.<agent>``) is
assembled from the roster there, so a new agent's section is a class here and a row there.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from trainer.base import logs
from trainer.config.section import Section, doc


class AgentConfig(Section):
    """Fields every stable-baselines3 agent shares."""

    learning_rate: float = doc("Optimizer learning rate.", gt=0, le=1)
    learning_rate_end: float = doc("The learning rate at the stage's last step, as a share of learning_rate, "
                                   "reached linearly over the stage's steps (1 = constant).", gt=0, le=1)
    gamma: float = doc("Discount factor.", gt=0, le=1)
    net_arch: list[Annotated[int, Field(ge=1)]] = doc("Hidden layer sizes of the policy and value networks.",
                                                      min_length=1)
    timesteps: int | None = doc("Training length in environment steps (or use episodes).", ge=1)
    episodes: int | None = doc("Training length in episodes of scenario.train_episode_days (or use timesteps).", ge=1)
    checkpoint_freq_steps: int = doc("Save a checkpoint every this many environment steps.", ge=1)
    log_interval: int = doc("SB3 log interval (episodes for SAC, rollouts for PPO/A2C).", ge=1)
    device: Literal["auto", "cpu", "cuda"] | None = doc(
        "Torch device of this agent; null = gpu.device (GPU profiles put PPO and A2C on the CPU, whose small "
        "networks gain nothing from a GPU).")

    @model_validator(mode="after")
    def _one_length(self) -> AgentConfig:
        if self.timesteps is None and self.episodes is None:
            raise ValueError("set one of timesteps or episodes")
        if self.timesteps is not None and self.episodes is not None:
            raise ValueError(
                f"set only one of timesteps ({self.timesteps}) or episodes ({self.episodes}); "
                "set the other to null"
            )
        return self

    @property
    def learns_while_stepping(self) -> bool:
        """Whether the environment steps in a worker while the learner updates (SAC's option)."""
        return False

    @property
    def layers(self) -> tuple[int, ...]:
        """The hidden layer sizes, once the run's site has settled an ``auto`` (:meth:`on_site`)."""
        if not isinstance(self.net_arch, list):
            raise TypeError("net_arch is still 'auto': settle the config on the run's site first (Config.on_site)")
        return tuple(self.net_arch)

    def on_site(self, one_period: bool) -> Self:
        """This section with what depends on the site settled, for a site of ``one_period`` (a dataset: its one
        year) or the built-in site; a section with nothing of the kind is itself."""
        return self

    def sb3_kwargs(self, n_envs: int = 1) -> dict[str, Any]:
        """The SB3 constructor arguments of this section for ``n_envs`` environments."""
        return {"learning_rate": self.learning_rate, "gamma": self.gamma,
                "policy_kwargs": {"net_arch": list(self.layers)}}


class OffPolicyConfig(AgentConfig):
    """Agents that learn from a replay buffer (SB3's ``OffPolicyAlgorithm``): the buffer is counted by the RAM
    preflight and by Ray's memory, and the night times their gradient updates apart from their steps."""

    batch_size: int = doc("Minibatch size of each gradient step.", ge=1)
    buffer_size: int = doc("Replay buffer capacity in transitions.", ge=1)
    gradient_steps: int = doc("Gradient steps per train_freq environment steps.", ge=1)
    train_freq: int = doc("Environment steps between learner updates.", ge=1)
    learning_starts: int = doc("Environment steps collected before the first update.", ge=0)
    tau: float = doc("Target network soft-update coefficient.", gt=0, le=1)
    n_envs: int = doc("Sites the agent steps at once on the training simulator: each step adds n_envs transitions "
                      "and takes gradient_steps updates (SB3's meaning). On CityLearn it steps one environment.",
                      ge=1, le=4096)

    @model_validator(mode="after")
    def _surely_a_mistake(self) -> OffPolicyConfig:
        """What can train but surely was not meant: said with the key, not refused."""
        if self.batch_size > self.buffer_size:
            logs.get().warning("batch_size is larger than buffer_size: each batch samples the same transitions "
                               "many times over", batch_size=self.batch_size, buffer_size=self.buffer_size)
        if self.timesteps is not None and self.learning_starts >= self.timesteps:
            logs.get().warning("learning_starts is not below timesteps: the agent will not take a single gradient "
                               "step", learning_starts=self.learning_starts, timesteps=self.timesteps)
        return self

    def sb3_kwargs(self, n_envs: int = 1) -> dict[str, Any]:
        return {**super().sb3_kwargs(n_envs), "batch_size": self.batch_size, "buffer_size": self.buffer_size,
                "gradient_steps": self.gradient_steps, "train_freq": self.train_freq,
                "learning_starts": self.learning_starts, "tau": self.tau}


# What ``sac.net_arch: auto`` builds: on the built-in site 256x256, wide enough to fit its ensemble's mean (64x64:
# 91.3 % of the optimum's cut); on a dataset of one period 64x64, which generalises to its months held out where the
# wider network fits the months it learnt from: on the official EV buildings, seven untimed nights in pairs, SAC +0.68
# points of the held-out optimum's cut on average (Building_10 +0.7 to +2.7 on all three seeds, its gap between the
# parts under 1.7 points against 5.05), Building_5 -0.4 and -1.1 (docs/agent-quality.md, "SAC at 64x64 on a dataset").
BUILT_IN_SAC_ARCH = [256, 256]
ONE_PERIOD_SAC_ARCH = [64, 64]


class SacConfig(OffPolicyConfig):
    net_arch: list[Annotated[int, Field(ge=1)]] | Literal["auto"] = doc(  # type: ignore[assignment]
        "Hidden layer sizes of the actor and critics (the warm start's members too); auto: "
        f"{'x'.join(map(str, ONE_PERIOD_SAC_ARCH))} on a dataset of one period, whose months held out a narrower "
        f"network generalises to, {'x'.join(map(str, BUILT_IN_SAC_ARCH))} on the built-in site "
        "(docs/agent-quality.md).", min_length=1)
    ent_coef: float | Literal["auto"] = doc("Entropy coefficient ('auto': SAC's learned temperature).")
    learn_while_stepping: bool = doc("Step the environment in a subprocess while the learner updates "
                                     "(the behaviour policy lags one update; docs/benchmarks.md). CityLearn only.")

    @property
    def learns_while_stepping(self) -> bool:
        return self.learn_while_stepping

    def on_site(self, one_period: bool) -> Self:
        if self.net_arch != "auto":
            return self
        return self.model_copy(update={"net_arch": list(ONE_PERIOD_SAC_ARCH if one_period else BUILT_IN_SAC_ARCH)})

    def sb3_kwargs(self, n_envs: int = 1) -> dict[str, Any]:
        return {**super().sb3_kwargs(n_envs), "ent_coef": self.ent_coef}


class OnPolicyConfig(AgentConfig):
    """PPO and A2C: rollouts collected from parallel environments."""

    n_steps: int = doc("Environment steps per rollout, summed over the parallel environments "
                       "(SB3's n_steps x n_envs); a multiple of n_envs.", ge=1)
    max_grad_norm: float = doc("Gradient clipping norm.", gt=0)
    ent_coef: float = doc("Entropy coefficient of the loss.")
    n_envs: int = doc(
        "Parallel environments; 0 = train.sites simulated sites on the training simulator, four CityLearn "
        "workers per CPU core otherwise (a divisor of n_steps either way).", ge=0, le=4096
    )
    gae_lambda: float = doc("GAE lambda (1.0 is plain A2C).", ge=0, le=1)
    vf_coef: float = doc("Value loss coefficient.", ge=0)

    @model_validator(mode="after")
    def _whole_rollouts(self) -> OnPolicyConfig:
        if self.n_envs and self.n_steps % self.n_envs:
            raise ValueError(
                f"n_steps ({self.n_steps}) must be a multiple of n_envs ({self.n_envs}); "
                f"set n_steps to {self.n_steps - self.n_steps % self.n_envs or self.n_envs} or n_envs to 0"
            )
        return self

    def sb3_kwargs(self, n_envs: int = 1) -> dict[str, Any]:
        # SB3's n_steps is per environment; the config's is the whole rollout.
        return {**super().sb3_kwargs(n_envs), "ent_coef": self.ent_coef,
                "n_steps": max(self.n_steps // n_envs, 1), "gae_lambda": self.gae_lambda, "vf_coef": self.vf_coef,
                "max_grad_norm": self.max_grad_norm}


class PpoConfig(OnPolicyConfig):
    batch_size: int = doc("Minibatch size of each gradient step.", ge=1)
    n_epochs: int = doc("Passes over each rollout.", ge=1)
    clip_range: float = doc("PPO clipping range.", gt=0, le=1)

    def sb3_kwargs(self, n_envs: int = 1) -> dict[str, Any]:
        return {**super().sb3_kwargs(n_envs), "batch_size": self.batch_size, "n_epochs": self.n_epochs,
                "clip_range": self.clip_range}


class A2cConfig(OnPolicyConfig):
    optimizer: Literal["rmsprop", "adam"] = doc(
        "rmsprop (SB3's default for A2C) or adam: RMSprop's first steps are ~10x its learning rate (its average "
        "of squared gradients starts at 0), enough to undo a warm start.")
    normalize_advantage: bool = doc("Normalise each rollout's advantages (SB3's normalize_advantage).")

    @model_validator(mode="after")
    def _advantages_to_normalise(self) -> A2cConfig:
        if self.normalize_advantage and self.n_steps < 2:
            raise ValueError("a2c.normalize_advantage needs a rollout of at least 2 steps (one advantage has no "
                             f"spread; SB3 would divide by NaN), got n_steps {self.n_steps}: set a2c.n_steps to 2 "
                             "or more, or a2c.normalize_advantage to false")
        return self

    def sb3_kwargs(self, n_envs: int = 1) -> dict[str, Any]:
        return {**super().sb3_kwargs(n_envs), "use_rms_prop": self.optimizer == "rmsprop",
                "normalize_advantage": self.normalize_advantage}
