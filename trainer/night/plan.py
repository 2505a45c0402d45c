"""The night's plan: a timeline from measured speeds (``calibrate``), and configs that cannot fit."""

from __future__ import annotations

import math
import tempfile
from datetime import datetime
from pathlib import Path

from trainer.base.beside import in_turn
from trainer.config.agents import OffPolicyConfig
from trainer.config.roster import agent_spec
from trainer.config.sections import FEWER_DRAWS, Config
from trainer.learn.selection import shortlist_size
from trainer.learn.warm_start.members import processes_beside
from trainer.learn.warm_start.validation import CHECK_AT, imitation_parts, validation_part
from trainer.night.budget import SAFETY, PlannedStage, StageKind, StageSpec, forecast
from trainer.night.calibrate import Speeds, calibrate
from trainer.references import reuse as reuse_references
from trainer.references.roster import REFERENCE_ROSTER, REFERENCES
from trainer.run.device import agent_device, apply_gpu_flags, free_cores, resolve_device
from trainer.run.session import site_for, training_targets
from trainer.sim.simulators import chooses_on_simulator
from trainer.site import Site
from trainer.site.holdout import hold_out
from trainer.site.scenario import HELD_OUT_YEARS

# The report (report.md, its plots): 0-2 s in each of 41 nights measured (2026-11/12, the built-in site and the
# official EV buildings, quiet and beside other work); planned at 20 s, a busy 20-minute night ended 77 s early.
REPORT_S = 8.0
# A year of the warm start's demonstrations beyond its replay: the linear program and, for a draw, building the site.
DEMONSTRATION_SOLVE_S = 3.0
# One call of a policy on a few states (SB3's predict): ~0.7 ms for SAC's 256x256 and PPO's 64x64 alike on 2 loaded
# cores, most of it SB3's own; the warm start's ensemble makes one call a member a step.
POLICY_CALL_S = 0.0007
# An imitation checked on a validation part (a dataset of one period) stops after two checks no better than its best
# (trainer.learn.warm_start.validation): on an official EV building (Building_5, 2026-11-30) ten members ran 100 to 400
# of their 400 epochs, 160 on average, and a night's single imitations 100 and 200. The plan counts this share of them.
CHECKED_EPOCHS_SHARE = 0.5
# The most of a timed night the warm starts' ensembles may take (fit_ensemble)...
ENSEMBLE_SHARE = 0.25
# ...unless the whole night with them, every agent to its target, fits in this share of its time: then its targets
# end it, not its deadline, and the time they leave imitates the ensemble. The whole, every part padded by SAFETY,
# is no tight figure: on the official EV Building_10 (2026-11-30, quiet) it said 14 minutes for a night that took 9.7,
# and at 0.8 a first night there (its references not yet kept) ran one imitation, 2-4 points under the ensemble's.
ENSEMBLE_SPARE = 1.0
REUSED_S = 1.0  # a reference's figures copied from an earlier run
BESIDE_START_S = 6.0  # a process beside this one (trainer.base.beside): ~5 s of imports before its work
# A step of the training simulator judging one policy or a few side by side (trainer.sim.simulators.judging_env), as
# a share of a CityLearn evaluation step at the calibrated rate: both are Python-bound. Measured on the 2-core VM's
# built-in site, the policies' calls apart: 3.1 ms against CityLearn's 4.0 (a year: 27.1 s against 35.3), most of it
# the EV guard's small arrays.
SIM_STEP_SHARE = 0.8


