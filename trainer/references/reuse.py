"""The references of an earlier run, reused: a second night on the same data and settings does not evaluate them again.

A reference's figures (the uncontrolled baseline, the rule-based controller, the optimum and the planner) depend on
the data, the period judged and learnt from, the seed, the settings that shape the site and its evaluation, and the
program; never on the agents. So each evaluation is kept under a key of exactly those (:func:`references_key`) in
the machine's cache (``trainer.base.files.cache_root() / "references"``), and a later run with the same key copies
its figures and timeseries instead of spending a minute or more of its night on them (the optimum's linear program
and the planner's, every hour). The program is keyed by the digest of its own source, so an upgrade evaluates again,
as ``trainer evaluate`` always does. ``schedule.reuse_references: false`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from trainer.base import logs
from trainer.base.files import DamagedFile, cache_root, read_json, write_bytes_atomic, write_json_atomic
from trainer.base.source import program_digest
from trainer.config.sections import Config
from trainer.site import Site

FORMAT = 1  # bump when what is kept changes
KEEP = 16  # keys kept (a key is one dataset, period, seed and settings); the least recently used go first
# The settings a reference's evaluation reads; the agents', the warm start's, the schedule's (but its evaluation
# length), the machine's and what the policies observe (``observations``: no reference reads the observation, each
# acts on CityLearn's state) do not change it.
SECTIONS = ("seed", "scenario", "reward", "ev", "holdout")
METRICS = "metrics.json"
TIMESERIES = "eval_timeseries.csv"


def cache_folder() -> Path:
    return cache_root() / "references"


def references_key(cfg: Config, site: Site, seed: int) -> str:
    """What a reference's evaluation depends on, as one digest (see the module's doc)."""
    held = site.held_out
    settings = cfg.to_dict()
    parts = {
        "format": FORMAT, "program": program_digest(), "seed": seed, "eval_days": cfg.schedule.eval_days,
        "settings": {name: settings[name] for name in SECTIONS},
        "site": [site.content_digest(), site.start, site.end],
        "held_out": None if held is None else [held.site.content_digest(), held.site.start, held.site.end],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def stored(cfg: Config, site: Site, seed: int, name: str) -> bool:
    """Whether reference ``name`` has figures kept for this run's key (the plan counts it as free)."""
    return cfg.schedule.reuse_references and (cache_folder() / references_key(cfg, site, seed) / name / METRICS
                                              ).is_file()


def recall(cfg: Config, site: Site, seed: int, name: str, timeseries: Path) -> dict[str, Any] | None:
    """An earlier run's figures of reference ``name`` with this run's key (its timeseries copied to ``timeseries``),
    or None: none kept, reuse turned off, or a kept file damaged (then removed, and the reference evaluated)."""
    if not cfg.schedule.reuse_references:
        return None
    folder = cache_folder() / references_key(cfg, site, seed) / name
    try:
        kept = read_json(folder / METRICS)
        if not isinstance(kept, dict) or not isinstance(kept.get("metrics"), dict):
            raise DamagedFile(f"{folder / METRICS} holds no figures")
        if (folder / TIMESERIES).is_file():
            write_bytes_atomic(timeseries, (folder / TIMESERIES).read_bytes())
        elif kept["metrics"].get("co2_kg") is not None:
            raise DamagedFile(f"{folder / TIMESERIES} is missing")
    except FileNotFoundError:
        return None
    except (DamagedFile, OSError) as exc:
        logs.get().warning("kept reference not reused: evaluating it again", agent=name, reason=str(exc))
        shutil.rmtree(folder, ignore_errors=True)
        return None
    folder.parent.touch()  # recently used: kept longest
    return {**kept["metrics"], "reused_from": kept.get("run")}


def remember(cfg: Config, site: Site, seed: int, name: str, metrics: dict[str, Any], timeseries: Path,
             run: Path) -> None:
    """Keep reference ``name``'s figures (and timeseries) for later runs with this run's key; a full or read-only
    cache costs only the reuse, never the night."""
    if not cfg.schedule.reuse_references:
        return
    key_folder = cache_folder() / references_key(cfg, site, seed)
    folder = key_folder / name
    try:
        if timeseries.is_file():
            write_bytes_atomic(folder / TIMESERIES, timeseries.read_bytes())
        write_json_atomic(folder / METRICS, {"run": str(run), "metrics": metrics})
        _forget_the_oldest()
    except OSError as exc:
        logs.get().warning("reference not kept for later runs", agent=name, folder=str(folder), reason=str(exc))


def _forget_the_oldest() -> None:
    keys = sorted((p for p in cache_folder().iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in keys[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
