"""The morning report's plots: CO2 and EV service by controller, the learning curves, a representative
week, the night's timeline and the GPU monitor's records, each a PNG under the run's plots/."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from trainer.base.files import FIXES, DamagedFile, read_json, read_typed
from trainer.config.roster import ROSTER
from trainer.judge.metrics import (
    DEFAULT_TARGET_MET_PCT,
    HOURS_PER_YEAR,
    best_agent,
    held_out_figures,
    planner_cuts_more,
    serves_cars,
)
from trainer.references.roster import REFERENCE_ROSTER
from trainer.run.folder import RunDir
from trainer.run.schedule_file import RUNNING, StageKind, StageRecord

# Each agent's and reference's colour, from their rosters; a name neither knows (a run of an agent since removed)
# is drawn in OTHER_COLOUR.
COLOURS = {name: spec.colour for name, spec in (*REFERENCE_ROSTER.items(), *ROSTER.items())}
OTHER_COLOUR = "#333333"


def _pyplot():
    """matplotlib's pyplot drawing to files (imported here: it is slow, and only the report draws)."""
    import matplotlib  # lazy: matplotlib, for the report's plots only

    matplotlib.use("Agg")  # files only: works without a display, in containers and over SSH
    import matplotlib.pyplot as plt

    return plt


def plot_co2(results: dict[str, dict[str, Any]], path: Path, target_pct: float = DEFAULT_TARGET_MET_PCT) -> None:
    """CO2 per controller with the EV service beside it: a CO2 cut that strands cars is no cut."""
    plt = _pyplot()
    names = [n for n in results if results[n].get("co2_kg_per_year") is not None]
    values = [results[n]["co2_kg_per_year"] / 1000 for n in names]
    fig, (ax, ev_ax) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    bars = ax.bar(names, values, color=[COLOURS.get(n, OTHER_COLOUR) for n in names])
    for bar, name in zip(bars, names):
        pct = results[name].get("co2_vs_baseline_pct")
        label = f"{bar.get_height():.1f} t" + (f"\n{pct:+.1f}%" if pct is not None and name != "baseline" else "")
        # Inside the bar, below its top: the reference lines run across the tops, and would cross a label there.
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, -4),
                    textcoords="offset points", ha="center", va="top", fontsize=9, color="white", fontweight="bold")
        if not serves_cars(results[name], target_pct):
            bar.set_hatch("//")
            bar.set_alpha(0.5)
    base = results.get("baseline", {}).get("co2_kg_per_year")
    if base:
        ax.axhline(base / 1000, color=COLOURS["baseline"], linestyle="--", linewidth=1, label="uncontrolled")
    bound = results.get("optimum", {}).get("lp_co2_kg_per_year")
    if bound:
        ax.axhline(bound / 1000, color=COLOURS["optimum"], linestyle=":", linewidth=1.5,
                   label="optimum's bound (perfect-foresight LP): no controller beats it")
    ax.set_ylabel("CO2, tonnes per year")
    period = "the part held out" if held_out_figures(results) else "evaluation period"
    ax.set_title(f"Grid CO2 per controller ({period}, scaled to a year)\nhatched: missed the EV target, "
                 "so not recommended", fontsize=10)
    ax.set_ylim(0, max(values) * 1.32 if values else 1)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper center", ncol=2, fontsize=8)
    met = [results[n].get("ev_departure_soc_met_pct") for n in names]
    ev_bars = ev_ax.bar(
        names, [m if m is not None else 0 for m in met], color=[COLOURS.get(n, OTHER_COLOUR) for n in names]
    )
    for bar, name, value in zip(ev_bars, names, met):
        unmet = results[name].get("ev_unmet_kwh")
        text = "no EVs" if value is None else f"{value:.0f}%" + (f"\n{_energy(unmet)} unmet" if unmet else "")
        ev_ax.annotate(text, (bar.get_x() + bar.get_width() / 2, max(bar.get_height(), 2)), ha="center",
                       va="bottom", fontsize=8)
    ev_ax.axhline(target_pct, color="#d62728", linestyle="--", linewidth=1,
                  label=f"EV target: {target_pct:g}% of departures (ev.target_met_pct)")
    ev_ax.legend(loc="lower right", fontsize=7, framealpha=0.9)  # above the bars sit their labels
    ev_ax.set_ylim(0, 135)
    ev_ax.set_ylabel("EV departures\nmet %")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _energy(kwh: float) -> str:
    return f"{kwh / 1000:,.1f} MWh" if kwh >= 1000 else f"{kwh:,.0f} kWh"


