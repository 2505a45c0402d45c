"""The morning report: report.md and PNG plots under plots/, from what the run folder holds."""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from monitor.summary import format_summary, read_records, summarise
from trainer.base.errors import UsageError
from trainer.base.files import DamagedFile, read_typed, write_text_atomic
from trainer.config.loading import read_yaml
from trainer.config.roster import AGENTS
from trainer.judge.metrics import (
    DEFAULT_TARGET_MET_PCT,
    Choice,
    agent_choice,
    evaluation_window,
    optimum_reach,
    planner_cuts_more,
    recommended_controller,
    serves_cars,
)
from trainer.judge.plots import (
    plot_co2,
    plot_learning_curves,
    plot_monitor,
    plot_timeline,
    plot_week,
    stage_status,
)
from trainer.run.folder import RunDir
from trainer.run.lock import RunLock
from trainer.run.schedule_file import ScheduleState, StageRecord

PLOTS = ("co2_by_agent.png", "learning_curves.png", "representative_week.png", "timeline.png")


def _recorded(run: RunDir, section: str, key: str, default: Any) -> Any:
    """A value of the run's config.yaml, or ``default`` where an older run folder lacks the file or the key."""
    data = read_yaml(run.config) if run.config.is_file() else None
    return ((data or {}).get(section) or {}).get(key, default)


def target_met_pct(run: RunDir) -> float:
    """The run's ev.target_met_pct."""
    return float(_recorded(run, "ev", "target_met_pct", DEFAULT_TARGET_MET_PCT))


def currency(run: RunDir) -> str | None:
    """The run's scenario.currency: the unit of every cost."""
    return _recorded(run, "scenario", "currency", None)


def curve_days(run: RunDir) -> int:
    """The run's schedule.curve_eval_days: the window each learning-curve evaluation covers."""
    return int(_recorded(run, "schedule", "curve_eval_days", 7))


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _table(results: dict[str, dict[str, Any]], unit: str | None, training: bool = True) -> list[str]:
    """The results table; without ``training``, the columns of how each agent trained are left out (figures of
    another year, where nothing trained)."""
    rbc = results.get("rbc", {}).get("co2_kg_per_year")
    columns = ["agent", "CO2 kg/yr", "vs baseline", "vs rbc", "share of optimum", "EV targets met", "EV unmet kWh",
               "CityLearn EV success", f"cost{f' {unit}' if unit else ''}", "peak kW", "PV self-use"]
    columns += ["train steps", "steps/s", "train time"] if training else []
    lines = [f"| {' | '.join(columns)} |", "| --- |" + " ---: |" * (len(columns) - 1)]
    for name, m in results.items():
        co2 = m.get("co2_kg_per_year")
        vs_rbc = 100 * (co2 - rbc) / rbc if co2 is not None and rbc else None
        wall = m.get("train_wall_s")
        row = (f"| {name} | {_fmt(co2, ',.0f')} | {_pct(m.get('co2_vs_baseline_pct'), '+.1f')} | "
               f"{_pct(vs_rbc, '+.1f')} | {_pct(m.get('co2_share_of_optimum_pct'), '.0f')} | "
               f"{_pct(m.get('ev_departure_soc_met_pct'), '.1f')} | {_fmt(m.get('ev_unmet_kwh'), ',.0f')} | "
               f"{_pct(m.get('citylearn_ev_departure_success_pct'), '.1f')} | {_fmt(m.get('cost'), ',.0f')} | "
               f"{_fmt(m.get('peak_kw'), '.1f')} | {_pct(m.get('pv_self_consumption_pct'), '.1f')} |")
        if training:
            row += (f" {_fmt(m.get('timesteps'), ',')} | {_fmt(m.get('steps_per_s'), '.0f')} | "
                    f"{'–' if not wall else f'{wall / 60:.1f} min'} |")
        lines.append(row)
    return lines


def _pct(value, spec: str) -> str:
    return "–" if value is None else f"{format(value, spec)}%"


PEAK_WORTH_SAYING = 1.1  # the headline names a peak import this much above the uncontrolled site's


