"""Evaluation and the metrics of results.json: the one place each metric is defined.

All energy figures are at the site's grid connection (the buildings' net exchange summed
per step): imports are ``max(net, 0)``, exports ``max(-net, 0)``.

- ``co2_kg``: imports x grid carbon intensity over the evaluation period.
- ``co2_kg_per_year``: ``co2_kg`` scaled to 8,760 hours.
- ``co2_vs_baseline_pct``: 100 x (agent - baseline) / baseline; negative means less CO2.
- ``cost``: imports x tariff (exports are not credited).
- ``grid_import_kwh``, ``peak_kw``: total import and the largest hourly import.
- ``pv_self_consumption_pct``: share of PV generation not exported.
- ``ev_departure_soc_met_pct``: share of EV departures at or above the required SoC
  (within ``EV_SOC_TOLERANCE``); null on a dataset without EV chargers.
- ``ev_unmet_kwh``: energy the EVs lacked at departure to reach their required SoC. An agent
  that leaves cars uncharged imports less, so read its CO2 saving together with this.
- ``ev_excess_kwh``: energy the EVs left with beyond their required SoC (what a car arrived with
  counts too). A car takes it away: charging past the target is energy the site never gets back,
  so compare controllers by it (``ev.stop_at_target``: the guard stops cars at their
  target, and on a V2G charger discharges into the site what a car could not otherwise use before
  it leaves).
- ``co2_share_of_optimum_pct``: the agent's CO2 cut against ``baseline`` as a share of the cut
  of the perfect-foresight linear program (trainer.references.optimum; ``lp_co2_kg`` of the ``optimum``
  entry, the bound): 100 % is the physical limit.
- ``citylearn_ev_departure_success_pct``: CityLearn's own ``evaluate_v2`` departure success rate.
  It counts a departure met within ``CITYLEARN_EV_TOLERANCE`` (5 % SoC) of its target, five times
  the product's tolerance, so it can read higher than ``ev_departure_soc_met_pct``.
- ``citylearn_kpis``: CityLearn's own district KPIs (``env.evaluate()``) as ratios to CityLearn's
  "without storage" reference. That reference also removes every charger's consumption: it is
  the site with every car stranded, so a ratio below 1 there does not mean a better controller.
  Compare controllers with the product's metrics, which are all against ``baseline``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from trainer.base.progress import Progress
from trainer.base.signals import STOP
from trainer.config.roster import AGENTS
from trainer.env.citylearn import central_arrays, guard_for
from trainer.references.controllers import Controller
from trainer.references.planner import planner_exports

if TYPE_CHECKING:
    import gymnasium
    from citylearn.citylearn import CityLearnEnv

EV_SOC_TOLERANCE = 0.01
CITYLEARN_EV_TOLERANCE = 0.05  # citylearn.internal.kpi's default ev_departure_service_tolerance
HOURS_PER_YEAR = 8760
METRIC_KEYS = (
    "co2_kg", "co2_kg_per_year", "co2_vs_baseline_pct", "co2_share_of_optimum_pct", "cost", "grid_import_kwh",
    "peak_kw", "pv_self_consumption_pct", "ev_departure_soc_met_pct", "ev_unmet_kwh", "ev_excess_kwh",
    "citylearn_ev_departure_success_pct", "timesteps", "train_wall_s", "steps_per_s", "citylearn_kpis",
)
TABLE_COLUMNS = (
    ("co2_kg_per_year", "CO2 kg/yr", "{:,.0f}"),
    ("co2_vs_baseline_pct", "vs baseline %", "{:+.1f}"),
    ("co2_share_of_optimum_pct", "of optimum %", "{:.0f}"),
    ("ev_departure_soc_met_pct", "EV met %", "{:.1f}"),
    ("ev_unmet_kwh", "EV unmet kWh", "{:,.0f}"),
    ("cost", "cost", "{:,.0f}"),
    ("grid_import_kwh", "import kWh", "{:,.0f}"),
    ("peak_kw", "peak kW", "{:.1f}"),
    ("pv_self_consumption_pct", "PV self-use %", "{:.1f}"),
    ("timesteps", "train steps", "{:,}"),
    ("steps_per_s", "steps/s", "{:.0f}"),
    ("train_wall_s", "train s", "{:.0f}"),
)


def _finite(value: float) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


def run_episode(controller: Controller, sb3_env: gymnasium.Env, timeseries_path: Path | None = None,
                label: str | None = None, trajectory: list[tuple[np.ndarray, np.ndarray, float]] | None = None
                ) -> dict[str, Any]:
    """Run ``controller`` over the evaluation env's whole episode and compute the metrics; with a ``label``, show
    the evaluation's progress (a stage's evaluation; the learning curve's short ones stay quiet). ``trajectory``
    gets each step's observation, action and reward (the optimum's replay: the warm start's demonstrations)."""
    env = sb3_env.unwrapped
    arrays = central_arrays(sb3_env)
    if arrays is not None:
        # Every evaluation replays the episode a fresh environment starts with: CityLearn seeds the drift of unplugged
        # cars' charge (what a car arrives with where the charger file gives no state of charge) by the episode's
        # index, so a second reset of the same environment would evaluate other arrivals (0.3 % of CO2 on the
        # shared district).
        arrays.set_next_episode(0)
    obs, _ = sb3_env.reset()
    progress = Progress("evaluation progress", env.time_steps, every=0.25, agent=label) if label else None
    departures_met: list[bool] = []
    unmet_kwh = excess_kwh = 0.0
    done = False
    steps = 0
    start = time.perf_counter()
    with guard_for(sb3_env, controller):  # the uncontrolled baseline runs unguarded
        while not done:
            STOP.check("an evaluation")
            t = env.time_step
            leaving = []
            for b in env.buildings:
                for charger in b.electric_vehicle_chargers or []:
                    sim = charger.charger_simulation
                    if (
                        t < len(sim.electric_vehicle_charger_state)
                        and sim.electric_vehicle_charger_state[t] == 1
                        and sim.electric_vehicle_departure_time[t] == 0
                        and charger.connected_electric_vehicle is not None
                    ):
                        leaving.append(
                            (charger.connected_electric_vehicle, float(sim.electric_vehicle_required_soc_departure[t]))
                        )
            action = controller.act(obs, env)
            seen = obs
            obs, reward, terminated, truncated, _ = sb3_env.step(action)
            if trajectory is not None:
                trajectory.append((seen, action, reward))
            steps += 1
            for ev, required in leaving:
                soc = float(ev.battery.soc[t])
                departures_met.append(soc >= required - EV_SOC_TOLERANCE)
                unmet_kwh += max(required - soc, 0.0) * float(ev.battery.capacity)
                excess_kwh += max(soc - required, 0.0) * float(ev.battery.capacity)
            done = terminated or truncated
            if progress is not None:
                progress.update(steps)
    if progress is not None:
        progress.close()
    wall = time.perf_counter() - start
    metrics = summarise(env, steps, departures_met)
    metrics["ev_unmet_kwh"] = unmet_kwh if departures_met else None
    metrics["ev_excess_kwh"] = excess_kwh if departures_met else None
    metrics["eval_wall_s"] = round(wall, 2)
    metrics["eval_hours"] = steps
    tracker = env.episode_tracker  # the period the environment simulates: whether the evaluation covered all of it
    metrics["period_hours"] = int(tracker.simulation_end_time_step - tracker.simulation_start_time_step)
    if timeseries_path is not None:
        timeseries(env, steps).to_csv(timeseries_path, index=False, float_format="%.4f")
    return metrics


