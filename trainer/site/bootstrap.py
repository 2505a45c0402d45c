"""Other years of a dataset that has one: its days resampled in blocks (a block bootstrap).

What makes a controller generalise on the built-in site is many years of its climate: the warm start imitates the
optimum of several, the selection validates on one and confirms its pick over two. A user's dataset has one period;
this gives it as many years as the runs ask for, drawn from the period the run learns from (``Site.period``: never
a part held out).

A drawn year follows the period's course: the block placed at each point of it starts within
:data:`SEASON_DAYS` of that point in the data, so winter stays in winter. Blocks are about a week
(:data:`BLOCK_DAYS`) of whole days, so a day's weather, loads, PV, carbon intensity, tariff and EV sessions stay
together, and so do the days of a week. Blocks are cut only where every charger is free (the hour of the day they
are most often free), so no car's stay is cut in two: a stay longer than a day makes a longer block. Every file of
the dataset is resampled with the same steps, so its rows still describe one moment each.

A year the warm start imitates the optimum of may also vary (:class:`Variation`): each block's loads and PV scaled
by a factor of its own (and, where asked, its loads' daily course reshaped), so its optimum shows the policy weeks
lighter and sunnier (or heavier), and days whose peaks fall at other hours, than any the data holds. A dataset's
part held out is months the part learnt from never showed (on the official EV buildings: May-July, mornings a third
as large and more sun; on Building_10 the mornings' load moved to the evening), and a policy that imitated only the
data kept the reserve its winter mornings wanted (docs/agent-quality.md, "Demonstration years that vary" and "Days
whose peaks fall at other hours"). A sunnier block is sunnier in its weather too: the irradiance the policy reads,
now and forecast, is scaled by its PV's factor (a forecast by the factor of the row it is read at), or the varied
years would teach the policy that the sun it is told of says little of the PV it will get.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from trainer.config.sections import LOAD_NOW, WarmStartConfig

BLOCK_DAYS = 7
SEASON_DAYS = 30
CONNECTED = 1  # CityLearn's charger state for a car plugged in
SOLAR_COLUMN = "solar_generation"  # a building's file: W per kW of PV (its loads: LOAD_NOW, kWh)
# A weather file's irradiance, now and forecast: what the PV's output follows, scaled with it.
IRRADIANCE = re.compile(r"(diffuse|direct)_solar_irradiance(_predicted_\w+)?")


@dataclass(frozen=True)
class Variation:
    """How much a drawn year's blocks may differ from the data: each block's loads and PV scaled by a factor drawn
    log-uniformly from ``load`` and ``solar`` (low, high); (1, 1) keeps them as the data has them. With ``shape``
    above 0 each block's loads also follow a daily profile of its own, ``1 + a cos(2 pi (h - phase) / day)`` with
    ``a`` drawn from [0, shape] and the phase from the whole day: the day's energy kept, its peaks moved (mornings
    lighter and evenings heavier, or the other way), as months held out may have them."""

    load: tuple[float, float] = (1.0, 1.0)
    solar: tuple[float, float] = (1.0, 1.0)
    shape: float = 0.0

    @classmethod
    def of(cls, warm_start: WarmStartConfig) -> Variation:
        """The variation ``warm_start.draw_load_scale``, ``draw_load_shape`` and ``draw_solar_scale`` ask of the
        years it imitates."""
        return cls(load=warm_start.draw_load_scale, solar=warm_start.draw_solar_scale,
                   shape=warm_start.draw_load_shape)

    @property
    def varies(self) -> bool:
        return self.load != (1.0, 1.0) or self.solar != (1.0, 1.0) or self.shape > 0

    def factors(self, steps: np.ndarray, rng: np.random.Generator, steps_per_day: int) -> dict[str, np.ndarray]:
        """Each varied column's factor at every step of a drawn year, one per block (a run of consecutive steps),
        the loads' factors times their block's daily profile."""
        block = np.concatenate([[0], np.cumsum(np.diff(steps) != 1)])
        count = int(block[-1]) + 1
        # Both drawn whichever varies: the loads' factors are the same with or without the PV's, and the profiles
        # are drawn after both, so a year's levels are the same with or without them.
        drawn = {column: (np.exp(rng.uniform(np.log(low), np.log(high), count))[block], (low, high) != (1.0, 1.0))
                 for column, (low, high) in ((LOAD_NOW, self.load), (SOLAR_COLUMN, self.solar))}
        if self.shape > 0:
            amplitude, phase = rng.uniform(0.0, self.shape, count), rng.uniform(0.0, 1.0, count)
            # Each row's step of the day in the data: a block's profile follows the data's clock, whatever its place.
            angle = 2 * np.pi * ((steps % steps_per_day) / steps_per_day - phase[block])
            drawn[LOAD_NOW] = (drawn[LOAD_NOW][0] * (1.0 + amplitude[block] * np.cos(angle)), True)
        return {column: factor for column, (factor, varied) in drawn.items() if varied}


class Resampled(Protocol):
    """What a draw reads of the site it resamples (a trainer.site.Site)."""

    @property
    def data(self) -> Mapping[str, Any]: ...

    @property
    def root(self) -> Path: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def steps_per_day(self) -> int: ...


def bootstrap_year(site: Resampled, folder: Path, seed_offset: int, schema_file: str = "schema.json",
                   variation: Variation | None = None) -> Path:
    """Write another year of ``site`` (its period's days resampled in blocks, seeded by the schema's random_seed
    and ``seed_offset``; each block's loads and PV scaled as ``variation`` says) into ``folder`` as a CityLearn
    dataset; returns its schema.json."""
    seed = int(site.data.get("random_seed") or 0)
    steps = resampled_steps(site, np.random.default_rng([seed, seed_offset]))
    # Its own stream: the same draw's steps with or without a variation.
    scaled = variation.factors(steps, np.random.default_rng([seed, seed_offset, 1]), site.steps_per_day) \
        if variation is not None and variation.varies else {}
    buildings = {b["energy_simulation"] for b in _buildings(site.data) if b.get("energy_simulation")}
    weather = {b["weather"] for b in _buildings(site.data) if b.get("weather")}
    folder.mkdir(parents=True, exist_ok=True)
    solar = scaled.get(SOLAR_COLUMN)

    def irradiance(column: str) -> np.ndarray | None:
        return solar if IRRADIANCE.fullmatch(column) else None

    for name in _files(site.data):
        factor_of = scaled.get if name in buildings else irradiance if name in weather else _unscaled
        _write_rows(site.root / name, folder / name, steps, factor_of)
    data = {**site.data, "root_directory": None, "simulation_start_time_step": 0,
            "simulation_end_time_step": len(steps) - 1,
            "pvbess_bootstrap": {"from": f"steps {site.start}-{site.end}", "seed_offset": seed_offset,
                                 "block_days": BLOCK_DAYS, "season_days": SEASON_DAYS,
                                 **({"load_scale": list(variation.load), "solar_scale": list(variation.solar),
                                     **({"load_shape": variation.shape} if variation.shape > 0 else {})}
                                    if scaled else {})}}
    schema = folder / schema_file
    schema.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return schema


def resampled_steps(site: Resampled, rng: np.random.Generator) -> np.ndarray:
    """The step of the data each step of a drawn year reads, as long as the period."""
    segments = _segments(site)
    starts = np.asarray([s[0] for s in segments]) - site.start
    length, day = site.end - site.start + 1, site.steps_per_day
    out: list[np.ndarray] = []
    filled = 0
    while filled < length:
        near = np.flatnonzero(np.abs(starts - filled) <= SEASON_DAYS * day)
        if len(near) == 0:  # a season with no block starting in it (a long stay): the nearest block
            near = np.asarray([int(np.argmin(np.abs(starts - filled)))])
        first = int(rng.choice(near))
        block, k = [], first
        while k < len(segments) and sum(len(b) for b in block) < BLOCK_DAYS * day:
            block.append(np.arange(*segments[k]))
            k += 1
        steps = np.concatenate(block)
        out.append(steps)
        filled += len(steps)
    return np.concatenate(out)[:length]


def _segments(site: Resampled) -> list[tuple[int, int]]:
    """The period cut where every charger is free, at the hour of the day they most often are: (first, end) steps."""
    day = site.steps_per_day
    occupied = _occupied(site)  # (steps of the period,) any car plugged in
    hour = int(np.argmin([occupied[h::day].sum() for h in range(day)])) if occupied.any() else 0
    cuts = [site.start + t for t in range(hour, len(occupied), day) if not occupied[t]]
    bounds = sorted({site.start, *cuts, site.end + 1})
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _occupied(site: Resampled) -> np.ndarray:
    import pandas as pd  # lazy: only a draw reads it

    length = site.end - site.start + 1
    occupied = np.zeros(length, dtype=bool)
    for building in _buildings(site.data):
        for charger in (building.get("chargers") or {}).values():
            if isinstance(charger, dict) and charger.get("charger_simulation"):
                state = pd.read_csv(site.root / charger["charger_simulation"],
                                    usecols=["electric_vehicle_charger_state"])["electric_vehicle_charger_state"]
                occupied |= state.to_numpy()[site.start:site.end + 1] == CONNECTED
    return occupied


def _buildings(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [b for b in (data.get("buildings") or {}).values() if isinstance(b, dict) and b.get("include", True)]


def _files(data: Mapping[str, Any]) -> list[str]:
    """Every file the simulated buildings read, once each."""
    names: list[str] = []
    for building in _buildings(data):
        names += [building[k] for k in ("energy_simulation", "weather", "carbon_intensity", "pricing")
                  if building.get(k)]
        names += [c["charger_simulation"] for c in (building.get("chargers") or {}).values()
                  if isinstance(c, dict) and c.get("charger_simulation")]
    return list(dict.fromkeys(names))


def _unscaled(column: str) -> None:
    return None


def _write_rows(source: Path, target: Path, steps: np.ndarray,
                factor_of: Callable[[str], np.ndarray | None]) -> None:
    """``source``'s rows ``steps`` (the header kept, every cell as written but those of a column ``factor_of`` gives
    a factor for, multiplied by it at that row) into ``target``."""
    lines = source.read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    columns = {j: factor for j, name in enumerate(header.split(",")) if (factor := factor_of(name)) is not None}
    out = [rows[t] for t in steps]
    for i, row in enumerate(out) if columns else ():
        cells = row.split(",")
        for j, factor in columns.items():
            if cells[j].strip():  # an empty cell (no reading) stays empty
                cells[j] = f"{float(cells[j]) * factor[i]:.6g}"
        out[i] = ",".join(cells)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join([header, *out]) + "\n", encoding="utf-8")