def _judged_on(run: RunDir, results: dict[str, dict[str, Any]]) -> list[str]:
    """What the figures are: held out, and from what, or in-sample; and what the agents do not read."""
    record, unread, look_back = run.held_out_record(), run.unread_observations(), run.load_look_back()
    reads = (f" The agents do not read {', '.join(f'`{name}`' for name in unread)} (`observations.ignore`): a "
             "calendar they would tell the months of the one period apart by (docs/scenario.md)." if unread else "")
    if look_back:
        hours = _joined([str(h) for h in look_back])
        reads += (f" The agents read each building's loads {hours} hours before (`observations.load_ago_hours`): what "
                  "the site's meter said, which a deployed controller must be given too (docs/export.md).")
    if run.reads_forecast():
        reads += (" They read the forecast of each building's net load and of the grid's carbon intensity over the "
                  "next 1-3, 4-8, 9-16 and 17-24 hours, learnt from the readings so far as the planner's "
                  "(`observations.forecast`): an exported controller keeps learning it (docs/export.md).")
    if varied := run.varied_years():
        load, solar = ("-".join(f"{x:g}" for x in varied[key]) for key in ("load_scale", "solar_scale"))
        reshaped = varied["load_shape"] > 0
        shape = (f" and its loads' daily course reshaped by up to {varied['load_shape']:.0%} "
                 "(`warm_start.draw_load_shape`)" if reshaped else "")
        years = _years_imitated(results, varied)
        reads += (f" Their warm start imitated the optimum of the part learnt from and of {years} years of its days "
                  f"resampled, each week's loads scaled by {load} and its PV by {solar} "
                  f"(`warm_start.draw_load_scale`, `draw_solar_scale`){shape}: weeks lighter and sunnier than the "
                  f"data's{', and days whose peaks fall at other hours' if reshaped else ''}.")
    if record is None:
        if run.held_out.is_file():  # a run that held nothing out (a run before held-out periods says nothing)
            return ["", "*Every figure here is in-sample: the run held nothing out (`--holdout none`), so the "
                        "agents are judged on the period they learnt from, which flatters them; on data they never "
                        f"saw they may do worse.{reads}*"]
        return []
    return ["", f"*Every figure here is held out: judged on {record['held_out']}; the agents learnt from "
                f"{record['learnt_from']}. The figures on the part they learnt from are under \"Held out and "
                f"in-sample\".{reads}*"]


def _years_imitated(results: dict[str, dict[str, Any]], varied: dict[str, Any]) -> str:
    """How many resampled years each agent's warm start imitated ("8", or "SAC's 8, PPO's and A2C's 3"): its
    ``warm_start.periods`` in results.json less the part learnt from. A stage short of time imitates fewer than the plan
    (trainer.learn.warm_start.optimum_demonstrations), so ``held-out.json``'s count, the plan's, is only the fallback
    (a run before the count per agent, or no agent's warm start recorded)."""
    counts: dict[int, list[str]] = {}
    for name in AGENTS:
        periods = ((results.get(name) or {}).get("warm_start") or {}).get("periods")
        if isinstance(periods, int) and periods >= 1:
            counts.setdefault(periods - 1, []).append(name.upper())
    if len(counts) <= 1:
        return str(next(iter(counts), varied["years"]))
    whose = []
    for years, names in sorted(counts.items(), reverse=True):
        possessive = [name + "'s" for name in names]
        whose.append(f"{_joined(possessive)} {years}")
    return ", ".join(whose)


