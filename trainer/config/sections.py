"""Typed, documented configuration.

Every key has a type, a range where it has one, and a one-line description
(``trainer config show --doc`` prints them). The models carry *no* defaults:
every default value lives in ``trainer/configs/default.yaml`` and nowhere else.

Reading, merging and validating the files is ``trainer.config.loading`` (:func:`load_config`).
"""

from __future__ import annotations

import hashlib
import json
import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, ValidationInfo, create_model, field_validator, model_validator

from trainer.base.durations import parse_clock, parse_duration
from trainer.base.errors import UsageError
from trainer.config.roster import AGENTS, ROSTER
from trainer.config.section import Section, doc

if TYPE_CHECKING:
    from trainer.config.agents import AgentConfig

# Package data, so a wheel install finds it as well as a checkout does.
CONFIG_DIR = Path(str(resources.files("trainer") / "configs"))
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"

MAX_SEED = 1_000_000  # the largest seed a config or --seeds takes
# An agent of the roster, as a config value (a typo is refused with the names it could be).
AgentName = Literal[AGENTS]  # type: ignore[valid-type]
# Whose policies an ensemble's members are: an agent's, or each agent's own.
TeacherName = Literal[(*AGENTS, "own")]  # type: ignore[valid-type]


class ScenarioConfig(Section):
    name: str = doc("Name of the built-in site, used in run names and the report.", min_length=1,
                    pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    location_name: str = doc("Human-readable location of the site.")
    latitude: float = doc("Site latitude in degrees north.", ge=-90, le=90)
    longitude: float = doc("Site longitude in degrees east.", ge=-180, le=180)
    altitude_m: float = doc("Site altitude above sea level in metres.", ge=-500, le=9000)
    timezone: str = doc("IANA time zone of the site's local clock (e.g. America/Los_Angeles).")

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}: use an IANA name such as America/Los_Angeles") from None
        return value
    year: int = doc("Calendar year simulated (hourly, 8760 steps; Feb 29 dropped).", ge=2000, le=2100)
    seed: int = doc("Seed of the site generator: the same config gives the same bytes.", ge=0)
    pv_kwp: float = doc("PV array DC size in kWp.", ge=0, le=10000)
    pv_tilt_deg: float = doc("PV tilt from horizontal in degrees.", ge=0, le=90)
    pv_azimuth_deg: float = doc("PV azimuth in degrees clockwise from north (180 = south).", ge=0, lt=360)
    pv_system_losses_pct: float = doc("PVWatts system losses (soiling, wiring, mismatch) in %.", ge=0, le=50)
    battery_kwh: float = doc("Battery usable capacity in kWh.", ge=0, le=100000)
    battery_kw: float = doc("Battery charge/discharge power limit in kW.", ge=0, le=100000)
    battery_efficiency: float = doc("Battery round-trip efficiency as a fraction (CityLearn applies its square root "
                                    "on the way in and on the way out).", gt=0, le=1)
    # The loads' and prices' ceilings keep a site in float32 and JSON (1e308 kW passed ge=0 and broke the baseline).
    building_base_kw: float = doc("Building load at night and weekends, kW.", ge=0, le=100000)
    building_occupied_kw: float = doc("Additional building load in occupied weekday hours, kW.", ge=0, le=100000)
    cooling_kw_per_degc: float = doc("Cooling load per degree C above 22 C in occupied hours, kW/C.", ge=0, le=10000)
    ev_chargers: int = doc("Number of EV chargers (the last one serves an overnight fleet van).", ge=0, le=50)
    charger_kw: float = doc("Maximum charging power of each charger in kW.", gt=0, le=350)
    charger_discharge_kw: float = doc("Power at which each charger may discharge a car into the site (V2G), kW; "
                                      "0 for none.", ge=0, le=350)
    charger_efficiency: float = doc("Charger efficiency as a fraction (grid kWh to kWh into the car).", gt=0, le=1)
    ev_battery_efficiency: float = doc("EV battery round-trip efficiency (its square root applies while charging).",
                                       gt=0, le=1)
    ev_battery_kwh: float = doc("Battery capacity of each EV in kWh.", gt=0, le=300)
    ev_departure_soc: float = doc("State of charge each EV requires at departure, fraction.", gt=0, le=1)
    carbon_mean_kg_per_kwh: float = doc("Annual mean grid carbon intensity, kg CO2/kWh.", gt=0, le=2)
    tariff_offpeak_per_kwh: float = doc("Time-of-use tariff, off-peak price per kWh.", ge=0, le=1000)
    tariff_peak_per_kwh: float = doc("Time-of-use tariff, peak price per kWh (16:00-21:00).", ge=0, le=1000)
    tariff_summer_peak_per_kwh: float = doc("Peak price per kWh in June-September.", ge=0, le=1000)
    currency: str = doc("Currency symbol of the tariff, used in the report.", min_length=1, max_length=8)
    train_episode_days: int = doc(
        "Length of a training episode in days (evaluation covers schedule.eval_days: the whole period by default).",
        ge=1, le=365)