def _district(env: CityLearnEnv, steps: int) -> dict[str, np.ndarray]:
    """The site's series. Each building has its own meter, as CityLearn counts emissions: the site imports what
    each building imports (one building's export does not cover another's load) and exports what each exports."""
    b0 = env.buildings[0]
    per_building = np.asarray([np.asarray(b.net_electricity_consumption[:steps], dtype=float) for b in env.buildings])
    pv = np.sum([-np.asarray(b.solar_generation[:steps], dtype=float) for b in env.buildings], axis=0)
    return {
        "net": per_building.sum(axis=0),
        "imports": np.clip(per_building, 0, None).sum(axis=0),
        "exports": np.clip(-per_building, 0, None).sum(axis=0),
        "pv": pv,
        "carbon": np.asarray(b0.carbon_intensity.carbon_intensity[:steps], dtype=float),
        "price": np.asarray(b0.pricing.electricity_pricing[:steps], dtype=float),
    }


def summarise(env: CityLearnEnv, steps: int, departures_met: list[bool]) -> dict[str, Any]:
    d = _district(env, steps)
    hours_per_step = env.seconds_per_time_step / 3600
    imports, exports = d["imports"], d["exports"]
    pv_total = float(d["pv"].sum())
    co2 = float((imports * d["carbon"]).sum())
    kpis = env.evaluate()
    district = kpis[kpis["level"] == "district"]
    success = _citylearn_ev_success(env) if departures_met else None
    return {
        "co2_kg": co2,
        "co2_kg_per_year": co2 * HOURS_PER_YEAR / (steps * hours_per_step),
        "cost": float((imports * d["price"]).sum()),
        "grid_import_kwh": float(imports.sum()),
        "grid_export_kwh": float(exports.sum()),
        "peak_kw": float(imports.max() / hours_per_step) if steps else 0.0,
        "pv_generation_kwh": pv_total,
        "pv_self_consumption_pct": 100 * (pv_total - float(exports.sum())) / pv_total if pv_total > 0 else None,
        "ev_departures": len(departures_met),
        "ev_departure_soc_met_pct": 100 * sum(departures_met) / len(departures_met) if departures_met else None,
        "citylearn_ev_departure_success_pct": success,
        "eval_timesteps": steps,
        "citylearn_kpis": {row.cost_function: _finite(row.value) for row in district.itertuples()},
    }