def stage_specs(
    cfg: Config, site: Site, speeds: Speeds, agents: list[str], targets: dict[str, int], one_process: bool = True
) -> dict[str, StageSpec]:
    """What the planner knows of each stage (evaluation times padded by SAFETY); ``one_process``: the backend runs
    every stage in this process, so a stage reuses what an earlier one computed (backends.py)."""
    def evaluated(part: Site) -> int:
        return part.length - 1 if cfg.schedule.eval_days is None else min(cfg.schedule.eval_days * 24,
                                                                           part.length) - 1

    eval_steps = evaluated(site)
    # Every final evaluation runs on the part learnt from and on the part held out (trainer.night.stages.judged).
    judged_steps = eval_steps + (evaluated(site.held_out.site) if site.held_out is not None else 0)
    eval_s = judged_steps / speeds.eval_steps_per_s * SAFETY
    # A trained policy adds its forward pass to every evaluation step (one call a step: SB3's predict).
    policy_eval_s = eval_s + judged_steps * POLICY_CALL_S * SAFETY
    # Each reference's evaluation as its row says: a multiple of the uncontrolled site's, and what it solves first.
    # One an earlier run evaluated on the same data and settings is copied (trainer.references.reuse).
    specs = {name: StageSpec(name, StageKind.EVAL, REUSED_S if reuse_references.stored(cfg, site, cfg.seed, name)
                             else eval_s * spec.eval_cost + spec.solve_s)
             for name, spec in REFERENCE_ROSTER.items()}
    specs["report"] = StageSpec("report", StageKind.REPORT, REPORT_S)
    # Short of time, or on a site the simulator steps as CityLearn does, the pick is confirmed on the training
    # simulator: each held-out year, the pick and its warm start side by side, one call each a step
    # (trainer.learn.selection.confirm_over_the_years).
    # What it confirms over is trainer.learn.selection.held_out_years: a dataset's validation part, else two years.
    confirms = confirms_over_years(cfg, site)
    check = validation_part(site) if confirms else None
    confirmed_steps = check.length if check is not None else HELD_OUT_YEARS * site.length

    # Two held-out years run side by side where a core is free (trainer.learn.selection._on_the_simulator): the
    # second in a process beside, which first imports the product. Counted in series, eleven policies' years were
    # planned at ~187 s where they took 78 (a quiet default night's SAC, 2026-12-01), and a quiet timed night would go
    # lean (its shortlist dropped) sooner than it needs to.
    side_by_side = check is None and free_cores(others=speeds.busy_now) >= 2

    def simulated(policies: int) -> float:  # one call of each policy a step
        if not confirms:
            return 0.0
        steps = confirmed_steps / HELD_OUT_YEARS * math.ceil(HELD_OUT_YEARS / 2) if side_by_side else confirmed_steps
        return (steps * (sim_step_s(speeds) + policies * POLICY_CALL_S) + (BESIDE_START_S if side_by_side else 0.0)) \
            * SAFETY

    # The pick, its runners-up on the window (train.shortlist) and the warm start; a night short of time judges the
    # pick alone with its warm start (trainer.night.stages._best_policy): eleven policies' two years would cost a busy
    # 20-minute night's SAC its slot.
    simulated_s = simulated(shortlist_size(cfg, site) + 1)
    # A dataset of one period confirms its pick on its validation part, 28 days, in CityLearn: the pick and its warm
    # start over them, not over two years as long as the evaluation (counted so, the plan said 69 s of evaluations
    # for each agent of a quiet night on the official Building_10, which took 10-27 s).
    validated_s = 0.0 if check is None else 2 * check.length * (1 / speeds.eval_steps_per_s + POLICY_CALL_S) * SAFETY
    on_simulator = chooses_on_simulator(cfg, site)
    lean_eval_s = policy_eval_s * policy_evaluations(cfg, site, lean=True) + simulated(2)
    agent_eval_s = (policy_eval_s * policy_evaluations(cfg, site, on_simulator=on_simulator)
                    + (simulated_s if on_simulator else validated_s))
    if cfg.train.keep_best:  # the last policy's evaluation on the validation window, after the slot (its candidacy)
        candidacy_s = policy_eval_s * min(cfg.schedule.curve_eval_days * 24, eval_steps) / judged_steps
        agent_eval_s += candidacy_s
        lean_eval_s += candidacy_s
    warm_starts = warm_start_s(cfg, site, speeds, agents, one_process)
    # The validation (learning-curve) evaluations take up to their share of a stage; with a four-week window
    # they do take it, on CityLearn and on the simulator alike (measured: a 20-minute night's SAC overran by 3 min).
    training_share = 1.0 - cfg.schedule.curve_max_share
    started_from: set[str] = set()
    for agent in agents:
        # An agent that starts from an earlier stage's warm start (A2C from PPO's imitation) reuses its evaluation in
        # a process of both (trainer.night.stages._evaluate_warm_start).
        policy = speeds.imitation_policy.get(agent) if agent_spec(agent).warm_start else None
        shared_s = policy_eval_s if one_process and policy is not None and policy in started_from else 0.0
        if policy is not None and cfg.warm_start.epochs > 0:
            started_from.add(policy)
        specs[agent] = StageSpec(agent, StageKind.TRAIN, agent_eval_s - shared_s,
                                 float(cfg.schedule.weights.get(agent, 1.0)),
                                 targets[agent], speeds.train_steps_per_s[agent] / SAFETY * training_share,
                                 setup_s=warm_starts.get(agent, 0.0),
                                 lean_fixed_s=lean_eval_s if lean_eval_s < agent_eval_s - shared_s else None,
                                 past_target=cfg.schedule.last_stage_past_target if one_process else 1.0,
                                 shares_warm_start=shared_s > 0)
    return specs