TIMESERIES = ("net_kwh", "carbon_kg_per_kwh", "battery_soc", "ev_charging_kwh")  # what the plots read of one
CURVE = ("step", "co2_kg_per_year", "ev_departure_soc_met_pct")


def read_written_csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A CSV the trainer wrote, with the numeric columns a plot reads; a damaged one is named with the way on."""
    fix = FIXES.get(path.name, "restore it from a backup or delete it")
    try:
        frame = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        detail = str(exc).splitlines()[0][:120] if str(exc) else "empty"
        raise DamagedFile(f"{path} is damaged ({type(exc).__name__}: {detail}); {fix}") from None
    wrong = [c for c in columns if c not in frame.columns or not pd.api.types.is_numeric_dtype(frame[c])]
    if wrong:
        raise DamagedFile(f"{path} is damaged: the column(s) {', '.join(wrong)} are missing or not numbers; {fix}")
    return frame


def site_imports(frame: pd.DataFrame) -> pd.Series:
    """Grid import per step: each building's own meter summed (``import_kwh``); a timeseries an older version wrote
    has only the site's net, whose positive part it is on a site of one building."""
    return frame["import_kwh"] if "import_kwh" in frame.columns else frame["net_kwh"].clip(lower=0)


def window_co2_t_per_year(timeseries: Path, hours: int) -> float | None:
    """A reference's CO2 over the first ``hours`` of its evaluation, scaled to a year (the curve's measure)."""
    if not timeseries.is_file():
        return None
    frame = read_written_csv(timeseries, ("net_kwh", "carbon_kg_per_kwh")).iloc[:hours]
    if len(frame) < hours:
        return None
    co2 = (site_imports(frame) * frame["carbon_kg_per_kwh"]).sum()
    return float(co2) * HOURS_PER_YEAR / hours / 1000


class _KeptRecord(BaseModel):
    """What the report reads of an agent's metrics.json."""

    kept: dict[str, Any] | None = None


def _kept(run: RunDir, agent: str) -> dict[str, Any]:
    """The agent's metrics' ``kept`` (what trainer.learn.selection chose, and why); {} without one."""
    metrics = run.agent(agent).metrics
    return (read_typed(metrics, _KeptRecord).kept if metrics.is_file() else None) or {}


def kept_point(kept: dict[str, Any], curve: pd.DataFrame) -> tuple[int, float] | None:
    """(step, CO2 kg/yr) of the curve point an agent deploys, from its metrics' ``kept``; None without one."""
    rows = curve[curve["step"] == kept.get("step")] if "step" in kept else curve.iloc[:0]
    return None if rows.empty else (int(kept["step"]), float(rows["co2_kg_per_year"].iloc[-1]))


def chosen_over_years(kept: dict[str, Any]) -> bool:
    """Whether an agent's deployed policy was chosen over the held-out years among several of its curve's best on
    the validation window (its metrics' ``kept.shortlist``), not by the window alone."""
    return len(kept.get("shortlist") or []) > 1


def change_since_first(curve: pd.DataFrame) -> pd.Series:
    """Each point's CO2 against the curve's first (step 0: the warm start, where the agent has one), in %; not a
    number where the first point imported nothing (a site that exports all month has no share to draw)."""
    first = float(curve["co2_kg_per_year"].iloc[0])
    return (curve["co2_kg_per_year"] / first - 1) * 100 if first > 0 else curve["co2_kg_per_year"] * float("nan")


