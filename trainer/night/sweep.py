"""Sweeps: the same night for several variants of its config, each an ordinary, separately resumable run folder,
plus a sweep folder with ``sweep.json`` and ``sweep.md`` (mean ± sd across the variants per agent).

A variant is a name and the ``--set`` overrides that make it. A producer turns what the user asked for into
variants: one row each in :data:`PRODUCERS`. A seed sweep (``--seeds``) is one; a hyperparameter search is another
producer, not a copy of this module. The nights run on one backend: one after another on the local one, their stages
in one queue on Ray.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from trainer.base.errors import TrainerError, UsageError
from trainer.base.files import DamagedFile, read_json, write_json_atomic, write_text_atomic
from trainer.config.loading import with_overrides
from trainer.config.roster import AGENTS
from trainer.config.sections import Config
from trainer.learn.preflight import check_resume_config, memory_checks
from trainer.night.backends import backend
from trainer.night.runner import prepare
from trainer.night.state import Night, drive
from trainer.references.roster import REFERENCES
from trainer.run import session
from trainer.run.folder import RunDir
from trainer.run.schedule_file import ScheduleState
from trainer.run.session import open_run, settled_on, training_targets
from trainer.site import given_site

SWEEP = "sweep.json"
SUMMARY = "sweep.md"
# The figures a sweep summarises, with how each is shown.
FIGURES = (("co2_kg_per_year", "CO2 kg/year", ",.0f"), ("co2_vs_baseline_pct", "CO2 vs baseline %", "+.1f"),
           ("ev_departure_soc_met_pct", "EV departures met %", ".1f"), ("cost", "cost", ",.0f"))


@dataclass(frozen=True)
class Variant:
    """One night of a sweep: its run folder's name, how the summary names it, and what it changes of the config."""

    name: str
    label: str
    overrides: tuple[str, ...]

    def config(self, base: Config) -> Config:
        return with_overrides(base, self.overrides)


@dataclass(frozen=True)
class Producer:
    """One way to make a sweep's variants: one row of :data:`PRODUCERS`."""

    name: str
    doc: str
    variants: Callable[[str], list[Variant]]  # from what the user asked for (--seeds' text, for seeds)
    title: Callable[[list[Variant]], str]  # sweep.md's heading


def seed_variants(text: str) -> list[Variant]:
    return [Variant(f"seed-{seed}", str(seed), (f"seed={seed}",)) for seed in session.parse_seeds(text)]


SEEDS = Producer("seeds", "the same night under each seed of --seeds", seed_variants,
                 lambda variants: "Seed sweep: seeds " + ", ".join(v.label for v in variants))
PRODUCERS: dict[str, Producer] = {row.name: row for row in (SEEDS,)}


def is_sweep(folder: Path) -> bool:
    return (folder / SWEEP).is_file()


def sweep_folder(cfg: Config, out: str | None) -> Path:
    if out:
        return Path(out)
    return Path(cfg.output.root) / f"{cfg.scenario.name}__sweep__{datetime.now():%Y%m%d-%H%M%S}"


@dataclass(frozen=True)
class Sweep:
    """A sweep as it runs: its folder, its producer and variants, and whether it goes on from one begun."""

    folder: Path
    producer: Producer
    variants: list[Variant]
    resume: bool = False

    def record(self, backend_name: str) -> dict[str, Any]:
        """sweep.json: enough to resume it (and, for a seed sweep, its seeds as before)."""
        data: dict[str, Any] = {"producer": self.producer.name, "runs": [v.name for v in self.variants],
                                "variants": [asdict(v) for v in self.variants],
                                "backend": backend_name}
        if self.producer is SEEDS:
            data["seeds"] = [int(v.label) for v in self.variants]
        return data


def run_sweep(cfg: Config, sweep: Sweep, schema: str | None, dataset: str | None, agents: list[str], quick: bool,
              deadline: datetime | None, force: bool, backend_name: str, backend_options: dict[str, Any],
              say: Callable[[str], None]) -> tuple[Path, list[ScheduleState]]:
    """Every variant's night (resuming those begun) on one backend, then the summary; returns the summary's path and
    the states."""
    folder, variants = sweep.folder, sweep.variants
    given = given_site(schema, dataset)  # every check before the sweep's folder or any variant's is written
    RunDir(folder).refuse_links_out()  # a variant's folder linked out of the sweep's would take its writes elsewhere
    runs = [folder / variant.name for variant in variants]
    # Settled as open_run settles them: a resumed variant's checkpoints hold the settled values.
    configs = [settled_on(variant.config(cfg), given) for variant in variants]
    for run, run_cfg in zip(runs, configs, strict=True):
        for agent in agents if sweep.resume and RunDir(run).config.is_file() else ():
            check_resume_config(run, agent, run_cfg, force)

    chosen = backend(backend_name)

    def night(stack: ExitStack, run: Path, run_cfg: Config, variant: Variant) -> Night:
        resuming = sweep.resume and RunDir(run).config.is_file()
        ctx = stack.enter_context(open_run(run_cfg, "night", run, schema, dataset, resuming=resuming,
                                           checks=memory_checks(agents)))
        if not is_sweep(folder):  # sweep.json once the first night has passed its checks (and made the folder)
            write_json_atomic(folder / SWEEP, sweep.record(backend_name))
        prepared = prepare(ctx, agents, training_targets(ctx.cfg, agents, quick, ctx.site), deadline, resuming,
                           force, chosen.one_process)
        say(f"{sweep.producer.name} {variant.label}: {prepared.plan_text}\n")
        return prepared

    nights: list[Night] = []
    if chosen.concurrent_nights:  # every night's stages in one queue
        with ExitStack() as stack:
            nights = [night(stack, *each) for each in zip(runs, configs, variants, strict=True)]
            with chosen.open(nights, backend_options, say) as executor:
                drive(nights, executor)
    else:  # one night after another, each logging to its own folder
        for each in zip(runs, configs, variants, strict=True):
            with ExitStack() as stack:
                nights.append(night(stack, *each))
                with chosen.open(nights[-1:], backend_options, say) as executor:
                    drive(nights[-1:], executor)
    summary = summarise([RunDir(r).results() for r in runs], sweep.producer.title(variants))
    write_text_atomic(folder / SUMMARY, summary)
    return folder / SUMMARY, [n.state for n in nights]


