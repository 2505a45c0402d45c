"""The run-folder layout, defined once. Every writer takes its paths from here.

    outputs/<run>/
        config.yaml        resolved config          command.txt   exact command line
        versions.json      Python, packages, device, the product's version, source digest and git commit
        site/              the generated dataset (built-in site)
        run.json           its dataset (trainer.run.session.RunRecord)
        logs/trainer.jsonl structlog JSON lines      results.json  results.csv
        <agent>/           model.zip, metrics.json, progress.csv, eval_timeseries.csv, checkpoints/
"""

from __future__ import annotations

import platform
import re
import shlex
import sys
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from trainer.base.errors import UsageError
from trainer.base.files import DamagedFile, read_typed, refuse_links_out, write_json_atomic, write_text_atomic
from trainer.base.source import source_record
from trainer.config.sections import Config
from trainer.site import Site

PACKAGES = ("pvbess-trainer", "citylearn", "stable-baselines3", "torch", "gymnasium", "numpy", "pvlib", "pydantic")


@dataclass(frozen=True)
class AgentDir:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model.zip"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def progress(self) -> Path:
        return self.root / "progress.csv"

    @property
    def timeseries(self) -> Path:
        return self.root / "eval_timeseries.csv"

    @property
    def curve(self) -> Path:
        """The learning curve: each evaluation on the validation window (trainer.learn.callbacks)."""
        return self.root / "eval_curve.csv"

    @property
    def attempts(self) -> Path:
        """On Ray: each attempt at the stage (node, pid, start), one JSON line each."""
        return self.root / "attempts.jsonl"

    def previous_progress(self, step: int, n: int = 1) -> Path:
        """progress.csv as it was before a resume from ``step`` (the ``n``-th such resume)."""
        return self.root / (f"progress.before-{step:010d}.csv" if n == 1 else f"progress.before-{step:010d}-{n}.csv")

    def has_checkpoint(self) -> bool:
        """Whether the agent has a complete checkpoint (one with its manifest)."""
        return any(self.checkpoints.glob("step_*/manifest.json"))

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def best(self) -> Path:
        """The best policy seen on the validation window (trainer.learn.selection)."""
        return self.root / "best"

    @property
    def best_model(self) -> Path:
        return self.best / "model.zip"

    @property
    def best_state(self) -> Path:
        """Which step the best policy is from, and its validation figures."""
        return self.best / "best.json"

    @property
    def shortlist_state(self) -> Path:
        """The runners-up on the validation window the held-out years also judge (train.shortlist): step, figures."""
        return self.best / "shortlist.json"

    def shortlisted(self, step: int) -> Path:
        """A runner-up's model (train.shortlist)."""
        return self.best / f"step_{step:010d}.zip"

    @property
    def warm_start(self) -> Path:
        """The policy right after its warm start, evaluated like the agent at the end."""
        return self.root / "warm_start.zip"