def sim_step_s(speeds: Speeds) -> float:
    """Seconds of a step of the training simulator judging a few policies (SIM_STEP_SHARE of CityLearn's)."""
    return SIM_STEP_SHARE / speeds.eval_steps_per_s


def confirms_over_years(cfg: Config, site: Site) -> bool:
    """Whether a trained stage confirms its pick against its warm start over held-out years (the built-in site's,
    with ``train.keep_best``; trainer.learn.selection)."""
    return cfg.warm_start.epochs > 0 and cfg.train.keep_best and site.kind.draws


def policy_evaluations(cfg: Config, site: Site, lean: bool = False, on_simulator: bool = False) -> int:
    """Evaluations as long as the final one (the part learnt from and the part held out) that a trained stage runs
    after training: its deployed policy; its warm start (results.json's warm_start); and, where it confirms its pick
    over held-out years in CityLearn, the pick and the warm start over each (a year each, so one such evaluation a
    year; the plan counted two a year and gave a busy 20-minute night's agents 220 s of evaluations each where they
    took 135). ``on_simulator``: the pick is confirmed on the training simulator; there, and on a dataset's
    validation part (28 days, not years), :func:`stage_specs` counts the confirmation apart. ``lean``: a night short
    of time confirms there too and leaves the warm start's evaluation, a comparison for the report, to ``trainer
    evaluate`` (a busy 20-minute night's agents spent 74 s each on it)."""
    if cfg.warm_start.epochs <= 0 or lean:
        return 1
    over_years = confirms_over_years(cfg, site) and not on_simulator and validation_part(site) is None
    return 2 + (HELD_OUT_YEARS if over_years else 0)


