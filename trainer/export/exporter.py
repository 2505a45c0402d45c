"""``trainer export``: a run's deployed policy as a folder that acts without this product, and the proof.

The folder holds ``policy.onnx`` (the deterministic action), ``spec.json`` (trainer.export.spec),
``controller.py`` (trainer/shipped/controller.py, unchanged), ``check.csv`` (a sample of the
evaluation's raw observations with the product's actions) and a README. Before it is put in place the
evaluation is replayed through CityLearn with the *exported* controller acting, and the product's own
policy and guard are asked the same step: the actions must agree within ``CHECK_TOLERANCE`` at every
step and CO2, EV service and cost must be the night's. Nothing in the folder is a pickle.

Where the run's day-ahead planner is the controller to deploy (it cuts more than every agent, as on the official
EV buildings), the folder holds the planner instead of a network: ``program.py`` (trainer/shipped/program.py, the
site's linear program the product's planner solves) beside ``controller.py``, the forecast it had learnt by the
period it is proven on, and ``check.csv`` with every hour of that period (the planner learns its forecast hour by
hour, so a sample hours apart could not be replayed). The proof is the same.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from trainer.base import logs
from trainer.base.errors import TrainerError, UsageError
from trainer.base.files import write_json_atomic, write_text_atomic
from trainer.config.roster import agent_spec
from trainer.config.sections import Config
from trainer.env.citylearn import (
    CentralAgentArrays,
    learnt_normalisation,
    make_citylearn_env,
    make_sb3_env,
    site_forecast,
)
from trainer.env.ev_guard import EvServiceGuard
from trainer.export import onnx_policy, spec
from trainer.judge.metrics import evaluation_window, recommended_controller, run_episode
from trainer.learn.model_file import load_model
from trainer.references.planner import FORECAST_OF_DRAWS, PLANNER_VERSION, ProfileForecast, planner_exports
from trainer.references.roster import REFERENCE_ROSTER, ReferenceUnavailable
from trainer.run.folder import RunContext, RunDir
from trainer.shipped import controller as standalone_controller
from trainer.shipped import program as shipped_program
from trainer.shipped.controller import (
    CHECK_FILE,
    CHECK_TOLERANCE,
    EXPECTED_PREFIX,
    PLANNER,
    PROGRAM_FILE,
    SPEC_FILE,
    Controller,
)

POLICY_FILE = "policy.onnx"
# What an export writes (and Python leaves beside controller.py once run): all that replacing it may delete.
EXPORT_FILES = frozenset({POLICY_FILE, SPEC_FILE, CHECK_FILE, PROGRAM_FILE, "controller.py", "README.md",
                          "__pycache__"})
SAMPLE_ROWS = 1000  # check.csv: evenly spaced steps of the evaluation (the policy and the guard are per step)
# The exported controller's year against the night's evaluation of the same agent: the same actions within
# CHECK_TOLERANCE give the same figures to this relative tolerance.
FIGURE_TOLERANCE = 1e-4
COMPARED = ("co2_kg", "ev_departure_soc_met_pct", "cost", "grid_import_kwh")


@dataclass
class _Replay:
    """What the replay saw: each step's raw observations and the product's actions, and the largest difference."""

    raw: list[np.ndarray] = field(default_factory=list)
    product: list[np.ndarray] = field(default_factory=list)
    worst: float = 0.0
    worst_step: int = -1
    forecast_worst: float = 0.0  # |the controller's forecast - the product's|, where the policy reads one
    seconds: list[float] = field(default_factory=list)


class _ExportedActing:
    """A controller for ``run_episode``: the exported folder acts; the product's policy and guard are asked too."""

    def __init__(self, exported: Controller, model: Any, arrays: CentralAgentArrays, guard: EvServiceGuard | None):
        self.exported, self.model, self.arrays, self.guard = exported, model, arrays, guard
        self.replay = _Replay()

    def act(self, obs: np.ndarray, env: Any) -> np.ndarray:
        started = time.perf_counter()
        native, raw = self._exported(self.arrays.raw)
        self.replay.seconds.append(time.perf_counter() - started)
        product = self._product(obs, env)
        if self.guard is not None:
            product = self.guard.apply(env, product)
        diff = float(np.max(np.abs(native - product)))
        if diff > self.replay.worst:
            self.replay.worst, self.replay.worst_step = diff, len(self.replay.raw)
        self.replay.raw.append(raw)
        self.replay.product.append(product)
        return self.arrays.scale.to_agent(native)

    def _exported(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exported controller's actions for the step's raw observations, and the raw row check.csv keeps."""
        # The controller forecasts the hours ahead itself from the site's readings (where the policy reads them).
        own = self.exported.with_forecast(raw[:len(self.exported.site_names)])
        native, _ = self.exported.native(own)
        if len(own) > len(self.exported.site_names):
            self.replay.forecast_worst = max(self.replay.forecast_worst, float(np.max(np.abs(own - raw))))
        return native, raw

    def _product(self, obs: np.ndarray, env: Any) -> np.ndarray:
        """The product's own action for the step (before its guard), in CityLearn's units."""
        action, _ = self.model.predict(obs, deterministic=True)
        return self.arrays.scale.to_native(action)


class _ExportedPlanning(_ExportedActing):
    """The exported planner acts; the product's planner and guard are asked the same step."""

    def __init__(self, exported: Controller, planner: Any, arrays: CentralAgentArrays, guard: EvServiceGuard | None,
                 steps: int):
        super().__init__(exported, None, arrays, guard)
        self.planner, self.steps = planner, steps

    def _exported(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raw = raw[:len(self.exported.site_names)]  # the site's readings: the planner's forecast is its own
        return self.exported.native(raw, self.steps - len(self.replay.raw))[0], raw

    def _product(self, obs: np.ndarray, env: Any) -> np.ndarray:
        return self.arrays.scale.to_native(self.planner.act(obs, env))


@dataclass
class ExportRequest:
    """What an export was asked for, checked before the run folder is touched: the agent (or the planner), its
    model (None for the planner), the folder."""

    agent: str
    model: Any
    out: Path


def request(run: RunDir, cfg: Config, agent: str | None, out: str | Path | None) -> ExportRequest:
    """Every check of an export that needs no evaluation: the controller (given, or the one the report
    recommends), its model loaded, and ``out`` (default RUN_DIR/export/<name>) free or an earlier export's."""
    run.results()  # the night's figures the proof compares with: a damaged file is named before anything is written
    name = choose_agent(run, cfg, agent)
    target = Path(out) if out else run.export / name
    model = None if name == PLANNER else load_model(cfg, name, run.agent(name).model,
                                                    fix=f"train it again: trainer train {name} --resume {run.root}")
    _refuse_to_replace(target)
    return ExportRequest(name, model, target)


def choose_agent(run: RunDir, cfg: Config, agent: str | None) -> str:
    if agent == PLANNER:
        planned = run.results().get(PLANNER, {})
        if planned.get("co2_kg_per_year") is None:
            why = planned.get("skipped") or "the run did not evaluate it"
            raise UsageError(f"{run.root} has no planner to export ({why}): evaluate it first "
                             f"(trainer evaluate {run.root})")
        if planned.get("forecast") == FORECAST_OF_DRAWS:
            raise UsageError("the built-in site's planner forecasts from other years of the site's climate, which a "
                             "site does not have: export an agent (--agent NAME), or the planner of a night on your "
                             "own dataset")
        if planned.get("forecast") is None:
            raise UsageError(f"{run.root}'s planner was evaluated by an earlier version, which did not record what "
                             f"its forecast learns from: evaluate it again (trainer evaluate {run.root})")
        if not planner_exports(planned):
            raise UsageError(f"{run.root}'s planner was evaluated by an earlier version of it (version "
                             f"{planned.get('version', 1)}, this one's {PLANNER_VERSION} decides otherwise): evaluate "
                             f"it again (trainer evaluate {run.root})")
        return agent
    if agent is not None:
        agent_spec(agent)  # an unknown name is refused with the roster's list
        if not run.agent(agent).model.is_file():
            raise UsageError(f"{run.root} has no trained {agent}: no {run.agent(agent).model} "
                             f"(train it first: trainer train {agent} --resume {run.root})")
        return agent
    best = recommended_controller(run.results(), cfg.ev.target_met_pct)
    if best is None:
        raise UsageError(f"{run.root}: no trained agent meets the EV target, so none is recommended; "
                         "pass --agent NAME to export one anyway")
    return best


def export_run(ctx: RunContext, asked: ExportRequest) -> dict[str, Any]:
    """Export the asked agent of the run into its folder (replaced whole, only once the proof holds); returns its
    spec."""
    agent, model, out = asked.agent, asked.model, asked.out
    log = logs.get().bind(agent=agent)
    _refuse_to_replace(out)  # again, under the run's lock: the folder may have changed since the request
    staging = out.with_name(f".{out.name}.partial")  # beside it: the rename into place cannot cross disks
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
    except OSError as exc:
        raise UsageError(f"cannot write the export to {out}: {exc.strerror} (choose another --out)") from None
    try:
        document, replay = _build(ctx, agent, model, staging, log)
        if out.exists():
            shutil.rmtree(out)
        staging.replace(out)
    finally:  # a failure anywhere leaves no half-written export, and an earlier one where it was
        shutil.rmtree(staging, ignore_errors=True)
    log.info("exported", out=str(out), max_action_difference=replay.worst)
    return document


def _build(ctx: RunContext, agent: str, model: Any, staging: Path, log: Any) -> tuple[dict[str, Any], _Replay]:
    """Write the export into ``staging`` and prove it on the evaluation; raises where the proof fails."""
    if agent == PLANNER:
        return _build_planner(ctx, staging, log)
    cfg = ctx.cfg
    # The proof replays what results.json's figures are of: the part held out where the run has one, read with the
    # normalisation the policy learnt (the export's), so the export is proven on data it never saw.
    judged = ctx.site.held_out.site if ctx.site.held_out is not None else ctx.site
    learnt = learnt_normalisation(cfg, ctx.site)
    env = make_citylearn_env(cfg, judged, "eval", ctx.seed, eval_days=cfg.schedule.eval_days)
    try:
        forecast = site_forecast(cfg, judged)
        arrays = CentralAgentArrays(env, None, cfg.observations, learnt, judged, forecast)
        arrays.reset()
        plan = arrays.plan
        assert plan is not None  # reset made it
        log.info("exporting the policy as ONNX")
        onnx_policy.write_onnx(model.policy, len(plan.features), staging / POLICY_FILE)
        results = ctx.run.results()
        document = spec.spec(
            env, plan, currency=cfg.scenario.currency, ev=cfg.ev,
            policy=_policy_entry(agent, model, staging / POLICY_FILE, len(plan.features)),
            site=_site_entry(ctx, env), metrics=_metrics_entry(ctx, results, agent), run=_run_entry(ctx, agent),
            forecast_table=forecast)
        write_json_atomic(staging / SPEC_FILE, document)
        shutil.copyfile(standalone_controller.__file__, staging / "controller.py")
        log.info("replaying the evaluation with the exported controller", hours=env.time_steps - 1)
        acting = _ExportedActing(Controller.load(staging), model, arrays,
                                 EvServiceGuard.of(cfg.ev))
        figures = run_episode(acting, arrays, label=f"{agent} export")
    finally:
        env.close()
    document["verification"] = _verify(acting.replay, figures, results.get(agent, {}))
    _write_sample(staging / CHECK_FILE, plan.names, [a["name"] for a in document["actions"]], acting.replay)
    write_json_atomic(staging / SPEC_FILE, document)
    write_text_atomic(staging / "README.md", _readme(document))
    return document, acting.replay


def _build_planner(ctx: RunContext, staging: Path, log: Any) -> tuple[dict[str, Any], _Replay]:
    """The planner's export (the module's doc) into ``staging``, proven as an agent's is."""
    cfg = ctx.cfg
    held = ctx.site.held_out
    judged = held.site if held is not None else ctx.site

    def open_env() -> Any:  # as the night evaluated the planner (trainer.night.stages)
        return make_sb3_env(cfg, judged, "eval", ctx.seed, eval_days=cfg.schedule.eval_days)

    def history() -> Any:  # the part the run learnt from, which the planner's forecast learns first
        return make_sb3_env(cfg, ctx.site, "eval", ctx.seed)

    try:
        planner, _ = REFERENCE_ROSTER[PLANNER].prepare(cfg, open_env, history if held is not None else None)
    except ReferenceUnavailable as exc:
        raise UsageError(f"the planner cannot run on this dataset ({exc}): export an agent (--agent NAME)") from None
    if not isinstance(planner.forecast, ProfileForecast):  # planner_exports said yes: a dataset's forecast
        raise TrainerError("the planner's forecast is not one a site can learn: export an agent (--agent NAME)")
    start = planner.forecast.state()  # what it learnt of the part before, as the exported controller starts
    learnt = learnt_normalisation(cfg, ctx.site)
    env = make_citylearn_env(cfg, judged, "eval", ctx.seed, eval_days=cfg.schedule.eval_days)
    try:
        arrays = CentralAgentArrays(env, None, cfg.observations, learnt, judged, site_forecast(cfg, judged))
        arrays.reset()
        plan = arrays.plan
        assert plan is not None  # reset made it
        steps = env.time_steps - 1
        results = ctx.run.results()
        document = spec.spec(
            env, plan, currency=cfg.scenario.currency, ev=cfg.ev,
            policy={"kind": PLANNER, "agent": PLANNER, "algorithm": "day-ahead linear program (HiGHS)",
                    "file": PROGRAM_FILE, "sha256": hashlib.sha256(Path(shipped_program.__file__).read_bytes())
                    .hexdigest(),
                    "action": "the first hour of the plan of least CO2 over the next day, in CityLearn's units"},
            site=_site_entry(ctx, env), metrics=_metrics_entry(ctx, results, PLANNER), run=_run_entry(ctx, PLANNER))
        document.pop("features")  # a network's inputs: the planner reads the observations as they are
        site_names = [o["name"] for o in document["observations"]]
        document["planner"] = spec.planner(env, site_names, planner.model.batteries, document["ev_guard"]["chargers"],
                                           start, steps, planner.stays)
        write_json_atomic(staging / SPEC_FILE, document)
        shutil.copyfile(standalone_controller.__file__, staging / "controller.py")
        shutil.copyfile(shipped_program.__file__, staging / PROGRAM_FILE)
        log.info("replaying the evaluation with the exported planner", hours=steps)
        acting = _ExportedPlanning(Controller.load(staging), planner, arrays, EvServiceGuard.of(cfg.ev), steps)
        figures = run_episode(acting, arrays, label="planner export")
    finally:
        env.close()
    document["verification"] = _verify(acting.replay, figures, results.get(PLANNER, {}))
    document["verification"]["idle_steps"] = acting.exported.idle_steps
    _write_sample(staging / CHECK_FILE, site_names, [a["name"] for a in document["actions"]], acting.replay,
                  every=True)
    write_json_atomic(staging / SPEC_FILE, document)
    write_text_atomic(staging / "README.md", _readme(document))
    return document, acting.replay


def _refuse_to_replace(out: Path) -> None:
    """An existing --out is replaced only when it is an export: never a folder of the user's."""
    if not out.exists():
        return
    if out.is_dir() and not any(out.iterdir()):
        return
    try:
        previous = json.loads((out / SPEC_FILE).read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        previous = None
    if previous != standalone_controller.FORMAT:
        raise UsageError(f"{out} exists and is not an export: choose another --out, or empty it")
    # The earlier export is replaced whole: a file of the user's beside it would go with it.
    theirs = sorted(p.name for p in out.iterdir() if p.name not in EXPORT_FILES)
    if theirs:
        raise UsageError(f"{out} holds an earlier export and files it did not write ({', '.join(theirs[:5])}"
                         f"{', ...' if len(theirs) > 5 else ''}), which replacing it would delete: move them out, "
                         "or choose another --out")


def _verify(replay: _Replay, figures: dict[str, Any], night: dict[str, Any]) -> dict[str, Any]:
    """The proof: every step's actions, and the year's figures against the night's own evaluation."""
    step_ms = 1000 * np.asarray(replay.seconds)
    out: dict[str, Any] = {
        "steps": len(replay.raw), "max_action_difference": replay.worst, "tolerance": CHECK_TOLERANCE,
        "max_forecast_difference": replay.forecast_worst,
        "step_ms_median": round(float(np.median(step_ms)), 4),
        "step_ms_p99": round(float(np.percentile(step_ms, 99)), 4),
        "figures": {k: {"exported": figures.get(k), "night": night.get(k)} for k in COMPARED},
    }
    if replay.worst > CHECK_TOLERANCE:
        raise TrainerError(f"the exported controller's actions differ from the product's by {replay.worst:.2e} at "
                           f"step {replay.worst_step} of the evaluation (tolerance {CHECK_TOLERANCE:g}); nothing was "
                           "exported: report this with the run folder")
    for key in COMPARED:
        exported, expected = figures.get(key), night.get(key)
        if exported is None or expected is None:
            continue
        if abs(exported - expected) > FIGURE_TOLERANCE * max(abs(expected), 1.0):
            raise TrainerError(f"the exported controller's {key} over the evaluation is {exported:,.2f}, the night's "
                               f"{expected:,.2f}; nothing was exported: re-evaluate the run (trainer evaluate RUN_DIR) "
                               "if it was trained with another version, else report this with the run folder")
    return out


def _write_sample(path: Path, names: list[str], actions: list[str], replay: _Replay, every: bool = False) -> None:
    """check.csv: :data:`SAMPLE_ROWS` steps evenly spaced, or ``every`` step (a planner's)."""
    count = len(replay.raw) if every else min(SAMPLE_ROWS, len(replay.raw))
    rows = np.unique(np.linspace(0, len(replay.raw) - 1, count).astype(int))
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*names, *(EXPECTED_PREFIX + a for a in actions)])
        for i in rows:  # repr of a float reads back to the same float
            writer.writerow([repr(float(v)) for v in (*replay.raw[i], *replay.product[i])])


def _policy_entry(agent: str, model: Any, path: Path, features: int) -> dict[str, Any]:
    return {
        "file": POLICY_FILE, "input": onnx_policy.INPUT, "output": onnx_policy.OUTPUT,
        "input_shape": ["batch", features], "output_shape": ["batch", int(np.prod(model.action_space.shape))],
        "agent": agent, "algorithm": type(model).__name__,
        "action": "deterministic, in [-1, 1]: the controller clips it and maps it to each action's range",
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def _site_entry(ctx: RunContext, env: Any) -> dict[str, Any]:
    return {
        "schema": str(ctx.site.schema), "built_in": ctx.site.schema.parent == ctx.run.site,
        "buildings": [b.name for b in env.buildings], "hours_per_step": env.seconds_per_time_step / 3600,
        "battery_kwh": [float(b.electrical_storage.capacity) for b in env.buildings],
        "battery_kw": [float(b.electrical_storage.nominal_power) for b in env.buildings],
        "chargers": [c.charger_id for b in env.buildings for c in b.electric_vehicle_chargers or []],
    }


def _metrics_entry(ctx: RunContext, results: dict[str, dict[str, Any]], agent: str) -> dict[str, Any]:
    keys = ("co2_kg_per_year", "co2_vs_baseline_pct", "co2_share_of_optimum_pct", "ev_departure_soc_met_pct",
            "cost", "grid_import_kwh", "peak_kw", "eval_hours", "timesteps")
    metrics = results.get(agent, {})
    held = ctx.site.held_out
    return {"evaluated": evaluation_window(results) or "the whole period",
            "judged_on": held.what if held is not None else "the period it learnt from (in-sample: nothing was "
                                                            "held out)",
            **{k: metrics.get(k) for k in keys}, "kept": metrics.get("kept"),
            "in_sample": metrics.get("in_sample")}


def _run_entry(ctx: RunContext, agent: str) -> dict[str, Any]:
    model = None if agent == PLANNER else str(ctx.run.agent(agent).model.relative_to(ctx.run.root))
    return {"folder": str(ctx.run.root.resolve()), "agent": agent, "seed": ctx.seed, "model": model,
            "exported_at": datetime.now(UTC).isoformat(timespec="seconds")}


def _readme(document: dict[str, Any]) -> str:
    metrics, proof = document["metrics"], document["verification"]
    share = metrics.get("co2_share_of_optimum_pct")
    return "\n".join([
        f"# {document['policy']['agent']} controller, exported {document['run']['exported_at']}",
        "",
        f"From {document['run']['folder']} (seed {document['run']['seed']}). In the night's evaluation, on "
        f"{metrics['judged_on']} ({metrics['evaluated']}): {_num(metrics.get('co2_kg_per_year'), ',.0f')} kg CO2 a "
        "year, "
        f"{_num(share, '.0f')} % of the optimum's cut, {_num(metrics.get('ev_departure_soc_met_pct'), '.1f')} % of EV "
        "departures met.",
        "",
        ("Needs Python 3 with numpy and scipy only (the planner solves program.py's linear program each hour):"
         if document["policy"].get("kind") == PLANNER else "Needs Python 3 with numpy and onnxruntime only:"),
        "",
        "```bash",
        "python controller.py check              # the evaluation's sample, replayed: exit 0 when it acts as trained",
        "python controller.py example > step.json   # one step of raw observations: a template for live data",
        "python controller.py act --obs step.json   # the actions in kW, with the EV guard applied",
        *(["python controller.py act --obs step.json --state forecast.json   # each hour: it keeps learning its "
           "forecast"] if "forecast" in document or "planner" in document else []),
        "```",
        "",
        f"Replayed through CityLearn before it was written: {proof['steps']:,} steps, largest difference from the "
        f"product's actions {proof['max_action_difference']:.1e}; {proof['step_ms_median']:.3f} ms a step (median).",
        "spec.json names every observation, its unit and the range accepted, and every action. "
        "See docs/export.md in pvbess-trainer for wiring it to live data.",
        "",
    ])


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)
