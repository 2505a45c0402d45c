"""A run's site: its dataset resolved once (schema read and checked, kind, period, scenario) and carried as one object.

Every part of a run asks the :class:`Site` it was handed rather than reading the schema again: how long its period
is, whether it can draw other years, where its files lie. Facts that need a CityLearn environment to learn (the
policy's sizes, what the training simulator cannot model) are remembered on the site the first time they are asked.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from trainer.base.errors import DatasetError
from trainer.base.files import DamagedFile
from trainer.config.sections import Config, ObservationsConfig, ScenarioConfig, WarmStartConfig
from trainer.site.bootstrap import Variation
from trainer.site.datasets import check_dataset, check_name, find_dataset, read_schema
from trainer.site.kinds import BUILT_IN, NAMED, SCHEMA, SiteKind, kind_of
from trainer.site.scenario import SCHEMA_FILE

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Site:
    """One CityLearn dataset as a run uses it."""

    kind: SiteKind
    schema: Path  # the schema.json CityLearn reads
    label: str | None  # how the run names it (a dataset's name or folder); None: the built-in site
    data: Mapping[str, Any] = field(repr=False)  # the schema's JSON, read and checked once
    scenario: ScenarioConfig | None = field(default=None, repr=False)  # what a built-in site was generated from
    held_out: HeldOut | None = field(default=None, repr=False)  # what the run judges on; None: in-sample figures
    # The site whose period a policy on this one learnt its scaling from (a draw's, a part held out's: the site the
    # run learns from); None: its own. trainer.env.citylearn.make_sb3_env reads it.
    scaled_as: Site | None = field(default=None, repr=False)
    _facts: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, schema: Path, given: SiteKind = SCHEMA, label: str | None = None, *, check: bool = False,
             fallback: ScenarioConfig | None = None) -> Site:
        """The site of ``schema``, read once (with ``check``, every file it names is opened too: a dataset a user
        gave). A built-in site's scenario is read from the schema; one an older version wrote, with keys since
        retired, takes ``fallback`` (the run's ``scenario`` section)."""
        data = check_dataset(schema) if check else read_schema(schema)
        kind = kind_of(data, given)
        scenario = None
        if kind is BUILT_IN:
            try:
                scenario = ScenarioConfig.model_validate(data["pvbess_site"])
            except (ValueError, KeyError):
                scenario = fallback or ScenarioConfig()
        return cls(kind, schema, label, data, scenario)

    # ----------------------------------------------------------------- the period

    @property
    def start(self) -> int:
        return int(self.data.get("simulation_start_time_step", 0))

    @property
    def length(self) -> int:
        """Steps in the schema's period (its end step included)."""
        return int(self.data.get("simulation_end_time_step", 8759)) - self.start + 1

    @property
    def end(self) -> int:
        """The period's last step."""
        return self.start + self.length - 1

    @property
    def steps_per_day(self) -> int:
        return max(1, round(86400 / int(self.data.get("seconds_per_time_step", 3600))))

    def period(self, first: int, last: int) -> Site:
        """This dataset over steps ``first``..``last`` of its files (the schema's period narrowed): CityLearn reads
        only those, and normalises observations by their range. Nothing learnt of the whole period carries over."""
        if not self.start <= first <= last <= self.end:
            raise ValueError(f"steps {first}..{last} are outside the period {self.start}..{self.end}")
        data = {**self.data, "simulation_start_time_step": first, "simulation_end_time_step": last}
        return replace(self, data=data, held_out=None, scaled_as=None, _facts={})

    def scaled(self, learnt_on: Site) -> Site:
        """This site as a policy that learnt on ``learnt_on`` reads it (its observations scaled as there)."""
        return replace(self, scaled_as=learnt_on)

    def learning_from(self, held_out: HeldOut) -> Site:
        """This site as the part a run learns from, carrying the part it is judged on."""
        return replace(self, held_out=held_out, _facts=self._facts)

    @property
    def observed(self) -> frozenset[str]:
        """The observations the schema makes active (CityLearn's names, without a building's)."""
        return frozenset(name for name, spec in (self.data.get("observations") or {}).items()
                         if isinstance(spec, Mapping) and spec.get("active"))

    @property
    def one_period(self) -> bool:
        """Whether this site is one period of data (a dataset: its one year, whose other seasons its policy never
        sees) rather than the built-in site, which draws as many years as it likes: what every site-dependent
        ``auto`` of the config asks."""
        return not self.kind.unseen_draws

    def settled(self, cfg: Config) -> Config:
        """``cfg`` with what depends on this site settled (:meth:`Config.on_site`: SAC's network size)."""
        return cfg.on_site(self.one_period)

    def unread(self, seen: ObservationsConfig) -> frozenset[str]:
        """What a policy on this site does not read (``observations.ignore``; ``auto`` asks the kind: a dataset has
        one period, whose months a policy would tell apart, the built-in site draws years that show every month)."""
        return seen.ignored(one_period=self.one_period, observed=self.observed)

    def demonstration_draws(self, warm: WarmStartConfig) -> int:
        """Other years of this site whose optimum the warm start imitates (``warm_start.extra_draws``; ``auto`` asks
        the kind: a dataset's varied years are the only other seasons its policy sees); 0 where the kind draws
        none."""
        return warm.draws(one_period=self.one_period) if self.kind.draws else 0

    def load_look_back(self, seen: ObservationsConfig) -> tuple[int, ...]:
        """Hours ago of each building's load a policy on this site reads (``observations.load_ago_hours``; ``auto``
        asks the kind as :meth:`unread` does: a dataset's held-out months may keep other habits than those learnt
        from, and yesterday's meter says which hold now)."""
        return seen.load_look_back(one_period=self.one_period, observed=self.observed)

    def reads_forecast(self, seen: ObservationsConfig) -> bool:
        """Whether a policy on this site reads the forecast of the hours ahead (``observations.forecast``; ``auto``
        asks the kind as :meth:`unread` does: a dataset's months held out are next season's, which the forecast
        learns as they come)."""
        return seen.reads_forecast(one_period=self.one_period, observed=self.observed)

    @property
    def root(self) -> Path:
        """Where CityLearn reads the dataset's files: ``root_directory`` (absolute, or relative to the schema), else
        beside the schema."""
        configured = self.data.get("root_directory")
        return self.schema.parent if not configured else (self.schema.parent / Path(str(configured)).expanduser()
                                                          ).resolve()

    def content_digest(self) -> str:
        """A digest of the data: the schema as read and every CSV beside or under its root (caches of what was
        computed from the site are keyed by it, not by its path's name)."""
        def digest() -> str:
            # Where the files lie is not what they hold: a copy of the dataset beside its schema is the same data.
            data = {key: value for key, value in self.data.items() if key != "root_directory"}
            hashed = hashlib.sha256(json.dumps(data, sort_keys=True).encode())
            for csv in sorted(self.root.glob("*.csv")):
                hashed.update(csv.name.encode())
                hashed.update(csv.read_bytes())
            return hashed.hexdigest()

        return self.remember("content digest", digest)

    # ----------------------------------------------------------------- other years

    def draw(self, folder: Path, seed_offset: int, variation: Variation | None = None) -> Site | None:
        """Another year of this site (its kind's ``draw_year`` with ``seed_offset``: the built-in site's climate drawn
        again, a dataset's own period resampled, its blocks varied by ``variation``), built once into ``folder`` and
        read as a policy that learnt on this site reads it; None where the kind has no other year. Built aside and
        renamed into place: stages side by side on Ray may both get here first."""
        if self.kind.draw_year is None:
            return None
        drawn = folder / SCHEMA_FILE
        if not drawn.is_file():
            folder.parent.mkdir(parents=True, exist_ok=True)
            aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
            self.kind.draw_year(self, aside, seed_offset, variation)
            try:
                aside.rename(folder)
            except OSError:  # another stage's is already there: use it
                shutil.rmtree(aside, ignore_errors=True)
            if not drawn.is_file():
                raise DamagedFile(f"{folder} holds no {SCHEMA_FILE} (a damaged copy of the site): delete the folder "
                                  "and run again; it is built anew")
        return Site.load(drawn, self.kind, self.label, fallback=self.scenario).scaled(self.scaled_as or self)

    # ----------------------------------------------------------------- facts learnt once

    def remember(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()`` the first time ``key`` is asked of this site, the same answer after."""
        if key not in self._facts:
            self._facts[key] = make()
        return self._facts[key]

    def __getstate__(self) -> dict[str, Any]:
        # Workers and Ray tasks get the site without what this process learnt of it (it may hold large objects).
        return {**self.__dict__, "_facts": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


@dataclass(frozen=True)
class HeldOut:
    """The part of the data a run judges on and learns nothing from (trainer.site.holdout decides it)."""

    site: Site
    what: str  # how it was chosen, as the report and the log say it
    learnt_from: str  # the part the agents learn from, in the same words


def given_site(schema: str | None, dataset: str | None) -> Site | None:
    """The dataset ``--schema``/``--dataset`` name, checked fully before anything runs; None means the built-in site
    (generated from the config: ``trainer.run.session`` places it)."""
    if schema is not None and dataset is not None:
        raise DatasetError("pass either --schema or --dataset, not both")
    if schema is not None and not schema.strip():
        raise DatasetError("--schema is empty; pass the path of a dataset's schema.json (or leave --schema out for the "
                           "built-in site)")
    if dataset is not None:
        check_name(dataset)
    if schema:
        path = Path(schema).expanduser()
        if path.is_dir():
            path = path / "schema.json"
        if not path.is_file():
            raise DatasetError(f"CityLearn schema not found: {path} (pass the path of a dataset's schema.json)")
        return Site.load(path.resolve(), SCHEMA, path.parent.name, check=True)
    if dataset:
        return Site.load(find_dataset(dataset), NAMED, dataset, check=True)
    return None