def warm_start_s(cfg: Config, site: Site, speeds: Speeds, agents: list[str],
                 one_process: bool = True) -> dict[str, float]:
    """Each warm-started agent's imitation (``warm_start.epochs`` of the period's minibatches at the calibrated
    speed; none for one whose policy an earlier agent imitated: the night reuses it), the first one's also the
    demonstrations: each year's optimum solved and replayed in CityLearn, the dataset's and
    ``warm_start.extra_draws`` more (a night computes them once a process: where each stage is its own,
    ``one_process`` False as on Ray, every agent computes its own). An imitation is reused by every process of the
    night (the run folder keeps it: trainer.learn.warm_start.saved), the ensemble's labels only within one. With
    ``warm_start.ensemble`` > 1, the student's imitation (``warm_start.student_epochs``) and, for the first agent
    its teacher's members teach, that many imitations at the teacher's speed and the members' mean action run
    over each year of the demonstrations; with ``warm_start.pick_best`` on the built-in site, the pick among them
    (the members and the student, one call each a step, over the held-out years;
    trainer.learn.warm_start.pick)."""
    settings = cfg.warm_start
    if settings.epochs <= 0:
        return {}
    period = site.length - 1
    minibatches_an_epoch = math.ceil(period / settings.batch_size)
    years = 1 + site.demonstration_draws(settings)
    free = free_cores(others=speeds.busy_now)  # as the stage will find them, if no busier
    # Where a core is free, the later half of the years replay, and run the members' mean, in a process beside the
    # stage's (optimum_demonstrations._replays, ensemble._ensemble_labels): the stage waits for the larger half.
    # Counted one after another, a quiet 20-minute night on Building_5 planned 306 s of demonstrations and 308 s of
    # labels for sixteen years that took 133 and 97 s, and nights that had room for them imitated eight.
    years_here = in_turn(years, site.length, free)
    demonstrations_s = years_here * (period / speeds.eval_steps_per_s * SAFETY + DEMONSTRATION_SOLVE_S)
    members = settings.ensemble
    # The agent's own network: the student where there is an ensemble, else the one imitation.
    own_epochs = settings.student_epochs if members > 1 else settings.epochs
    # The years side by side: each step of them costs each member one call.
    # On the training simulator where it steps the years as CityLearn does (the ensemble's _Year).
    year_step_s = sim_step_s(speeds) if chooses_on_simulator(cfg, site) else 1 / speeds.eval_steps_per_s
    # On a dataset the members are first ranked by a drive over the validation part each (the best members_kept
    # share of them make the mean: trainer.learn.warm_start.ensemble.best_members), once a process.
    check = imitation_parts(site, None).check
    meaned = settings.members_meaned(members, ranked=check is not None)
    rank_s = 0.0 if check is None or meaned == members else \
        members * check.length * (1 / speeds.eval_steps_per_s + POLICY_CALL_S) * SAFETY
    labels_s = 0.0 if members <= 1 else (years_here * year_step_s + meaned * POLICY_CALL_S) * period * SAFETY + rank_s
    pick_s = (members + 1) * HELD_OUT_YEARS * period * POLICY_CALL_S * SAFETY if site.kind.draws else 0.0
    # Each imitation of the optimum (the one, or each member) drives its validation part at its checks
    # (trainer.learn.warm_start.validation), every check counted; and stops after two no better than its best: it
    # is counted at CHECKED_EPOCHS_SHARE of its epochs.
    checks = sum(1 for e in CHECK_AT if e < settings.epochs) + 1
    check_s = 0.0 if check is None else checks * check.length * (1 / speeds.eval_steps_per_s + POLICY_CALL_S) * SAFETY
    checked = 1.0 if check is None else CHECKED_EPOCHS_SHARE
    out, imitated, taught = {}, set(), set()
    def actor_update_s(agent: str, full_s: float) -> float:  # a calibration before it was kept: the full update's
        return speeds.imitation_actor_update_s.get(agent, full_s)

    for agent in agents:
        if not agent_spec(agent).warm_start:
            continue
        policy = speeds.imitation_policy.get(agent)  # None from a calibration before it was recorded: imitates
        own_update_s = speeds.imitation_update_s.get(agent, 0.0)
        reused = policy in imitated
        # The student fits its critic in its first student_critic_epochs only, then the actor alone.
        critic_epochs = own_epochs if members <= 1 else min(settings.student_critic_epochs, own_epochs)
        own_s = (critic_epochs * own_update_s + (own_epochs - critic_epochs) * actor_update_s(agent, own_update_s))
        if members <= 1:  # the one imitation is checked, the student (of the members' labels) is not
            own_s *= checked
        seconds = (0 if reused else minibatches_an_epoch * own_s) * SAFETY
        if members <= 1 and not reused:
            seconds += check_s
        if settings.picks_a_member(agent) and not reused:
            seconds += pick_s
        teacher = settings.teacher_of(agent)
        members_of = speeds.imitation_policy.get(teacher, teacher)  # PPO's and A2C's own members are the same
        first_taught = members_of not in taught
        if members > 1 and first_taught:
            teacher_s = speeds.imitation_update_s.get(teacher, own_update_s)
            member_update_s = teacher_s if settings.members_fit_critics else actor_update_s(teacher, teacher_s)
            # Side by side in processes of their own where cores are free (trainer.learn.warm_start.members): as many
            # rounds as it takes, the stage's process on one thread as the others.
            member_minibatches = settings.epochs * checked * minibatches_an_epoch
            processes = 1 + processes_beside(settings, members, member_minibatches, agent_device(cfg, teacher), free)
            seconds += math.ceil(members / processes) * (member_minibatches * member_update_s * SAFETY + check_s)
        if members > 1 and (first_taught or not one_process):  # each process labels the members' mean itself
            seconds += labels_s
        out[agent] = seconds + demonstrations_s
        # The imitations are kept in the run folder for every process of the night (trainer.learn.warm_start.saved);
        # the demonstrations only in a process's memory.
        taught.add(members_of)
        if policy is not None:
            imitated.add(policy)
        if one_process:
            demonstrations_s = 0.0
    return out