def _joined(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _below_rbc(results: dict[str, dict[str, Any]], name: str) -> str | None:
    """A sentence where ``name`` emits more than the rule-based controller over what it is judged on."""
    co2, rbc = results.get(name, {}).get("co2_kg_per_year"), results.get("rbc", {}).get("co2_kg_per_year")
    if co2 is None or rbc is None or co2 <= rbc:
        return None
    where = "held-out " if "in_sample" in results[name] else ""
    return (f" **On the {where}data it does worse than the rule-based controller** ({co2:,.0f} against "
            f"{rbc:,.0f} kg CO2/year): deploy `rbc`'s rules, or train longer on more data, before this.")


def _window(kept: dict[str, Any]) -> str:
    """What the stage's validation window was, as the report names it."""
    return kept.get("window") or ("the validation window, in another year of the data" if kept.get("held_out")
                                  else "the validation window, the first days of the dataset")


def _how_chosen(results: dict[str, dict[str, Any]], choice: Choice) -> str:
    """A sentence saying what the agent was chosen on (trainer.judge.metrics.agent_choice), and which agent, if any,
    emits less over the period judged here: the choice does not look at it, as a site choosing its controller
    cannot. Nothing where it was the only agent to choose."""
    if len(choice.figures) < 2:
        return ""
    if choice.basis == "figures":
        return (" Chosen on the figures below: not every agent kept its figure on the validation window "
                "(`train.keep_best`).")
    kept = results[choice.agent]["kept"]
    if choice.basis == "window":
        where = _window(kept)
    else:  # a dataset's validation part, or the built-in site's other years, each pick confirmed over them
        where = kept.get("window") or (f"the {choice.years} other years the selection holds out from training, "
                                       "where each pick was confirmed")
    said = f" Chosen on {where} ({choice.figures[choice.agent]:,.0f} kg CO2/year there), not on the figures here."
    best = results[choice.agent]["co2_kg_per_year"]
    lower = [name for name in choice.figures if results[name]["co2_kg_per_year"] < best]
    if lower:
        other = min(lower, key=lambda name: results[name]["co2_kg_per_year"])
        said += (f" `{other}` emits less here ({results[other]['co2_kg_per_year']:,.0f} kg CO2/year), not there "
                 f"({choice.figures[other]:,.0f}): which agent does best on a period is not known before it.")
    return said


def _which_policy(agent: str, m: dict[str, Any]) -> str:
    """Which policy of ``agent`` is deployed, said as the headline's end: its warm start (what it imitated),
    untrained, where it trained nothing or kept its start; else the step kept of those trained."""
    trained, kept = int(m.get("timesteps") or 0), m.get("kept") or {}
    step = kept.get("step", trained) if isinstance(kept, dict) else trained
    if m.get("warm_start") and (trained <= 0 or step == 0):
        # A dataset's pick is judged on its validation part (kept["window"] says so), the built-in site's over years
        # it draws for the selection: never the part the report's figures are judged on.
        judged = (f"on {kept['window']}" if isinstance(kept, dict) and kept.get("window") else
                  "over the years the selection holds out from training")
        why = "it trained no step" if trained <= 0 else f"none of its {trained:,} training steps did better {judged}"
        imitation = _imitation(agent, m["warm_start"]) or "the imitation of the optimum"
        return f": its warm start ({imitation}), untrained: {why}."
    if not trained:
        return "."
    if step != trained:
        return f", the policy after {step:,} of its {trained:,} training steps."
    return f", after {trained:,} training steps."


def _imitation(agent: str, warm: dict[str, Any]) -> str | None:
    """What ``agent``'s warm start imitated where it was an ensemble (results.json's ``warm_start``): the member
    picked, or the members' mean; None for one imitation."""
    ensemble = warm.get("ensemble") or {}
    members, picked = ensemble.get("members"), (ensemble.get("pick") or {}).get("member")
    if members and picked:  # warm_start.pick_best chose a member over the mean
        return f"imitation {picked} of {members}: it did better over the held-out years than their mean in one policy"
    if members:
        teacher = ensemble.get("teacher", agent)  # another agent's policies taught this one
        whose = f"{teacher.upper()} " if teacher != agent else ""
        kept = ensemble.get("members_kept")
        if kept and len(kept) < members:  # a dataset's: the members best on its validation part
            return (f"the mean of the {len(kept)} of {members} {whose}imitations of the optimum that did best on the "
                    "validation part, in one policy")
        return f"the mean of {members} {whose}imitations of the optimum, in one policy"
    return None


def _reused(results: dict[str, dict[str, Any]]) -> str | None:
    """A line naming the references whose figures an earlier run evaluated (trainer.references.reuse)."""
    reused = {name: m["reused_from"] for name, m in results.items() if m.get("reused_from")}
    if not reused:
        return None
    runs = sorted(set(reused.values()))
    return (f"{', '.join(reused)}: figures of an earlier run on the same data and settings ({', '.join(runs)}), "
            "not evaluated again (`schedule.reuse_references`).")


def _same_policy(results: dict[str, dict[str, Any]], best: str) -> str:
    """The other agents that deploy the very weights ``best`` deploys (the same imitation, untrained), said after the
    headline's policy: they are one controller, not several that agree."""
    digest = results[best].get("policy_digest")
    same = [name for name, m in results.items()
            if name != best and name in AGENTS and digest and m.get("policy_digest") == digest]
    if not same:
        return ""
    names = " and ".join(f"`{name}`" for name in same)
    return (f" {names} {'deploys' if len(same) == 1 else 'deploy'} the very same policy (the same imitation, kept "
            f"untrained): one controller, not {len(same) + 1} that agree.")


def _planner_to_the_site(run: RunDir) -> str:
    return (f"To take the planner to the site: `trainer export {run.root}` writes it with the linear program it "
            "solves each hour and a `controller.py` that needs only numpy and scipy, its forecast learnt from the "
            "readings as it goes, the EV guard included, proven on this evaluation (docs/export.md).")


def _headline(results: dict[str, dict[str, Any]], target_pct: float, run: RunDir) -> list[str]:
    """The morning answer: which controller to deploy, judged by CO2 and EV service together, and how."""
    choice = agent_choice(results, target_pct)
    lines = []
    if choice:
        best = choice.agent
        m = results[best]
        share = m.get("co2_share_of_optimum_pct")
        lines.append(f"**Best agent: {best}**, {m['co2_kg_per_year']:,.0f} kg CO2/year "
                     f"({_fmt(m.get('co2_vs_baseline_pct'), '+.1f')}% against the uncontrolled baseline"
                     + (f", {share:.0f}% of the optimum's cut" if share is not None else "")
                     + f"), meeting {_fmt(m.get('ev_departure_soc_met_pct'), '.1f')}% of EV departures"
                     + _which_policy(best, m)
                     + _same_policy(results, best)
                     + _how_chosen(results, choice)
                     + (_below_rbc(results, best) or ""))
        peak, base_peak = m.get("peak_kw"), results.get("baseline", {}).get("peak_kw")
        if peak and base_peak and peak > PEAK_WORTH_SAYING * base_peak:  # a CO2 cut can cost the site's connection
            lines[-1] += (f" Its peak import is {peak:,.0f} kW, {100 * (peak / base_peak - 1):.0f}% above the "
                          f"uncontrolled site's {base_peak:,.0f} kW.")
        planner = results.get("planner", {})
        if planner_cuts_more(results, best, target_pct):
            lines[-1] += (" The `planner` reference, which plans the next day every hour on a forecast that never "
                          f"reads ahead, cuts more: {planner['co2_kg_per_year']:,.0f} kg CO2/year"
                          + (f" ({planner['co2_share_of_optimum_pct']:.0f}% of the optimum's cut)"
                             if planner.get("co2_share_of_optimum_pct") is not None else "")
                          + "; a controller that cannot see ahead reaches that much (docs/agent-quality.md).")
        if recommended_controller(results, target_pct) == "planner":
            lines += ["", _planner_to_the_site(run) + f" `trainer export {run.root} --agent {best}` exports {best} "
                          "instead, as ONNX with a `controller.py` that needs only numpy and onnxruntime."]
        else:
            lines += ["", f"To take it to the site: `trainer export {run.root}` writes it as ONNX with a "
                          "`controller.py` that needs only numpy and onnxruntime, the EV guard included, proven on "
                          "this evaluation (docs/export.md)."]
    elif any(a in results for a in AGENTS):
        lines.append(f"**No agent is worth deploying from this run**: none both cut CO2 and met {target_pct:g}% of "
                     "EV departures (`ev.target_met_pct`).")
        if recommended_controller(results, target_pct) == "planner":
            lines += ["", _planner_to_the_site(run)]
    short = [n for n, m in results.items() if n in AGENTS and not serves_cars(m, target_pct)]
    if short:
        lines += [
            "",
            f"Not recommended: {', '.join(short)} met fewer than {target_pct:g}% of EV departures (see the EV "
            "columns); part of their CO2 saving is energy not delivered to cars, not energy saved.",
        ]
    skipped = results.get("optimum", {}).get("skipped")
    if skipped:
        lines += ["", f"The optimum was not computed: {skipped}."]
    return lines


NOTES = [
    "How to read it: `share of optimum` is a controller's CO2 cut against the uncontrolled baseline as a share of the "
    "cut of the perfect-foresight linear program (`optimum`'s `lp_co2_kg` in results.json; the `optimum` row is that "
    "dispatch replayed through CityLearn, what perfect foresight really reaches; `planner` plans the next 24 hours "
    "every hour on a forecast, a causal controller's reach). `EV targets met` counts departures "
    "within 1% SoC of their target; `CityLearn EV success` is CityLearn's own `evaluate_v2` rate, which allows 5% SoC, "
    "so it can read higher. `cost` is what the grid imports cost at the tariff over the evaluation period (exports are "
    "not credited); `peak kW` is the highest hourly import in it. `citylearn_kpis` in results.json are ratios to "
    "CityLearn's \"without storage\" reference, which also removes every charger's consumption (the site with every "
    "car stranded): compare controllers with the columns here, which are all against the uncontrolled baseline. "
    "`steps/s` and `train time` are learning's own: the warm start (its demonstrations and imitation) is counted "
    "apart, as `warm_start_s` in results.json.",
]


# A held-out share of the optimum this many points under the in-sample one is said: the controller memorised.
GAP_WORTH_SAYING = 5.0


def _in_sample(results: dict[str, dict[str, Any]]) -> list[str]:
    """Held-out figures beside the in-sample ones (the part the agents learnt from), with the gap."""
    rows = [(name, m, m["in_sample"]) for name, m in results.items() if isinstance(m.get("in_sample"), dict)]
    if not rows:
        return []
    lines = ["## Held out and in-sample", "",
             "The same controllers on the part of the data the agents learnt from (in-sample) beside the part held "
             "out (the figures above). A controller that acts on what it observes keeps its share on data it never "
             "saw; a large gap means it learnt the period, not the site. Each period's share is against its own "
             "optimum.", "",
             "| controller | share of optimum, held out | in-sample | gap (points) | vs baseline, held out | "
             "in-sample | EV targets met, held out | in-sample |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    gaps = {}
    for name, m, inside in rows:
        out, into = m.get("co2_share_of_optimum_pct"), inside.get("co2_share_of_optimum_pct")
        gaps[name] = into - out if out is not None and into is not None else None
        lines.append(f"| {name} | {_pct(out, '.0f')} | {_pct(into, '.0f')} | {_fmt(gaps[name], '+.0f')} | "
                     f"{_pct(m.get('co2_vs_baseline_pct'), '+.1f')} | "
                     f"{_pct(inside.get('co2_vs_baseline_pct'), '+.1f')} | "
                     f"{_pct(m.get('ev_departure_soc_met_pct'), '.1f')} | "
                     f"{_pct(inside.get('ev_departure_soc_met_pct'), '.1f')} |")
    # The rule-based controller learnt nothing: its gap is what the two parts differ by (season, cars), the rest of
    # an agent's is what it learnt of the period it trained on. An agent is named where it loses more than the bar
    # both in itself and beyond the RBC: on the official EV buildings the RBC's share rises 4-9 points on the months
    # held out while the agents' fall 1-3, and naming those would be a false alarm.
    level = gaps.get("rbc") or 0.0
    wide = [f"{name} ({gap:+.0f} points; rbc {level:+.0f})" for name, gap in gaps.items()
            if name in AGENTS and gap is not None and min(gap, gap - level) > GAP_WORTH_SAYING]
    if wide:
        lines += ["", f"**Held out, {', '.join(wide)} lose more than {GAP_WORTH_SAYING:g} points, and more than "
                      f"{GAP_WORTH_SAYING:g} beyond what the rule-based controller, which learnt nothing, loses "
                      "between the two parts**: part of what they learnt was the period itself."]
    return [*lines, ""]


def _deployed(results: dict[str, dict[str, Any]]) -> list[str]:
    """Which policy each agent deploys and why, with its warm start's figure beside the deployed one."""
    rows = []
    for agent in AGENTS:
        metrics = results.get(agent) or {}
        kept, warm = metrics.get("kept"), metrics.get("warm_start") or {}
        if not kept:
            continue
        which = ("its warm start (step 0)" if kept["step"] == 0 else
                 "its last policy" if kept["step"] == kept["final_step"] else f"the policy of step {kept['step']:,}")
        window, last = _window(kept), kept.get("last_validation_co2_kg_per_year")
        last = None if kept["step"] == kept["final_step"] else last
        line = f"- **{agent}** deploys {which} of {kept['final_step']:,} steps: {kept['why']}"
        # A dataset's window is its validation part, which the confirmation against the warm start has just named
        # with the deployed policy's figure there: the sentence does not name it twice (a run of an older version
        # says so only in its words).
        if kept.get("why_names_window", bool(kept.get("window")) and window.split(",")[0] in kept["why"]):
            line += "" if last is None else f"; the last policy {last / 1000:,.2f} t/yr there"
        else:
            line += f" ({window}: {kept['validation_co2_kg_per_year'] / 1000:,.2f} t/yr"
            line += ("" if last is None else f", the last policy {last / 1000:,.2f}") + ")"
        line += "."
        early = kept.get("ended_early")
        if early:
            line += (f" Its stage ended at step {kept['final_step']:,} of {early['target']:,}: no better policy on the "
                     f"window in {early['patience_steps']:,} steps or more (train.patience).")
        past = metrics.get("past_target")
        if past and kept["final_step"] > past["target"]:
            line += (f" As the night's last stage it learnt on past its target of {past['target']:,} steps, in time no "
                     f"stage after it could use ({past['up_to']:,} at most, schedule.last_stage_past_target).")
        if isinstance(warm.get("co2_kg_per_year"), (int, float)):
            said = _imitation(agent, warm)
            imitation = f" ({said})" if said else ""
            line += (f" Warm start alone{imitation}: {warm['co2_kg_per_year']:,.0f} kg/yr; deployed: "
                     f"{metrics['co2_kg_per_year']:,.0f} kg/yr.")
        elif warm.get("not_evaluated"):
            line += f" Warm start alone: not evaluated ({warm['not_evaluated']})."
        rows.append(line)
    if not rows:
        return []
    return ["## What each agent deploys", "",
            "The best policy each stage saw on a validation window it never trained on (EV target first, then "
            "CO2), never merely the last (`train.keep_best`; docs/agent-quality.md).", "", *rows, ""]


def _unseen_year(run: RunDir, unit: str | None) -> list[str]:
    """The figures of ``trainer evaluate --unseen-year``, where it has run: the same controllers over a year of the
    built-in site no stage trained, validated or imitated on."""
    path = run.unseen_year_results
    if not path.is_file():
        return []
    lines = ["## A year no stage saw", ""]
    try:
        results = read_typed(path, dict[str, dict[str, Any]])
    except DamagedFile:  # the run's own figures stand without it
        return [*lines, f"{path} is damaged and left out; run `trainer evaluate {run.root} --unseen-year` again to "
                        "rewrite it.", ""]
    lines += ["`trainer evaluate --unseen-year` ran the references, each deployed policy and its warm start over "
              "another year of the built-in site (`unseen-year/site/`); the share of optimum is that year's "
              "optimum's. A controller that keeps its share and its rank here acts on what it observes, not on a "
              "year it memorised.", ""]
    # A stage trained again since (a resumed or re-run night) deploys another policy than the one these figures judge.
    newer = [a for a in AGENTS if run.agent(a).model.is_file()
             and run.agent(a).model.stat().st_mtime > path.stat().st_mtime]
    if newer:
        lines += [f"**These figures are older than the model {', '.join(newer)} deploys now**: run "
                  f"`trainer evaluate {run.root} --unseen-year` again.", ""]
    return [*lines, *_table(results, unit, training=False), ""]


def write_report(run: RunDir) -> Path:
    """Write report.md and every plot; returns the report's path. Plots are drawn aside and moved into plots/ once
    the whole report is made: a damaged file it reads (named, with the way on) leaves the earlier report and plots
    as they were."""
    run.plots.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".plots-", dir=run.plots))
    try:
        text = _compose(run, staging)
        for plot in sorted(staging.iterdir()):
            os.replace(plot, run.plot(plot.name))
        write_text_atomic(run.report, text)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return run.report


