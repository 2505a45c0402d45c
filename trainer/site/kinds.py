"""The kinds of dataset a run may control, one row each in :data:`SITE_KINDS`.

A kind says what a site of it can give beyond its own period: the built-in site draws other years of its
climate (the selection's held-out years, the warm start's extra years, the year it is judged on); a dataset a
user brings resamples its own days into other years (trainer.site.bootstrap: the selection's and the warm start's
years, never one to judge on). Code asks the kind (``site.kind.draws``, ``site.kind.unseen_draws``), never where
the dataset came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainer.config.sections import ScenarioConfig
from trainer.site.bootstrap import Resampled, Variation, bootstrap_year
from trainer.site.scenario import SCHEMA_FILE, build_site


class Drawn(Resampled, Protocol):
    """What a kind's ``draw_year`` reads of the site it draws from (a trainer.site.Site)."""

    @property
    def scenario(self) -> ScenarioConfig | None: ...


# Builds another year of a site into a folder with the seed offset given (and how a resampled year may vary from
# the data) and returns its schema.json.
DrawYear = Callable[[Drawn, Path, int, Variation | None], Path]


@dataclass(frozen=True)
class SiteKind:
    """One kind of dataset: its name (run.json, the logs), what it is, and how it draws another year (if it can)."""

    name: str
    doc: str
    draw_year: DrawYear | None = None
    unseen_draws: bool = False  # its other years are data it never held (one can be judged on), not its own resampled
    # The training simulator steps it as CityLearn does (docs/simulator.md, "Parity": a year of the built-in site
    # within 7.6e-6), so what only chooses (a pick, its confirmation, the learning curve) may run there. A dataset's
    # unplugged cars drift in CityLearn as the simulator does not draw: its choices stay in CityLearn.
    simulated_exactly: bool = False

    @property
    def draws(self) -> bool:
        """Whether a site of this kind has years other than its own period (held-out years, extra demonstrations)."""
        return self.draw_year is not None

    def __reduce__(self) -> tuple:
        # A worker process or a Ray task gets the row of its own table, so that `site.kind is BUILT_IN` holds there.
        return kind_named, (self.name,)


def _draw_built_in(site: Drawn, folder: Path, seed_offset: int, variation: Variation | None) -> Path:
    # Its other years are its climate drawn again: they vary as weather and habits do, not by a scale.
    scenario = site.scenario or ScenarioConfig()
    build_site(scenario.model_copy(update={"seed": scenario.seed + seed_offset}), folder)
    return folder / SCHEMA_FILE


def _draw_bootstrap(site: Drawn, folder: Path, seed_offset: int, variation: Variation | None) -> Path:
    return bootstrap_year(site, folder, seed_offset, SCHEMA_FILE, variation)


BUILT_IN = SiteKind("built-in", "the product's own site, generated from a scenario (the config's, or the one a "
                                "schema it generated carries); other years are the same climate drawn again",
                    _draw_built_in, unseen_draws=True, simulated_exactly=True)
SCHEMA = SiteKind("schema", "a CityLearn dataset given by its schema.json (--schema): its one period, whose days "
                            "other years resample", _draw_bootstrap)
NAMED = SiteKind("citylearn", "a CityLearn dataset given by name (--dataset), found as CityLearn finds it: its one "
                              "period, whose days other years resample", _draw_bootstrap)

SITE_KINDS: dict[str, SiteKind] = {kind.name: kind for kind in (BUILT_IN, SCHEMA, NAMED)}


def kind_named(name: str) -> SiteKind:
    """The row of :data:`SITE_KINDS` called ``name``."""
    return SITE_KINDS[name]


def kind_of(data: dict, given: SiteKind) -> SiteKind:
    """The kind of a schema given as ``given``: one the product generated carries its scenario, and is built-in
    however it was given (a built-in site passed by --schema still draws its other years)."""
    return BUILT_IN if "pvbess_site" in data else given
