"""``trainer optimum check``: how far the optimum's model of a dataset is from CityLearn, and where.

Three comparisons over the evaluation period, each against CityLearn itself:

- the model's uncontrolled site (batteries idle, every car charged at full power from arrival) against CityLearn's
  uncontrolled run, building by building: the model reads every load, PV and charging session right when they
  agree (on the built-in site and the official 2022 datasets within 0.01 %);
- the optimum's replay against its bound (the program at each curve's best point): what CityLearn's curves and
  chargers' minimum power cost a controller that knows the whole period;
- the plan fitted to those curves (trainer.references.physics) against its replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainer.config.sections import Config
from trainer.env.citylearn import make_sb3_env
from trainer.judge.metrics import BOUND_SHORTFALL_PCT, run_episode
from trainer.references.controllers import UncontrolledBaseline
from trainer.references.optimum import OptimumReplay
from trainer.references.optimum_model import site_model
from trainer.references.physics import solve_in_physics
from trainer.site import Site

BASELINE_TOLERANCE_PCT = 1.0  # the model's uncontrolled site further than this from CityLearn's is a model error


@dataclass
class OptimumCheck:
    """What ``trainer optimum check`` measured (kg CO2 over the period)."""

    hours: int
    baseline_kg: float
    model_baseline_kg: float
    bound_kg: float
    plan_physics_kg: float
    replay_kg: float
    replay_ev_met_pct: float | None
    buildings: list[tuple[str, float, float]] = field(default_factory=list)  # (name, CityLearn kg, model kg)

    @property
    def baseline_gap_pct(self) -> float:
        return 100 * (self.model_baseline_kg - self.baseline_kg) / max(self.baseline_kg, 1e-9)

    def share(self, kg: float) -> float | None:
        """``kg``'s cut against the uncontrolled site as a share of the bound's, in %."""
        cut = self.baseline_kg - self.bound_kg
        return 100 * (self.baseline_kg - kg) / cut if cut > 0 else None

    @property
    def ok(self) -> bool:
        return abs(self.baseline_gap_pct) <= BASELINE_TOLERANCE_PCT

    def lines(self) -> list[str]:
        replay, plan = self.share(self.replay_kg), self.share(self.plan_physics_kg)
        out = [f"over {self.hours} hours:",
               f"  uncontrolled site  CityLearn {self.baseline_kg:,.1f} kg, the model {self.model_baseline_kg:,.1f} kg "
               f"({self.baseline_gap_pct:+.2f} %)"]
        for name, actual, modelled in self.buildings:
            out.append(f"    {name}: CityLearn {actual:,.1f} kg, the model {modelled:,.1f} kg")
        out.append(f"  bound              {self.bound_kg:,.1f} kg (every curve at its best point)")
        if replay is not None and plan is not None:
            ev = "" if self.replay_ev_met_pct is None else f", EV departures met {self.replay_ev_met_pct:.1f} %"
            out += [f"  plan fitted        {self.plan_physics_kg:,.1f} kg in its own physics ({plan:.1f} % of the "
                    "bound's cut)",
                    f"  replay             {self.replay_kg:,.1f} kg in CityLearn ({replay:.1f} % of the bound's "
                    f"cut{ev})"]
        return out

    def verdict(self) -> str:
        if not self.ok:
            worst = max(self.buildings, key=lambda b: abs(b[2] - b[1]), default=None)
            where = f", most in {worst[0]}" if worst else ""
            return (f"the optimum's model differs from CityLearn's uncontrolled run by {self.baseline_gap_pct:+.2f} % "
                    f"(more than {BASELINE_TOLERANCE_PCT:g} %{where}): its figures are not to be trusted on this "
                    "dataset; please report it with the dataset")
        replay = self.share(self.replay_kg)
        if replay is not None and replay < 100 - BOUND_SHORTFALL_PCT:
            return (f"the model matches CityLearn; the optimum's replay reaches {replay:.1f} % of its bound's cut: "
                    "CityLearn's efficiency and power curves and chargers' minimum power cost the rest, and shares "
                    "of the optimum are measured against the bound")
        return "the model matches CityLearn and the optimum's replay reaches its bound"


def check_optimum(cfg: Config, site: Site, days: int | None) -> OptimumCheck:
    """Compare the optimum's model and plan with CityLearn over the first ``days`` of the period (None: all of it);
    OptimumUnavailable where the dataset holds what the program does not model."""
    env = make_sb3_env(cfg, site, "eval", cfg.seed, eval_days=days)
    try:
        env.reset()
        model = site_model(env.unwrapped, cfg.ev.margin_soc)
        fitted = solve_in_physics(model)
        baseline = run_episode(UncontrolledBaseline(), env)
        actual = np.asarray([np.asarray(b.net_electricity_consumption[:model.steps], dtype=float)
                             for b in env.unwrapped.buildings])
        uncontrolled = model.uncontrolled_net_kwh()
        names = [b.name for b in env.unwrapped.buildings]
        replay = run_episode(OptimumReplay(fitted.plan, model.sessions), env)
    finally:
        env.close()
    # each building's meter, in CityLearn's run and in the model: kg of its imports
    per_building = [(np.clip(net, 0, None) * model.carbon).sum(axis=1) for net in (actual, uncontrolled)]
    differing = [(n, float(a), float(m)) for n, a, m in zip(names, *per_building)
                 if abs(m - a) > max(0.005 * abs(a), 0.05)]
    return OptimumCheck(model.steps, baseline["co2_kg"], model.co2_kg(uncontrolled), fitted.bound.co2_kg,
                        fitted.physics_co2_kg, replay["co2_kg"], replay.get("ev_departure_soc_met_pct"), differing)