def _citylearn_ev_success(env: CityLearnEnv) -> float | None:
    """CityLearn's evaluate_v2 district departure success rate, in % (its 5 % SoC tolerance).

    ``evaluate_v2`` computes some 390 KPIs (12 s after a year of the built-in site, as long as the
    episode itself); this is the one function it calls for the EV ones, per building, summed as
    it sums them (citylearn 3.0.2 is pinned).
    """
    try:
        per_building = [env._kpi_service._compute_ev_metrics(b) for b in env.buildings]
    except AttributeError:  # another CityLearn: the full, slow way
        kpis = env.evaluate_v2()
        rows = kpis[
            (kpis["level"] == "district") & (kpis["cost_function"] == "district_ev_performance_departure_success_ratio")
        ]
        value = _finite(rows["value"].iloc[0]) if len(rows) else None
        return None if value is None else 100 * value
    total = sum(m["departures_total"] for m in per_building)
    return 100 * sum(m["departures_met"] for m in per_building) / total if total else None


def timeseries(env: CityLearnEnv, steps: int) -> pd.DataFrame:
    """Per-step site series for the report's representative week."""
    d = _district(env, steps)
    battery_soc = np.mean([np.asarray(b.electrical_storage.soc[:steps], dtype=float) for b in env.buildings], axis=0)
    ev, connected = np.zeros(steps), np.zeros(steps)
    for b in env.buildings:
        for charger in b.electric_vehicle_chargers or []:
            ev += np.asarray(charger.electricity_consumption[:steps], dtype=float)
            state = np.asarray(charger.charger_simulation.electric_vehicle_charger_state[:steps], dtype=float)
            connected += np.nan_to_num(state) == 1
    sim = env.buildings[0].energy_simulation
    calendar = {name: np.asarray(getattr(sim, name)[:steps], dtype=int) for name in ("month", "day_type", "hour")}
    return pd.DataFrame({"step": np.arange(steps), **calendar, "net_kwh": d["net"], "import_kwh": d["imports"],
                         "pv_kwh": d["pv"],
                         "battery_soc": battery_soc, "ev_charging_kwh": ev, "ev_connected": connected,
                         "carbon_kg_per_kwh": d["carbon"], "price_per_kwh": d["price"]})


