"""The morning report: report.md and PNG plots under plots/, from what the run folder holds."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from monitor.summary import format_summary, read_records, summarise
from trainer.config import AGENTS
from trainer.files import read_json, write_text_atomic
from trainer.run_dir import RunDir

COLOURS = {"baseline": "#7f7f7f", "rbc": "#bcbd22", "optimum": "#9467bd", "sac": "#1f77b4", "ppo": "#ff7f0e",
           "a2c": "#2ca02c"}
DEFAULT_TARGET_MET_PCT = (
    98.0  # trainer/configs/default.yaml's ev.target_met_pct, for run folders made before it existed
)
PLOTS = ("co2_by_agent.png", "learning_curves.png", "representative_week.png", "timeline.png")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: works without a display, in containers and over SSH
    import matplotlib.pyplot as plt

    return plt


def serves_cars(metrics: dict[str, Any], target_met_pct: float) -> bool:
    """Whether a controller met the EV target (a site without chargers has nothing to miss)."""
    met = metrics.get("ev_departure_soc_met_pct")
    return met is None or met >= target_met_pct


def best_agent(results: dict[str, dict[str, Any]], target_met_pct: float = DEFAULT_TARGET_MET_PCT) -> str | None:
    """The trained agent with the least CO2 among those that serve the cars (None if none does).

    A controller counts only if it cuts CO2 *and* serves the cars: leaving cars uncharged always
    lowers imports, so an agent below the EV target is never recommended, whatever its CO2.
    """
    trained = [a for a in AGENTS if a in results and results[a].get("co2_kg_per_year") is not None
               and serves_cars(results[a], target_met_pct)]
    return min(trained, key=lambda a: results[a]["co2_kg_per_year"]) if trained else None


def target_met_pct(run: RunDir) -> float:
    """The run's ev.target_met_pct (its config.yaml), or the default for older run folders."""
    if not run.config.is_file():
        return DEFAULT_TARGET_MET_PCT
    data = yaml.safe_load(run.config.read_text(encoding="utf-8")) or {}
    return float((data.get("ev") or {}).get("target_met_pct", DEFAULT_TARGET_MET_PCT))


def progress_frame(folder: Path) -> pd.DataFrame:
    """SB3's progress.csv, with the parts kept from before each resume, in step order."""
    parts = sorted(folder.glob("progress.before-*.csv")) + [folder / "progress.csv"]
    frames = []
    for part in parts:
        if part.is_file() and part.stat().st_size > 0:
            try:
                frames.append(pd.read_csv(part))
            except pd.errors.EmptyDataError:
                continue
    if not frames:
        return pd.DataFrame()
    frame = pd.concat(frames, ignore_index=True)
    return frame.sort_values("time/total_timesteps") if "time/total_timesteps" in frame else frame


def plot_co2(results: dict[str, dict[str, Any]], path: Path, target_pct: float = DEFAULT_TARGET_MET_PCT) -> None:
    """CO2 per controller with the EV service beside it: a CO2 cut that strands cars is no cut."""
    plt = _pyplot()
    names = [n for n in results if results[n].get("co2_kg_per_year") is not None]
    values = [results[n]["co2_kg_per_year"] / 1000 for n in names]
    fig, (ax, ev_ax) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    bars = ax.bar(names, values, color=[COLOURS.get(n, "#333333") for n in names])
    for bar, name in zip(bars, names):
        pct = results[name].get("co2_vs_baseline_pct")
        label = f"{bar.get_height():.1f} t" + (f"\n{pct:+.1f}%" if pct is not None and name != "baseline" else "")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=9)
        if not serves_cars(results[name], target_pct):
            bar.set_hatch("//")
            bar.set_alpha(0.5)
    base = results.get("baseline", {}).get("co2_kg_per_year")
    if base:
        ax.axhline(base / 1000, color=COLOURS["baseline"], linestyle="--", linewidth=1, label="uncontrolled")
    bound = results.get("optimum", {}).get("lp_co2_kg_per_year")
    if bound:
        ax.axhline(bound / 1000, color=COLOURS["optimum"], linestyle=":", linewidth=1.5,
                   label="optimum (perfect-foresight LP): the physical limit")
    ax.set_ylabel("CO2, tonnes per year")
    ax.set_title("Grid CO2 per controller (evaluation period, scaled to a year)\nhatched: missed the EV target, "
                 "so not recommended", fontsize=10)
    ax.set_ylim(0, max(values) * 1.32 if values else 1)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper center", ncol=2, fontsize=8)
    met = [results[n].get("ev_departure_soc_met_pct") for n in names]
    ev_bars = ev_ax.bar(
        names, [m if m is not None else 0 for m in met], color=[COLOURS.get(n, "#333333") for n in names]
    )
    for bar, name, value in zip(ev_bars, names, met):
        unmet = results[name].get("ev_unmet_kwh")
        text = "no EVs" if value is None else f"{value:.0f}%" + (f"\n{_energy(unmet)} unmet" if unmet else "")
        ev_ax.annotate(text, (bar.get_x() + bar.get_width() / 2, max(bar.get_height(), 2)), ha="center",
                       va="bottom", fontsize=8)
    ev_ax.axhline(target_pct, color="#d62728", linestyle="--", linewidth=1)
    ev_ax.set_ylim(0, 135)
    ev_ax.set_ylabel("EV departures\nmet %")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _energy(kwh: float) -> str:
    return f"{kwh / 1000:,.1f} MWh" if kwh >= 1000 else f"{kwh:,.0f} kWh"