class RewardConfig(Section):
    co2: float = doc("Weight of grid-import CO2 (kg, normalised by site scale x max intensity).", ge=0)
    cost: float = doc("Weight of import cost (normalised by site scale x max price).", ge=0)
    ev: float = doc(
        "Price of each kWh a car can no longer get by departure, as a multiple of the most that kWh "
        "can earn in the other terms (> 1 ranks serving cars above stranding them; docs/scenario.md).",
        ge=0,
    )
    grid: float = doc("Weight of the squared grid import (peak shaving), per site scale.", ge=0)
    storage: float = doc("Potential-based shaping that credits stored energy at its mean value as it is stored "
                         "(0 = off; leaves the optimal policy unchanged; docs/scenario.md).", ge=0, le=10)
    storage_gamma: float = doc("Discount the storage shaping assumes: set it to the agents' gamma.", gt=0, le=1)
    solar: float = doc("Weight of exported PV that could have been self-consumed, per site scale.", ge=0)

    @model_validator(mode="after")
    def _some_weight(self) -> RewardConfig:
        if self.co2 + self.cost + self.ev + self.grid + self.solar <= 0:
            raise ValueError("at least one reward weight must be positive")
        return self


class EvConfig(Section):
    guard: bool = doc("Raise every controller's EV charging to the least that still meets each car's departure "
                      "target (off: the reward alone must teach it; docs/scenario.md).")
    margin_soc: float = doc("Safety margin of the guard, as a fraction of the car's capacity.", ge=0, le=0.2)
    stop_at_target: bool = doc("The guard also stops charging a car once it holds its departure target (plus "
                               "margin_soc); on a V2G charger, once it holds that plus what it can still discharge "
                               "into the site before it leaves, discharging the rest: energy beyond the target leaves "
                               "with the car, imported for nothing (false lets controllers fill cars further).")
    target_met_pct: float = doc("Share of departures an agent must meet to be recommended in the report, %.",
                                ge=0, le=100)


# What ``observations.ignore: auto`` leaves out on a dataset of one period: the calendar's month and the weather its
# loads and PV already show. A policy that learnt from August-April read them to tell its months apart and met values
# it never learnt from in May-July: on the official EV Building_10 (seed 0, 20-minute nights) the best agent reached
# 73.1 % of the held-out optimum's cut reading them all, 75.6 % without the month, 76.9 % without the weather too
# (docs/agent-quality.md, "What the policy reads").
ONE_PERIOD_IGNORED = frozenset({
    "month",
    *(f"outdoor_{what}{ahead}" for what in ("dry_bulb_temperature", "relative_humidity")
      for ahead in ("", "_predicted_1", "_predicted_2", "_predicted_3")),
})

# What ``observations.load_ago_hours: auto`` adds on a dataset of one period: each building's loads yesterday at this
# hour and 3, 6 and 9 hours after it, what its meter said. The months held out can keep other habits than the months
# learnt from (the official EV Building_10 uses 0.4-0.7 kWh at 7-9 am in May-July, 1.5-3 in August-April), and
# yesterday tells a policy which hold now. 20-minute nights, the best agent's share of the held-out optimum's cut:
# +0.4 to +2.1 points on each of seven nights of Buildings 10, 5 and 4, -0.2 to -1.5 on Building_7's three with the
# ensemble (docs/agent-quality.md, "Yesterday's loads").
ONE_PERIOD_LOAD_AGO = (24, 21, 18, 15)
LOAD_NOW = "non_shiftable_load"
# What ``observations.forecast`` learns from: the hour, the grid's carbon intensity, each building's load and its PV's
# output (the last where a building has PV). Off by default: 20-minute nights on the official EV buildings reading
# it (``auto``: on a dataset of one period) moved the night's choice held out by +0.65 and +0.05 points of the
# optimum's cut on Building_5, +0.83 and +0.74 on Building_7, +0.76 on Building_4, and -1.36 and -2.83 on Building_10
# (seeds apart; docs/agent-quality.md, "The planner's forecast as observations"): a little more on three buildings,
# much less on the fourth.
FORECAST_READS = ("hour", "carbon_intensity", LOAD_NOW, "solar_generation")