@dataclass(frozen=True)
class RunDir:
    root: Path

    config = property(lambda self: self.root / "config.yaml")
    command = property(lambda self: self.root / "command.txt")
    versions = property(lambda self: self.root / "versions.json")
    logs = property(lambda self: self.root / "logs")
    log_file = property(lambda self: self.root / "logs" / "trainer.jsonl")
    site = property(lambda self: self.root / "site")
    site_schema = property(lambda self: self.root / "site" / "schema.json")  # the built-in site as generated
    launcher_log = property(lambda self: self.root / "logs" / "launcher.log")
    results_json = property(lambda self: self.root / "results.json")
    results_csv = property(lambda self: self.root / "results.csv")
    schedule = property(lambda self: self.root / "schedule.json")
    report = property(lambda self: self.root / "report.md")
    plots = property(lambda self: self.root / "plots")
    monitor = property(lambda self: self.root / "monitor.jsonl")
    record = property(lambda self: self.root / "run.json")
    activity = property(lambda self: self.root / "activity.json")
    export = property(lambda self: self.root / "export")  # trainer export's folders, one an agent
    validation_site = property(lambda self: self.root / "validation-site")  # the built-in site's held-out draw
    second_held_out_site = property(lambda self: self.root / "validation-site-2")  # the selection's second one
    # The built-in site's other draws whose optimum the warm start imitates too (warm_start.extra_draws).
    demonstration_sites = property(lambda self: self.root / "demonstration-sites")
    # The warm start's imitations, for the night's other processes (trainer.learn.warm_start.saved).
    imitations = property(lambda self: self.root / "imitations")
    validation_references = property(lambda self: self.root / "validation-site" / "references.json")
    # trainer evaluate --unseen-year: a year of the built-in site nothing trained on (site/) and the figures there.
    unseen_year = property(lambda self: self.root / "unseen-year")
    unseen_year_site = property(lambda self: self.root / "unseen-year" / "site")
    unseen_year_results = property(lambda self: self.root / "unseen-year" / "results.json")  # as results.json
    # What the run judges on and learns nothing from (trainer.site.holdout), in words and steps, for the report.
    held_out = property(lambda self: self.root / "held-out.json")

    def held_out_record(self) -> dict[str, Any] | None:
        """What the run judged on and learnt from (``held-out.json``), or None where it held nothing out, predates
        held-out periods, or the file is damaged (the report and its plots then say nothing of it)."""
        record = self._held_out_file()
        return record if record.get("held_out") else None

    def unread_observations(self) -> list[str]:
        """The observations the run's agents do not read (``held-out.json``'s ``unread``); [] where it names none, or
        the file is damaged."""
        unread = self._held_out_file().get("unread")
        return [str(name) for name in unread] if isinstance(unread, list) else []

    def load_look_back(self) -> list[int]:
        """The hours ago of each building's load the run's agents read (``held-out.json``'s ``load_ago_hours``); []
        where it names none, or the file is damaged."""
        hours = self._held_out_file().get("load_ago_hours")
        return [int(h) for h in hours] if isinstance(hours, list) and all(isinstance(h, int) for h in hours) else []

    def reads_forecast(self) -> bool:
        """Whether the run's agents read the forecast of the hours ahead (``held-out.json``'s ``forecast``)."""
        return self._held_out_file().get("forecast") is True

    def varied_years(self) -> dict[str, Any] | None:
        """How the resampled years the warm start imitated were varied (``held-out.json``'s ``varied_years``: their
        count, each range of factors and the loads' daily profile's largest amplitude); None where they were not, or
        the file is damaged."""
        varied = self._held_out_file().get("varied_years")
        try:
            return {"years": int(varied["years"]), "load_scale": [float(x) for x in varied["load_scale"]],
                    "solar_scale": [float(x) for x in varied["solar_scale"]],
                    "load_shape": float(varied.get("load_shape", 0.0))}  # a run before the shape: none
        except (TypeError, KeyError, ValueError):
            return None

    def _held_out_file(self) -> dict[str, Any]:
        """``held-out.json`` as read; {} where there is none or it is damaged."""
        try:
            return read_typed(self.held_out, dict[str, Any]) if self.held_out.is_file() else {}
        except DamagedFile:
            return {}

    def plot(self, name: str) -> Path:
        """One of the report's plots (``report.PLOTS``, or gpu.png) under plots/."""
        return self.plots / name

    def agent(self, name: str) -> AgentDir:
        return AgentDir(self.root / name)

    def has_checkpoints(self) -> bool:
        """Whether any agent of the run has a complete checkpoint."""
        return any(self.root.glob("*/checkpoints/step_*/manifest.json"))

    def results(self) -> dict[str, dict[str, Any]]:
        """``results.json``: each evaluated controller's metrics (empty before the first), checked as such."""
        if not self.results_json.is_file():
            return {}
        return read_typed(self.results_json, dict[str, dict[str, Any]])

    def refuse_links_out(self) -> None:
        """Refuse a run folder holding a symbolic link to anything outside it, before anything is written:
        everything the trainer writes (the lock note, the log, an agent's folder, a checkpoint) lies under it."""
        refuse_links_out(self.root, "the run folder")

    def write_config(self, cfg: Config) -> None:
        """config.yaml: the config the run runs with, resolved."""
        write_text_atomic(self.config, yaml.safe_dump(cfg.to_dict(), sort_keys=False))

    def create(self, cfg: Config, argv: list[str], device: str, resuming: bool = False) -> RunDir:
        """Make the folder and record how the run was made, so it can be repeated.

        A resumed run keeps its history: its command line is appended to command.txt.
        """
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create run folder {self.root}: {exc.strerror} (choose another --out)") from None
        self.write_config(cfg)
        previous = self.command.read_text(encoding="utf-8") if resuming and self.command.is_file() else ""
        write_text_atomic(self.command, previous + " ".join(shlex.quote(a) for a in argv) + "\n")
        write_json_atomic(self.versions, versions(device))
        return self


def default_run_dir(cfg: Config, command: str, label: str | None = None) -> RunDir:
    """``output.root/<run_name>``: one folder inside the root, whatever the label (a dataset's name) holds."""
    scenario = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(label).name if label else cfg.scenario.name).lstrip(".") or "run"
    name = cfg.output.run_name.format(
        scenario=scenario, command=command, seed=cfg.seed, time=datetime.now().strftime("%Y%m%d-%H%M%S"),
    )
    root = Path(cfg.output.root)
    folder = root / name
    if folder.resolve().parent != root.resolve():
        raise UsageError(f"run folder {folder} is not a folder directly inside output.root ({root}); "
                         "check output.run_name")
    return RunDir(folder)


def versions(device: str) -> dict[str, Any]:
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {"python": sys.version.split()[0], "platform": platform.platform(), "device": device,
            "trainer": source_record(), "packages": packages}


@dataclass(frozen=True)
class RunContext:
    """What every stage of one run shares."""

    cfg: Config
    run: RunDir
    site: Site
    device: str

    def __post_init__(self) -> None:
        # The config as the site settles it (SAC's network size): open_run settled it before config.yaml; a context
        # made by hand (a benchmark trial, a Ray worker, a library user) gets the same, never an unsettled 'auto'.
        object.__setattr__(self, "cfg", self.site.settled(self.cfg))

    @property
    def seed(self) -> int:
        return self.cfg.seed