def _compose(run: RunDir, plots: Path) -> str:
    """report.md's text, its plots drawn into ``plots``."""
    results = run.results()
    schedule = ScheduleState.load(run.schedule).as_dict() if run.schedule.is_file() else None
    agents = [a for a in AGENTS if run.agent(a).root.is_dir()]
    target_pct = target_met_pct(run)
    plot_co2(results, plots / "co2_by_agent.png", target_pct)
    curves = plot_learning_curves(run, agents, plots / "learning_curves.png", curve_days(run))
    best_shown = plot_week(run, results, plots / "representative_week.png", target_pct)  # beside the baseline
    if schedule:
        plot_timeline(schedule, plots / "timeline.png")

    lines = [f"# Night report: {run.root.name}", "", *_headline(results, target_pct, run),
             *_judged_on(run, results)]
    if schedule:
        failed = [s for s in schedule["stages"] if s["status"] == "failed"]
        skipped = [s for s in schedule["stages"] if s["status"] == "skipped"]
        deadline = f", deadline {schedule['deadline']}" if schedule.get("deadline") else ""
        lines += ["", f"Started {schedule['created_at']}{deadline}."]
        for stage in failed:
            lines.append(f"- **{stage['name']} failed**: {stage['error']}")
        for stage in skipped:
            lines.append(f"- {stage['name']} skipped: {stage['error']}")
    window, reach, reused = evaluation_window(results), optimum_reach(results), _reused(results)
    lines += ["", "## Results", "", *([f"*{window[0].upper()}{window[1:]}.*", ""] if window else []),
              *([f"*{reach[0].upper()}{reach[1:]}.*", ""] if reach else []),
              *([f"*{reused}*", ""] if reused else []),
              *_table(results, currency(run)), "", *NOTES, ""]
    lines += ["![CO2 per agent](plots/co2_by_agent.png)", ""]
    lines += _in_sample(results)
    lines += _deployed(results)
    lines += _unseen_year(run, currency(run))
    if curves:
        lines += ["## Learning", "", "![Learning curves](plots/learning_curves.png)", ""]
    if best_shown is not None:
        drawn = " and ".join(["baseline (dashed)", *best_shown]) if len(best_shown) < 2 else \
            f"baseline (dashed), {', '.join(best_shown[:-1])} and {best_shown[-1]}"
        lines += ["## A representative week", "", "Grid import, battery state of charge and EV charging (cars "
                  f"connected shaded): {drawn}.", "",
                  "![Representative week](plots/representative_week.png)", ""]
    if schedule:
        lines += ["## The night", "", "| stage | status | planned | actual | steps |",
                  "| --- | --- | --- | --- | ---: |"]
        for s in schedule["stages"]:
            planned = f"{_hm(s['planned_start'])}–{_hm(s['planned_end'])}" if s["planned_start"] else "–"
            steps = s["timesteps_done"] or "–"
            lines.append(f"| {s['name']} | {stage_status(s)} | {planned} | {_actual(s)} | {steps} |")
        spent = schedule.get("time_left")
        if spent:  # after the stages, before the report (trainer.night.state._spend_time_left)
            agents = spent["warm_starts_evaluated"]
            lines += ["", f"The time the stages left, {_hm(spent['start'])}–{_hm(spent['end'])}, evaluated the warm "
                          f"start{'s' if len(agents) > 1 else ''} of {', '.join(agents)}, which the night had left "
                          "for lack of time."]
        lines += ["", "![Timeline](plots/timeline.png)", ""]
    if run.monitor.is_file():
        records = read_records(run.monitor)
        plot_monitor(records, plots / "gpu.png", schedule)
        lines += [
            "## The machine",
            "",
            "```",
            format_summary(summarise(records)),
            "```",
            "",
            "![GPU](plots/gpu.png)",
            "",
        ]
    lines += ["Metric definitions: `trainer/judge/metrics.py`; the run's config: `config.yaml`.", ""]
    return "\n".join(lines)


def _actual(stage: dict[str, Any]) -> str:
    """When it ran: one stretch a run, so a resumed stage shows the hours the night was stopped as a gap."""
    # Started, not ended: "from 03:32:41", not "03:32:41––".
    return ", ".join(f"{_hm(start)}–{_hm(end)}" if end else f"from {_hm(start)}"
                     for start, end in StageRecord(**stage).stretches()) or "–"


def _hm(text: str | None) -> str:
    return datetime.fromisoformat(text).strftime("%H:%M:%S") if text else "–"


def report_run(run_dir: Path) -> Path:
    """`trainer report`: the report of a finished (or stopped) run; refused while a trainer writes the folder."""
    run = RunDir(run_dir)
    if not run.results_json.is_file():
        raise UsageError(f"no results in {run_dir}: it has no results.json (pass a folder made by trainer train or "
                         "night)")
    run.results()  # the state files checked before the lock file or anything else is written
    if run.schedule.is_file():
        ScheduleState.load(run.schedule)
    lock = RunLock(run.root).acquire()
    try:
        return write_report(run)
    finally:
        lock.release()