def one_imitation(cfg: Config, site: Site) -> tuple[Config, str]:
    """``cfg`` with one imitation instead of the ensemble, over at most the last of FEWER_DRAWS other years: more
    years pay only with the ensemble's mean (on the built-in site one imitation of seven other years reached 91.4 and
    91.7 % where three gave 91.9 and 92.9: docs/agent-quality.md), and their demonstrations cost a short night's time.
    The second value names the years where they were cut (' over 3 other years'), else ''."""
    settings = cfg.warm_start
    years = site.demonstration_draws(settings)
    least = FEWER_DRAWS[-1]
    cut = {"extra_draws": least} if years > least else {}
    single = cfg.model_copy(update={"warm_start": settings.model_copy(update={"ensemble": 1, **cut})})
    return single, (f" over {least} {_years_word(site)}" if cut else "")


def ensemble_for_size(cfg: Config, site: Site, targets: dict[str, int]) -> tuple[Config, str | None]:
    """An untimed run's config with ``warm_start.ensemble`` as its size warrants, and why it changed (None: it did
    not): one imitation where no warm-started agent trains ``warm_start.ensemble_min_steps`` steps (ten imitations
    took ~15 minutes on 2 cores when each fitted its critics too: `trainer train sac --timesteps 2000` imitated ten
    members for an hour on a busy machine, then learnt for seconds; since the members fit their actor alone, side by
    side, the ten, their labels and SAC's student take 13.5 minutes on a quiet 2-core machine, docs/benchmarks.md)."""
    settings = cfg.warm_start
    steps = [t for a, t in targets.items() if agent_spec(a).warm_start]
    if settings.ensemble <= 1 or settings.epochs <= 0 or not steps or max(steps) >= settings.ensemble_min_steps:
        return cfg, None
    single, over = one_imitation(cfg, site)
    return single, (f"one imitation{over}, not the mean of {settings.ensemble}: the run trains {max(steps):,} steps, "
                    f"under warm_start.ensemble_min_steps ({settings.ensemble_min_steps:,}), and the ensemble would "
                    f"take many times its learning (a longer run imitates them)")


def fit_ensemble(cfg: Config, site: Site, speeds: Speeds, agents: list[str], available_s: float | None,
                 one_process: bool = True, targets: dict[str, int] | None = None,
                 references_done: bool = False, pace: float = 1.0) -> tuple[Config, str | None]:
    """The night's config with ``warm_start.ensemble`` as it fits, and why it changed (None: it did not).

    A night without a deadline runs the configured ensemble where its size warrants it (:func:`ensemble_for_size`,
    with its ``targets``). A timed night runs it only where its warm starts take
    at most ENSEMBLE_SHARE of the time: five SAC imitations and their student took 12.4 minutes on 2 cores, more
    than half a 20-minute night (ten and a longer-fitted student, the default, about half an hour), where one
    imitation leaves the time to reinforcement learning; or where the whole night with them (:func:`untimed_night_s`),
    each agent trained as far as a flat curve may end its stage (``train.patience`` of its target), fits in
    ENSEMBLE_SPARE of the time. On the official EV buildings (2026-11-30, seed 2) the ensemble's warm start was worth
    2-4 points of the optimum's cut over the months held out (Building_4's best 76 -> 79 %, Building_5's 77 -> 79 %),
    and the untimed nights with it took 8-10 minutes on a 2-core machine, where a 20-minute night with one imitation
    ended after 7, its curves flat. Smaller ensembles are not tried: the mean of two measured worse than its first
    member, of three below the best one imitation of five (docs/agent-quality.md). ``references_done``: asked again
    once the references have run (:func:`refit_ensemble`), the whole night is the agents' stages and the report, and
    ``available_s`` the time left, the estimates counted at the ``pace`` the night's stages have shown."""
    settings = cfg.warm_start
    if available_s is None and targets is not None:
        return ensemble_for_size(cfg, site, targets)
    if available_s is None or settings.ensemble <= 1 or settings.epochs <= 0:
        return cfg, None
    needed = sum(warm_start_s(cfg, site, speeds, agents, one_process).values()) * pace
    if needed <= ENSEMBLE_SHARE * available_s:
        return cfg, None
    # Asked again once the references have run, what is weighed is the time left, not the night's.
    of_time = (f"the {human_duration(available_s)} left" if references_done
               else f"the night's {human_duration(available_s)}")
    whole = ""
    if targets is not None:
        # Each agent as far as a flat curve may end its stage (train.patience): the steps the night owes it.
        share = cfg.train.patience or 1.0
        owed = {agent: int(steps * share) for agent, steps in targets.items()}
        whole_s = untimed_night_s(cfg, site, speeds, agents, owed, one_process, references=not references_done) * pace
        if whole_s <= ENSEMBLE_SPARE * available_s:
            reach = "its timesteps" if share >= 1.0 else f"{share:.0%} of its timesteps (train.patience)"
            return cfg, (f"the mean of {settings.ensemble} imitations{_over_years(site, cfg)}: with it every agent "
                         f"still reaches {reach} in ~{human_duration(whole_s)} of {of_time}")
        # Both figures the choice weighed: each is padded (SAFETY), and a night that then ends early shows by how much.
        whole = f", and the whole night with it ~{human_duration(whole_s)}"
    years = site.demonstration_draws(settings)
    fewer_years = [rung for rung in FEWER_DRAWS if rung < years]
    if fewer_years:
        # Fewer years before one imitation: on the official EV buildings eight resampled years gained 0.9-1.4 points
        # with the ensemble, where one imitation of them lost 1.2 (docs/agent-quality.md, "More varied years").
        fewer = cfg.model_copy(update={"warm_start": settings.model_copy(update={"extra_draws": fewer_years[0]})})
        kept, why = fit_ensemble(fewer, site, speeds, agents, available_s, one_process, targets, references_done,
                                 pace)
        if kept.warm_start.ensemble > 1:
            return kept, (f"{site.demonstration_draws(kept.warm_start)} {_years_word(site)} imitated, not {years}, "
                          f"to keep the mean of {settings.ensemble} imitations: with {years} the warm starts would "
                          f"take ~{human_duration(needed)}{whole}" + (f"; {why}" if why else ""))
    single, over = one_imitation(cfg, site)
    return single, (f"one imitation{over}, not the mean of {settings.ensemble}: with it the warm starts would take "
                    f"~{human_duration(needed)}, over {ENSEMBLE_SHARE:.0%} of {of_time}{whole} "
                    "(a longer night runs it)")


