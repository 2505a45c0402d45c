"""Never deploy a regression: each agent deploys the best policy its stage has seen, judged on a held-out window.

Reinforcement learning from a good warm start can make a policy worse (docs/agent-quality.md), and
the last policy of a stage is not the best one. So the learning curve's evaluations are also a
validation: the warm start (step 0) and each curve point are scored on a window the agents never
train on and the report never judges them by, and the best so far is kept in ``<agent>/best/``.
At the end the stage deploys that one.

- **The window**: another year of the site (its seed + VALIDATION_SEED_OFFSET, built once per run in
  ``<run>/validation-site/``): on the built-in site another draw of the same climate, a year the agents never
  trained on; on a dataset a user brings, its days resampled in blocks from the part the run learns from
  (trainer.site.bootstrap), never from the part it is judged on. A site that draws no other year: the first
  ``schedule.curve_eval_days`` of its period.
- **The criterion** is the product's own: the EV departures target first
  (``ev.target_met_pct``), then CO2. Ties keep the earlier policy.
- **Confirmed**: a pick other than the warm start is deployed only if it also beats the warm start over two
  whole other years together (the window's and the seed + SECOND_HELD_OUT_SEED_OFFSET's), by more than
  YEAR_MARGIN of its CO2 (``confirm_over_the_years``). On the built-in site the window and the years are judged on
  the training simulator, which steps them as CityLearn does (trainer.sim.simulators.chooses_on_simulator), and
  there the window only shortlists: its ``train.shortlist`` best policies are all judged over the years, and the
  least there is the one that must beat the warm start (four weeks rank policies a few hundredths of a percent
  apart by luck; two years rank them as the year judged does).
- **A flat curve ends the stage** (``train.patience``): once that share of the stage's timesteps has passed with
  no better policy on the window, the steps after it would only cost time, since the best seen is what deploys.
  On the built-in site's default night PPO's best came at step 43,008 of 501,760 and A2C's at 147,456 of 401,408
  (docs/agent-quality.md); the later points differed from it by the window's noise.
- **Resume** keeps the selection: ``best.json`` and its model are written atomically, and a
  resumed stage starts from them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from trainer.base import logs
from trainer.base.beside import MIN_STEPS, beside
from trainer.base.files import write_json_atomic
from trainer.env.citylearn import make_sb3_env
from trainer.judge.metrics import run_episode
from trainer.learn.warm_start.validation import validation_part
from trainer.references.controllers import PolicyController
from trainer.references.roster import REFERENCE_ROSTER
from trainer.run.device import free_cores_now
from trainer.sim.simulators import chooses_on_simulator
from trainer.site import Site
from trainer.site.scenario import SECOND_HELD_OUT_SEED_OFFSET, VALIDATION_SEED_OFFSET

if TYPE_CHECKING:
    from pathlib import Path

    from trainer.config.sections import Config
    from trainer.run.folder import AgentDir, RunContext

# A policy beats its warm start over the held-out years (together) only by more than this share of the warm start's
# CO2. Every pick measured with a gain of 0.11-0.18 % over one (five, which 0.2 % had refused) was better over the
# evaluation year too (0.13-0.21 %) and no worse over a year nothing saw; below 0.05 % the two are a tie
# (docs/agent-quality.md).
YEAR_MARGIN = 0.0005


@dataclass(frozen=True)
class Candidate:
    """One policy's validation score."""

    step: int
    co2_kg_per_year: float
    ev_departure_soc_met_pct: float | None

    def key(self, target_pct: float) -> tuple[int, float]:
        """Smaller is better: meeting the EV target first, then CO2."""
        met = self.ev_departure_soc_met_pct
        return (0 if met is None or met >= target_pct else 1, self.co2_kg_per_year)


