"""Exact resume: 2N steps straight equals N steps, a stop, and a resume for N more.

The stop falls on an episode boundary (one-day episodes, N a multiple of their length): there the
resumed environment starts the very episode the straight run was about to start, so the
final parameters must be bit-identical. Elsewhere the resumed run starts the next episode
instead of finishing the interrupted one (docs/reliability.md).
"""

from __future__ import annotations

import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback

from trainer.base.signals import STOP
from trainer.config.loading import load_config
from trainer.learn.trainer import StageTrainer, TrainingInterrupted
from trainer.run.device import resolve_agent
from trainer.run.folder import RunContext, RunDir
from trainer.site import Site

from .conftest import tiny_overrides

# CityLearn ends an episode of T hours after T - 1 steps: a one-day episode is 23 steps.
EPISODE = 23
N = 2 * EPISODE


class StopAt(BaseCallback):
    """Raise the same stop request a SIGTERM would, after step ``at``."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def _on_step(self) -> bool:
        if self.num_timesteps == self.at:
            STOP.signum = 15
        return True


@pytest.fixture(autouse=True)
def clear_stop():
    STOP.signum = None
    yield
    STOP.signum = None


# Two PPO environments in worker processes, each collecting one episode per rollout.
PARALLEL = ("ppo.n_envs=2", f"ppo.n_steps={2 * EPISODE}")


def context(tmp_path, name, schema, agent, extra=()):
    cfg = load_config(overrides=tiny_overrides(
        "scenario.train_episode_days=1", f"{agent}.checkpoint_freq_steps={EPISODE}",
        "sac.learning_starts=20", f"ppo.n_steps={EPISODE}", "ppo.batch_size=23", "a2c.n_steps=23",
        "ppo.n_envs=1", "a2c.n_envs=1", "sac.n_envs=1",
        # One thread: SAC's follow the cores free at each moment, and a straight run and a resumed one would differ
        # by the float roundings of another thread count, not by what resuming does.
        "gpu.cpu_threads=1", *extra))
    return RunContext(cfg, RunDir(tmp_path / name), Site.load(schema), "cpu")


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


# CityLearn itself, and the training simulator: two PPO sites in one process, SAC on one and on two sites,
# with the windows it draws itself; PPO (its numpy update), SAC and A2C warm-started and held near their
# demonstrations (their batches are drawn from torch's generator, which the checkpoint restores).
CITYLEARN = ("train.simulator=citylearn",)
SIMULATOR = ("train.simulator=vector",)


@pytest.mark.parametrize("agent,extra", [
    ("sac", CITYLEARN), ("ppo", CITYLEARN), ("a2c", CITYLEARN), ("ppo", (*PARALLEL, *CITYLEARN)),
    ("ppo", ("warm_start.epochs=1", *PARALLEL, *SIMULATOR)), ("sac", SIMULATOR), ("sac", ("sac.n_envs=2", *SIMULATOR)),
    ("sac", ("warm_start.epochs=1", *SIMULATOR)), ("a2c", ("warm_start.epochs=1", *SIMULATOR)),
], ids=["sac", "ppo", "a2c", "ppo-2-workers", "ppo-2-simulated-fine-tuned", "sac-simulated", "sac-2-simulated",
        "sac-fine-tuned", "a2c-fine-tuned"])
def test_straight_equals_stop_and_resume(agent, extra, tmp_path, site_schema, week):
    # A warm start on a week: its demonstrations, the optimum of the whole period replayed, take a second there and
    # 15-20 s over the year, and what is resumed is the same.
    site_schema = week if "warm_start.epochs=1" in extra else site_schema
    straight_ctx = context(tmp_path, "straight", site_schema, agent, extra)
    straight = StageTrainer(straight_ctx, resolve_agent(straight_ctx.cfg, agent), 2 * N)
    try:
        reference = params(straight.train())
    finally:
        straight.close()

    ctx = context(tmp_path, "resumed", site_schema, agent, extra)
    first = StageTrainer(ctx, resolve_agent(ctx.cfg, agent), 2 * N, callbacks=[StopAt(N)])
    with pytest.raises(TrainingInterrupted) as stopped:
        first.train()
    first.close()
    assert stopped.value.step == N and stopped.value.exit_code == 143
    STOP.signum = None

    second = StageTrainer(ctx, resolve_agent(ctx.cfg, agent), 2 * N)
    try:
        model = second.train(resume=True)
    finally:
        second.close()
    assert model.num_timesteps == 2 * N and second.n_envs == (2 if {"ppo.n_envs=2", "sac.n_envs=2"} & set(extra) else 1)
    resumed = params(model)
    assert resumed.keys() == reference.keys()
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), key