def _resampled(run: RunDir) -> bool:
    """Whether the run's validation year is a dataset's own days resampled (trainer.site.bootstrap)."""
    schema = run.validation_site / "schema.json"
    try:
        return schema.is_file() and "pvbess_bootstrap" in read_json(schema)
    except DamagedFile:
        return False


CURVE_MARKERS = ("o", "s", "^", "D")
CURVE_LINES = ("-", "--", ":", "-.")


def plot_learning_curves(run: RunDir, agents: list[str], path: Path, curve_days: int) -> bool:
    """Each agent's evaluations during training: CO2 on the curve's window with the references on the same
    window; the same against each agent's first point, on a scale where fine-tuning's moves of a few tenths of a
    percent around a warm start show; and EV departures met, where the curve has them (not one judged on the training
    simulator). False (and no file) when no agent has a point yet."""
    curves = {a: read_written_csv(run.agent(a).curve, CURVE).sort_values("step") for a in agents
              if run.agent(a).curve.is_file()}
    if not curves:
        return False
    plt = _pyplot()
    # A curve judged on the training simulator has no EV column (the guard serves every reachable departure there as
    # in CityLearn: trainer.learn.callbacks.EvalCurve): no empty panel for it.
    with_ev = any(curve["ev_departure_soc_met_pct"].notna().any() for curve in curves.values())
    if with_ev:
        fig, (co2_ax, change_ax, ev_ax) = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True,
                                                       gridspec_kw={"height_ratios": [3, 1.8, 1.2]})
    else:
        fig, (co2_ax, change_ax) = plt.subplots(2, 1, figsize=(8, 6.3), sharex=True,
                                                gridspec_kw={"height_ratios": [3, 1.8]})
        ev_ax = None
    any_kept = by_years = False
    for order, (agent, curve) in enumerate(curves.items()):
        colour = COLOURS.get(agent, OTHER_COLOUR)
        change = change_since_first(curve)
        # Agents often sit on one another (PPO and A2C deploy one imitation): each later agent's markers are smaller,
        # another shape and drawn above, its line another style, so every agent shows where they coincide.
        look = {"color": colour, "marker": CURVE_MARKERS[order % len(CURVE_MARKERS)],
                "linestyle": CURVE_LINES[order % len(CURVE_LINES)], "zorder": 3 + order}
        size = max(6 - 1.5 * order, 2.5)
        co2_ax.plot(curve["step"], curve["co2_kg_per_year"] / 1000, label=agent, markersize=size, **look)
        change_ax.plot(curve["step"], change, markersize=max(size - 3, 2), **look)
        if ev_ax is not None:
            ev_ax.plot(curve["step"], curve["ev_departure_soc_met_pct"], markersize=size, **look)
        record = _kept(run, agent)
        kept = kept_point(record, curve)
        if kept is not None:  # the policy the agent deploys (trainer.learn.selection)
            star = {"marker": "*", "markersize": max(18 - 4 * order, 8), "color": colour, "markeredgecolor": "black",
                    "linestyle": "none", "zorder": 10 + order}
            co2_ax.plot([kept[0]], [kept[1] / 1000], **star)
            change_ax.plot([kept[0]], [change[curve["step"] == kept[0]].iloc[-1]], **star)
            any_kept = True
            by_years = by_years or chosen_over_years(record)
    change_ax.axhline(0, color="black", linewidth=0.8)
    change_ax.set_ylabel("CO2 against its\nstep 0, %")
    if any_kept:  # one neutral legend entry for every agent's star
        co2_ax.plot([], [], marker="*", markersize=12, color="white", markeredgecolor="black", linestyle="none",
                    label="deployed")
    held_out = read_json(run.validation_references) if run.validation_references.is_file() else None
    if held_out is not None and not isinstance(held_out, dict):
        raise DamagedFile(f"{run.validation_references} is damaged: expected an object of the references' CO2 "
                          f"(baseline, rbc), found {json.dumps(held_out)[:80]}; delete it (the learning curve then "
                          "draws the references from their evaluation)")
    for name in (name for name, spec in REFERENCE_ROSTER.items() if spec.on_curve):
        if held_out is not None:
            reference = held_out.get(name) / 1000 if isinstance(held_out.get(name), (int, float)) else None
        else:
            reference = window_co2_t_per_year(run.agent(name).timeseries, curve_days * 24)
        if reference is not None:
            co2_ax.axhline(reference, color=COLOURS.get(name, OTHER_COLOUR), linestyle="--", linewidth=1.2, label=name)
    co2_ax.set_ylabel("CO2, t/yr")
    window = (f"the first {curve_days} days of the dataset" if held_out is None else
              f"{curve_days} days of a year of the dataset's own days resampled" if _resampled(run) else
              f"{curve_days} days of a held-out year (another draw of the site)"
              if (run.validation_site / "schema.json").is_file() else
              "the last days of the part learnt from, which no stage trained on")
    table = "the part held out" if run.held_out_record() is not None else "the whole evaluation period"
    judged = "" if with_ev else "judged on the training simulator, where the guard meets every reachable departure\n"
    # Where the window only shortlisted (trainer.learn.selection), the star need not sit on its curve's lowest point.
    star = ("a star: the policy deployed, of the window's best the least over two held-out years" if by_years
            else "a star: the policy deployed")
    # One clause a line: at the figure's width a longer line was cut at its edge ("...two held-out" without "years").
    change = "middle" if ev_ax is not None else "below"  # the EV panel, where there is one, sits under it
    co2_ax.set_title(f"Validation: {window}, per year\n{judged}"
                     f"(the table covers {table};\n{star};\n"
                     f"{change}: each agent against its step 0, its warm start where it has one; below 0 is better)",
                     fontsize=10)
    co2_ax.legend(loc="best", fontsize=8)
    if ev_ax is not None:
        ev_ax.set_ylabel("EV departures\nmet %")
        ev_ax.set_ylim(0, 105)
    (ev_ax or change_ax).set_xlabel("environment steps")
    for ax in (co2_ax, change_ax, ev_ax):
        if ax is not None:
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def representative_week(base: pd.DataFrame) -> slice:
    """The 7-day window whose baseline imports are the median of all whole weeks (or the whole period)."""
    hours = 7 * 24
    if len(base) <= hours:
        return slice(0, len(base))
    weeks = len(base) // hours
    imported = site_imports(base)
    imports = [imported.iloc[w * hours:(w + 1) * hours].sum() for w in range(weeks)]
    week = int(np.argsort(imports)[len(imports) // 2])
    return slice(week * hours, (week + 1) * hours)


DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "Holiday")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def plot_week(
    run: RunDir, results: dict[str, dict[str, Any]], path: Path, target_pct: float = DEFAULT_TARGET_MET_PCT
) -> list[str] | None:
    """Grid import, battery and EV charging over the median week: baseline, rbc, the planner where it cuts more than
    the recommended agent, and that agent; the controllers drawn beside the baseline (None: no plot)."""
    best = best_agent(results, target_pct)
    base_path = run.agent("baseline").timeseries
    if not base_path.is_file():
        return None
    base = read_written_csv(base_path, TIMESERIES)
    window = representative_week(base)
    series = {"baseline": base.iloc[window]}
    planner = ("planner",) if best and planner_cuts_more(results, best, target_pct) else ()
    for name in ("rbc", *planner, best):
        if name and run.agent(name).timeseries.is_file():
            series[name] = read_written_csv(run.agent(name).timeseries, TIMESERIES).iloc[window]
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    panels = [("net_kwh", "grid import kW"), ("battery_soc", "battery SoC"), ("ev_charging_kwh", "EV charging kW")]
    for ax, (column, label) in zip(axes, panels):
        for name, frame in series.items():
            values = site_imports(frame) if column == "net_kwh" else frame[column]
            ax.plot(frame["step"], values, label=name, color=COLOURS.get(name, OTHER_COLOUR),
                    linestyle="--" if name == "baseline" else "-", linewidth=1.2)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3)
    week = series["baseline"]
    if "ev_connected" in week:  # when cars are there to charge
        cars = axes[2].twinx()
        cars.fill_between(week["step"], week["ev_connected"], step="mid", color="#999999", alpha=0.15, label="cars")
        cars.set_ylabel("cars connected", fontsize=8, color="#777777")
        from matplotlib.ticker import MaxNLocator  # lazy: matplotlib, for the report's plots only

        cars.yaxis.set_major_locator(MaxNLocator(integer=True))  # cars come whole
    if {"day_type", "month", "hour"} <= set(week.columns):
        # A dataset's hours carry no year, so each day is named by its weekday, month and day of the dataset.
        midnights = week[week["hour"] == 1]
        axes[-1].set_xticks(midnights["step"], [f"{DAYS[int(d) - 1]} {MONTHS[int(m) - 1]}\nday {int(t) // 24 + 1}"
                                                for d, m, t in zip(midnights["day_type"], midnights["month"],
                                                                   midnights["step"])], fontsize=8)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[0].set_title("A representative week (the median week of baseline imports)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [name for name in series if name != "baseline"]


TIME_LEFT_COLOUR = "#6baed6"


def plot_timeline(schedule: dict[str, Any] | None, path: Path) -> None:
    import matplotlib.dates as mdates  # lazy: matplotlib, for the report's plots only

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.5))
    stages = (schedule or {}).get("stages", [])
    rows = []  # (label, bars), top to bottom
    for stage in stages:
        bars = [(0.2, stage.get("planned_start"), stage.get("planned_end"), "#c6dbef")]
        # A stage run again by --resume: one bar a run, the hours the night was stopped left blank.
        bars += [(-0.2, start, end, _status_colour(stage["status"])) for start, end in StageRecord(**stage).stretches()]
        rows.append((f"{stage['name']} ({stage_status(stage)})", bars))
    # The time the stages left before the report, where the night spent it (schedule.json's time_left): a row of its
    # own above the report's.
    spent = (schedule or {}).get("time_left")
    if spent and rows:
        rows.insert(len(rows) - 1, (f"time left (warm starts evaluated: {', '.join(spent['warm_starts_evaluated'])})",
                                    [(-0.2, spent["start"], spent["end"], TIME_LEFT_COLOUR)]))
    for row, (_, bars) in enumerate(reversed(rows)):
        for offset, start, end, colour in bars:
            if start and end:
                s, e = datetime.fromisoformat(start), datetime.fromisoformat(end)
                ax.barh(row + offset, mdates.date2num(e) - mdates.date2num(s),
                        left=mdates.date2num(s), height=0.35, color=colour)
    from matplotlib.lines import Line2D  # lazy: matplotlib, for the report's plots only
    from matplotlib.patches import Patch

    ax.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)], fontsize=8)
    ax.xaxis_date()
    times = [datetime.fromisoformat(t) for s in stages
             for t in (s.get("planned_start"), s.get("actual_start"), s.get("actual_end")) if t]
    short_night = bool(times) and (max(times) - min(times)).total_seconds() < 1800
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if short_night else "%H:%M"))
    handles = [Patch(color="#c6dbef", label="planned"), Patch(color="#2171b5", label="actual (done)")]
    handles += [Patch(color=_status_colour(status), label=status) for status in ("failed", "skipped")
                if any(s["status"] == status for s in stages)]  # only what happened this night
    if spent:
        handles.append(Patch(color=TIME_LEFT_COLOUR, label="time left, spent"))
    if schedule and schedule.get("deadline"):
        ax.axvline(mdates.date2num(datetime.fromisoformat(schedule["deadline"])), color="#d62728", linestyle="--")
        handles.append(Line2D([], [], color="#d62728", linestyle="--", label="deadline"))
    ax.set_title("The night: planned and actual time of each stage")
    ax.legend(handles=handles, loc="lower left", fontsize=7, ncol=len(handles))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_monitor(records: list[dict[str, Any]], path: Path, schedule: dict[str, Any] | None = None) -> None:
    """GPU utilisation and memory over the night (host CPU and memory on a night without a GPU), with the
    stages marked on the time axis so a reader sees which stage left the device idle."""
    plt = _pyplot()
    samples = [r for r in records if r.get("kind") == "sample"]
    fig, (use_ax, mem_ax) = plt.subplots(2, 1, figsize=(9, 4.8), sharex=True)
    start = samples[0]["unix_time"] if samples else 0.0
    span_s = samples[-1]["unix_time"] - start if samples else 0.0
    unit_s, unit = (3600, "hours") if span_s >= 2 * 3600 else (60, "minutes")  # a quick night reads in minutes
    hours = [(r["unix_time"] - start) / unit_s for r in samples]
    indices = sorted({g["index"] for r in samples for g in r["gpus"]})
    for index in indices:
        points = [((r["unix_time"] - start) / unit_s, g) for r in samples for g in r["gpus"] if g["index"] == index]
        use_ax.plot([t for t, _ in points], [g["utilization_gpu_pct"] for _, g in points], label=f"GPU {index}")
        mem_ax.plot([t for t, _ in points], [None if g["memory_used_bytes"] is None else g["memory_used_bytes"] / 2**30
                                             for _, g in points], label=f"GPU {index}")
    if indices:
        use_ax.set_ylabel("GPU utilisation %")
        mem_ax.set_ylabel("GPU memory GiB")
        title = "GPU over the night"
    else:
        use_ax.plot(hours, [r["host"]["cpu_pct"] for r in samples], color="#2171b5")
        mem_ax.plot(hours, [r["host"]["ram_used_bytes"] / 2**30 for r in samples], color="#2171b5", label="host")
        watched = [(t, r["host"]["watched_rss_bytes"] / 2**30) for t, r in zip(hours, samples)
                   if r["host"].get("watched_rss_bytes")]
        if watched:
            mem_ax.plot(*zip(*watched), color="#ff7f0e", label="trainer and workers (RSS: shared pages per process)")
            mem_ax.legend(loc="upper left", fontsize=7)
        use_ax.set_ylabel("host CPU %")
        use_ax.set_ylim(0, 105)
        mem_ax.set_ylabel("host memory GiB")
        title = "The host over the night (no GPU: " + str(next((r["gpu_error"] for r in samples if r.get("gpu_error")),
                                                               "none found")) + ")"
    for stage in (schedule or {}).get("stages", []):
        if stage.get("actual_start") and samples:
            begin = (datetime.fromisoformat(stage["actual_start"]).timestamp() - start) / unit_s
            for ax in (use_ax, mem_ax):
                ax.axvline(begin, color="#999999", linewidth=0.8, linestyle=":")
            use_ax.annotate(stage["name"], (begin, 1.0), xycoords=("data", "axes fraction"), fontsize=7, rotation=90,
                            va="top", ha="right", color="#555555")
    use_ax.set_title(title, fontsize=10)
    mem_ax.set_xlabel(f"{unit} since the monitor started (dotted: a stage starts)")
    for ax in (use_ax, mem_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stage_status(stage: dict[str, Any]) -> str:
    """A schedule stage's status as the report shows it."""
    # The night writes its report while the report stage runs: the report would call itself "running".
    if stage["kind"] == StageKind.REPORT and stage["status"] == RUNNING:
        return "this report"
    return stage["status"]


def _status_colour(status: str) -> str:
    return {"done": "#2171b5", "failed": "#d62728", "skipped": "#969696", "running": "#fd8d3c"}.get(status, "#6baed6")