def untimed_night_s(cfg: Config, site: Site, speeds: Speeds, agents: list[str], targets: dict[str, int],
                    one_process: bool = True, references: bool = True) -> float:
    """How long the night would take with every stage whole: its warm starts, each agent to its target, every
    evaluation (padded, as the plan pads them); ``references``: theirs too (False: they have run)."""
    specs = stage_specs(cfg, site, speeds, agents, targets, one_process)
    return sum(spec.setup_s + spec.fixed_s + spec.needed_train_s for name, spec in specs.items()
               if references or name not in REFERENCE_ROSTER)


def _years_word(site: Site) -> str:
    """What the warm start's other years are on ``site``: its climate drawn again, or a dataset's days resampled."""
    return "other years" if site.kind.unseen_draws else "resampled years"


def _over_years(site: Site, cfg: Config) -> str:
    """' over N resampled years' where the warm start imitates more years than a night short of time keeps."""
    years = site.demonstration_draws(cfg.warm_start)
    return f" over {years} {_years_word(site)}" if years > FEWER_DRAWS[-1] else ""


def _weight(cfg: Config, site: Site) -> tuple[int, int]:
    """How much warm start ``cfg`` imitates on ``site``: its members, then the years they imitate."""
    return cfg.warm_start.ensemble, site.demonstration_draws(cfg.warm_start)


def left_out(fitted: Config, configured: Config, site: Site) -> bool:
    """Whether the night's first plan (``fitted``) left out some of the warm start ``configured``: the ensemble, or
    some of the years it imitates."""
    return _weight(fitted, site) != _weight(configured, site)