# What ``warm_start.extra_draws: auto`` imitates: on the built-in site 8 other years of its climate (with the
# ensemble's ten members, default nights over three seeds +0.32 points of the optimum's cut held out against 3; seven
# added nothing to one imitation: docs/agent-quality.md, "Eight years on the built-in site too"), on a dataset of one
# period 16 years of its own days resampled and varied, the only other seasons its policy sees (on the official EV
# buildings, 20-minute nights with the ensemble, +0.75 points held out on average over four against three years:
# docs/agent-quality.md, "More varied years"; untimed nights on Building_10 and Building_5, every agent +0.6 to +1.7
# points with 16 against 8, "Sixteen years on a dataset"). A timed night short of time for them steps down to 8.
BUILT_IN_DRAWS = 8
ONE_PERIOD_DRAWS = 16
# A timed night without room for the ensemble over those years tries it over each of these below them, most first,
# before one imitation, which imitates no more than the last (trainer.night.plan.fit_ensemble, one_imitation).
FEWER_DRAWS = (8, 3)


Hours = Annotated[int, Field(ge=1, le=168)]
# A range of factors [low, high], each in (0, 10].
ScaleRange = tuple[Annotated[float, Field(gt=0, le=10)], Annotated[float, Field(gt=0, le=10)]]


class ObservationsConfig(Section):
    carbon_ahead_hours: list[Hours] = doc(
        "Hours ahead of grid carbon intensity added to the agents' observations "
        "(from the dataset: perfect forecasts); [] adds none.",
        max_length=48,
    )
    load_ago_hours: Annotated[list[Hours], Field(max_length=48)] | Literal["auto"] = doc(
        "Hours ago of each building's other loads (non_shiftable_load) added to the agents' observations, what the "
        "site's meter said then: [24, 21] is yesterday's this hour and 3 hours after it, a hint of today's; [] adds "
        "none; auto: on a dataset of one period yesterday's this hour and 3, 6 and 9 hours after it (its months "
        "held out may keep other habits), none on the built-in site (docs/scenario.md).",
    )
    ignore: Annotated[list[str], Field(max_length=64)] | Literal["auto"] = doc(
        "CityLearn observations the agents do not read (still checked by an export); auto: on a dataset of one "
        "period, the month and the weather its loads already show (a policy tells the months of its one year apart "
        "by them, and the months held out never showed it theirs), none on the built-in site, whose drawn years "
        "show every month (docs/scenario.md).",
    )

    forecast: bool | Literal["auto"] = doc(
        "Each building's net load (its other loads less its PV) and the grid's carbon intensity forecast for the next "
        "1-3, 4-8, 9-16 and 17-24 hours added to the agents' observations, as the planner forecasts them: their mean "
        "by hour of the day over the hours seen so far, weighted to the recent days, and this hour's deviation from "
        "it fading; learnt from the site's own readings, never from an hour to come (an export keeps learning it); "
        "auto: on a dataset of one period that observes the hour, carbon intensity and load, off on the built-in "
        "site; false by default (on the official EV buildings it moved 20-minute nights by -2.8 to +0.8 points of "
        "the optimum's cut; docs/scenario.md).")

    def reads_forecast(self, one_period: bool, observed: frozenset[str]) -> bool:
        """Whether the agents read the forecast on a site of ``one_period`` that observes ``observed``."""
        if self.forecast != "auto":
            return self.forecast
        return one_period and set(FORECAST_READS[:3]) <= observed

    def load_look_back(self, one_period: bool, observed: frozenset[str]) -> tuple[int, ...]:
        """The hours ago of each building's load the agents read on a site of ``one_period`` that observes
        ``observed``: auto reads them on a dataset of one period whose load is observed, a list as given."""
        if self.load_ago_hours != "auto":
            return tuple(self.load_ago_hours)
        return ONE_PERIOD_LOAD_AGO if one_period and LOAD_NOW in observed else ()

    def ignored(self, one_period: bool, observed: frozenset[str]) -> frozenset[str]:
        """The observations left out on a site of ``one_period`` (a dataset: its one year) that observes
        ``observed``; a name given by hand is kept whether observed or not (the site refuses it by name)."""
        if self.ignore != "auto":
            return frozenset(self.ignore)
        return ONE_PERIOD_IGNORED & observed if one_period else frozenset()


