"""Never deploy a regression: each agent deploys the best policy its stage has seen, judged on a held-out window.

Reinforcement learning from a good warm start can make a policy worse (docs/agent-quality.md), and
the last policy of a stage is not the best one. So the learning curve's evaluations are also a
validation: the warm start (step 0) and each curve point are scored on a window the agents never
train on and the report never judges them by, and the best so far is kept in ``<agent>/best/``.
At the end the stage deploys that one.

- **The window**: on the built-in site, another draw of the same climate (``scenario.seed`` +
  VALIDATION_SEED_OFFSET, built once per run in ``<run>/validation-site/``): a year the agents never
  trained on. On any other dataset there is no other year: the first ``schedule.curve_eval_days``
  of the dataset itself, which the final evaluation also covers (the report says so).
- **The criterion** is the product's own: the EV departures target first
  (``ev.target_met_pct``), then CO2. Ties keep the earlier policy.
- **Resume** keeps the selection: ``best.json`` and its model are written atomically, and a
  resumed stage starts from them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import logs
from trainer.config import ScenarioConfig
from trainer.files import DamagedFile, write_json_atomic
from trainer.metrics import run_episode
from trainer.references import REFERENCE_ROSTER

if TYPE_CHECKING:
    from trainer.run_dir import AgentDir
    from trainer.session import RunContext

VALIDATION_SEED_OFFSET = 1000


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
    """The best policy a stage has seen, in ``<agent>/best/`` (``model.zip`` and ``best.json``)."""

    def __init__(self, agent: AgentDir, target_pct: float) -> None:
        self.folder, self.model_path, self.state_path = agent.best, agent.best_model, agent.best_state
        self.target_pct = target_pct
        self.best: Candidate | None = self._read()
        self.last: Candidate | None = None
        self.evaluated = 0

    def _read(self) -> Candidate | None:
        if not (self.state_path.is_file() and self.model_path.is_file()):
            return None
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
            return Candidate(int(data["step"]), float(data["co2_kg_per_year"]),
                             None if data.get("ev_departure_soc_met_pct") is None
                             else float(data["ev_departure_soc_met_pct"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logs.get().warning("the best policy so far is unreadable: the selection starts again",
                               path=str(self.state_path), error=f"{type(exc).__name__}: {exc}")
            return None

    def offer(self, model: Any, candidate: Candidate) -> bool:
        """Keep ``model`` if it beats the best so far; True if it was kept."""
        self.evaluated += 1
        self.last = candidate
        if self.best is not None and candidate.key(self.target_pct) >= self.best.key(self.target_pct):
            return False
        from trainer.learn.agents import save_model_atomic  # lazy: SB3 and torch

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            save_model_atomic(model, self.model_path)
            write_json_atomic(self.state_path, asdict(candidate))
        except OSError as exc:  # a full disk costs the selection a candidate, not the stage
            logs.get().warning("best policy not saved", path=str(self.folder), error=exc.strerror,
                               hint="free disk space; training goes on")
            return False
        self.best = candidate
        return True


def validation_schema(ctx: RunContext) -> tuple[Path, bool]:
    """(the schema validation runs on, whether it is held out from the final evaluation)."""
    data = json.loads(ctx.schema.read_text(encoding="utf-8"))
    if "pvbess_site" not in data:
        return ctx.schema, False
    from trainer.scenario import build_site  # the built-in site: another draw of the same climate

    folder = ctx.run.validation_site
    schema = folder / "schema.json"
    if not schema.is_file():
        # Built aside and renamed into place: stages side by side on Ray may both get here first.
        # The site's own scenario, which a built-in site passed by --schema need not share with the run's config
        # (one an older version wrote, with keys since retired, falls back to the run's).
        try:
            site = ScenarioConfig.model_validate(data["pvbess_site"])
        except ValueError:
            site = ctx.cfg.scenario
        scenario = site.model_copy(update={"seed": site.seed + VALIDATION_SEED_OFFSET})
        ctx.run.root.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(prefix=".validation-site-", dir=ctx.run.root))
        build_site(scenario, aside)
        try:
            aside.rename(folder)
        except OSError:  # another stage's is already there: use it
            shutil.rmtree(aside, ignore_errors=True)
        if not schema.is_file():
            raise DamagedFile(f"{folder} holds no schema.json (a damaged validation site): delete the folder and "
                              "run again; it is built anew")
    return schema, True


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
