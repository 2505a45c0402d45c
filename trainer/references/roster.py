"""The references every agent is measured against, one row each, in the order the night evaluates them.

A reference is a controller replayed through CityLearn over the evaluation period: the
uncontrolled site (the baseline every figure is compared with), the rule-based controller, and
the perfect-foresight optimum, which solves a linear program first, and the day-ahead planner, which solves
one every step on a forecast (trainer.references.planner). A row says how to prepare its
controller, what it costs the night's plan, and whether the learning curve's plot draws it.
Adding a reference is its controller (``controllers.py`` or its own module) and a row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.base import logs
from trainer.references.controllers import Controller, RuleBasedController, UncontrolledBaseline
from trainer.references.optimum import OptimumReplay
from trainer.references.optimum_model import OptimumUnavailable, SiteModel, site_model
from trainer.references.physics import FittedPlan, solve_in_physics
from trainer.references.planner import PLANNER_VERSION, day_ahead_planner, forecast_source
from trainer.site.series import HOURS_PER_YEAR

if TYPE_CHECKING:
    from trainer.config.sections import Config

BASELINE = "baseline"  # the uncontrolled site: every other figure is compared with it


class ReferenceUnavailable(Exception):
    """This reference cannot be prepared for this dataset (the night records it as skipped, with the reason)."""


# (the config, a function opening a fresh evaluation environment, and one opening the part of the data the run learnt
# from where the environment is a part held out, else None) -> (the controller, metrics of its own)
Opener = Callable[[], Any]
Prepare = Callable[["Config", Opener, "Opener | None"], tuple[Controller, dict[str, Any]]]


@dataclass(frozen=True)
class ReferenceSpec:
    name: str
    colour: str              # its colour in every plot of the report
    prepare: Prepare
    eval_cost: float = 1.0   # its evaluation's time as a multiple of the uncontrolled site's (the night's plan)
    solve_s: float = 0.0     # seconds it needs before its evaluation (the night's plan)
    on_curve: bool = False   # drawn beside each learning curve (evaluated on the validation window too)
    # Its run over the part learnt from is the warm start's demonstrations of it (the optimum's replay): kept for them.
    demonstrates: bool = False


def _stateless(controller: type) -> Prepare:
    return lambda cfg, open_env, history=None: (controller(), {})


def _read_period(open_env: Callable[[], Any], read: Callable[[Any], Any]) -> Any:
    """``read`` of a freshly reset evaluation environment's CityLearnEnv, the environment closed after; what the
    dataset holds that the programs do not model is ReferenceUnavailable, with the reason."""
    env = open_env()
    try:
        env.reset()
        return read(env.unwrapped)
    except OptimumUnavailable as exc:
        raise ReferenceUnavailable(str(exc)) from None
    finally:
        env.close()


def _optimum(cfg: Config, open_env: Opener, history: Opener | None = None) -> tuple[Controller, dict[str, Any]]:
    """Solve the perfect-foresight linear program over the evaluation period (the bound), fit its plan to
    CityLearn's physics (trainer.references.physics); that plan is then replayed."""
    def read(env: Any) -> tuple[SiteModel, FittedPlan]:
        model = site_model(env, cfg.ev.margin_soc)
        return model, solve_in_physics(model)

    model, fitted = _read_period(open_env, read)
    bound = fitted.bound
    logs.get().info("linear program solved", agent="optimum", co2_kg=round(bound.co2_kg, 1),
                    plan_co2_kg=round(fitted.physics_co2_kg, 1), rounds=fitted.rounds,
                    seconds=round(fitted.solve_s, 2), variables=bound.variables,
                    constraints=bound.constraints)
    hours = model.steps * model.hours
    return OptimumReplay(fitted.plan, model.sessions), {
        "lp_co2_kg": bound.co2_kg, "lp_co2_kg_per_year": bound.co2_kg * HOURS_PER_YEAR / hours,
        "lp_uncontrolled_co2_kg": model.co2_kg(model.uncontrolled_net_kwh()),
        "lp_physics_co2_kg": fitted.physics_co2_kg, "lp_fit_rounds": fitted.rounds,
        "lp_solve_s": round(fitted.solve_s, 2), "lp_variables": bound.variables}


def _planner(cfg: Config, open_env: Opener, history: Opener | None = None) -> tuple[Controller, dict[str, Any]]:
    """The day-ahead planner on a forecast that never reads the period ahead (trainer.references.planner), learnt
    first from the part of the data the run learnt from where it is judged on a part held out."""
    planner = _read_period(open_env, lambda env: day_ahead_planner(cfg, env, history))
    return planner, {"forecast": forecast_source(planner), "version": PLANNER_VERSION}


REFERENCE_ROSTER: dict[str, ReferenceSpec] = {spec.name: spec for spec in (
    ReferenceSpec(BASELINE, "#7f7f7f", _stateless(UncontrolledBaseline), on_curve=True),
    ReferenceSpec("rbc", "#bcbd22", _stateless(RuleBasedController), eval_cost=1.1, on_curve=True),
    # A year of the built-in site solves in ~1-2 s on 2 cores; padded for larger sites.
    ReferenceSpec("optimum", "#9467bd", _optimum, eval_cost=1.1, solve_s=10.0, demonstrates=True),
    # A small program every step: a year took 50-55 s on 2 cores where the uncontrolled site takes 20-27; its
    # forecast reads three other years of the site first (~2 s; padded for larger sites).
    ReferenceSpec("planner", "#17becf", _planner, eval_cost=2.0, solve_s=15.0),
)}
REFERENCES: tuple[str, ...] = tuple(REFERENCE_ROSTER)