class WarmStartConfig(Section):
    epochs: int = doc("Epochs of imitating the optimum's dispatch before a fresh agent learns from the reward, each "
                      "as many samples as the dataset's period, drawn from all the demonstrations (0 = off: learn from "
                      "scratch); on a dataset of one period at most this many, the best on its last 28 days kept "
                      "(docs/agent-quality.md).", ge=0, le=2000)
    extra_draws: Annotated[int, Field(ge=0, le=20)] | Literal["auto"] = doc(
        "Other years of the site (the built-in site's climate drawn again, a dataset's own days resampled; seeds + "
        "2000, 2001, ...) whose optimum the policy imitates too, built once into the run's demonstration-sites/: a "
        f"policy that keeps to the optimum in closed loop; auto: {BUILT_IN_DRAWS} on the built-in site, "
        f"{ONE_PERIOD_DRAWS} on a dataset of one period, whose varied years are all it sees of other seasons; a timed "
        f"night short of time for the ensemble over them imitates {' or '.join(map(str, FEWER_DRAWS))}, one "
        f"imitation {FEWER_DRAWS[-1]} "
        "(docs/agent-quality.md, docs/schedule.md).")
    draw_load_scale: ScaleRange = doc(
        "On a dataset of one period, each block (about a week) of a resampled year the warm start imitates has its "
        "loads scaled by a factor drawn log-uniformly from [low, high]: its optimum then shows the policy lighter and "
        "heavier weeks than the part learnt from holds, as months held out may be; [1, 1] = as in the data. The "
        "built-in site's drawn years are its climate, never scaled (docs/agent-quality.md).")
    draw_load_shape: float = doc(
        "On a dataset of one period, each block of those years also has its loads follow a daily profile of its own "
        "(1 + a cos, a drawn from [0, this], its peak at any hour; the day's energy kept): days whose peaks fall at "
        "other hours than the data's, as months held out may have them; 0 = the data's daily course (the default: 0.6 "
        "moved the official EV buildings' best agent by -0.1 points on average, docs/agent-quality.md).", ge=0, lt=1)
    draw_solar_scale: ScaleRange = doc("The same for the PV's output per kW in those blocks and the irradiance the "
                                       "policy reads, now and forecast (a sunnier or duller week than the data's); "
                                       "[1, 1] = as in the data.")
    ensemble: int = doc("Imitations from this many initial weights (the seed, then + 1000, + 2000, ...) whose mean "
                        "action, run over each year of the demonstrations, the agent's policy then imitates: one "
                        "network nearer the optimum than one imitation on average over seeds (each member costs an "
                        "imitation; 1 = a single imitation; docs/agent-quality.md).", ge=1, le=16)
    ensemble_min_steps: int = doc("An untimed run whose agents train fewer steps than this imitates once, not the "
                                  "ensemble (its ten imitations, their labels and the student took 13.5 minutes of a "
                                  "quiet 2-core machine, many times a short run's learning); 0 = the ensemble "
                                  "whatever the run's length.", ge=0)
    members_kept: float = doc("On a dataset with a validation part, the share of the ensemble's members whose mean "
                              "action the student imitates: those whose policies did best over the validation part "
                              "(rounded up; a 28-day drive each, ~1.5 s); 1.0 = all. The best half's mean beat the "
                              "student of all ten's held out on 10 nights of 11 with 256x256 members, not with the "
                              "64x64 ones sac.net_arch: auto builds on a dataset (-0.14 points; "
                              "docs/agent-quality.md).",
                              gt=0, le=1)
    student_epochs: int = doc("Epochs of the one network that imitates the ensemble's mean action (each as many "
                              "samples as the dataset's period): it must fit the mean closely to keep it in closed "
                              "loop: three times an imitation's 400 by default, at a decaying rate "
                              "(student_decay; docs/agent-quality.md).", ge=1, le=5000)
    member_processes: int = doc("Processes that imitate the ensemble's members side by side, one torch thread "
                                "each (trainer.learn.warm_start.members): 0 = one a core free of other work, at "
                                "most 4, on a CPU, and in an untimed night the later stages' students beside the "
                                "first's (trainer.learn.warm_start.students); 1 = the stage's own process alone.",
                                ge=0, le=16)
    student_critic_epochs: int = doc("The first epochs of the student's, in which its critic (PPO's and A2C's value, "
                                     "SAC's Q networks) fits the returns too; the actor fits all student_epochs (a "
                                     "critic learning from rewards after needs no closer fit than one imitation's).",
                                     ge=0, le=5000)
    student_decay: bool = doc("The student's learning rate falls from learning_rate to 0 over its epochs (a "
                              "cosine): it fits the members' mean closer in half the epochs of a constant rate "
                              "(docs/agent-quality.md); false: constant, as an imitation's.")
    teacher: TeacherName = doc(
        "Whose policy the ensemble's members are: one agent's (one ensemble a night; the others distil its members' "
        "mean, reusing them within a process), or own: each agent imitates with its own policy. SAC's imitations "
        "fit the optimum closest: PPO taught by them deployed 94.2 % of the optimum's cut over three seeds, by its "
        "own 91.3 % (docs/agent-quality.md).")
    pick_best: bool = doc("With an ensemble on a built-in site, for the agent whose policy the members are (teacher): "
                          "the warm start is whichever of the members and their distilled mean emits least CO2 "
                          "over the held-out years (the training simulator judges; "
                          "a member's rank there is its rank over the evaluation year), not always the mean; "
                          "off: a better start that has not yet made a night end higher (docs/agent-quality.md).")
    reuse_demonstrations: bool = doc("Reuse the optimum's replay an earlier run kept for the same data, period, seed, "
                                     "site settings and program (the machine's cache) instead of replaying it in "
                                     "CityLearn again (a minute a year on 2 cores).")
    learning_rate: float = doc("Adam learning rate of the imitation.", gt=0, le=1)
    batch_size: int = doc("Minibatch size of the imitation.", ge=1)
    policy_std: float = doc("PPO's and A2C's exploration standard deviation after the imitation (SB3 starts at 1, "
                            "which undoes the imitation); SAC keeps SB3's.", gt=0, le=1)
    sac_temperature: float = doc("SAC's entropy temperature after the imitation, then learned as SB3 does (SB3 starts "
                                 "at 1, where the entropy bonus outweighs this reward ~100 times and pulls the policy "
                                 "to the middle of its range).", gt=0, le=10)
    sac_bc_alpha: float = doc("TD3+BC's alpha for SAC after the imitation: the actor's loss keeps it near the "
                              "demonstrations, weighted mean |Q| / alpha (larger imitates less; 0 = off).", ge=0)
    sac_critic_updates: int = doc("SAC's first gradient updates after the imitation train its critics alone (actor and "
                                  "temperature wait): the imitation fitted them at the demonstrations' actions only, "
                                  "so their slope in the action, which the actor follows, means nothing yet (0 = off; "
                                  "docs/agent-quality.md).", ge=0)
    ppo_bc_weight: float = doc("PPO after the imitation: each gradient step adds this weight times the mean squared "
                               "distance of its policy's mean to the demonstrations' actions (a behaviour-cloning "
                               "term, as DAPG adds; larger imitates more; 0 = off).", ge=0)
    a2c_bc_weight: float = doc("The same term for A2C (0 = off).", ge=0)

    @field_validator("draw_load_scale", "draw_solar_scale")
    @classmethod
    def _low_then_high(cls, value: tuple[float, float], info: ValidationInfo) -> tuple[float, float]:
        if value[0] > value[1]:
            raise ValueError(f"warm_start.{info.field_name} is [low, high]; got {list(value)}: swap them")
        return value

    def draws(self, one_period: bool) -> int:
        """The other years imitated on a site of ``one_period`` (a dataset: its own days resampled): auto asks it."""
        if self.extra_draws != "auto":
            return self.extra_draws
        return ONE_PERIOD_DRAWS if one_period else BUILT_IN_DRAWS

    def members_meaned(self, members: int, ranked: bool) -> int:
        """How many of ``members`` make the mean the student imitates: the members_kept share where they are
        ``ranked`` on a validation part (rounded up: at least one), else all. The tolerance keeps a product that is
        whole in decimal whole in binary (0.3 x 10 is 3.0000000000000004, not 4 members)."""
        return max(1, math.ceil(self.members_kept * members - 1e-9)) if ranked and self.members_kept < 1.0 else members

    def teacher_of(self, agent: str) -> str:
        """The agent whose policy ``agent``'s ensemble members are (``teacher``, or the agent itself for own)."""
        return agent if self.teacher == "own" else self.teacher

    @property
    def members_fit_critics(self) -> bool:
        """Whether an ensemble's members fit a critic too: only where one may become a stage's start (``pick_best``);
        otherwise only their mean action is used, and SAC's actor alone costs a third of its minibatch."""
        return self.pick_best

    def picks_a_member(self, agent: str) -> bool:
        """Whether ``agent``'s warm start chooses among an ensemble's members and their mean (over the held-out
        years): only members of its own policy can be its start."""
        return self.pick_best and self.ensemble > 1 and self.teacher_of(agent) == agent


