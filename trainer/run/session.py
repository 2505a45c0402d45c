"""From command-line arguments to a ready run: the config, the run folder, its lock, log and record.

Every command that runs something goes through here: :func:`resolve_config` (defaults, a
device profile, ``--config`` files, ``--set``), :func:`open_run` (create or resume a run
folder, lock it, log to it, record how it was made) and :func:`night_deadline`. What a
resume needs to know about a run (its dataset) is kept in the run folder's ``run.json``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from trainer.base import durations, logs
from trainer.base.errors import ConfigError, TrainerError, UsageError
from trainer.base.files import DamagedFile, read_typed, write_json_atomic
from trainer.base.progress import live_console
from trainer.config import profiles
from trainer.config.loading import load_config, read_yaml
from trainer.config.roster import AGENTS
from trainer.config.sections import MAX_SEED, Config, ObservationsConfig
from trainer.run.device import apply_gpu_flags, resolve_device
from trainer.run.folder import RunContext, RunDir, default_run_dir
from trainer.run.lock import RunLock
from trainer.site import BUILT_IN, SITE_KINDS, Site, given_site
from trainer.site.bootstrap import Variation
from trainer.site.holdout import hold_out, judged_instead
from trainer.site.kinds import kind_of
from trainer.site.scenario import build_site

# A check of the run's config on its site before its folder is touched (trainer.learn.preflight.memory_checks);
# raises to refuse.
SiteCheck = Callable[[Config, Site], None]

LATEST = "latest"  # --resume without a folder: --out, else the newest run


@dataclass(frozen=True)
class RunRecord:
    """``run.json``: what resuming or re-evaluating a run needs that its config does not say."""

    schema: str | None  # a CityLearn dataset's schema.json; None: the built-in site, generated into site/
    label: str | None
    kind: str | None = None  # trainer.site.SITE_KINDS' name of how it was given (a run before it: by its schema)
    digest: str | None = None  # the data's Site.content_digest (a run before it: none): a resume checks it

    def save(self, run: RunDir) -> None:
        write_json_atomic(run.record, asdict(self))

    @classmethod
    def load(cls, run: RunDir) -> RunRecord:
        if run.record.is_file():
            return read_typed(run.record, cls)
        if run.site_schema.is_file():
            return cls(None, None)
        raise UsageError(f"{run.root}: cannot tell which dataset this run used (no {run.record.name} and no site/ "
                         "folder); pass --schema or --dataset")

    def given(self) -> Site | None:
        """The dataset the run was given, checked again (it may have changed since); None: the built-in site."""
        if not self.schema:
            return None
        site = given_site(self.schema, None)
        kind = SITE_KINDS.get(self.kind or "")
        if site is None or kind is None:
            return site
        return replace(site, kind=kind_of(site.data, kind), label=self.label)


# ------------------------------------------------------------------------------ config


def resolve_config(config_files: Sequence[str | Path] = (), overrides: Sequence[str] = (), *, seed: int | None = None,
                   device: str | None = None, profile: str | None = None) -> Config:
    """Defaults, then the device profile, each config file and each override (``seed``/``device`` last)."""
    extra = list(overrides)
    if seed is not None:
        extra.append(f"seed={seed}")
    if device is not None:
        extra.append(f"gpu.device={device}")
    overlay, note = profiles.resolve(profile)
    if note:
        logs.get().info("device profile", profile=note)
    return load_config(list(config_files), extra, profile=overlay)


def resolve_for_resume(resume: str | None, out: str | None, marker: str, config_files: Sequence[str],
                       overrides: Sequence[str], **kw) -> tuple[Config, str | None]:
    """The config and run folder; on resume the run's own config.yaml (which already holds its profile's values)
    is the base, under the new --config files and --set overrides."""
    if resume is None:
        return resolve_config(config_files, overrides, **kw), out
    run_dir = resume_dir(resolve_config(config_files, overrides, **kw), resume, out, marker)
    before = as_it_was_made(RunDir(run_dir))
    cfg = resolve_config([RunDir(run_dir).config, *config_files], [*before, *overrides], **{**kw, "profile": None})
    return cfg, str(run_dir)


# What every run's config.yaml has held, since the first version: a file without them is not the trainer's.
RUN_CONFIG_KEYS = ("seed", "scenario", "sac", "ppo", "a2c")


def run_config(run: RunDir) -> dict[str, Any]:
    """The run's config.yaml as the trainer wrote it, read strictly: its YAML (file, line and column where it is
    not) and the sections every run holds. An emptied file would otherwise read as the defaults, and a resume or
    an export would go on with a config the run never had."""
    data = read_yaml(run.config)
    missing = [key for key in RUN_CONFIG_KEYS if key not in data]
    if missing:
        found = ", ".join(list(data)[:6]) or "nothing"
        raise DamagedFile(f"{run.config} is damaged: a run's config.yaml holds the whole config the run was made "
                          f"with, and {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing (it holds "
                          f"{found}); restore it from a backup, or start a new run")
    return data


def as_it_was_made(run: RunDir) -> list[str]:
    """Overrides that keep a run an earlier version made as it was made, where its config.yaml lacks a setting
    whose default has changed since: without a holdout section it learnt from all of its data (resumed and
    re-evaluated with nothing held out); without ``observations.load_ago_hours`` its policy reads no load of
    hours before; without ``warm_start.draw_load_scale`` its resampled years were the data's days unscaled; without
    ``observations.forecast`` its policy reads no forecast."""
    data = run_config(run)
    observations, warm_start = data.get("observations"), data.get("warm_start")
    return [*([] if "holdout" in data else ["holdout.share=0"]),
            *([] if isinstance(observations, dict) and "load_ago_hours" in observations
              else ["observations.load_ago_hours=[]"]),
            *([] if isinstance(observations, dict) and "forecast" in observations
              else ["observations.forecast=false"]),
            *([] if isinstance(warm_start, dict) and "draw_load_scale" in warm_start
              else ["warm_start.draw_load_scale=[1,1]", "warm_start.draw_solar_scale=[1,1]"])]


def newest_run(root: Path, marker: str = "config.yaml") -> Path | None:
    """The most recently changed run folder under ``root`` that holds ``marker``."""
    found = sorted((p for p in root.glob("*") if (p / marker).exists()), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def resume_dir(cfg: Config, value: str, out: str | None, marker: str) -> Path:
    """The run folder to resume: given, --out, or the newest under output.root holding ``marker``."""
    if value != LATEST:
        path = Path(value)
    elif out:
        path = Path(out)
    else:
        root = Path(cfg.output.root)
        path = newest_run(root, marker)
        if path is None:
            raise UsageError(
                f"--resume: no run folder under {root} has {marker}; pass the run folder: --resume RUN_DIR"
            )
    if not RunDir(path).config.is_file():
        raise UsageError(f"--resume: {path} is not a run folder (no config.yaml); "
                         "pass a folder made by trainer train or night")
    return path


def night_deadline(cfg: Config, budget_text: str | None, finish_by: str | None,
                   now: datetime | None = None) -> datetime | None:
    """The night's deadline from --budget or --finish-by, else from the config; None = untimed."""
    if not budget_text and not finish_by:
        budget_text, finish_by = cfg.schedule.budget, cfg.schedule.finish_by
    return durations.deadline(budget_text, finish_by, now or datetime.now())