class BestPolicy:
    """The best policy a stage has seen, in ``<agent>/best/`` (``model.zip`` and ``best.json``), and the runners-up
    on the window behind it (``train.shortlist``: ``shortlist.json`` and a ``step_N.zip`` each; never the warm start,
    which the years judge anyway)."""

    def __init__(self, agent: AgentDir, target_pct: float, size: int = 1) -> None:
        self.agent = agent
        self.folder, self.model_path, self.state_path = agent.best, agent.best_model, agent.best_state
        self.target_pct, self.size = target_pct, size
        self.best: Candidate | None = self._read()
        self.runners_up: list[Candidate] = self._read_runners_up() if self.best is not None else []
        self.last: Candidate | None = None
        self.evaluated = 0
        self.warm_start_co2: float | None = None  # its window figure: a curve point of the same weights is no runner-up

    def _read(self) -> Candidate | None:
        if not (self.state_path.is_file() and self.model_path.is_file()):
            return None
        try:
            return _candidate(json.loads(self.state_path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logs.get().warning("the best policy so far is unreadable: the selection starts again",
                               path=str(self.state_path), error=f"{type(exc).__name__}: {exc}")
            return None

    def _read_runners_up(self) -> list[Candidate]:
        path = self.agent.shortlist_state
        if self.size <= 1 or not path.is_file():
            return []
        try:
            kept = [_candidate(row) for row in json.loads(path.read_text(encoding="utf-8"))]
        except (OSError, ValueError, KeyError, TypeError) as exc:  # the best stands; the years judge it alone
            logs.get().warning("the runners-up so far are unreadable: the best is judged without them", path=str(path),
                               error=f"{type(exc).__name__}: {exc}")
            return []
        return [c for c in kept if self.agent.shortlisted(c.step).is_file()]

    def shortlist(self) -> list[tuple[Candidate, Path]]:
        """The best on the window, then the runners-up, best first, each with its model's path."""
        if self.best is None:
            return []
        return [(self.best, self.model_path), *((c, self.agent.shortlisted(c.step)) for c in self.runners_up)]

    def flat(self, step: int, patience_steps: int | None) -> bool:
        """Whether a stage at ``step`` has seen no better policy than its best for ``patience_steps`` (train.patience;
        None or 0: never)."""
        return bool(patience_steps) and self.best is not None and step - self.best.step >= patience_steps

    def offer(self, model: Any, candidate: Candidate) -> bool:
        """Keep ``model`` if it beats the best so far (True), or among the runners-up if it beats one of them."""
        self.evaluated += 1
        self.last = candidate
        if candidate.step == 0:
            self.warm_start_co2 = candidate.co2_kg_per_year
        key = candidate.key(self.target_pct)
        if self.best is not None and key >= self.best.key(self.target_pct):
            if self._ranks_among_runners_up(candidate):
                self._keep_runner_up(model, candidate)
            return False
        from trainer.learn.agents import save_model_atomic  # lazy: SB3 and torch

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # The best so far, where it ranks among the runners-up: asked once, before the new best replaces it.
            demoted = self.best if self.best is not None and self._ranks_among_runners_up(self.best) else None
            if demoted is not None:
                # The best so far becomes a runner-up: its model copied before the new best takes its place.
                shutil.copyfile(self.model_path, self.agent.shortlisted(demoted.step))
            save_model_atomic(model, self.model_path)
            write_json_atomic(self.state_path, asdict(candidate))
        except OSError as exc:  # a full disk costs the selection a candidate, not the stage
            logs.get().warning("best policy not saved", path=str(self.folder), error=exc.strerror,
                               hint="free disk space; training goes on")
            return False
        self.best = candidate
        if demoted is not None:
            self._shortlist(demoted)
        return True

    def _ranks_among_runners_up(self, candidate: Candidate) -> bool:
        if self.size <= 1 or candidate.step == 0:  # the warm start is judged over the years anyway
            return False
        # The same figure to the last digit is the same policy: SAC's actor is its warm start's until its critics
        # have learnt alone (warm_start.sac_critic_updates), and those points would take the shortlist's places.
        kept = {c.co2_kg_per_year for c in (self.best, *self.runners_up) if c is not None and c is not candidate}
        if candidate.co2_kg_per_year in kept | {self.warm_start_co2}:
            return False
        if len(self.runners_up) < self.size - 1:
            return True
        return candidate.key(self.target_pct) < self.runners_up[-1].key(self.target_pct)

    def _keep_runner_up(self, model: Any, candidate: Candidate) -> None:
        from trainer.learn.agents import save_model_atomic  # lazy: SB3 and torch

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            save_model_atomic(model, self.agent.shortlisted(candidate.step))
        except OSError as exc:  # a full disk costs the shortlist a candidate, not the stage
            logs.get().warning("runner-up not saved", path=str(self.folder), error=exc.strerror,
                               hint="free disk space; training goes on")
            return
        self._shortlist(candidate)

    def _shortlist(self, candidate: Candidate) -> None:
        """``candidate`` (its model saved) among the runners-up, the worst beyond ``size - 1`` let go."""
        ranked = sorted([*self.runners_up, candidate], key=lambda c: c.key(self.target_pct))
        self.runners_up, dropped = ranked[:self.size - 1], ranked[self.size - 1:]
        try:
            write_json_atomic(self.agent.shortlist_state, [asdict(c) for c in self.runners_up])
            for old in dropped:
                self.agent.shortlisted(old.step).unlink(missing_ok=True)
        except OSError as exc:
            logs.get().warning("runners-up not saved", path=str(self.agent.shortlist_state), error=exc.strerror,
                               hint="free disk space; training goes on")


def _candidate(row: dict[str, Any]) -> Candidate:
    met = row.get("ev_departure_soc_met_pct")
    return Candidate(int(row["step"]), float(row["co2_kg_per_year"]), None if met is None else float(met))


def shortlist_size(cfg: Config, site: Site) -> int:
    """The policies a stage keeps for the held-out years to choose among (``train.shortlist``) where they are whole
    years judged on the training simulator, else 1: a dataset's years are its validation part, the window itself,
    and in CityLearn each more policy would cost a minute or two a year."""
    if not (cfg.train.keep_best and site.kind.draws and validation_part(site) is None
            and chooses_on_simulator(cfg, site)):
        return 1
    return cfg.train.shortlist


def validation_site(ctx: RunContext) -> tuple[Site, bool]:
    """(the site validation runs on, whether it is held out from the final evaluation)."""
    # A dataset of one period: its validation part, the last days before the part held out, which no stage learns
    # from (trainer.learn.warm_start.validation). The built-in site: another draw of its climate. A site that can
    # do neither: its first days.
    part = validation_part(ctx.site)
    if part is not None:
        return part, True
    drawn = ctx.site.draw(ctx.run.validation_site, VALIDATION_SEED_OFFSET)
    return (ctx.site, False) if drawn is None else (drawn, True)


def kept_summary(best: BestPolicy, final_step: int, held_out: bool) -> dict[str, Any]:
    """What results.json and the report say of the selection."""
    chosen = best.best
    assert chosen is not None
    if chosen.step == 0:
        why = "training never beat its warm start on the validation window"
    elif chosen.step == final_step:
        why = "the last policy was the best on the validation window"
    else:
        why = "a later policy was worse on the validation window"
    return {"step": chosen.step, "final_step": final_step, "why": why, "held_out": held_out,
            "validation_co2_kg_per_year": round(chosen.co2_kg_per_year, 1),
            "validation_ev_departure_soc_met_pct": chosen.ev_departure_soc_met_pct,
            "last_validation_co2_kg_per_year": None if best.last is None else round(best.last.co2_kg_per_year, 1)}


def held_out_years(ctx: RunContext) -> list[Site]:
    """The years a pick is confirmed over: the validation window's (``validation_site``) and a second draw of the
    site (the seed + SECOND_HELD_OUT_SEED_OFFSET, built once into ``<run>/validation-site-2/``); none on a site
    that draws no other year."""
    part = validation_part(ctx.site)
    if part is not None:
        return [part]  # a dataset's validation part: the only days nothing learnt from
    first, held_out = validation_site(ctx)
    if not held_out:
        return []
    second = ctx.site.draw(ctx.run.second_held_out_site, SECOND_HELD_OUT_SEED_OFFSET)
    assert second is not None  # the site that drew the first year draws the second
    return [first, second]


def _over_the_year(ctx: RunContext, agent: str, model: Any, year: Site) -> Candidate:
    env = make_sb3_env(ctx.cfg, year, "eval", ctx.seed, eval_days=ctx.cfg.schedule.eval_days)
    try:
        metrics = run_episode(PolicyController(agent, model), env)
    finally:
        env.close()
    return Candidate(0, float(metrics["co2_kg_per_year"]), metrics["ev_departure_soc_met_pct"])


def _on_the_simulator(ctx: RunContext, models: list[Any], years: list[Site]) -> list[list[float]] | None:
    """Each of ``models``' kg CO2 a year over each year on the training simulator, side by side (the EV guard serves
    every car there as in CityLearn, so EV service is not what it can tell apart): a list a year, a figure a model;
    None where the simulator does not model the site."""
    import torch  # lazy: torch takes seconds to import

    from trainer.sim.site import Unsupported  # lazy: the simulator imports torch

    policies, steps = [model.policy for model in models], _eval_steps(ctx)
    # Each year is a core's Python: where a core is free, the later half run in a process beside this one, each
    # process on one torch thread (a few policies' calls on a few sites gain nothing from a second).
    half = (len(years) + 1) // 2
    worth = len(years) > 1 and min(steps or year.length for year in years[half:]) >= MIN_STEPS
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        pending = beside(_co2_over, ctx.cfg, years[half:], policies, steps, free=free_cores_now() if worth else 1)
        try:
            co2 = _co2_over(ctx.cfg, years[:half], policies, steps) + pending.result("the pick's confirmation")
        finally:
            pending.cancel()
    except Unsupported as exc:
        logs.get().info("the pick is confirmed in CityLearn: the training simulator does not model this site",
                        reason=str(exc))
        return None
    finally:
        torch.set_num_threads(threads)
    return [[float(figure) for figure in year] for year in co2]


def _co2_over(cfg: Config, years: list[Site], policies: list[Any], steps: int | None) -> list[Any]:
    """Each policy's kg CO2 a year over each of ``years`` on the training simulator, side by side."""
    from trainer.learn.warm_start.pick import co2_per_year  # lazy: the pick imports the simulator

    return [co2_per_year(cfg, year, policies, steps) for year in years]


def _eval_steps(ctx: RunContext) -> int | None:
    """The steps of a year an evaluation drives (``schedule.eval_days``; None: all of it)."""
    days = ctx.cfg.schedule.eval_days
    return None if days is None else days * 24


def confirm_over_the_years(ctx: RunContext, agent: str, contenders: list[tuple[Candidate, Any]], warm_start: Any,
                           kept: dict[str, Any], target_pct: float, warm_start_window: float | None,
                           on_simulator: bool = False) -> tuple[Any, dict[str, Any]]:
    """(the policy to deploy, what the report says of it): of ``contenders`` (the window's pick, then its runners-up,
    each with its window figure: ``BestPolicy.shortlist``), the one that emits least over the whole held-out years
    (``held_out_years``, together) is deployed where it beats the warm start there too, or the warm start is.

    From a warm start near the optimum, reinforcement learning's gains are about as large as the noise of four
    weeks: measured, policies 0.2 % better than their warm start on the window were 0.9 % better or 0.1-0.2 % worse
    over the evaluation year; and one held-out year is not enough either: picks 0.24-0.35 % better over it were
    0.02-0.08 % worse over the evaluation year, and 0.17-0.34 % worse over a second (docs/agent-quality.md). Two
    years together judged seven picks as the evaluation year did; each year on its own, five; and they ranked three
    agents' policies as the evaluation year did on three nights, where the window chose the worst of them on one. So
    the window shortlists (``train.shortlist``) and the years choose. The years (as long as the evaluation:
    ``schedule.eval_days``, the whole year by default) are never the period the report scores; the decision is
    deterministic, so a resumed stage makes it alike. ``warm_start_window``: the warm start's figure on the window.
    ``on_simulator``: a night short of time judges the years on the training simulator (seconds, where CityLearn takes
    a minute or two a year on a busy machine); the figures say so. Where the simulator steps the years as CityLearn
    does (the built-in site: ``chooses_on_simulator``), they are judged there in any night; in CityLearn only the
    window's pick is.
    """
    held_out = held_out_years(ctx)
    # Where the simulator steps the years as CityLearn does, the same figures in seconds (chooses_on_simulator).
    exact = bool(held_out) and all(chooses_on_simulator(ctx.cfg, year) for year in held_out)
    simulated = None
    if (on_simulator or exact) and held_out:
        simulated = _on_the_simulator(ctx, [*(model for _, model in contenders), warm_start], held_out)
    judged_by = "the training simulator" if simulated is not None else "CityLearn"
    if simulated is not None:  # the guard serves every car there as in CityLearn: the years tell policies by CO2
        figures = [[Candidate(0, co2, None) for co2 in year] for year in simulated]
    else:
        contenders = contenders[:1]  # each more policy would cost CityLearn a minute or two a year
        figures = [[_over_the_year(ctx, agent, contenders[0][1], year), _over_the_year(ctx, agent, warm_start, year)]
                   for year in held_out]
    if not figures:  # no other year (any dataset but the built-in site): the window's pick stands
        return contenders[0][1], kept
    # Each policy's years that miss the EV target first, then the CO2 of all the years together.
    totals = [(sum(year[i].key(target_pct)[0] for year in figures), sum(year[i].co2_kg_per_year for year in figures))
              for i in range(len(contenders) + 1)]
    best = min(range(len(contenders)), key=lambda i: totals[i])  # a tie keeps the window's order
    (candidate, chosen), (misses, co2), (warm_misses, warm_co2) = contenders[best], totals[best], totals[-1]
    kept = {**kept, "years_judged_by": judged_by}
    years = [{"co2_kg_per_year": round(year[best].co2_kg_per_year, 1),
              "warm_start_co2_kg_per_year": round(year[-1].co2_kg_per_year, 1)} for year in figures]
    n, days = len(contenders), ctx.cfg.schedule.eval_days
    if n > 1:
        kept["shortlist"] = [{"step": c.step, "validation_co2_kg_per_year": round(c.co2_kg_per_year, 1),
                              "years_co2_kg_per_year": [round(year[i].co2_kg_per_year, 1) for year in figures]}
                             for i, (c, _) in enumerate(contenders)]
    # The built-in site's other years are new draws of its climate; a dataset's pick is confirmed on its validation
    # part, the days before the part held out that nothing learnt from.
    # The validation part is the window itself: the report then does not name it a second time ("why_names_window").
    kept["why_names_window"] = validation_part(ctx.site) is not None
    if kept["why_names_window"]:
        period = "the validation part (the last days of the part learnt from, which no stage trained on)"
    else:
        period = (f"the {len(years)} whole held-out years together" if days is None else
                  f"the first {days} days of the {len(years)} held-out years together")
    versus = "; ".join(_versus(y["co2_kg_per_year"], y["warm_start_co2_kg_per_year"]) for y in years)
    if judged_by != "CityLearn":
        versus += f", on {judged_by}" + ("" if exact else ": the night was short of time")
    # Leaving the warm start must be worth more than a tie.
    beaten = misses < warm_misses or (misses == warm_misses and co2 < (1 - YEAR_MARGIN) * warm_co2)
    margin = f"by more than {YEAR_MARGIN:.2%} ({versus})"
    # What the window said first: it preferred a policy of the curve (step > 0), or the warm start itself.
    window_pick = kept["step"]
    others = f"the policy of step {candidate.step:,}" if n == 1 else f"any of the {n} best policies there after it"
    if not beaten:
        window = kept["validation_co2_kg_per_year"] if warm_start_window is None else round(warm_start_window, 1)
        if window_pick == 0:
            why = f"{kept['why']}, nor did {others} over {period} {margin}"
        elif n == 1:
            why = f"the policy of step {window_pick:,} beat it on the validation window but not over {period} {margin}"
        else:
            why = (f"the policy of step {window_pick:,} beat it on the validation window, but none of the {n} best "
                   f"policies there did over {period} {margin}")
        return warm_start, {**kept, "step": 0, "years": years, "validation_co2_kg_per_year": window, "why": why}
    if candidate.step == window_pick:
        why = f"{kept['why']}, and it beat its warm start over {period}"
        if n > 1:
            why += f", the least there of the window's {n} best"
    else:  # a runner-up on the window
        lead = ("training never beat its warm start on the validation window, but" if window_pick == 0 else
                f"the validation window preferred step {window_pick:,}, but")
        why = (f"{lead} of the {n} best policies there the {_ordinal(best + 1)} emitted least over {period} and beat "
               "its warm start there")
    return chosen, {**kept, "step": candidate.step, "validation_co2_kg_per_year": round(candidate.co2_kg_per_year, 1),
                    "years": years, "why": f"{why} {margin}"}


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def record_references(ctx: RunContext, env: Any, held_out: bool) -> None:
    """The uncontrolled site and the RBC on the validation window (once per run): the curve's reference lines."""
    path = ctx.run.validation_references
    if path.is_file():
        return
    lines = {}
    for name, spec in REFERENCE_ROSTER.items():
        if spec.on_curve:
            controller, _ = spec.prepare(ctx.cfg, lambda: env)
            lines[name] = run_episode(controller, env)["co2_kg_per_year"]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"days": ctx.cfg.schedule.curve_eval_days, "held_out": held_out, **lines})
    except OSError as exc:
        logs.get().warning("validation references not saved", path=str(path), error=exc.strerror)


def _versus(co2_kg: float, warm_kg: float) -> str:
    """'1.479 against 1.480 t/yr': in as many decimals (2 to 4) as it takes for two figures that differ to read apart
    (a 0.09 % margin on Building_10's 1.48 t a year read "1.48 against 1.48")."""
    digits = next((d for d in (2, 3) if round(co2_kg / 1000, d) != round(warm_kg / 1000, d)), 4)
    return f"{co2_kg / 1000:,.{digits}f} against {warm_kg / 1000:,.{digits}f} t/yr"