class TrainConfig(Section):
    simulator: Literal["auto", "vector", "citylearn"] = doc(
        "What agents train on: vector (the training simulator, many sites as arrays in one process; "
        "docs/simulator.md), citylearn (CityLearn itself, in worker processes), or auto (vector where the dataset "
        "is one it models, else citylearn). Evaluation, references and every reported figure always use CityLearn.")
    choose_on: Literal["auto", "citylearn"] = doc(
        "Where the night's choices run (the learning curve that picks the policy to deploy, the pick's confirmation "
        "over held-out years, the warm start's ensemble labels): auto, the training simulator where agents train on it "
        "and it steps the site as CityLearn does (the built-in site; docs/simulator.md, \"Parity\"), CityLearn "
        "elsewhere (and with train.simulator: citylearn); citylearn, "
        "always CityLearn. Every figure in results.json and the report is CityLearn's either way.")
    keep_best: bool = doc("Deploy the best policy the stage has seen on the validation window (its warm start or a "
                          "learning-curve point; trainer.learn.selection), not merely the last one.")
    shortlist: int = doc("Policies the learning curve keeps, the best on the validation window, for the held-out "
                         "years to choose among where those are whole years judged on the training simulator (the "
                         "built-in site): four weeks rank policies 0.1 % apart by luck, two years as the year "
                         "judged does (docs/agent-quality.md); 1 = the window's pick alone.", ge=1, le=20)
    patience: float = doc("End a stage once this share of its timesteps has passed without a better policy on the "
                          "validation window (with keep_best, which deploys the best seen: the steps after it only "
                          "cost time); 0 = train to the target.", ge=0, le=1)
    sites: int = doc("Sites the training simulator steps at once for PPO and A2C when their n_envs is 0 (the "
                     "largest divisor of n_steps up to this; docs/simulator.md).", ge=1, le=4096)