def summarise(results: list[dict[str, dict[str, Any]]], title: str) -> str:
    """sweep.md: per agent, mean ± sd across the variants of each figure, with how many variants had it."""
    what = "seeds" if title.startswith("Seed sweep") else "variants"
    lines = [f"# {title}", "",
             f"Mean ± standard deviation across {what} (n = {what} that finished the stage).", "",
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
             seeds_text: str | None, out: str | None, resume: str | None) -> tuple[Config, Sweep]:
    """The sweep a `trainer night --seeds` (or `--resume SWEEP_DIR`) asks for: its config and its variants."""
    folder = Path(resume) if resume and resume != session.LATEST else None
    if folder is not None and not is_sweep(folder):
        raise UsageError(f"--seeds starts a sweep, and {resume} is not one (no {SWEEP}): resume the run without "
                         "--seeds, or start the sweep with --out in a new folder")
    if folder is not None and is_sweep(folder):
        producer, variants = read_variants(folder)
        asked = SEEDS.variants(seeds_text) if seeds_text else None
        if asked is not None and [v.name for v in asked] != [v.name for v in variants]:
            own = ", ".join(v.label for v in variants)
            raise UsageError(f"--resume {resume} goes on with the sweep's own runs ({own}), and --seeds asks for "
                             f"{seeds_text}: drop --seeds, or start another sweep with --out in a new folder")
        first = RunDir(folder / variants[0].name)  # a sweep's runs differ only in their variant's overrides
        before = session.as_it_was_made(first) if first.config.is_file() else []
        cfg = session.resolve_config([first.config, *config_files] if first.config.is_file() else config_files,
                                     [*before, *overrides], device=device)
        return cfg, Sweep(folder, producer, variants, resume=True)
    if resume == session.LATEST:
        raise UsageError("--seeds starts a sweep, and --resume latest resumes a run: resume a sweep by its folder "
                         "(--resume SWEEP_DIR), or drop --resume")
    cfg = session.resolve_config(config_files, overrides, device=device, profile=profile)
    target = sweep_folder(cfg, out)
    if RunDir(target).config.is_file() and not is_sweep(target):
        raise UsageError(f"{target} is a run's folder, not a sweep's: choose another --out for the sweep")
    return cfg, Sweep(target, SEEDS, SEEDS.variants(seeds_text or ""))


def read_variants(folder: Path) -> tuple[Producer, list[Variant]]:
    """The producer and variants a sweep.json records (a seed sweep of the version before: its seeds), refused with
    its name when it is not what the trainer wrote."""
    data = read_json(folder / SWEEP)
    if isinstance(data, dict) and "variants" in data:
        try:
            producer = PRODUCERS[data["producer"]]
            variants = [Variant(str(v["name"]), str(v["label"]), tuple(str(o) for o in v["overrides"]))
                        for v in data["variants"]]
        except (KeyError, TypeError):
            variants = []
        if not variants or len({v.name for v in variants}) != len(variants):
            producers = ", ".join(PRODUCERS)
            raise DamagedFile(f"{folder / SWEEP}: expected {{\"producer\": one of {producers}, \"variants\": [{{name, "
                              f"label, overrides}}, ...]}}, found {json.dumps(data)[:80]}; restore it or start the "
                              "sweep again")
        return producer, variants
    seeds = data.get("seeds") if isinstance(data, dict) else None
    if not (isinstance(seeds, list) and seeds and all(type(s) is int and s >= 0 for s in seeds)
            and len(set(seeds)) == len(seeds)):
        raise DamagedFile(f"{folder / SWEEP}: expected {{\"seeds\": [distinct non-negative integers], ...}}, found "
                          f"{json.dumps(data)[:80]}; restore it or start the sweep again with --seeds")
    return SEEDS, SEEDS.variants(",".join(map(str, seeds)))


def is_sweep_resume(resume: str | None) -> bool:
    return bool(resume) and resume != session.LATEST and is_sweep(Path(resume))


def run_and_summarise(cfg: Config, sweep: Sweep, schema: str | None, dataset: str | None, agents: str | None,
                      quick: bool, budget: str | None, finish_by: str | None, force: bool, backend_name: str,
                      backend_options: dict[str, Any], say: Callable[[str], None]) -> str:
    """`trainer night --seeds`: every variant's night, then the summary's text; a failed stage is an error after it."""
    cfg, chosen, deadline = session.night_plan(cfg, quick, agents, budget, finish_by)
    summary, states = run_sweep(cfg, sweep, schema, dataset, chosen, quick, deadline, force, backend_name,
                                backend_options, say)
    if any(state.failed() for state in states):
        say(summary.read_text(encoding="utf-8"))
        raise TrainerError(f"some stages failed; see each variant's report.md under {sweep.folder}")
    return summary.read_text(encoding="utf-8") + f"\nsweep: {sweep.folder}"
