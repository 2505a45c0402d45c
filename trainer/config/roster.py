"""The roster: every agent the product trains, one row each, looked up by name (rl-baselines3-zoo's ``ALGOS``).

A row says what the rest of the product asks about an agent: its config section (``cfg.<name>``,
a class in ``agent_config.py``; off-policy when it is an ``OffPolicyConfig``), the class that
trains it, the networks its gradient step holds (the batch back-off's memory model), whether the
warm start can imitate into its policy, which fine-tuning term keeps it near the demonstrations,
and its colour in the report's plots. The config's agent sections, the CLI's and launchers'
choices, the night's stages and the report all come from this table: adding an agent is its
section, its row and its block in ``configs/default.yaml`` (docs/architecture.md).

The references (uncontrolled, rule-based, the optimum) are ``trainer.references.roster``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.base.errors import UsageError
from trainer.config.agents import A2cConfig, AgentConfig, OffPolicyConfig, PpoConfig, SacConfig

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm


@dataclass(frozen=True)
class AgentSpec:
    name: str
    section: type[AgentConfig]   # its config section, cfg.<name>
    algorithm: str               # "module:Class" that trains it (imported when needed: SB3 imports torch)
    colour: str                  # its colour in every plot of the report
    plain: str                   # "module:Class" of stable-baselines3's own, the benchmark's plain recipe
    critics: int = 1             # critic networks a gradient step runs (targets included): the batch back-off
    actors: int = 1              # actor networks a gradient step runs (targets included)
    warm_start: bool = True      # its policy can imitate the optimum (a stochastic actor: trainer.learn.warm_start)
    fine_tune_key: str | None = None  # warm_start.<key>: the strength of the term that keeps it near the demos
    saved_keys: frozenset[str] = frozenset()  # what its SB3 class saves beyond SAC, PPO and A2C (model_file)

    @property
    def off_policy(self) -> bool:
        """Learns from a replay buffer: its buffer needs RAM, its updates are timed apart from its steps."""
        return issubclass(self.section, OffPolicyConfig)

    def algorithm_class(self) -> type[BaseAlgorithm]:
        return _imported(self.algorithm)

    def plain_class(self) -> type[BaseAlgorithm]:
        return _imported(self.plain)


def _imported(path: str) -> type[BaseAlgorithm]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)  # SB3 imports torch: only when an agent is built


ROSTER: dict[str, AgentSpec] = {spec.name: spec for spec in (
    # SAC: an actor, two critics and their two targets (FastSAC: SB3's SAC, leaner; the same save format).
    AgentSpec("sac", SacConfig, "trainer.learn.fast_sac:FastSAC", "#1f77b4", "stable_baselines3:SAC", critics=4,
              fine_tune_key="sac_bc_alpha"),
    # PPO: SB3's PPO with its gradient step in numpy on a CPU (the same update; the same save format).
    AgentSpec("ppo", PpoConfig, "trainer.learn.fast_ppo:FastPPO", "#ff7f0e", "stable_baselines3:PPO",
              fine_tune_key="ppo_bc_weight"),
    AgentSpec("a2c", A2cConfig, "stable_baselines3:A2C", "#2ca02c", "stable_baselines3:A2C",
              fine_tune_key="a2c_bc_weight"),
)}
AGENTS: tuple[str, ...] = tuple(ROSTER)


@dataclass(frozen=True)
class Agent:
    """One agent as a stage trains it, resolved once (``trainer.run.device.resolve_agent``): its roster row, its config
    section and the device it trains on. Code asks the handle, not the name again."""

    spec: AgentSpec
    section: AgentConfig
    device: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def off_policy(self) -> bool:
        """Learns from a replay buffer (its section is an ``OffPolicyConfig``): the one way the product asks."""
        return self.spec.off_policy


def off_policy_agents(names: list[str] | tuple[str, ...] = AGENTS) -> list[str]:
    """Those of ``names`` that learn from a replay buffer."""
    return [name for name in names if agent_spec(name).off_policy]


def agent_spec(name: str) -> AgentSpec:
    try:
        return ROSTER[name]
    except KeyError:
        raise UsageError(f"unknown agent {name!r}: expected one of {', '.join(AGENTS)}") from None