class HoldoutConfig(Section):
    share: float = doc("Share of a one-period dataset's period held out at its end, its last months (deploying next "
                       "season): nothing the agents learn from reads it, and the headline figures are judged on it; "
                       "the built-in site holds out another year of its climate instead. 0 = none: every figure is "
                       "in-sample (--holdout none).", ge=0, le=0.5)
    eval_schema: str | None = doc("A CityLearn schema.json (or its folder) to judge on instead: another period or "
                                  "another building with the same devices; the dataset's own period is then all "
                                  "for learning (--eval-schema).")
    eval_dataset: str | None = doc("A CityLearn dataset name to judge on instead, found as --dataset finds one "
                                   "(--eval-dataset).")

    @model_validator(mode="after")
    def _one_eval_dataset(self) -> HoldoutConfig:
        if self.eval_schema is not None and self.eval_dataset is not None:
            raise ValueError(f"set only one of eval_schema ({self.eval_schema!r}) or eval_dataset "
                             f"({self.eval_dataset!r})")
        return self


class GpuConfig(Section):
    device: Literal["auto", "cpu", "cuda"] = doc("Torch device: auto picks cuda when available.")
    cudnn_benchmark: bool = doc("torch.backends.cudnn.benchmark on CUDA.")
    tf32: bool = doc("Allow TF32 matmuls and convolutions on CUDA (Ampere or newer); off: no gain measured.")
    deterministic: bool = doc("torch.use_deterministic_algorithms on CUDA (slower, reproducible).")
    cpu_threads: int = doc("torch intra-op CPU threads; 0 = one where environment workers run beside the learner "
                           "(the defaults), one per free core (the cores less the load of other work) for SAC "
                           "without learn_while_stepping (docs/benchmarks.md).",
                           ge=0, le=256)


