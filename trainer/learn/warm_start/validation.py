"""The run's validation part: how long to imitate, and which policy to deploy, decided on days nothing learnt from.

How many epochs of imitation generalise depends on the data, not on a constant. On a dataset's months never seen
(the part held out, docs/scenario.md), SAC imitations of the official EV buildings did best after 25-50 epochs and
lost 5-8 points of the optimum's cut by 400, where on the built-in site's unseen year 400 did best: there the year
judged on is the same climate drawn again, and fitting it closer pays (docs/agent-quality.md, "How long to
imitate"). So on a dataset of one period the imitation learns from all but the last VALIDATION_DAYS of the part the
run learns from, its policy drives those days in CityLearn at CHECK_AT epochs, and the epochs whose policy did best
there are kept: the same test the part held out makes, a season later, without looking at it. The built-in site
keeps its fixed epochs (``warm_start.epochs``, measured).

Reinforcement learning then trains on the same shorter part (:func:`learning_part`), and the selection
(trainer.learn.selection) validates and confirms its pick on the validation part (:func:`validation_part`):
validated on the resampled years of the days it trained on, a pick confirmed what the policy had memorised
(Building_5: SAC's warm start kept 80 % of the optimum's cut held out, its confirmed pick 73 %).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.base import logs
from trainer.config.sections import Config
from trainer.site import Site
from trainer.site.holdout import MIN_LEARNING_DAYS

VALIDATION_DAYS = 28
# Epochs at which an imitation's policy drives the validation part (and the last epoch): doubling, since its
# policy changes less and less per epoch. It stops after two checks in a row that are no better than its best.
CHECK_AT = (25, 50, 100, 200, 400, 800, 1600)
PATIENCE = 2


@dataclass(frozen=True)
class ImitationParts:
    """What the imitation learns from, and what it is checked on."""

    fit: Site  # the demonstrations' period (its observations scaled as the run's site)
    draws: Path | None  # where the fit part's other years are built
    check: Site | None  # the validation part; None: imitate for warm_start.epochs, unchecked

    @property
    def label(self) -> str:
        """What the imitation's inputs include of the parts, for the keys of imitations reused."""
        if self.check is None:
            return ""
        return f"fit {self.fit.start}-{self.fit.end} check {self.check.start}-{self.check.end}"


def imitation_parts(site: Site, draws: Path | None) -> ImitationParts:
    """The run's ``site`` split for the imitation: the last VALIDATION_DAYS days apart on a dataset of one period
    that is long enough; the whole site, unchecked, on the built-in site (its years are drawn) or a short period."""
    day = site.steps_per_day
    if site.kind.unseen_draws or site.length // day - VALIDATION_DAYS < MIN_LEARNING_DAYS:
        return ImitationParts(site, draws, None)

    def split() -> tuple[Site, Site]:  # once a site: each part then keeps what is learnt of it
        learning = site.scaled_as or site
        last_fit = site.end - VALIDATION_DAYS * day
        return (site.period(site.start, last_fit).scaled(learning),
                site.period(last_fit + 1, site.end).scaled(learning))

    fit, check = site.remember("validation split", split)
    return ImitationParts(fit, None if draws is None else draws / "before-validation", check)


def learning_part(site: Site) -> Site:
    """What reinforcement learning trains on: the run's site less its validation part (where it has one)."""
    return imitation_parts(site, None).fit


def validation_part(site: Site) -> Site | None:
    """The days a run's policies are chosen on and nothing learns from (None: a site that draws its own years)."""
    return imitation_parts(site, None).check


def policy_check(cfg: Config, parts: ImitationParts, agent: str, model: Any) -> Callable[[], float] | None:
    """A function that drives ``model``'s policy over the validation part in CityLearn (the EV guard on, as every
    evaluation) and returns its CO2 in kg a year; None where there is no validation part."""
    check = parts.check
    if check is None:
        return None
    # lazy: CityLearn and SB3 take seconds to import, and the night's plan reads this module's constants
    from trainer.env.citylearn import make_sb3_env
    from trainer.judge.metrics import run_episode
    from trainer.references.controllers import PolicyController

    def co2_kg_per_year() -> float:
        env = make_sb3_env(cfg, check, "eval", cfg.seed)
        try:
            return float(run_episode(PolicyController(agent, model), env)["co2_kg_per_year"])
        finally:
            env.close()

    return co2_kg_per_year


class KeepBest:
    """An imitation's checks: the weights at its best check, and when to stop (PATIENCE checks without a better)."""

    def __init__(self, policy: Any, score: Callable[[], float], epochs: int) -> None:
        self.policy, self.score = policy, score
        self.at = {e for e in CHECK_AT if e < epochs} | {epochs}
        self.best: tuple[float, int, dict[str, Any], tuple[float, float]] | None = None
        self.since_best = 0
        self.seconds = 0.0

    def after(self, epoch: int, errors: tuple[float, float], last: bool = False) -> bool:
        """Check after ``epoch`` (its ``errors``) where it is a check's, or it is the ``last`` (the imitation's time
        is up); True when the imitation should stop."""
        if epoch not in self.at and not last:
            return False
        started = time.perf_counter()
        self.policy.train(False)  # SB3's set_training_mode, as an evaluation leaves a policy
        co2 = self.score()
        self.policy.train(True)
        self.seconds += time.perf_counter() - started
        # Also the imitation's progress: a long one is otherwise silent for minutes.
        logs.get().info("warm start: imitation checked on the validation part", epoch=epoch,
                        validation_co2_kg_per_year=round(co2, 1), actor_mse=round(errors[0], 5))
        if self.best is None or co2 < self.best[0]:
            self.best = (co2, epoch, {k: t.detach().clone() for k, t in self.policy.state_dict().items()}, errors)
            self.since_best = 0
        else:
            self.since_best += 1
        return self.since_best >= PATIENCE

    def restore(self, last_epoch: int) -> tuple[float, float]:
        """Leave the best check's weights in the policy, say which, and return their errors."""
        assert self.best is not None  # the last epoch is always a check
        co2, epoch, weights, errors = self.best
        self.policy.load_state_dict(weights)
        logs.get().info("warm start: the imitation's epochs that did best on the validation part kept",
                        kept_epochs=epoch, ran=last_epoch, validation_co2_kg_per_year=round(co2, 1),
                        checks_s=round(self.seconds, 1))
        return errors
