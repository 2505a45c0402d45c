"""What a run holds out: the part of the data it judges on and learns nothing from.

A user brings one year of one site. Judged on the period it learnt from, a controller can score by memorising
that year (a warm start imitating the optimum of the very period it is evaluated on); deployed, it meets next
season. So by default a run holds out the **end** of a one-period dataset's period (``holdout.share``, a quarter:
with a year, its last three months): what deploying next season means, and the test a user's own split makes
(train on August-March, judge on April-July). Every fourth week instead would put each season in both parts and
flatter the controller: consecutive weeks share weather, cars and loads, so a week between two training weeks is
barely unseen. The built-in site holds out another year of its climate (a draw no stage trains, validates or
imitates on), and ``holdout.eval_schema`` names another period or building to judge on.

:func:`hold_out` returns the run's :class:`Site` narrowed to the part it learns from, carrying the
:class:`HeldOut` part; everything that learns reads the first, the headline figures come from the second.
"""

from __future__ import annotations

from pathlib import Path

from trainer.base import logs
from trainer.base.errors import DatasetError
from trainer.config.sections import HoldoutConfig
from trainer.site.scenario import UNSEEN_YEAR_SEED_OFFSET
from trainer.site.site import HeldOut, Site, given_site

# Less than this left to learn from, or to judge on, and a split says nothing: the figures are in-sample, and said so.
MIN_LEARNING_DAYS = 28
MIN_HELD_OUT_DAYS = 7
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def hold_out(site: Site, holdout: HoldoutConfig, draws: Path) -> Site:
    """``site`` as the part a run learns from, carrying the part it is judged on (``site.held_out``), or ``site``
    unchanged where nothing is held out (``holdout.share`` 0, or a period too short to split). ``draws`` is where
    the built-in site's held-out year is built (once)."""
    other = judged_instead(site, holdout)
    if other is not None:
        name = other.label or other.schema.parent.name
        return site.learning_from(HeldOut(
            other.scaled(site), f"{name} ({describe(other, other.start, other.end)}), another dataset given with "
                                "--eval-schema/--eval-dataset",
            f"all of {site.label or 'the dataset'} ({describe(site, site.start, site.end)})"))
    if holdout.share == 0:
        return site
    if site.kind.unseen_draws:
        year = site.draw(draws, UNSEEN_YEAR_SEED_OFFSET)  # read as the site is
        assert year is not None  # a kind that draws
        return site.learning_from(HeldOut(
            year, "another year of the built-in site's climate (unseen-year/site/), which no stage trains, "
                  "validates or imitates on", "the site's own year"))
    day = site.steps_per_day
    days = site.length // day
    held_days = round(days * holdout.share)
    if days - held_days < MIN_LEARNING_DAYS or held_days < MIN_HELD_OUT_DAYS:
        logs.get().warning("the period is too short to hold a part out: every figure is in-sample",
                           days=days, share=holdout.share, least=f"{MIN_LEARNING_DAYS + MIN_HELD_OUT_DAYS} days")
        return site
    first_held = site.end - held_days * day + 1
    learning = site.period(site.start, first_held - 1)
    judged = site.period(first_held, site.end)
    return learning.learning_from(HeldOut(
        judged.scaled(learning),
        f"the last {held_days} days of the period ({describe(site, first_held, site.end)}), which no stage trains, "
        "validates or imitates on",
        f"the first {days - held_days} days ({describe(site, site.start, first_held - 1)})"))


def judged_instead(site: Site, holdout: HoldoutConfig) -> Site | None:
    """The dataset ``holdout`` names to judge on instead of a part of ``site`` (checked: its files, and the same
    devices as ``site``), or None."""
    if holdout.eval_schema is None and holdout.eval_dataset is None:
        return None
    other = given_site(holdout.eval_schema, holdout.eval_dataset)
    assert other is not None  # one of the two is given
    same_devices(site, other)
    return other


def describe(site: Site, first: int, last: int) -> str:
    """Steps ``first``..``last`` in words: their months where the data says them, and the steps."""
    steps = f"steps {first:,}-{last:,}"
    months = _months(site)
    if months is None or last >= len(months):
        return steps
    start, end = MONTHS[months[first] - 1], MONTHS[months[last] - 1]
    return f"{start}-{end}, {steps}" if start != end else f"{start}, {steps}"


def _months(site: Site) -> list[int] | None:
    """The month of every step of the first building's file (None where it cannot be read: words are a nicety)."""
    import pandas as pd  # lazy: only a split reads it

    def read() -> list[int] | None:
        building = next((b for b in site.data.get("buildings", {}).values()
                         if isinstance(b, dict) and b.get("include", True) and b.get("energy_simulation")), None)
        if building is None:
            return None
        try:
            months = pd.read_csv(site.root / building["energy_simulation"], usecols=["month"])["month"]
            return [int(m) if 1 <= m <= 12 else 1 for m in months.fillna(1)]
        except (OSError, ValueError, KeyError):
            return None

    return site.remember("months", read)


def _devices(site: Site) -> list[tuple[bool, int]]:
    """Each simulated building's controllable devices, in order: (a battery, chargers)."""
    out = []
    for building in site.data.get("buildings", {}).values():
        if isinstance(building, dict) and building.get("include", True):
            out.append((bool(building.get("electrical_storage")), len(building.get("chargers") or {})))
    return out


def _active(site: Site, key: str) -> list[str]:
    return sorted(name for name, spec in (site.data.get(key) or {}).items()
                  if isinstance(spec, dict) and spec.get("active"))


def same_devices(site: Site, other: Site) -> None:
    """A dataset to judge on has what the policy reads and drives: the same buildings' devices, observations and
    actions (another period of the site, or another building like it)."""
    for what, mine, theirs in (("buildings (battery, chargers)", _devices(site), _devices(other)),
                               ("active observations", _active(site, "observations"), _active(other, "observations")),
                               ("active actions", _active(site, "actions"), _active(other, "actions"))):
        if mine != theirs:
            raise DatasetError(f"{other.schema}: its {what} differ from {site.schema}'s ({theirs} against "
                               f"{mine}): a policy reads and drives the devices it learnt on; judge it on a dataset "
                               "with the same devices (another period of the site, or a building like it)")