def compare_to_baseline(results: dict[str, dict[str, Any]]) -> None:
    """Fill ``co2_vs_baseline_pct`` and ``co2_share_of_optimum_pct`` in place for every entry.

    The first against the ``baseline`` entry, the second against the cut of the ``optimum``
    entry's linear program (its ``lp_co2_kg``), where both exist. An entry's ``in_sample`` figures (the part a run
    learnt from, beside its held-out ones) are compared with the references' own ``in_sample`` figures.
    """
    _compare({name: m for name, m in results.items()})
    _compare({name: m["in_sample"] for name, m in results.items() if isinstance(m.get("in_sample"), dict)})


def _compare(results: dict[str, dict[str, Any]]) -> None:
    base = results.get("baseline", {}).get("co2_kg")
    bound = results.get("optimum", {}).get("lp_co2_kg")
    best_cut = base - bound if base and bound is not None else None
    for metrics in results.values():
        co2 = metrics.get("co2_kg")
        metrics["co2_vs_baseline_pct"] = 100 * (co2 - base) / base if base and co2 is not None else None
        metrics["co2_share_of_optimum_pct"] = (100 * (base - co2) / best_cut
                                               if best_cut and best_cut > 0 and co2 is not None else None)


BOUND_SHORTFALL_PCT = 2.0  # an optimum's replay further than this short of its bound's cut is explained


def optimum_reach(results: dict[str, dict[str, Any]]) -> str | None:
    """A line saying why the optimum's replay falls short of its bound, where it does by more than
    :data:`BOUND_SHORTFALL_PCT` of the cut (the bound takes every curve at its best point)."""
    optimum = results.get("optimum", {})
    share, base = optimum.get("co2_share_of_optimum_pct"), results.get("baseline", {}).get("co2_kg")
    if share is None or share >= 100 - BOUND_SHORTFALL_PCT or not base:
        return None
    bound, physics = optimum.get("lp_co2_kg"), optimum.get("lp_physics_co2_kg")
    line = (f"the optimum's replay reaches {share:.0f}% of its bound's cut: the bound takes every battery's and "
            "car's efficiency and power curve at its best point and ignores chargers' minimum power, as CityLearn "
            "does not")
    if bound is not None and physics is not None and base > bound:
        line += (f"; the plan fitted to CityLearn's curves reaches {100 * (base - physics) / (base - bound):.0f}% by "
                 "its own physics, so the rest is what those curves cost any controller")
    return line + " (share of optimum is measured against the bound)"


def evaluation_window(results: dict[str, dict[str, Any]]) -> str | None:
    """A line saying what was evaluated, where it is not a whole year (a --quick night, eval_days, a part held out)."""
    hours = {m.get("eval_hours") for m in results.values() if m.get("eval_hours")}
    if not hours or max(hours) >= HOURS_PER_YEAR - 24:
        return None
    days = ", ".join(f"{h / 24:.0f}" for h in sorted(hours))  # an evaluation steps all but its last hour
    whole = all(m.get("eval_hours") == m.get("period_hours") for m in results.values() if m.get("eval_hours"))
    if held_out_figures(results):
        where = (f"the whole part held out, {days} days" if whole else
                 f"the first {days} days of the part held out (and of the part learnt from)")
    else:
        where = f"the whole period, {days} days" if whole else f"the first {days} days of the dataset"
    return (f"evaluated on {where}: CO2 per year is scaled from them; cost and grid import are those days' "
            "totals")


def held_out_figures(results: dict[str, dict[str, Any]]) -> bool:
    """Whether ``results`` are figures on a part held out (each entry's in-sample ones beside them)."""
    return any(isinstance(m.get("in_sample"), dict) for m in results.values())


