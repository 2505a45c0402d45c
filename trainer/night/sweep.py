"""Seed sweeps: the same night for several seeds, each an ordinary, separately resumable run folder,
plus a sweep folder with ``sweep.json`` and ``sweep.md`` (mean ± sd across seeds per agent).

The nights run on one backend: one after another on the local one, their stages in one queue on Ray.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

from trainer import session
from trainer.config import Config
from trainer.errors import TrainerError, UsageError
from trainer.files import DamagedFile, read_json, write_json_atomic, write_text_atomic
from trainer.learn.preflight import check_resume_config, memory_checks
from trainer.night.backends import backend
from trainer.night.runner import prepare
from trainer.night.state import Night, drive
from trainer.references import REFERENCES
from trainer.roster import AGENTS
from trainer.run_dir import RunDir
from trainer.schedule_file import ScheduleState
from trainer.session import open_run, training_targets
from trainer.site import given_site

SWEEP = "sweep.json"
SUMMARY = "sweep.md"
# The figures a sweep summarises, with how each is shown.
FIGURES = (("co2_kg_per_year", "CO2 kg/year", ",.0f"), ("co2_vs_baseline_pct", "CO2 vs baseline %", "+.1f"),
           ("ev_departure_soc_met_pct", "EV departures met %", ".1f"), ("cost", "cost", ",.0f"))


def is_sweep(folder: Path) -> bool:
    return (folder / SWEEP).is_file()


def sweep_folder(cfg: Config, out: str | None) -> Path:
    if out:
        return Path(out)
    return Path(cfg.output.root) / f"{cfg.scenario.name}__sweep__{datetime.now():%Y%m%d-%H%M%S}"


def run_sweep(cfg: Config, seeds: list[int], folder: Path, schema: str | None, dataset: str | None,
              agents: list[str], quick: bool, deadline: datetime | None, resume: bool, force: bool, backend_name: str,
              backend_options: dict[str, Any], say: Callable[[str], None]) -> tuple[Path, list[ScheduleState]]:
    """Every seed's night (resuming those begun) on one backend, then the summary; returns the summary's path and
    the states."""
    if resume and not is_sweep(folder):
        raise UsageError(f"--resume: {folder} is not a sweep folder (no {SWEEP}); pass the folder a --seeds night made")
    seeds = read_seeds(folder) if resume else seeds
    given_site(schema, dataset)  # every check before the sweep's folder or any seed's is written
    RunDir(folder).refuse_links_out()  # a seed's folder linked out of the sweep's would take its writes elsewhere
    runs = [folder / f"seed-{seed}" for seed in seeds]
    seeded = [cfg.model_copy(update={"seed": seed}) for seed in seeds]
    for run, run_cfg in zip(runs, seeded, strict=True):
        for agent in agents if resume and RunDir(run).config.is_file() else ():
            check_resume_config(run, agent, run_cfg, force)

    chosen = backend(backend_name)

    def night(stack: ExitStack, run: Path, run_cfg: Config) -> Night:
        resuming = resume and RunDir(run).config.is_file()
        ctx = stack.enter_context(open_run(run_cfg, "night", run, schema, dataset, resuming=resuming,
                                           checks=memory_checks(run_cfg, agents)))
        if not is_sweep(folder):  # sweep.json once the first night has passed its checks (and made the folder)
            write_json_atomic(folder / SWEEP, {"seeds": seeds, "runs": [r.name for r in runs],
                                               "backend": backend_name})
        prepared = prepare(ctx, agents, training_targets(ctx.cfg, agents, quick, ctx.site), deadline, resuming,
                           force, chosen.one_process)
        say(f"seed {ctx.cfg.seed}: {prepared.plan_text}\n")
        return prepared

    if chosen.concurrent_nights:  # every night's stages in one queue
        with ExitStack() as stack:
            nights = [night(stack, run, run_cfg) for run, run_cfg in zip(runs, seeded, strict=True)]
            with chosen.open(nights, backend_options, say) as executor:
                drive(nights, executor)
    else:  # one night after another, each logging to its own folder
        nights = []
        for run, run_cfg in zip(runs, seeded, strict=True):
            with ExitStack() as stack:
                nights.append(night(stack, run, run_cfg))
                with chosen.open(nights[-1:], backend_options, say) as executor:
                    drive(nights[-1:], executor)
    summary = summarise([RunDir(r).results() for r in runs], seeds)
    write_text_atomic(folder / SUMMARY, summary)
    return folder / SUMMARY, [n.state for n in nights]


def summarise(results: list[dict[str, dict[str, Any]]], seeds: list[int]) -> str:
    """sweep.md: per agent, mean ± sd across seeds of each figure, with how many seeds had it."""
    lines = [f"# Seed sweep: seeds {', '.join(map(str, seeds))}", "",
             "Mean ± standard deviation across seeds (n = seeds that finished the stage).", "",
             "| agent | n | " + " | ".join(label for _, label, _ in FIGURES) + " |",
             "| --- | ---: | " + " | ".join("---:" for _ in FIGURES) + " |"]
    for name in (*REFERENCES, *AGENTS):
        rows = [r[name] for r in results if name in r and r[name].get("co2_kg_per_year") is not None]
        if not rows:
            continue
        cells = []
        for key, _, spec in FIGURES:
            values = [float(row[key]) for row in rows if row.get(key) is not None]
            if not values:
                cells.append("–")
                continue
            mean = statistics.mean(values)
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{format(mean, spec)} ± {format(sd, spec.lstrip('+'))}")
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def from_cli(config_files: tuple[str, ...], overrides: tuple[str, ...], profile: str | None, device: str | None,
             seeds_text: str | None, out: str | None, resume: str | None) -> tuple[Config, list[int], Path, bool]:
    """The sweep a `trainer night --seeds` (or `--resume SWEEP_DIR`) asks for: its config, seeds and folder."""
    folder = Path(resume) if resume and resume != session.LATEST else None
    if folder is not None and is_sweep(folder):
        seeds = read_seeds(folder)
        base = RunDir(folder / f"seed-{seeds[0]}").config  # a sweep's runs differ only in their seed
        cfg = session.resolve_config([base, *config_files] if base.is_file() else config_files, overrides,
                                     device=device)
        return cfg, seeds, folder, True
    cfg = session.resolve_config(config_files, overrides, device=device, profile=profile)
    return cfg, session.parse_seeds(seeds_text or ""), sweep_folder(cfg, out), False


def read_seeds(folder: Path) -> list[int]:
    """The seeds a sweep's sweep.json records, refused with its name when it is not what the trainer wrote."""
    data = read_json(folder / SWEEP)
    seeds = data.get("seeds") if isinstance(data, dict) else None
    if not (isinstance(seeds, list) and seeds and all(type(s) is int and s >= 0 for s in seeds)
            and len(set(seeds)) == len(seeds)):
        raise DamagedFile(f"{folder / SWEEP}: expected {{\"seeds\": [distinct non-negative integers], ...}}, found "
                          f"{json.dumps(data)[:80]}; restore it or start the sweep again with --seeds")
    return seeds


def is_sweep_resume(resume: str | None) -> bool:
    return bool(resume) and resume != session.LATEST and is_sweep(Path(resume))


def run_and_summarise(cfg: Config, seeds: list[int], folder: Path, schema: str | None, dataset: str | None,
                      agents: str | None, quick: bool, budget: str | None, finish_by: str | None, resuming: bool,
                      force: bool, backend_name: str, backend_options: dict[str, Any],
                      say: Callable[[str], None]) -> str:
    """`trainer night --seeds`: every seed's night, then the summary's text; a failed stage is an error after it."""
    cfg, chosen, deadline = session.night_plan(cfg, quick, agents, budget, finish_by)
    summary, states = run_sweep(cfg, seeds, folder, schema, dataset, chosen, quick, deadline, resuming, force,
                                backend_name, backend_options, say)
    if any(state.failed() for state in states):
        say(summary.read_text(encoding="utf-8"))
        raise TrainerError(f"some stages failed; see each seed's report.md under {folder}")
    return summary.read_text(encoding="utf-8") + f"\nsweep: {folder}"
