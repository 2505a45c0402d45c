"""tune/report.md, best.yaml and history.png: what a tune found, ranked by the re-run on fresh seeds."""

from __future__ import annotations

from typing import Any

import optuna
import yaml

from trainer.base.files import read_json, write_text_atomic
from trainer.config.sections import Config
from trainer.tune import space as spaces
from trainer.tune.study import DEFAULTS_ATTR, TuneFolder, TunePlan, ranked, stored_settings


def write_report(folder: TuneFolder, cfg: Config, plan: TunePlan, study: Any) -> Any:
    """Write best.yaml (the re-run's winner: the defaults where they won), history.png and report.md."""
    reruns = read_json(folder.reruns) if folder.reruns.is_file() else {}
    rows = ranked(reruns)
    trials = study.get_trials(deepcopy=False)
    counts = {state.name.lower(): sum(t.state is state for t in trials) for state in optuna.trial.TrialState}
    winner = rows[0] if rows else None
    # Every setting re-run with the same figures: each deployed the same policy, and nothing was found to beat the
    # defaults, whatever the sort's order (the answer is then the defaults').
    tied = len(rows) > 1 and all((r["share"], r["co2"]) == (rows[0]["share"], rows[0]["co2"]) for r in rows)
    if tied:
        winner = {**rows[0], "name": "defaults", "settings": spaces.defaults(cfg.to_dict(), plan.params)}
    if winner is not None:
        header = (f"# trainer tune {plan.agent}: the settings that did best on fresh seeds over the part held out "
                  f"({winner['name']}).\n# Use: trainer night --config {folder.best}\n")
        write_text_atomic(folder.best, header + yaml.safe_dump(spaces.nested(winner["settings"]), sort_keys=True))
    _plot_history(study, folder)
    lines = [f"# Tune report: {plan.agent}", ""]
    defaults = next((r for r in rows if r["name"] == "defaults"), None)
    if winner is None:
        lines += ["No re-run finished: the budget ended in the search. Resume it with a budget for the re-runs: "
                  f"`trainer tune {plan.agent} --resume {folder.root} --budget 30m`.", ""]
    elif tied:
        lines += ["**No difference**: every setting re-run gave the same figures on fresh seeds (each deployed the "
                  "same policy: see the steps below; step 0 is the warm start, which training within "
                  f"tune.trial_timesteps never beat on the validation window). `{folder.best.name}` holds the "
                  "defaults' values; a longer `tune.trial_timesteps` lets the settings matter.", ""]
    elif winner["name"] == "defaults" and len(rows) == 1:
        lines += ["**Only the defaults were re-run**: no other trial completed before the search's share of the "
                  f"budget ran out. `{folder.best.name}` holds the defaults' values; give the search more time: "
                  f"`trainer tune {plan.agent} --resume {folder.root} --budget 1h`.", ""]
    elif winner["name"] == "defaults":
        lines += [f"**The defaults held**: no setting the search found beat them on fresh seeds over the part held "
                  f"out. `{folder.best.name}` holds the defaults' values.", ""]
    else:
        gain = "" if defaults is None or defaults["share"] is None or winner["share"] is None else \
            f" ({100 * (winner['share'] - defaults['share']):+.1f} points of the optimum's cut against the defaults)"
        lines += [f"**Best: {winner['name']}**{gain}. Use it: `trainer night --config {folder.best}`.", ""]
    lines += [f"Searched {len(trials)} trials ({counts.get('complete', 0)} complete, {counts.get('pruned', 0)} "
              f"pruned, {counts.get('fail', 0)} failed), each under seeds {', '.join(map(str, plan.seeds))}, scored "
              "on the validation window (the last days of the part learnt from; a built-in site: another draw of its "
              "year): never on the part the re-runs are judged on.", "",
              "## Re-run on fresh seeds, judged on the part held out", "",
              f"Seeds {', '.join(map(str, plan.rerun_seeds))}; the first {cfg.tune.rerun_eval_days} days of the part "
              "held out; mean ± standard deviation over the seeds.", "",
              "| settings | seeds | of optimum's cut % | CO2 kg/yr | EV met % (worst) | deployed step |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        share = "–" if row["share"] is None else f"{100 * row['share']:.1f} ± {100 * row['share_sd']:.1f}"
        co2 = "–" if row["co2"] is None else f"{row['co2']:,.0f} ± {row['co2_sd']:,.0f}"
        met = "–" if row["ev_met"] is None else f"{row['ev_met']:.1f}"
        steps = ", ".join(f"{step:,}" for step in row["steps"])
        lines.append(f"| {row['name']} | {row['seeds']} | {share} | {co2} | {met} | {steps} |")
    lines += ["", "## Settings", "", "| key | " + " | ".join(r["name"] for r in rows) + " |",
              "| --- |" + " ---: |" * len(rows)]
    for param in plan.params:
        lines.append(f"| `{param.key}` | " + " | ".join(_value(r["settings"].get(param.key)) for r in rows) + " |")
    lines += ["", "## The search", "", "![history](history.png)", ""]
    importance = _importances(study)
    if importance:
        lines += ["Importance of each parameter to the validation score (Optuna's fANOVA over the complete trials):",
                  "", "| key | importance |", "| --- | ---: |"]
        lines += [f"| `{key}` | {value:.2f} |" for key, value in importance.items()]
        lines.append("")
    best_trials = sorted((t for t in trials if t.state is optuna.trial.TrialState.COMPLETE), key=lambda t: t.value)
    if best_trials:
        lines += ["| trial | score (validation CO2 kg/yr, mean over seeds) | settings |", "| ---: | ---: | --- |"]
        for trial in best_trials[:10]:
            label = " (defaults)" if trial.user_attrs.get(DEFAULTS_ATTR) else ""
            settings = stored_settings(trial, plan.params)
            shown = ", ".join(f"{k.split('.', 1)[1]}={_value(v)}" for k, v in settings.items())
            lines.append(f"| {trial.number}{label} | {trial.value:,.1f} | {shown} |")
        lines.append("")
    write_text_atomic(folder.report, "\n".join(lines))
    return folder.report


def _importances(study: Any) -> dict[str, float]:
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 3:  # fewer says nothing (Optuna then gives every parameter the same share)
        return {}
    try:
        return optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError, ZeroDivisionError):  # too few complete trials, or none that vary
        return {}


def _plot_history(study: Any, folder: TuneFolder) -> None:
    import matplotlib  # lazy: seconds to import, for the plot alone

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state is optuna.trial.TrialState.COMPLETE]
    pruned = [t for t in trials if t.state is optuna.trial.TrialState.PRUNED and t.intermediate_values]
    fig, ax = plt.subplots(figsize=(8, 4))
    if complete:
        ax.plot([t.number for t in complete], [t.value for t in complete], "o", color="tab:blue", label="complete")
        best, line = float("inf"), []
        for t in complete:
            best = min(best, t.value)
            line.append(best)
        ax.step([t.number for t in complete], line, where="post", color="black", label="best so far")
    if pruned:
        ax.plot([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned], "x",
                color="tab:red", label="pruned (its last report)")
    ax.set_xlabel("trial")
    ax.set_ylabel("validation CO2, kg/yr (smaller is better)")
    ax.set_title("The search: each trial's score on the validation window")
    if complete or pruned:
        ax.legend()
    fig.tight_layout()
    fig.savefig(folder.history, dpi=110)
    plt.close(fig)


def _value(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if isinstance(value, float) else str(value)