def in_sample_gap(results: dict[str, dict[str, Any]]) -> str | None:
    """A line saying the figures are held out, with each agent's in-sample share of the optimum beside its own."""
    if not held_out_figures(results):
        return None
    pairs = [f"{name} {m['in_sample']['co2_share_of_optimum_pct']:.0f}%"
             for name, m in results.items() if name in AGENTS and isinstance(m.get("in_sample"), dict)
             and m["in_sample"].get("co2_share_of_optimum_pct") is not None]
    return ("figures on the part of the data held out from training (held-out.json); "
            + (f"in-sample shares of the optimum, on the part learnt from: {', '.join(pairs)}" if pairs else
               "the in-sample figures, on the part learnt from, are under in_sample in results.json"))


def format_table(results: dict[str, dict[str, Any]], currency: str | None = None) -> str:
    """The console's table; ``currency`` (the run's ``scenario.currency``) labels the cost column."""
    header = ["agent"] + [f"{label} {currency}" if key == "cost" and currency else label
                          for key, label, _ in TABLE_COLUMNS]
    rows = [header]
    for agent, metrics in results.items():
        row = [agent]
        for key, _, fmt in TABLE_COLUMNS:
            value = metrics.get(key)
            row.append("-" if value is None else fmt.format(value))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"({note})" for note in (in_sample_gap(results), evaluation_window(results), optimum_reach(results))
             if note]
    return "\n".join([*lines, *notes])


DEFAULT_TARGET_MET_PCT = (
    98.0  # trainer/configs/default.yaml's ev.target_met_pct, for run folders made before it existed
)


def serves_cars(metrics: dict[str, Any], target_met_pct: float) -> bool:
    """Whether a controller met the EV target (a site without chargers has nothing to miss)."""
    met = metrics.get("ev_departure_soc_met_pct")
    return met is None or met >= target_met_pct


def validation_figure(metrics: dict[str, Any]) -> float | None:
    """The deployed policy's kg CO2 a year on the validation window its stage chose by (``kept`` in results.json:
    the curve's figure, or its warm start's where the confirmation kept that); None where the stage kept none."""
    kept = metrics.get("kept")
    figure = kept.get("validation_co2_kg_per_year") if isinstance(kept, dict) else None
    return float(figure) if isinstance(figure, (int, float)) else None


@dataclass(frozen=True)
class YearsFigure:
    """A deployed policy's kg CO2 a year over the held-out years its pick was confirmed over."""

    co2_kg_per_year: float  # the mean over the years
    judged_by: str | None  # "the training simulator" or "CityLearn" (``kept.years_judged_by``)
    years: int


def held_out_years_figure(metrics: dict[str, Any]) -> YearsFigure | None:
    """The deployed policy's figure over the held-out years its stage confirmed its pick over (``kept.years``: the
    pick's figures, or its warm start's where the confirmation kept that); None where the stage confirmed nothing
    (its curve never beat its start)."""
    kept = metrics.get("kept")
    years = kept.get("years") if isinstance(kept, dict) else None
    if not years:
        return None
    key = "warm_start_co2_kg_per_year" if kept.get("step") == 0 else "co2_kg_per_year"
    figures = [year.get(key) if isinstance(year, dict) else None for year in years]
    if not all(isinstance(f, (int, float)) for f in figures):  # a results.json edited by hand: the window chooses
        return None
    return YearsFigure(sum(figures) / len(figures), kept.get("years_judged_by"), len(figures))


@dataclass(frozen=True)
class Choice:
    """Which agent to deploy and on what: ``basis`` is "years" (the held-out years the picks were confirmed over),
    "window" (the validation window) or "figures" (the evaluation's own, where the agents kept neither)."""

    agent: str
    basis: str
    figures: dict[str, float]  # each agent chosen among: its kg CO2 a year on the basis (the years' mean)
    years: int = 0  # how many held-out years the "years" basis is


def serving_agents(results: dict[str, dict[str, Any]], target_met_pct: float) -> list[str]:
    """The trained agents that serve the cars (``serves_cars``), in the roster's order."""
    return [a for a in AGENTS if a in results and results[a].get("co2_kg_per_year") is not None
            and serves_cars(results[a], target_met_pct)]