class ScheduleConfig(Section):
    agents: list[AgentName] = doc("Agents trained by `trainer night`, in order.", min_length=1)
    weights: dict[AgentName, Annotated[float, Field(ge=0)]] = doc(
        "Share of the night's training time per agent (targets are each agent's timesteps); 0 gives it none.")
    budget: str | None = doc("Default time budget, e.g. 10h or 90m (overridden by --budget/--finish-by).")
    finish_by: str | None = doc("Default local finish time HH:MM (overridden by --budget/--finish-by).")
    curve_every_steps: int = doc("Evaluate the policy for the learning curve every this many steps.", ge=1)
    curve_eval_days: int = doc("Days of the validation window: each learning-curve evaluation, which also chooses "
                               "the policy an agent deploys (train.keep_best).", ge=1, le=365)
    curve_max_share: float = doc(
        "Most of a stage's time its learning-curve evaluations (in CityLearn) may take: on a fast learner they "
        "wait longer than curve_every_steps between them.", gt=0, le=1)
    last_stage_past_target: float = doc(
        "A timed night's last training stage (one process, no stage after it to use the time) learns on past its "
        "target to its slot's end, to at most this many times its target, its learning rate held at its end value "
        "past the target; the best policy seen still deploys. 1 = it stops at its target, and the night ends early "
        "by what is left (docs/schedule.md).", ge=1, le=100)
    reuse_references: bool = doc(
        "Reuse the references' figures of an earlier run with the same data, periods, seed, site settings and "
        "program (kept in the machine's cache) instead of evaluating them again.")
    quick_timesteps: dict[AgentName, Annotated[int, Field(ge=1)]] = doc(
        "Timesteps per agent with --quick (a smoke run of the whole schedule)."
    )
    eval_days: int | None = doc("Evaluation length in days from the dataset's start; null = the whole period.", ge=1)
    quick_eval_days: int = doc("Evaluation length in days with --quick (at most eval_days), so a smoke run is quick.",
                               ge=1)
    quick_warm_start_epochs: int = doc("Imitation epochs with --quick (at most warm_start.epochs), of the dataset's "
                                       "own period only (no extra draws) and with no SAC critics-first phase, so a "
                                       "smoke run is quick.", ge=0)

    @field_validator("budget", "finish_by")
    @classmethod
    def _a_duration_or_clock_time(cls, value: str | None, info: ValidationInfo) -> str | None:
        parse = parse_duration if info.field_name == "budget" else parse_clock
        if value is not None:
            _as_value_error(parse, value, "it")
        return value

    @field_validator("weights")
    @classmethod
    def _some_weight(cls, weights: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        agents = info.data.get("agents") or []  # absent where agents itself was refused: that error is said
        if agents and not any(weights.get(agent, 1.0) > 0 for agent in agents):  # a missing weight is 1
            raise ValueError(f"every agent of the night has weight 0 ({weights}): give at least one of "
                             f"{', '.join(agents)} a weight above 0")
        return weights

    @model_validator(mode="after")
    def _budget_or_deadline(self) -> ScheduleConfig:
        if self.budget is not None and self.finish_by is not None:
            raise ValueError(f"set only one of budget ({self.budget!r}) or finish_by ({self.finish_by!r})")
        return self


def _as_value_error(parse: Any, value: str, option: str) -> None:
    """The night's own parsers, as a config check (pydantic reports ValueErrors with the key)."""
    try:
        parse(value, option)
    except UsageError as exc:
        raise ValueError(str(exc)) from None


class RayConfig(Section):
    max_retries: int = doc("Times a stage whose worker died (killed, node lost) is run again from its checkpoint.",
                           ge=0, le=100)
    stop_timeout_s: float = doc("On Ctrl+C or SIGTERM, seconds the running stages get to save a checkpoint.", gt=0)
    num_cpus: dict[str, float] = doc("CPUs per stage on Ray: one key per agent, and eval (references, report).")
    num_gpus: dict[str, float] = doc("GPUs per stage on Ray (fractions share one: 0.5 runs two stages on a GPU); "
                                     "0 = the stage runs on the CPU.")
    memory_headroom_gb: float = doc("Memory reserved per stage beyond an off-policy agent's replay buffer, GB.", ge=0)

    @field_validator("num_cpus", "num_gpus")
    @classmethod
    def _stages(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = set(value) - {*AGENTS, "eval"}
        if unknown:
            raise ValueError(f"unknown stage(s) {', '.join(sorted(unknown))}: use {', '.join(AGENTS)} or eval")
        if any(v < 0 or v != v for v in value.values()):
            raise ValueError("resources must be 0 or more")
        return value


class ReliabilityConfig(Section):
    keep_checkpoints: int = doc(
        "Checkpoints kept per stage (older ones are pruned once a new one is complete).", ge=1, le=100
    )
    min_batch_size: int = doc("Out-of-memory backoff halves the batch down to this floor, then stops.", ge=1)
    batch_memory_fraction: float = doc(
        "Share of free memory a training batch may use before it is backed off up front.", gt=0, le=1
    )
    nonfinite_lr_factor: float = doc(
        "A NaN/inf loss or parameter rolls back and multiplies the learning rate by this.", gt=0, lt=1
    )
    nonfinite_retries: int = doc("Rollbacks for non-finite values before the stage stops.", ge=0)
    checkpoint_min_interval_s: float = doc(
        "Checkpoints are at least this many seconds apart, whatever checkpoint_freq_steps says: on the training "
        "simulator 1,000 steps take a fraction of a second. A stop signal still saves at once.", ge=0)


class MonitorConfig(Section):
    interval_s: float = doc("Seconds between monitor samples.", gt=0)
    util_low_pct: float = doc("Warn when GPU utilisation stays under this %...", ge=0, le=100)
    util_low_window_s: float = doc("...for this many seconds.", ge=0)
    temp_high_c: float = doc("Warn when GPU temperature is over this, degrees C.", gt=0)
    memory_high_pct: float = doc("Warn when GPU memory use is over this %.", gt=0, le=100)
    max_bytes: int = doc("Rotate the monitor file past this size.", ge=1024)
    backups: int = doc("Rotated monitor files kept (monitor.jsonl.1, .2, ...).", ge=0, le=100)


class OutputConfig(Section):
    root: str = doc("Folder holding run folders (relative to the working directory).", min_length=1)
    run_name: str = doc("Run folder name template: {scenario}, {command}, {seed}, {time}; one folder name.",
                        min_length=1)

    @field_validator("run_name")
    @classmethod
    def _one_folder_name(cls, value: str) -> str:
        try:
            name = value.format(scenario="s", command="c", seed=0, time="t")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"unknown placeholder {exc} in {value!r}: use {{scenario}}, {{command}}, {{seed}}, "
                             "{time}") from None
        if "/" in name or "\\" in name or name in (".", "..") or name.startswith(".."):
            raise ValueError(f"{value!r} must name one folder inside output.root (no '/', '\\' or '..')")
        return value
    tensorboard: bool | Literal["auto"] = doc(
        "TensorBoard events beside progress.csv: auto (when the tensorboard package is installed, silently off "
        "otherwise), true (warn when it is missing) or false.")


class TuneConfig(Section):
    """`trainer tune AGENT`: the hyperparameter search (docs/tune.md)."""

    trials: int = doc("Most trials the search runs (it stops earlier at its budget's search share).", ge=1, le=10_000)
    trial_timesteps: dict[AgentName, Annotated[int, Field(ge=1)]] = doc(
        "Training steps of one trial, per agent: a fraction of a night's, on the training simulator.")
    seeds: int = doc("Seeds each trial is trained under; its score is their mean.", ge=2, le=10)
    warm_start_ensemble: int = doc("The warm start's members in a trial (a night's ten cost minutes each).",
                                   ge=1, le=32)
    rerun_top: int = doc("The best settings re-run on fresh seeds, with the defaults beside them.", ge=1, le=10)
    rerun_seeds: int = doc("Fresh seeds each re-run is trained under.", ge=2, le=10)
    rerun_share: float = doc("Share of the budget kept for the re-runs.", gt=0, lt=1)
    rerun_eval_days: int = doc("Days of the held-out part a re-run is judged on (its first ones).", ge=1, le=366)
    startup_trials: int = doc("Trials sampled at random before TPE models the scores, and before any is pruned.",
                              ge=1)
    ev_shortfall_cost: float = doc("A score's penalty per point of EV departures met below ev.target_met_pct, as a "
                                   "share of its CO2.", ge=0, le=1)


class _Sections(Section):
    """Every section but the agents' (added from the roster, below)."""

    # CityLearn seeds episode k of worker i with (seed + 1 + 7919 i)(k + 1), which NumPy needs below 2**32.
    seed: int = doc("Global seed for Python, NumPy, torch and the environment.", ge=0, le=MAX_SEED)
    scenario: ScenarioConfig
    reward: RewardConfig
    ev: EvConfig
    observations: ObservationsConfig
    warm_start: WarmStartConfig
    train: TrainConfig
    holdout: HoldoutConfig
    gpu: GpuConfig
    schedule: ScheduleConfig
    reliability: ReliabilityConfig
    ray: RayConfig
    monitor: MonitorConfig
    output: OutputConfig
    tune: TuneConfig

    def agent(self, name: str) -> AgentConfig:
        """The config section of an agent of the roster."""
        return getattr(self, name)

    def on_site(self, one_period: bool) -> Self:
        """This config with every ``auto`` that depends on the site settled (an agent's network size), for a site of
        ``one_period`` (a dataset: its one year) or the built-in site: done once where a run's site is first known,
        so config.yaml, checkpoints and every stage hold the value (the observations' and the warm start's autos are
        asked of the site as they are read: ``trainer.site.Site``)."""
        settled = {name: self.agent(name).on_site(one_period) for name in AGENTS}
        changed = {name: section for name, section in settled.items() if section is not self.agent(name)}
        return self.model_copy(update=changed) if changed else self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def digest(self) -> str:
        """A stable hash of the resolved config (checkpoints refuse a changed one)."""
        payload = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:16]


# The whole config: the sections above and one per agent of the roster (cfg.sac, cfg.ppo, ...), each its own
# section class, so a new agent needs no edit here.
Config = create_model("Config", __base__=_Sections, __module__=__name__,
                      **{name: (spec.section, ...) for name, spec in ROSTER.items()})
Config.__doc__ = "The resolved config: every section, and one per agent of the roster."