def refit_ensemble(cfg: Config, site: Site, speeds: Speeds, agents: list[str], targets: dict[str, int],
                   left_s: float, pace: float, current: Config | None = None, fitting: list[str] | None = None,
                   ) -> tuple[Config, dict[str, StageSpec], str] | None:
    """Once the references have run, before each agent's warm start until it is taken: the ensemble (and the years)
    the night's first plan (``current``) left out (``cfg`` as configured, not as fitted), where the time now
    ``left_s`` affords the stages of ``fitting`` (the agents still to train; None: all of ``agents``) at the
    ``pace`` the night's stages have shown: its config, the stages' specs with it and why; None where no more of it
    fits than ``current`` has. The first plan counts the references and a calibration's speeds, both padded, and a
    busy calibration under-promises (docs/benchmarks.md): busy 20-minute nights on official EV buildings ran one
    imitation and ended 6-8 minutes early, where the ensemble was worth 2-4 points there; a quiet one on Building_5
    took its 8 years' ensemble for ~22 minutes, where such a night took 15. Asked again before a later agent, it
    counts what the stages before left: a busy night on Building_10 whose SAC's curve went flat with 14 minutes
    left ran PPO and A2C from one imitation and ended 10 minutes early, where the ensemble's student of SAC's
    members gave them 3 points more."""
    fitting = agents if fitting is None else fitting
    if not any(agent_spec(agent).warm_start for agent in fitting):
        return None
    fitted, why = fit_ensemble(cfg, site, speeds, fitting, left_s, True, {agent: targets[agent] for agent in fitting},
                               references_done=True, pace=pace)
    # Only more than the plan has: fewer years than the earlier stages imitated would make a later agent imitate again
    # (it no longer shares their student) and worse (a quiet 20-minute night on Building_10 gave A2C three years where
    # PPO's student had eight: 4.3 minutes more for 1.5 % more CO2 held out; docs/schedule.md).
    if fitted.warm_start.ensemble <= 1 or (current is not None and _weight(fitted, site) <= _weight(current, site)):
        return None
    why = why or (f"the mean of {cfg.warm_start.ensemble} imitations{_over_years(site, fitted)}: the warm starts "
                  f"fit in {ENSEMBLE_SHARE:.0%} of the {human_duration(left_s)} left")
    # Every agent's spec for the timeline; those still to train as their stages will run it, the first of them
    # imitating the members (an earlier stage ran one imitation).
    specs = stage_specs(fitted, site, speeds, agents, targets, True)
    specs.update({agent: spec for agent, spec in stage_specs(fitted, site, speeds, fitting, targets, True).items()
                  if agent in fitting})
    return fitted, specs, why


def fit_warnings(cfg: Config, speeds: Speeds, planned: list[PlannedStage]) -> list[str]:
    """What the plan cannot give: a night short of time (lean), warm starts cut to their part of a slot, stages
    skipped, and stages that cannot reach their target in their slot, with the numbers and what would fit."""
    notes = []
    if any(stage.lean for stage in planned):
        notes.append("the night is short of time: the agents confirm their picks on the training simulator, not in "
                     "CityLearn (every reported figure is still CityLearn's)")
    for stage in planned:
        if stage.skipped:
            notes.append(f"{stage.name}: skipped, {stage.notes[0]}; give the night more time, or fewer --agents")
            continue
        if stage.setup_s < stage.planned_setup_s - 1:
            notes.append(f"{stage.name}: its warm start stops after ~{stage.setup_s / 60:.1f} of its "
                         f"~{stage.planned_setup_s / 60:.1f} min with the best it has, to leave learning time")
        if stage.target_steps <= 0 or stage.planned_steps >= stage.target_steps:
            continue
        agent = stage.name
        rate = speeds.train_steps_per_s[agent]
        note = (
            f"{agent}: {human_duration(stage.train_s)} at ~{rate:.3g} steps/s reaches ~{stage.planned_steps:,} of its "
            f"{stage.target_steps:,} timesteps"
        )
        section = cfg.agent(agent)
        update_s = speeds.update_s.get(agent)
        if (isinstance(section, OffPolicyConfig) and update_s is not None
                and section.gradient_steps / section.train_freq > 1):
            updates = section.gradient_steps / section.train_freq
            cost = updates * update_s
            note += (
                f"; gradient_steps={section.gradient_steps} / train_freq={section.train_freq} = {updates:g} gradient "
                f"updates per environment step at ~{update_s * 1000:.1f} ms each = {cost:.2f} s per step"
            )
            fit_rate = 1 / (1 / speeds.env_steps_per_s[agent] + update_s)
            note += (f"; with gradient_steps=1, train_freq=1 it would do ~{fit_rate:.0f} steps/s, "
                     f"~{int(fit_rate * stage.train_s):,} steps in the same slot")
        else:
            note += f"; to finish, set {agent}.timesteps to {stage.planned_steps:,} or give the night more time"
        notes.append(note)
    return notes


