"""The forecast the agents read on a dataset of one period (``observations.forecast``).

The day-ahead planner cuts more than the agents that imitate the optimum on some of the official EV buildings: it
knows which mornings come, from a profile of the hours it has seen. A policy that reads the same forecast (each
building's net load and the grid's carbon intensity, their means over the next 1-3, 4-8, 9-16 and 17-24 hours) can
tell them too: on the months held out of four official EV buildings it moved 20-minute nights' choices by +0.05 to
+0.83 points of the optimum's cut on three of them and by -1.36 and -2.83 on Building_10 (docs/agent-quality.md,
"The planner's forecast as observations"), so it is off unless asked for (``observations.forecast: auto`` or true).

It is a function of the data alone, never of the actions, so it is computed once a site as a table (a row a step)
that CityLearn's wrapper and the training simulator both read by the step. Each period starts from what the
forecast learnt before it (:func:`history`): a part held out from the part learnt from, the validation part from the
days before it, a resampled year from the part it was resampled from. An exported controller carries that starting
point and keeps learning from its readings (trainer.shipped.controller.HourlyForecast).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.base.errors import ConfigError
from trainer.config.sections import FORECAST_READS, LOAD_NOW
from trainer.shipped.controller import HourlyForecast, forecast_names, hour_slots
from trainer.site import Site

if TYPE_CHECKING:
    from citylearn.citylearn import CityLearnEnv

SOLAR_NOW = "solar_generation"
# A site's readings over its period: (hour of the day, each building's net load, carbon intensity, building names).
Readings = tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]


@dataclass(frozen=True)
class ForecastTable:
    """What a policy reads of the forecast at each step of a site's period, and where the forecast started."""

    names: list[str]  # the raw observations' names, in the raw vector's order (forecast_names)
    values: np.ndarray  # (steps, names): each step's, the forecast as it stood before learning that step
    start: dict[str, Any]  # the forecast's state before the period's first step (HourlyForecast.state)

    def at(self, steps: np.ndarray | int) -> np.ndarray:
        """The rows of steps ``steps`` of the period (the last row past its end)."""
        return self.values[np.minimum(steps, len(self.values) - 1)]

    @property
    def ranges(self) -> list[tuple[float, float]]:
        """Each column's least and greatest value over the period (what a policy scales it by)."""
        return [(float(low), float(high)) for low, high in zip(self.values.min(axis=0), self.values.max(axis=0))]


def forecast_table(site: Site, read: Callable[[Site], Readings]) -> ForecastTable:
    """The forecast a policy reads over ``site``'s period, learnt first from its :func:`history`; once a site.
    ``read`` opens a site's environment and gives its :func:`readings` (trainer.env.citylearn's, which reads this
    module)."""
    before = history(site)
    key = ("forecast table", None if before is None else (str(before.schema), before.start, before.end))
    return site.remember(key, lambda: _table(site, before, read))


def history(site: Site) -> Site | None:
    """What the forecast learns from before ``site``'s period: the part of the site a policy on it learnt on
    (``Site.scaled_as``) where that lies before it or is other data (a resampled year's source, another building),
    the days of it before this period where this period lies inside it (the validation part); None for the part
    learnt from itself."""
    learnt = site.scaled_as
    if learnt is None or learnt is site:
        return None
    if learnt.schema.resolve() != site.schema.resolve() or learnt.end < site.start:
        return learnt
    if site.start > learnt.start:
        return learnt.period(learnt.start, site.start - 1)
    return None


def readings(env: CityLearnEnv) -> Readings:
    """(hour of the day 0-23, each building's net load in kWh, carbon intensity, the buildings' names) at each step of
    ``env``'s period (a reset one), as its raw observations give them (the load less the PV's output)."""
    steps = env.time_steps
    buildings = env.buildings
    missing = sorted({key for key in FORECAST_READS
                      if key not in buildings[0].active_observations and key != SOLAR_NOW})
    if missing:
        raise ConfigError(f"observations.forecast reads {', '.join(missing)}, which this dataset leaves inactive: "
                          "activate them in the schema or set observations.forecast: false")
    slots = hour_slots(buildings[0].energy_simulation.hour[:steps])
    fixed = np.zeros((len(buildings), steps))
    for b, building in enumerate(buildings):
        sim = building.energy_simulation
        fixed[b] = np.asarray(getattr(sim, LOAD_NOW)[:steps], dtype=np.float32)
        if building.pv is not None and SOLAR_NOW in building.active_observations:
            # On CityLearn's own float32 series, as its observation is computed: the same number to the last bit.
            solar = building.pv.get_generation(np.asarray(sim.solar_generation[:steps]))
            fixed[b] -= np.asarray(solar, dtype=np.float32)
    carbon = np.asarray(buildings[0].carbon_intensity.carbon_intensity[:steps], dtype=np.float32).astype(float)
    return slots, fixed, carbon, [b.name for b in buildings]


def _table(site: Site, before: Site | None, read: Callable[[Site], Readings]) -> ForecastTable:
    slots, fixed, carbon, buildings = read(site)
    forecast = HourlyForecast(len(buildings))
    if before is not None:
        # Read once a site: every resampled year a warm start imitates learns first from the same part.
        past_slots, past_fixed, past_carbon, _ = before.remember(("forecast readings",), lambda: read(before))
        if past_fixed.shape[0] != fixed.shape[0]:
            raise ConfigError(f"{site.schema} has {fixed.shape[0]} buildings where the data learnt from has "
                              f"{past_fixed.shape[0]}: the forecast needs the same buildings")
        forecast.learn(past_slots, past_fixed, past_carbon)
    start = forecast.state()
    values = np.asarray([forecast.windows(int(slots[t]), fixed[:, t], float(carbon[t])) for t in range(len(slots))])
    return ForecastTable(forecast_names(buildings), values, start)