# ------------------------------------------------------------------------------ arguments


def parse_agents(text: str) -> list[str]:
    chosen = [a.strip().lower() for a in text.split(",") if a.strip()]
    unknown = [a for a in chosen if a not in AGENTS]
    if unknown or not chosen:
        raise UsageError(f"--agents expects a comma-separated subset of {', '.join(AGENTS)}, got {text!r}")
    return chosen


def comma_integers(text: str) -> list[int]:
    """``1,2, 3`` as [1, 2, 3]; [] where any part is not an integer (the caller says what it expected)."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        return []


def parse_seeds(text: str) -> list[int]:
    seeds = comma_integers(text)
    if not seeds or min(seeds) < 0 or max(seeds) > MAX_SEED:
        raise UsageError(f"--seeds expects comma-separated integers from 0 to {MAX_SEED}, got {text!r}")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:  # one night per seed: a repeat would be counted twice in the spread
        raise UsageError(f"--seeds names {', '.join(map(str, repeated))} more than once, got {text!r}; list each seed "
                         "once")
    return seeds


def length_overrides(agents: Sequence[str], timesteps: int | None, episodes: int | None) -> list[str]:
    """``--set`` overrides for --timesteps or --episodes."""
    if timesteps is not None and episodes is not None:
        raise UsageError("pass either --timesteps or --episodes, not both")
    extra = []
    for agent in agents:
        if timesteps is not None:
            extra += [f"{agent}.timesteps={timesteps}", f"{agent}.episodes=null"]
        if episodes is not None:
            extra += [f"{agent}.episodes={episodes}", f"{agent}.timesteps=null"]
    return extra


def holdout_overrides(holdout: str | None, eval_schema: str | None, eval_dataset: str | None) -> list[str]:
    """``--set`` overrides for --holdout, --eval-schema and --eval-dataset (the config's holdout section)."""
    extra = []
    if holdout is not None:
        text = holdout.strip().lower()
        try:
            share = 0.0 if text == "none" else float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            share = -1.0
        if not 0 <= share <= 0.5:
            raise UsageError(f"--holdout expects a share of the period up to 50%, such as 25%, or none; got "
                             f"{holdout!r}")
        extra.append(f"holdout.share={share}")
    if eval_schema is not None:
        if eval_dataset is not None:
            raise UsageError("pass either --eval-schema or --eval-dataset, not both")
        given = given_site(eval_schema, None)  # checked fully now, before anything runs
        assert given is not None
        extra += [f"holdout.eval_schema={given.schema}", "holdout.eval_dataset=null"]
    if eval_dataset is not None:
        given_site(None, eval_dataset)
        extra += [f"holdout.eval_dataset={eval_dataset}", "holdout.eval_schema=null"]
    return extra


def training_timesteps(cfg: Config, agent: str, site: Site) -> int:
    section = cfg.agent(agent)
    if section.timesteps is not None:
        return whole_rollouts(cfg, agent, section.timesteps)
    episode = min(cfg.scenario.train_episode_days * 24, site.length)
    return whole_rollouts(cfg, agent, int(section.episodes) * episode)


def whole_rollouts(cfg: Config, agent: str, steps: int) -> int:
    """``steps`` rounded up to whole rollouts for an on-policy agent: SB3 ends its training at a rollout's end
    (PPO's 500,000 trained 501,760), so the plan, the progress line and the table say the number it trains."""
    rollout = getattr(cfg.agent(agent), "n_steps", None)
    return -(-steps // rollout) * rollout if rollout else steps


def night_plan(cfg: Config, quick: bool, agents: str | None, budget_text: str | None,
               finish_by: str | None) -> tuple[Config, list[str], datetime | None]:
    """What a night's options settle: its config (--quick's short evaluations), its agents and its deadline."""
    cfg = quick_night(cfg) if quick else cfg
    chosen = parse_agents(agents) if agents else list(cfg.schedule.agents)
    return cfg, chosen, night_deadline(cfg, budget_text, finish_by)


def quick_night(cfg: Config) -> Config:
    """The config of a --quick night: its evaluations cover schedule.quick_eval_days, not the whole period, and its
    warm start imitates the dataset's own period once for schedule.quick_warm_start_epochs (a smoke run, not the
    best).
    SAC's few quick updates all move its actor (its critics-first phase would outlast them: a smoke run runs the
    whole update), and each stage trains its few steps whatever its curve (train.patience: a smoke run runs it all)
    and no more (schedule.last_stage_past_target: a smoke run ends when its stages do)."""
    days = min(cfg.schedule.quick_eval_days, cfg.schedule.eval_days or cfg.schedule.quick_eval_days)
    epochs = min(cfg.schedule.quick_warm_start_epochs, cfg.warm_start.epochs)
    return cfg.model_copy(update={
        "schedule": cfg.schedule.model_copy(update={"eval_days": days, "last_stage_past_target": 1.0}),
        "train": cfg.train.model_copy(update={"patience": 0.0}),
        "warm_start": cfg.warm_start.model_copy(update={"epochs": epochs, "extra_draws": 0, "ensemble": 1,
                                                        "sac_critic_updates": 0})})


def training_targets(cfg: Config, agents: Sequence[str], quick: bool, site: Site) -> dict[str, int]:
    return {a: whole_rollouts(cfg, a, cfg.schedule.quick_timesteps.get(a, 1000)) if quick
            else training_timesteps(cfg, a, site) for a in agents}


# ------------------------------------------------------------------------------ run folders


@contextmanager
def staged_dataset(cfg: Config, run: RunDir, given: Site | None, resuming: bool) -> Iterator[Site]:
    """The run's site, checked before the run folder is touched: the given dataset, a resumed run's own
    site, or the built-in site generated into a temporary folder (:func:`place_dataset` moves it in)."""
    if given is not None:
        yield given
    elif resuming and run.site_schema.is_file():
        # It may have been edited since: refuse a class CityLearn would run.
        yield Site.load(run.site_schema, BUILT_IN, check=True, fallback=cfg.scenario)
    else:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            schema = build_site(cfg.scenario, Path(tmp) / "site")
            logs.get().debug("built-in site generated", seconds=round(time.perf_counter() - start, 2))
            yield Site.load(schema, BUILT_IN, fallback=cfg.scenario)


def place_dataset(run: RunDir, staged: Site, given: Site | None) -> Site:
    """The site the run reads once its folder is open: a generated site is copied into site/."""
    if given is not None:
        logs.get().info("dataset", schema=str(given.schema), label=given.label, kind=given.kind.name)
        return given
    if staged.schema.parent == run.site:
        return staged
    shutil.copytree(staged.schema.parent, run.site, dirs_exist_ok=True)
    logs.get().info("built-in site generated", schema=str(run.site_schema))
    return replace(staged, schema=run.site_schema)  # the same site: what was learnt of it holds


def _create(run: RunDir) -> RunLock:
    try:
        run.root.mkdir(parents=True, exist_ok=True)
        return RunLock(run.root).acquire()  # before anything in the folder is rewritten
    except OSError as exc:
        raise UsageError(f"cannot write in run folder {run.root}: {exc.strerror} (make it writable, or choose "
                         "another --out)") from None


@contextmanager
def site_for(cfg: Config, given: Site | None) -> Iterator[Site]:
    """The given dataset's site, or the built-in site generated into a temporary folder (plan, benchmark, doctor)."""
    if given is not None:
        yield given
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield Site.load(build_site(cfg.scenario, Path(tmp) / "site"), BUILT_IN, fallback=cfg.scenario)


def _read_json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def settled_on(cfg: Config, given: Site | None) -> Config:
    """``cfg`` settled on the dataset ``given`` (None: the built-in site), where a command knows its site before
    :func:`open_run` does (a sweep's or a tune's checks and config.yaml)."""
    return given.settled(cfg) if given is not None else cfg.on_site(one_period=False)


def judged_apart(cfg: Config, run: RunDir, site: Site) -> Site:
    """The run's site as the part it learns from, carrying the part it is judged on (``cfg.holdout``), recorded in
    held-out.json for the report."""
    site = hold_out(site, cfg.holdout, run.unseen_year_site)
    record_held_out(run, site, cfg)
    return site


def with_fitted_warm_start(ctx: RunContext, fitted: Config) -> RunContext:
    """``ctx`` with the warm start a run fitted to its size or its night's time (``fitted``), written to config.yaml
    (a resume and Ray's workers read it there) and, where it imitates another number of years, to held-out.json (the
    report says how many the warm start imitated)."""
    ctx.run.write_config(fitted)
    if ctx.site.demonstration_draws(fitted.warm_start) != ctx.site.demonstration_draws(ctx.cfg.warm_start):
        record_held_out(ctx.run, ctx.site, fitted, log=False)
    return replace(ctx, cfg=fitted)


def record_held_out(run: RunDir, site: Site, cfg: Config, log: bool = True) -> None:
    """held-out.json: what ``site`` is judged on, the observations the policy does not read, the hours ago of the
    loads it reads (``cfg``'s on this site) and how the resampled years its warm start imitates vary, for the
    report; logged unless ``log`` is False (recorded again as the night fits its warm start: said once is enough)."""
    info = logs.get().info if log else (lambda *args, **kwargs: None)
    seen = cfg.observations
    unread = site.unread(seen)
    held = site.held_out
    record: dict[str, Any] = {"held_out": None, "learnt_from": None} if held is None else {
        "held_out": held.what, "learnt_from": held.learnt_from, "schema": str(held.site.schema),
        "first_step": held.site.start, "last_step": held.site.end}
    if unread:
        record["unread"] = sorted(unread)
        info("observations the agents do not read (observations.ignore)", unread=sorted(unread))
    if look_back := site.load_look_back(seen):
        record["load_ago_hours"] = list(look_back)
        info("the agents read each building's loads hours before (observations.load_ago_hours)",
             hours=list(look_back))
    if site.reads_forecast(seen):
        record["forecast"] = True
        info("the agents read the forecast of the hours ahead, learnt from the readings so far (observations.forecast)")
    warm = cfg.warm_start
    if not site.kind.unseen_draws and warm.epochs and (years := site.demonstration_draws(warm)) and \
            Variation.of(warm).varies:
        record["varied_years"] = {"years": years, "load_scale": list(warm.draw_load_scale),
                                  "solar_scale": list(warm.draw_solar_scale), "load_shape": warm.draw_load_shape}
    if _read_json_or_none(run.held_out) != record:  # a re-evaluation leaves the same record's file as it was
        write_json_atomic(run.held_out, record)
    if held is not None:
        info("judged on a part held out", held_out=held.what, learnt_from=held.learnt_from)


@contextmanager
def open_run(cfg: Config, command: str, out: str | Path | None, schema: str | None = None, dataset: str | None = None,
             resuming: bool = False, checks: Sequence[SiteCheck] = ()) -> Iterator[RunContext]:
    """Create (or, resuming, reopen) a run folder, hold its lock, log to it and record how it was made.

    Every check comes first (the dataset, each of the caller's ``checks`` of the site, such as the replay buffers
    against the RAM, then the links in the folder as the lock is taken): a refused command leaves an existing folder
    byte for byte as it was.
    """
    previous = RunRecord.load(RunDir(Path(out))) if resuming and not schema and not dataset else None
    given = previous.given() if previous else given_site(schema, dataset)
    if resuming and (schema or dataset):
        same_dataset(RunDir(Path(out)), given)
    device = resolve_device(cfg.gpu.device)
    label = given.label if given else None
    run = RunDir(Path(out)) if out else default_run_dir(cfg, command.replace(" ", "-"), label)
    if run.results_json.is_file():
        run.results()  # a damaged one is named before anything is written: the stages would fail on it later
    with staged_dataset(cfg, run, given, resuming) as staged:
        cfg = staged.settled(cfg)  # once, before config.yaml is written: every stage and a resume read it there
        judged_instead(staged, cfg.holdout)  # a dataset to judge on that the policy could not drive is refused now
        check_ignored(staged, cfg.observations)
        for check in checks:
            check(cfg, staged)
        lock = _create(run)
        try:
            run.create(cfg, ["trainer", *sys.argv[1:]], device, resuming=resuming)
            logs.configure(run.log_file)
            logs.get().info("run resumed" if resuming else "run started", run=str(run.root), command=command,
                            device=device)
            RunRecord(str(given.schema) if given else None, label, given.kind.name if given else None,
                      given.content_digest() if given else None).save(run)
            site = judged_apart(cfg, run, place_dataset(run, staged, given))
        except BaseException:
            lock.release()
            raise
    try:
        apply_gpu_flags(cfg.gpu, device)
        with live_console():
            yield RunContext(cfg, run, site, device)
    finally:
        lock.release()


def same_dataset(run: RunDir, given: Site | None) -> None:
    """Refuse to resume ``run`` on other data than it learnt on: a dataset passed again on --resume (one that moved)
    must hold what the run's own did, byte for byte, or the run's policy, checkpoints and figures would mix two
    sites. Where the run's own dataset can no longer be read and run.json holds no digest, it cannot tell: allowed."""
    if not run.record.is_file():
        return
    record = RunRecord.load(run)
    if record.schema is None:
        if given is not None:
            raise UsageError(f"--resume: {run.root} learnt on the built-in site, not on {given.schema}; resume it "
                             "without --schema/--dataset, or start a new run with the dataset")
        return
    if given is None:
        return
    recorded = record.digest
    if recorded is None:
        try:
            own = record.given()
        except TrainerError:  # moved or damaged: nothing to compare with
            return
        recorded = own.content_digest() if own is not None else None
    if recorded is not None and recorded != given.content_digest():
        raise UsageError(f"--resume: {given.schema} holds other data than the dataset {run.root} learnt on "
                         f"({record.schema}, run.json); resume with that dataset (or with none: run.json names it), "
                         "or start a new run with this one")


def check_ignored(site: Site | None, seen: ObservationsConfig) -> None:
    """Refuse an ``observations.ignore`` name the dataset does not observe, before anything is written."""
    if site is None or seen.ignore == "auto" or not seen.ignore:
        return  # auto leaves out only what the site observes
    unknown = sorted(set(seen.ignore) - site.observed)
    if unknown:
        raise ConfigError(f"observations.ignore names {', '.join(map(repr, unknown))}, which {site.schema} does not "
                          f"observe (its observations: {', '.join(sorted(site.observed))}); fix the name or remove it")


@contextmanager
def reopen_run(run_dir: str | Path, device: str,
               check: Callable[[RunContext], None] | None = None) -> Iterator[RunContext]:
    """An existing run folder, locked and logged to, with its own config and dataset (re-evaluation). Every check
    comes first (the folder, its dataset, the device, then the caller's ``check`` of the run as it will be given): a
    refused command leaves the folder byte for byte as it was, its log included."""
    run = RunDir(Path(run_dir))
    if not run.config.is_file():
        raise UsageError(f"not a run folder: {run_dir} has no config.yaml (pass a folder made by trainer train or "
                         "night)")
    # Checked strictly (an emptied file would read as the defaults), kept as an earlier version made it.
    cfg = load_config([run.config], as_it_was_made(run))
    # Before the lock note and the log: a built-in site is checked too, to refuse a class CityLearn would run.
    site = RunRecord.load(run).given() or Site.load(run.site_schema, BUILT_IN, check=True, fallback=cfg.scenario)
    resolved = resolve_device(device)
    lock = RunLock(run.root).acquire()  # its note goes with it: a refusal below leaves the folder as it was
    try:
        ctx = RunContext(cfg, run, hold_out(site, cfg.holdout, run.unseen_year_site), resolved)
        if check is not None:
            check(ctx)
        logs.configure(run.log_file)
        record_held_out(run, ctx.site, cfg)
        yield ctx
    finally:
        lock.release()