def _over_the_years(results: dict[str, dict[str, Any]], agents: list[str]) -> dict[str, YearsFigure] | None:
    """Each agent's deployed policy over the held-out years, an agent that confirmed nothing given the figure of
    another that deploys the very same weights (PPO and A2C from their shared imitation); None unless every agent has
    one, judged alike (the same years, by the same simulator)."""
    own = {a: held_out_years_figure(results[a]) for a in agents}
    by_policy = {results[a].get("policy_digest"): f for a, f in own.items() if f and results[a].get("policy_digest")}
    figures = {a: own[a] or by_policy.get(results[a].get("policy_digest")) for a in agents}
    found = {a: f for a, f in figures.items() if f is not None}
    if len(found) != len(agents) or len({(f.judged_by, f.years) for f in found.values()}) != 1:
        return None
    return found


def agent_choice(results: dict[str, dict[str, Any]], target_met_pct: float = DEFAULT_TARGET_MET_PCT) -> Choice | None:
    """The trained agent to deploy: of those that serve the cars, the one whose deployed policy emitted least CO2 on
    what the stages chose their policies by (None if none serves them).

    A controller counts only if it cuts CO2 *and* serves the cars: leaving cars uncharged always
    lowers imports, so an agent below the EV target is never recommended, whatever its CO2.
    Among those, the choice is made on data the stages held out from training, never on the period the report then
    judges: the least CO2 of three agents over the held-out period is the luckiest of three draws there, and the
    choice would no longer be held out from it. Over the held-out years the picks were confirmed over (the built-in
    site's two other whole years; a dataset's validation part) where every agent has them: on three default nights
    they ranked the agents as the held-out year then did, where the 28-day window, 0.03 % apart, chose the last of
    three (docs/agent-quality.md). Else on the validation window; a run whose agents kept neither (``train.keep_best``
    off, or from before it) on the evaluation's figures. Ties keep the roster's order.
    """
    serving = serving_agents(results, target_met_pct)
    if not serving:
        return None
    over_years = _over_the_years(results, serving)
    if over_years is not None:
        figures = {a: f.co2_kg_per_year for a, f in over_years.items()}
        return Choice(min(serving, key=lambda a: figures[a]), "years", figures, over_years[serving[0]].years)
    window = {a: validation_figure(results[a]) for a in serving}
    if all(f is not None for f in window.values()):
        figures, basis = {a: float(f) for a, f in window.items() if f is not None}, "window"
    else:
        figures, basis = {a: float(results[a]["co2_kg_per_year"]) for a in serving}, "figures"
    return Choice(min(serving, key=lambda a: figures[a]), basis, figures)


def best_agent(results: dict[str, dict[str, Any]], target_met_pct: float = DEFAULT_TARGET_MET_PCT) -> str | None:
    """The agent :func:`agent_choice` recommends (None if none serves the cars)."""
    choice = agent_choice(results, target_met_pct)
    return choice.agent if choice else None


def planner_cuts_more(results: dict[str, dict[str, Any]], agent: str, target_met_pct: float) -> bool:
    """Whether the `planner` reference emits less than ``agent`` while serving the cars as the product requires: the
    report's headline says so and its week draws the planner (a causal controller that did better is worth seeing)."""
    planner = results.get("planner", {})
    return (planner.get("co2_kg_per_year") is not None and agent in results
            and planner["co2_kg_per_year"] < results[agent]["co2_kg_per_year"] and serves_cars(planner, target_met_pct))


def recommended_controller(results: dict[str, dict[str, Any]], target_met_pct: float) -> str | None:
    """What the report recommends deploying (and ``trainer export`` exports): the best agent, or the `planner` where
    it cuts more and serves the cars and can be exported (on a dataset); None where nothing serves the cars."""
    best = best_agent(results, target_met_pct)
    planner = results.get("planner", {})
    if planner_exports(planner) and planner.get("co2_kg_per_year") is not None and (
            planner_cuts_more(results, best, target_met_pct) if best else serves_cars(planner, target_met_pct)):
        return "planner"
    return best
