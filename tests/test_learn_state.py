"""The typed pieces of the training loop: a checkpoint's state round-trips, the back-off policy halves to a floor."""

from __future__ import annotations

from trainer.learn.memory import BatchBackoff
from trainer.learn.state import Sizes, TrainingState


def state(**changes) -> TrainingState:
    fields = dict(agent="ppo", step=2000, target=5000, episode_indices=[3, 7], at_episode_starts=[False, True],
                  n_envs=2, batch_size=64, n_steps=500, learning_rate=3e-4, nonfinite_rollbacks=1,
                  backoffs=[{"field": "batch_size", "old": 128, "new": 64}], checkpoint_write_failures=2,
                  config_digest="abc", config={"seed": 42}, saved_at=1.5)
    return TrainingState(**{**fields, **changes})


def test_a_checkpoint_state_round_trips_and_keeps_the_single_environment_keys():
    data = state().to_dict()
    assert (data["episode_index"], data["at_episode_start"]) == (3, False)
    assert TrainingState.from_dict(data) == state()


def test_a_state_written_before_parallel_environments_still_loads():
    old = {"step": 100, "episode_index": 4, "at_episode_start": True, "batch_size": 32, "learning_rate": 1e-3}
    loaded = TrainingState.from_dict(old)
    assert (loaded.episode_indices, loaded.at_episode_starts, loaded.n_envs) == ([4], [True], 1)
    assert (loaded.nonfinite_rollbacks, loaded.backoffs, loaded.checkpoint_write_failures) == (0, [], 0)


def test_sizes_adopt_a_checkpoint_and_keep_the_rollout_when_the_environments_changed():
    sizes = Sizes(batch_size=256, n_steps=1000, learning_rate=1e-3)
    assert sizes.adopt(state(), n_envs=2) is True
    assert (sizes.batch_size, sizes.n_steps, sizes.learning_rate, sizes.nonfinite_rollbacks) == (64, 500, 3e-4, 1)
    other = Sizes(batch_size=256, n_steps=1000, learning_rate=1e-3)
    assert other.adopt(state(), n_envs=4) is False
    assert (other.batch_size, other.n_steps) == (64, 1000)


def test_the_back_off_halves_until_the_floor():
    backoff = BatchBackoff(floor=16)
    assert backoff.next(64) == (32, True)
    assert backoff.next(32) == (16, True)
    assert backoff.next(16) == (16, False)
    assert backoff.next(31) == (31, False)  # 15 would be below the floor
