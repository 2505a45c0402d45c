"""The warm start: before it learns from the reward, each agent's policy imitates the optimum.

Reinforcement learning alone, in a night's budget on a laptop, finds the easy half of the
problem (shift EV charging within each car's slack) and misses the battery's daily cycle: charging
costs imports at once and pays back hours later, and an untrained policy learns first never to
charge it (measured: PPO at 150k steps left the battery empty all year; docs/agent-quality.md).

The perfect-foresight optimum (trainer.references.optimum) knows the whole training period in advance, so its
dispatch is not a policy an agent can run; but replayed through the training site it is a set of
demonstrations, (observation, action) pairs, that a policy can imitate from what it sees at each
step. Imitated by supervised regression (behaviour cloning), a policy captures most of the
optimum's cut, and the cloned policy is a causal controller: on a year it has never seen (another
draw of the built-in site) it keeps that share (measured). It also imitates the optimum of other years
(``warm_start.extra_draws``: the built-in site's climate drawn again, a user's dataset's own days resampled in
blocks, trainer.site.bootstrap): one year is a single
trajectory, and a policy fitted to it alone drifts off it in closed loop by as much as its
initialisation decides (docs/agent-quality.md). Reinforcement learning then goes on from there
with the reward.

Which policy the regression ends with depends on its initial weights and minibatches as much as on the
demonstrations: five SAC imitations of one night, alike but for their seed, ranged from 87.3 to 93.0 % of the
optimum's cut, each drifting off the demonstrations in its own way, and the mean of their actions reached 93.8 %.
So the warm start is a distilled ensemble (``warm_start.ensemble``): that many imitations, from the seed and from
seed + MEMBER_SEED_STEP, + 2 x MEMBER_SEED_STEP...; their mean action, run in closed loop over each year of the
demonstrations, labels the states it meets as well as the demonstrations' own; and the agent's policy imitates
those labels (one network: the one reinforcement learning goes on with). Each label is a function of what the
policy observes, so the labels agree with each other, and the states are those the ensemble reaches (measured:
93.7 % there, where labels that pull a policy back to the optimum's trajectory, which it cannot see, made it
worse). The student must fit them far closer than an imitation fits the optimum (``warm_start.student_epochs``):
over three seeds the mean of ten imitations reached 94.1 %, its student fitted for an imitation's 400 epochs
91.9 %, for 2,400 epochs 93.9 % (docs/agent-quality.md). Its learning rate falls to 0 over its epochs
(``warm_start.student_decay``): 1,200 such epochs fit the labels closer than 2,400 at a constant rate.

The members are one agent's policies for every agent of the night (``warm_start.teacher``, SAC's): SAC's squashed
actor imitates the optimum closest, and PPO's 256x256 network taught by SAC's ten members' mean deployed 94.2 % of
the optimum's cut over three seeds, where its own ensemble (64x64) started it at 89.9 % and its night ended at
91.3 %. The members are imitated once in a process, by the first stage that needs them (docs/agent-quality.md).

Only a fresh stage is warm-started (a resumed one loads its checkpoint). The demonstrations are
computed once per process for a dataset and config (a second agent of the night reuses them), and so
is an imitation whose every input is the same: a night's PPO and A2C build the same policy from the
same seed, and the second copies the first's imitated weights (half a minute of a 20-minute night).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainer.base import logs
from trainer.base.durations import TimeBox
from trainer.config.roster import agent_spec
from trainer.config.sections import Config
from trainer.learn.warm_start.cloning import imitate_once, imitation_key, policy_digest
from trainer.learn.warm_start.ensemble import distil_an_ensemble
from trainer.learn.warm_start.fine_tune import (
    BehaviourCloningTerm,
    keep_near_demonstrations,
    narrow_exploration,
    start_temperature,
    time_with_the_term,
)
from trainer.learn.warm_start.optimum_demonstrations import (
    Demonstrations,
    adopt_replay,
    demonstrations,
    training_demonstrations,
)
from trainer.learn.warm_start.pick import pick_the_best
from trainer.learn.warm_start.saved import SavedImitations
from trainer.learn.warm_start.validation import imitation_parts, policy_check
from trainer.references.optimum_model import OptimumUnavailable
from trainer.site import Site

# The package's doors: the warm start, and what the night's other parts (the plan's calibration, the stage) call.
__all__ = ["BehaviourCloningTerm", "Demonstrations", "SavedImitations", "adopt_replay", "demonstrations",
           "imitation_key", "keep_near_demonstrations", "policy_digest", "time_with_the_term",
           "training_demonstrations", "warm_start"]


def warm_start(cfg: Config, site: Site, agent: str, model: Any, draws: Path | None = None,
               held_out: list[Site] | None = None, saved: SavedImitations | None = None,
               box: TimeBox | None = None, later: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """Imitate the optimum before learning (``warm_start.epochs`` > 0); None where it is off or not possible. With
    ``warm_start.ensemble`` > 1, the imitation of that many imitations' mean (:func:`distil_an_ensemble`), or with
    ``warm_start.pick_best`` whichever of it and the members does best over the ``held_out`` years
    (trainer.learn.warm_start.pick). With ``saved``, the imitations other processes of the run made are reused and
    this one's kept for them (trainer.learn.warm_start.saved). With a ``box`` (its part of the stage's slot) it
    stops there with the best it has: fewer epochs, fewer members (the plan sized it; a busy machine may not
    give it what the plan measured). The ``later`` stages of the night (one after another) have their students
    imitated beside this one's where they can (trainer.learn.warm_start.students)."""
    settings = cfg.warm_start
    log = logs.get().bind(agent=agent)
    if settings.epochs <= 0:
        return None
    if not agent_spec(agent).warm_start:
        log.info("warm start skipped: this agent's policy cannot imitate (its roster row)")
        return None
    parts = imitation_parts(site, draws)
    asked = time.perf_counter()
    try:
        demos = training_demonstrations(cfg, parts.fit, cfg.seed, parts.draws, box)
    except OptimumUnavailable as exc:
        log.warning("warm start skipped: the optimum is not available for this dataset", reason=str(exc))
        return None
    started = time.perf_counter()
    ensemble = None
    if settings.ensemble > 1:
        ensemble, (actor_error, critic_error), reused, members = distil_an_ensemble(cfg, site, agent, model, demos,
                                                                                    parts, saved, box, later)
        pick = pick_the_best(cfg, agent, model, members, held_out or []) if settings.picks_a_member(agent) else None
        if pick is not None:
            ensemble["pick"] = pick
            if pick["member"]:  # the stage starts from that member: its fit is the warm start's
                actor_error = ensemble["members_actor_mse"][pick["member"] - 1]
                critic_error = ensemble["members_critic_mse"][pick["member"] - 1]
    else:
        (actor_error, critic_error), reused = imitate_once(model, demos, settings.epochs, settings.learning_rate,
                                                           settings.batch_size, cfg.seed, saved=saved,
                                                           check=policy_check(cfg, parts, agent, model),
                                                           checked=parts.label, box=box)
    narrow_exploration(model, settings.policy_std)
    start_temperature(model, settings.sac_temperature)
    summary = {"steps": len(demos.actions), "periods": len(demos.periods) or 1, "epochs": settings.epochs,
               "actor_mse": round(actor_error, 5),
               "critic_mse": round(critic_error, 4),
               # This stage's time on them: none where an earlier stage of the process, or a run before, made them.
               "demonstrations_s": round(started - asked, 1), "imitation_s": round(time.perf_counter() - started, 1)}
    if ensemble is not None:
        summary["ensemble"] = ensemble
    if box is not None and box.reached:
        summary["stopped_at_its_time"] = True
    what = "the optimum"
    if ensemble is not None:
        member = (ensemble.get("pick") or {}).get("member", 0)
        what = (f"the mean of {settings.ensemble} {ensemble['teacher'].upper()} imitations of the optimum"
                if not member else
                f"the optimum: member {member} of {settings.ensemble} imitations, the best over the held-out years")
    log.info(f"warm start: the policy imitates {what}"
             + (" (the same imitation as an earlier stage's: its weights reused)" if reused else ""), **summary)
    return summary