def human_duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


SPARE_WORTH_SAYING = 0.25  # a plan that leaves this share of its budget unused says why, and how to use it


def _using_spare(planned: list[PlannedStage]) -> str:
    trained = [s for s in planned if s.target_steps]
    if not trained:
        return ""
    steps = ", ".join(f"{s.name}.timesteps {s.target_steps:,}" for s in trained)
    return (f", and the agents' timesteps ({steps}) end the night; to use the time, raise them (--set "
            f"{trained[0].name}.timesteps=...) or train several seeds (trainer night --seeds 1,2,3)")


def render(planned: list[PlannedStage], deadline: datetime | None, notes: list[str], speeds: Speeds) -> str:
    lines = [f"plan ({speeds.machine}; speeds measured {speeds.measured_at})"]
    if speeds.busy:
        lines.append(f"  ! speeds measured while other work kept ~{speeds.busy_cores:.1f} cores busy: this plan may "
                     "give the agents less than a quiet machine would; `trainer plan --refresh` measures again "
                     "(a later plan on a quiet machine does so itself)")
    if speeds.busier_now:
        lines.append(f"  ! the machine is busy now (~{speeds.busy_now:.1f} cores of other work) and these speeds were "
                     "measured when it was not: each stage will take longer; the plan is made again after every "
                     "stage from the times measured, and each warm start stops at its part of the stage's time")
    for stage in planned:
        what = f"train {stage.planned_steps:,}/{stage.target_steps:,} steps + evaluate" if stage.target_steps else (
            "write the report" if stage.name == "report" else "evaluate")
        if stage.planned_steps > stage.target_steps > 0:  # the night's last stage, on past its target
            what = f"train {stage.target_steps:,}, on to ~{stage.planned_steps:,} + evaluate"
        if stage.skipped:
            what = "skipped: no time left for training"
        lines.append(f"  {stage.start:%a %H:%M}  {stage.name:<8} {what:<40} done {stage.end:%H:%M}")
    if deadline is not None:
        end = planned[-1].end if planned else datetime.now()
        lines.append(f"  deadline {deadline:%a %H:%M}; planned end {end:%a %H:%M}")
        spare = (deadline - end).total_seconds()
        if planned and spare > SPARE_WORTH_SAYING * (deadline - planned[0].start).total_seconds():
            lines.append(f"  the night ends {human_duration(spare)} early: the budget is a cap{_using_spare(planned)}")
    for note in notes:
        lines.append(f"  ! {note}")
    return "\n".join(lines)


def build_plan(cfg: Config, site: Site, speeds: Speeds, agents: list[str], targets: dict[str, int],
               start: datetime, deadline: datetime | None,
               one_process: bool = True) -> tuple[list[PlannedStage], list[str]]:
    specs = stage_specs(cfg, site, speeds, agents, targets, one_process)
    order = [*REFERENCES, *agents, "report"]
    available = (deadline - start).total_seconds() if deadline else None
    planned = forecast([specs[n] for n in order], start, available)
    return planned, fit_warnings(cfg, speeds, planned)



def plan_text(cfg: Config, given: Site | None, agents: list[str], quick: bool, deadline: datetime | None,
              refresh: bool = False) -> str:
    """``trainer plan``: calibrate (or read the cache) with the night's threads and flags, and render the plan."""
    device = resolve_device(cfg.gpu.device)
    apply_gpu_flags(cfg.gpu, device)
    with site_for(cfg, given) as whole, tempfile.TemporaryDirectory() as draws:
        site = hold_out(whole, cfg.holdout, Path(draws) / "held-out")  # as the night splits it
        speeds = calibrate(cfg, site, device, agents, refresh=refresh)
        targets = training_targets(cfg, agents, quick, site)
        now = datetime.now()
        cfg, why = fit_ensemble(cfg, site, speeds, agents, (deadline - now).total_seconds() if deadline else None,
                                targets=targets)
        planned, notes = build_plan(cfg, site, speeds, agents, targets, now, deadline)
    return render(planned, deadline, ([f"warm start: {why}"] if why else []) + notes, speeds)
