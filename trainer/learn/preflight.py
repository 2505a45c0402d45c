"""Checks made before a stage writes anything: a config changed since the checkpoint, RAM for the replay buffer."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainer.base import logs
from trainer.base.errors import UsageError
from trainer.base.files import DamagedFile
from trainer.config.agents import OffPolicyConfig
from trainer.config.roster import AGENTS
from trainer.config.sections import Config
from trainer.env.citylearn import policy_sizes
from trainer.learn.checkpoint_store import CheckpointStore
from trainer.learn.memory import GIB, Shapes, host_available_bytes, replay_buffer_bytes
from trainer.learn.warm_start.saved import SavedImitations
from trainer.run.folder import RunDir
from trainer.run.schedule_file import ScheduleState
from trainer.site import Site


def config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Key paths whose values differ, with both values."""
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(config_diff(a, b, f"{path}."))
        elif a != b:
            diffs.append(f"{path} ({a!r} -> {b!r})")
    return diffs


# Sections a resumed agent's training does not depend on (another agent's, the night's timing, where it runs,
# output): a checkpoint resumes on another device or backend.
NOT_TRAINING = ("schedule", "monitor", "output", "gpu", "ray")


def training_view(config: dict[str, Any], agent: str) -> dict[str, Any]:
    """The part of a config an agent's checkpoint depends on: its own section and the shared ones. Its length
    (timesteps, episodes) is left out, so a finished run can be extended."""
    others = set(AGENTS) - {agent}
    view = {k: v for k, v in config.items() if k not in others and k not in NOT_TRAINING}
    view.setdefault("train", {"simulator": "citylearn"})  # checkpoints from before the choice trained on CityLearn
    # Checkpoints from before held-out periods learnt from all of their data (such a run resumes with share 0).
    view.setdefault("holdout", {"share": 0.0, "eval_schema": None, "eval_dataset": None})
    if isinstance(view.get("observations"), dict):  # and before the loads of hours before, or the forecast, read none
        view["observations"] = {"load_ago_hours": [], "forecast": False, **view["observations"]}
    # Which policy is deployed (and among how many: the shortlist) is chosen after training; when a stage stops (a
    # flat curve) is like its length.
    if isinstance(view["train"], dict):
        view["train"] = {k: v for k, v in view["train"].items() if k not in ("keep_best", "shortlist", "patience")}
    if isinstance(view.get("warm_start"), dict):
        # The ensemble, its student's epochs (its critic's too, its decay), its pick and how its resampled years
        # vary shape a fresh start only (a resumed night may refit the ensemble; a checkpoint from before them has
        # no key for them).
        view["warm_start"] = {k: v for k, v in view["warm_start"].items()
                              if k not in ("ensemble", "student_epochs", "student_critic_epochs", "student_decay",
                                           "pick_best", "draw_load_scale", "draw_solar_scale",
                                           "draw_load_shape")}
    if isinstance(view.get(agent), dict):
        view[agent] = {k: v for k, v in view[agent].items() if k not in ("timesteps", "episodes", "device")}
    return view


def check_resume_config(run_dir: Path, agent: str, cfg: Config, force: bool, require_checkpoint: bool = False) -> None:
    """Refuse, before anything is written, to resume with a config that differs from the checkpoint's in what
    this agent's training depends on; with ``require_checkpoint``, to resume an agent the folder never trained."""
    run = RunDir(run_dir)
    checkpoint, broken = CheckpointStore(run.agent(agent).checkpoints, keep=1).survey()
    if checkpoint is None:
        if require_checkpoint and broken:
            path, problem = broken[0]
            more = f" (and {len(broken) - 1} older ones)" if len(broken) > 1 else ""
            raise DamagedFile(f"--resume: every {agent} checkpoint in {run_dir} is damaged: {path.name}: {problem}"
                              f"{more}; restore one from a backup, or train {agent} again in a new folder (the folder "
                              "keeps its model.zip and results)")
        if require_checkpoint:
            trained = [a for a in AGENTS if run.agent(a).has_checkpoint()]
            if not trained and SavedImitations(run.imitations).holds_any():
                return  # stopped in its warm start: the stage starts again and loads what the folder kept
            holds = f"it holds {', '.join(trained)}'s" if trained else "it holds none"
            raise UsageError(f"--resume: {run_dir} has no {agent} checkpoint to resume ({holds}); resume the agent it "
                             f"trained, or train {agent} in a new folder")
        return
    diffs = config_diff(training_view(checkpoint.state.get("config", {}), agent), training_view(cfg.to_dict(), agent))
    if not diffs:
        return
    if force:
        logs.get().warning("config changed since the checkpoint; resuming anyway (--force)", agent=agent, changes=diffs)
        return
    raise UsageError(f"the config changed since the checkpoint at step {checkpoint.step}: {'; '.join(diffs)}; "
                     "resume with the same config, or pass --force to resume with the new one")


def memory_checks(agents: Sequence[str]) -> list[Callable[[Config, Site], None]]:
    """:func:`check_memory` of each agent, as checks ``trainer.run.session.open_run`` runs (with the config settled
    on the run's site) before the run folder."""
    return [functools.partial(check_memory, agent=agent) for agent in agents]


def check_memory(cfg: Config, site: Site, agent: str) -> None:
    """Refuse, before the night starts, an off-policy agent's replay buffer that cannot fit in RAM."""
    section = cfg.agent(agent)
    if not isinstance(section, OffPolicyConfig):
        return
    shapes = Shapes(*policy_sizes(cfg, site), section.layers)
    need, have = replay_buffer_bytes(shapes, section.buffer_size), host_available_bytes()
    if need > have:
        per = replay_buffer_bytes(shapes, 1)
        raise UsageError(
            f"{agent}.buffer_size={section.buffer_size:,} needs {need / GIB:.1f} GiB of RAM for the replay buffer "
            f"but {have / GIB:.1f} GiB is available; set {agent}.buffer_size to at most {int(have * 0.8 // per):,}")


def has_progress(run: RunDir) -> bool:
    """Whether a resume would start from something: a complete checkpoint, a warm start's kept imitation, or a
    finished stage of the night."""
    if run.has_checkpoints() or SavedImitations(run.imitations).holds_any():
        return True
    if run.schedule.is_file():
        return any(stage.status == "done" for stage in ScheduleState.load(run.schedule).stages)
    return False