def plot_learning_curves(run: RunDir, agents: list[str], path: Path) -> None:
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for agent in agents:
        folder = run.agent(agent).root
        progress = progress_frame(folder)
        if {"time/total_timesteps", "rollout/ep_rew_mean"} <= set(progress.columns):
            rows = progress.dropna(subset=["rollout/ep_rew_mean"])
            top.plot(
                rows["time/total_timesteps"], rows["rollout/ep_rew_mean"], label=agent, color=COLOURS[agent], marker="."
            )
        curve_path = folder / "eval_curve.csv"
        if curve_path.is_file():
            curve = pd.read_csv(curve_path).sort_values("step")
            bottom.plot(curve["step"], curve["co2_kg_per_year"] / 1000, label=agent, color=COLOURS[agent], marker="o")
    top.set_ylabel("episode reward (mean)")
    top.set_title("Learning curves")
    bottom.set_ylabel("evaluation CO2, t/yr")
    bottom.set_xlabel("environment steps")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no points yet (the run was shorter than one episode or one curve interval)",
                    transform=ax.transAxes, ha="center", va="center", fontsize=8, color="#666666")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def representative_week(base: pd.DataFrame) -> slice:
    """The 7-day window whose baseline imports are the median of all whole weeks (or the whole period)."""
    hours = 7 * 24
    if len(base) <= hours:
        return slice(0, len(base))
    weeks = len(base) // hours
    imports = [np.clip(base["net_kwh"].iloc[w * hours:(w + 1) * hours], 0, None).sum() for w in range(weeks)]
    week = int(np.argsort(imports)[len(imports) // 2])
    return slice(week * hours, (week + 1) * hours)


def plot_week(
    run: RunDir, results: dict[str, dict[str, Any]], path: Path, target_pct: float = DEFAULT_TARGET_MET_PCT
) -> str | None:
    plt = _pyplot()
    best = best_agent(results, target_pct) or ("rbc" if "rbc" in results else None)
    base_path = run.agent("baseline").timeseries
    if not base_path.is_file():
        return None
    base = pd.read_csv(base_path)
    window = representative_week(base)
    series = {"baseline": base.iloc[window]}
    if best and run.agent(best).timeseries.is_file():
        series[best] = pd.read_csv(run.agent(best).timeseries).iloc[window]
    fig, axes = plt.subplots(4, 1, figsize=(9, 8), sharex=True)
    panels = [
        ("net_kwh", "grid import kW"),
        ("pv_kwh", "PV kW"),
        ("battery_soc", "battery SoC"),
        ("ev_charging_kwh", "EV charging kW"),
    ]
    for ax, (column, label) in zip(axes, panels):
        for name, frame in series.items():
            values = frame[column].clip(lower=0) if column == "net_kwh" else frame[column]
            ax.plot(frame["step"], values, label=name, color=COLOURS.get(name, "#333333"),
                    linestyle="--" if name == "baseline" else "-", linewidth=1.2)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[0].set_title(f"A representative week: baseline against {best or 'baseline'}")
    axes[-1].set_xlabel("hour of the evaluation period")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return best


def plot_timeline(schedule: dict[str, Any] | None, path: Path) -> None:
    import matplotlib.dates as mdates

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.5))
    stages = (schedule or {}).get("stages", [])
    for row, stage in enumerate(reversed(stages)):
        for offset, (start, end, colour) in enumerate((
                (stage.get("planned_start"), stage.get("planned_end"), "#c6dbef"),
                (stage.get("actual_start"), stage.get("actual_end"), _status_colour(stage["status"])))):
            if start and end:
                s, e = datetime.fromisoformat(start), datetime.fromisoformat(end)
                ax.barh(row + (0.2 if offset == 0 else -0.2), mdates.date2num(e) - mdates.date2num(s),
                        left=mdates.date2num(s), height=0.35, color=colour)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    labels = [f"{s['name']} ({'this report' if s['name'] == 'report' and s['status'] == 'running' else s['status']})"
              for s in reversed(stages)]
    ax.set_yticks(range(len(stages)), labels, fontsize=8)
    ax.xaxis_date()
    times = [datetime.fromisoformat(t) for s in stages for t in (s.get("planned_start"), s.get("actual_end")) if t]
    short_night = bool(times) and (max(times) - min(times)).total_seconds() < 1800
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if short_night else "%H:%M"))
    handles = [Patch(color="#c6dbef", label="planned"), Patch(color="#2171b5", label="actual (done)"),
               Patch(color="#d62728", label="failed")]
    if schedule and schedule.get("deadline"):
        ax.axvline(mdates.date2num(datetime.fromisoformat(schedule["deadline"])), color="#d62728", linestyle="--")
        handles.append(Line2D([], [], color="#d62728", linestyle="--", label="deadline"))
    ax.set_title("The night: planned and actual time of each stage")
    ax.legend(handles=handles, loc="lower left", fontsize=7, ncol=len(handles))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_monitor(records: list[dict[str, Any]], path: Path) -> None:
    """GPU utilisation and memory over the night, from the monitor's samples."""
    plt = _pyplot()
    samples = [r for r in records if r.get("kind") == "sample"]
    fig, (util_ax, mem_ax) = plt.subplots(2, 1, figsize=(9, 4.5), sharex=True)
    start = samples[0]["unix_time"] if samples else 0.0
    indices = sorted({g["index"] for r in samples for g in r["gpus"]})
    for index in indices:
        points = [((r["unix_time"] - start) / 3600, g) for r in samples for g in r["gpus"] if g["index"] == index]
        hours = [t for t, _ in points]
        util_ax.plot(hours, [g["utilization_gpu_pct"] for _, g in points], label=f"GPU {index}")
        mem_ax.plot(hours, [(g["memory_used_bytes"] or 0) / 2**30 if g["memory_used_bytes"] is not None else None
                            for _, g in points], label=f"GPU {index}")
    if not indices:
        util_ax.text(0.5, 0.5, "no GPU data: " + str(next((r["gpu_error"] for r in samples if r.get("gpu_error")), "")),
                     transform=util_ax.transAxes, ha="center", va="center", fontsize=8)
    util_ax.set_ylabel("utilisation %")
    mem_ax.set_ylabel("memory GiB")
    mem_ax.set_xlabel("hours since the monitor started")
    util_ax.set_title("GPU over the night")
    for ax in (util_ax, mem_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _status_colour(status: str) -> str:
    return {"done": "#2171b5", "failed": "#d62728", "skipped": "#969696", "running": "#fd8d3c"}.get(status, "#6baed6")


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _table(results: dict[str, dict[str, Any]]) -> list[str]:
    rbc = results.get("rbc", {}).get("co2_kg_per_year")
    lines = ["| agent | CO2 kg/yr | vs baseline | vs rbc | share of optimum | EV targets met | EV unmet kWh | "
             "CityLearn EV success | cost | peak kW | PV self-use | train steps | steps/s | train time |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, m in results.items():
        co2 = m.get("co2_kg_per_year")
        vs_rbc = 100 * (co2 - rbc) / rbc if co2 is not None and rbc else None
        wall = m.get("train_wall_s")
        lines.append(
            f"| {name} | {_fmt(co2, ',.0f')} | {_pct(m.get('co2_vs_baseline_pct'), '+.1f')} | {_pct(vs_rbc, '+.1f')} | "
            f"{_pct(m.get('co2_share_of_optimum_pct'), '.0f')} | {_pct(m.get('ev_departure_soc_met_pct'), '.1f')} | "
            f"{_fmt(m.get('ev_unmet_kwh'), ',.0f')} | {_pct(m.get('citylearn_ev_departure_success_pct'), '.1f')} | "
            f"{_fmt(m.get('cost'), ',.0f')} | {_fmt(m.get('peak_kw'), '.1f')} | "
            f"{_pct(m.get('pv_self_consumption_pct'), '.1f')} | "
            f"{_fmt(m.get('timesteps'), ',')} | {_fmt(m.get('steps_per_s'), '.0f')} | "
            f"{'–' if not wall else f'{wall / 60:.1f} min'} |"
        )
    return lines


def _pct(value, spec: str) -> str:
    return "–" if value is None else f"{format(value, spec)}%"


def _headline(results: dict[str, dict[str, Any]], target_pct: float) -> list[str]:
    """The morning answer: which controller to deploy, judged by CO2 and EV service together."""
    best = best_agent(results, target_pct)
    lines = []
    if best:
        m = results[best]
        share = m.get("co2_share_of_optimum_pct")
        lines.append(f"**Best agent: {best}**, {m['co2_kg_per_year']:,.0f} kg CO2/year "
                     f"({_fmt(m.get('co2_vs_baseline_pct'), '+.1f')}% against the uncontrolled baseline"
                     + (f", {share:.0f}% of the optimum's cut" if share is not None else "")
                     + f"), meeting {_fmt(m.get('ev_departure_soc_met_pct'), '.1f')}% of EV departures.")
    elif any(a in results for a in AGENTS):
        lines.append(f"**No agent is worth deploying from this run**: none both cut CO2 and met {target_pct:g}% of "
                     "EV departures (`ev.target_met_pct`).")
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
    "dispatch replayed through CityLearn, what perfect foresight really reaches). `EV targets met` counts departures "
    "within 1% SoC of their target; `CityLearn EV success` is CityLearn's own `evaluate_v2` rate, which allows 5% SoC, "
    "so it can read higher. `citylearn_kpis` in results.json are ratios to CityLearn's \"without storage\" reference, "
    "which also removes every charger's consumption (the site with every car stranded): compare controllers with the "
    "columns here, which are all against the uncontrolled baseline.",
]


def write_report(run: RunDir) -> Path:
    """Write report.md and every plot; returns the report's path."""
    results = read_json(run.results_json) if run.results_json.is_file() else {}
    schedule = read_json(run.schedule) if run.schedule.is_file() else None
    run.plots.mkdir(parents=True, exist_ok=True)
    agents = [a for a in AGENTS if run.agent(a).root.is_dir()]
    target_pct = target_met_pct(run)
    plot_co2(results, run.plots / "co2_by_agent.png", target_pct)
    plot_learning_curves(run, agents, run.plots / "learning_curves.png")
    best_shown = plot_week(run, results, run.plots / "representative_week.png", target_pct)
    plot_timeline(schedule, run.plots / "timeline.png")

    lines = [f"# Night report: {run.root.name}", "", *_headline(results, target_pct)]
    if schedule:
        failed = [s for s in schedule["stages"] if s["status"] == "failed"]
        skipped = [s for s in schedule["stages"] if s["status"] == "skipped"]
        deadline = f", deadline {schedule['deadline']}" if schedule.get("deadline") else ""
        lines += ["", f"Started {schedule['created_at']}{deadline}."]
        for stage in failed:
            lines.append(f"- **{stage['name']} failed**: {stage['error']}")
        for stage in skipped:
            lines.append(f"- {stage['name']} skipped: {stage['error']}")
    lines += ["", "## Results", "", *_table(results), "", *NOTES, ""]
    lines += [
        "![CO2 per agent](plots/co2_by_agent.png)",
        "",
        "## Learning",
        "",
        "![Learning curves](plots/learning_curves.png)",
        "",
        "## A representative week",
        "",
        "Grid import, PV, battery state of charge and EV charging: baseline (dashed) against "
        f"{best_shown or 'the baseline'}.",
        "",
        "![Representative week](plots/representative_week.png)",
        "",
        "## The night",
        "",
    ]
    if schedule:
        lines += ["| stage | status | planned | actual | steps |", "| --- | --- | --- | --- | ---: |"]
        for s in schedule["stages"]:
            lines.append(f"| {s['name']} | {s['status']} | {_hm(s['planned_start'])}–{_hm(s['planned_end'])} | "
                         f"{_hm(s['actual_start'])}–{_hm(s['actual_end'])} | {s['timesteps_done'] or '–'} |")
        lines.append("")
    lines += ["![Timeline](plots/timeline.png)", ""]
    if run.monitor.is_file():
        records = read_records(run.monitor)
        plot_monitor(records, run.plots / "gpu.png")
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
    lines += ["Metric definitions: `trainer/metrics.py`; the run's config: `config.yaml`.", ""]
    write_text_atomic(run.report, "\n".join(lines))
    return run.report


def _hm(text: str | None) -> str:
    return datetime.fromisoformat(text).strftime("%H:%M:%S") if text else "–"
