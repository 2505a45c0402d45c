"""`trainer tune --backend ray`: trials side by side as Ray tasks, each with the CPUs and GPUs a night gives its
agent (``ray.num_cpus``/``ray.num_gpus``).

The driver asks Optuna for a trial and sends its number and settings to a fresh worker (``max_calls=1``: no stale
globals), which trains it and reports its validation scores straight into the study's journal file (Optuna's
JournalFileBackend locks it for processes on one machine; a cluster's nodes need the tune folder at the same path,
as a night's do); the worker's outcome comes back as a plain tuple and the driver tells the study.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import optuna

from trainer.base import logs
from trainer.base.signals import Stopped, handle_stop_signals
from trainer.config.loading import load_config
from trainer.night.ray_cluster import ray_session
from trainer.run.device import ASSIGNED_CPUS_ENV
from trainer.tune.study import Search, TuneFolder, TunePlan, open_study, settings_of


def search_on_ray(search: Search, options: dict[str, Any]) -> None:
    """The search with as many trials at once as the cluster fits; ends as the local search does."""
    agent = search.plan.agent
    cpus = float(search.cfg.ray.num_cpus.get(agent, 1))
    gpus = float(search.cfg.ray.num_gpus.get(agent, 0))
    with ray_session(options.get("address"), shared=search.folder.root) as ray:
        slots = max(int(ray.cluster_resources().get("CPU", 1) // max(cpus, 1e-3)), 1)
        task = ray.remote(max_calls=1)(run_trial_task).options(num_cpus=cpus, num_gpus=gpus)
        running: dict[Any, int] = {}
        search.say(f"search on Ray: {slots} trial(s) at once, {cpus:g} CPU and {gpus:g} GPU each")
        try:
            while True:
                while len(running) < slots and search.room_for_a_trial():
                    trial = search.study.ask()
                    settings = settings_of(trial, search.plan.params)
                    ref = task.remote(str(search.folder.root), trial.number, trial._trial_id, settings,
                                      search.end - time.monotonic() if search.end is not None else None)
                    running[ref] = trial.number
                if not running:
                    return
                done, _ = ray.wait(list(running), num_returns=1)
                for ref in done:
                    number = running.pop(ref)
                    try:
                        outcome = ray.get(ref)
                    except Exception as exc:  # a worker that died: the trial failed, the search goes on
                        outcome = ("failed", None, f"its Ray task failed: {str(exc).splitlines()[0]}")
                    search.tell(number, outcome)
        finally:
            for ref, number in running.items():  # stopped: the trials left are failed; a resume runs the search on
                ray.cancel(ref)
                search.tell(number, ("failed", None, "stopped"))


def run_trial_task(root: str, number: int, trial_id: int, settings: dict[str, Any],
                   seconds_left: float | None) -> tuple[str, float | None, str]:
    """One trial in a Ray worker, reporting into the study's journal; its outcome, never an exception."""
    import ray  # lazy: an optional extra, imported where it runs

    folder = TuneFolder(Path(root))
    assigned = ray.get_runtime_context().get_assigned_resources()
    os.environ[ASSIGNED_CPUS_ENV] = str(max(int(assigned.get("CPU", 1)), 1))
    logs.configure(folder.root / "logs" / f"trial-{number:04d}.jsonl")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = load_config([folder.config])
    plan = TunePlan.load(folder)
    # A trial given no GPU runs on the CPU, even on a GPU node (Ray 2.60 no longer hides the GPU from it).
    cfg.agent(plan.agent).device = "cuda" if assigned.get("GPU", 0) > 0 else "cpu"
    study = open_study(folder, cfg, plan, driver=False)
    trial = optuna.trial.Trial(study, trial_id)
    end = None if seconds_left is None else time.monotonic() + seconds_left
    search = Search(folder, cfg, plan, study, end, lambda line: logs.get().info(line))
    try:
        with handle_stop_signals():
            return search.evaluate(trial, settings)
    except Stopped as exc:
        return "failed", None, str(exc)
