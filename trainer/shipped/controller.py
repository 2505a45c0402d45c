"""A site controller that needs only numpy and onnxruntime: a trained policy, its observations'
normalisation, its action scale and the EV service guard, read from an export folder. Or, where the run's
day-ahead planner is what the export holds, that planner: the site's linear program (``program.py``, beside this
file) solved every hour over the next day on the forecast it learns from the readings, which needs scipy instead of
onnxruntime.

This file is copied unchanged into every export as ``controller.py`` (``trainer export``,
docs/export.md). Inside the product, ``trainer.env.citylearn`` normalises observations and ``trainer.env.ev_guard``
guards EV actions with this file's classes, so what trained and evaluated a policy is, line for line,
what ships with it. It imports nothing but numpy, onnxruntime (when a policy runs), program.py and scipy
(when a planner plans) and the standard library, and it must stay so: a test imports it in a process that has
nothing else.

Use, from the export folder::

    python controller.py check              # replay the export's sample; exit 0 when every action matches
    python controller.py example            # one step of raw observations, as the JSON `act` reads
    python controller.py act --obs step.json   # or a CSV of steps: the actions in kW, guard applied
    python controller.py act --obs step.json --state forecast.json   # each hour: the forecast learnt on between calls

    from controller import Controller
    controller = Controller.load(".")
    actions = controller.act({"hour": 13, ...})   # {"electrical_storage": {"kw": ..., ...}, ...}

Exit status: 0 done, 1 ``check`` found a difference, 2 bad input (one line on stderr says which).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import importlib
import importlib.util
import json
import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

SPEC_FILE = "spec.json"
CHECK_FILE = "check.csv"
PROGRAM_FILE = "program.py"  # the site's linear program, which a planner's export ships beside this file
PLANNER = "planner"  # spec.json's policy.kind for the day-ahead planner (no network: a program solved each hour)
FORMAT = "pvbess-controller"
VERSION = 1  # of spec.json; a controller refuses a spec of another version
CHECK_TOLERANCE = 1e-5  # |action - the product's action|, in CityLearn's units (a fraction of full power)
EXPECTED_PREFIX = "expected:"  # check.csv's columns of the product's actions
# Bisection on the action over [-1, 1]: 2^-20 of full power is far below any charger's resolution.
BISECTION_STEPS = 21
GUARD_RAISE = 1e-4  # a raise smaller than this is bisection noise on a schedule that already serves the car
# The guard looks this many steps ahead at most (a year of hours): a car "leaving in 1e9 hours" needs no more.
MAX_STEPS_AHEAD = 8784
# A learnt forecast's weight on an hour seen a step ago (its profile's half-life ~3 days): on the official 2022
# dataset's first 28 days, 0.99 reached 66 % of the optimum's cut, an unweighted mean by hour and day type 61 %
# (perfect foresight of the load: 90 %).
FORECAST_DECAY = 0.99
# The hours ahead (first, last; 1 = the next) whose forecast means a policy reads (observations.forecast).
FORECAST_WINDOWS = ((1, 3), (4, 8), (9, 16), (17, 24))


class InputError(ValueError):
    """Observations the controller refuses: the message is one line that names the input and the fix."""


# ------------------------------------------------------------------------------------------------------- the guard


@dataclass(frozen=True)
class Curve:
    """CityLearn's piecewise-linear curves, evaluated as CityLearn does (clamped-extrapolated ends)."""

    x: tuple[float, ...]
    y: tuple[float, ...]

    @classmethod
    def of(cls, array: Any) -> Curve:
        x, y = np.asarray(array, dtype=float)
        return cls(tuple(float(v) for v in x), tuple(float(v) for v in y))

    def __call__(self, value: float) -> float:
        # CityLearn: idx = clip(searchsorted(x, v, side='left') - 1, 0, len - 2), then a linear segment.
        idx = min(len(self.x) - 2, max(0, bisect.bisect_left(self.x, value) - 1))
        x0, x1, y0, y1 = self.x[idx], self.x[idx + 1], self.y[idx], self.y[idx + 1]
        return y0 + (y1 - y0) * (value - x0) / (x1 - x0)

    def as_lists(self) -> list[list[float]]:
        return [list(self.x), list(self.y)]


# A charging path's fields, by what they belong to: the charger, and the car's battery.
CHARGER_FIELDS = ("max_power_kw", "min_power_kw", "charger_efficiency", "charger_curve", "max_discharge_kw",
                  "min_discharge_kw", "discharge_curve")
BATTERY_FIELDS = ("capacity_kwh", "nominal_power_kw", "power_efficiency", "capacity_power", "loss_per_step", "min_soc")


@dataclass(frozen=True)
class ChargingPath:
    """One charger and the EV battery plugged into it, as numbers: what CityLearn 3.0.2 stores each step.

    ``Charger.update_connected_electric_vehicle_soc`` and ``Battery.charge``, step by step: the charger's
    efficiency (or its curve), the battery's power-efficiency curve (a square root each way), its
    capacity-power curve, standby loss, capacity and depth of discharge, discharge (V2G) included.
    """

    max_power_kw: float
    min_power_kw: float
    charger_efficiency: float
    charger_curve: Curve | None
    capacity_kwh: float
    degraded_capacity_kwh: float
    nominal_power_kw: float
    power_efficiency: Curve
    capacity_power: Curve
    loss_per_step: float
    min_soc: float
    hours: float
    max_discharge_kw: float = 0.0  # V2G: 0 where the charger cannot discharge the car
    min_discharge_kw: float = 0.0
    discharge_curve: Curve | None = None

    @classmethod
    def from_parts(cls, charger: dict[str, Any], battery: dict[str, Any], hours: float) -> ChargingPath:
        """From an export's JSON: a capacity fade it cannot observe is left to the guard's margin."""
        curves = {k: None if v is None else Curve.of(v) for k, v in {**charger, **battery}.items()
                  if k in ("charger_curve", "discharge_curve", "power_efficiency", "capacity_power")}
        values = {**charger, **battery, **curves}
        return cls(**values, degraded_capacity_kwh=float(battery["capacity_kwh"]), hours=hours)

    def parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(charger, battery) as JSON: the inverse of :meth:`from_parts`."""
        def plain(value: Any) -> Any:
            return value.as_lists() if isinstance(value, Curve) else value
        return ({k: plain(getattr(self, k)) for k in CHARGER_FIELDS},
                {k: plain(getattr(self, k)) for k in BATTERY_FIELDS})

    def with_capacity(self, capacity_kwh: float) -> ChargingPath:
        return replace(self, capacity_kwh=capacity_kwh, degraded_capacity_kwh=capacity_kwh)

    def stored_after(self, energy_init: float, action: float) -> float:
        """Stored kWh after one step that starts at ``energy_init`` with ``action`` in [-1, 1] (< 0 discharges)."""
        return self.step(energy_init, action)[0]

    def step(self, energy_init: float, action: float) -> tuple[float, float]:
        """(stored kWh after, grid kWh the charger draws: < 0 where it feeds the building) for one step."""
        action = min(max(float(action), -1.0), 1.0)
        if action < 0.0:
            return self._discharged(energy_init, -action)
        power = action * self.max_power_kw
        if power <= 0.0 or power < min(self.min_power_kw, self.max_power_kw):
            return energy_init, 0.0
        efficiency = self.charger_curve(action) if self.charger_curve is not None else self.charger_efficiency
        requested = power * self.hours * efficiency
        soc = energy_init / max(self.capacity_kwh, 1e-12)
        max_input = max(self.nominal_power_kw * self.capacity_power(soc), 0.0) * self.hours
        limited = min(requested, max_input)
        battery_efficiency = 1.0
        for _ in range(2):  # CityLearn iterates twice: efficiency depends on the power it limits
            battery_efficiency = self.power_efficiency(self._normalised(limited))
            headroom = max(self.degraded_capacity_kwh - energy_init, 0.0) / max(math.sqrt(battery_efficiency), 1e-12)
            limited = min(requested, max_input, headroom)
        stored = min(energy_init + limited * math.sqrt(battery_efficiency), self.capacity_kwh)
        balance = (stored - energy_init) / max(math.sqrt(battery_efficiency), 1e-12)
        return stored, balance / max(efficiency, 1e-12)

    def _discharged(self, energy_init: float, share: float) -> tuple[float, float]:
        """A discharging step at ``share`` of the charger's discharge power (CityLearn's V2G path)."""
        power = share * self.max_discharge_kw
        if power <= 0.0 or power < min(self.min_discharge_kw, self.max_discharge_kw):
            return energy_init, 0.0
        efficiency = self.discharge_curve(share) if self.discharge_curve is not None else self.charger_efficiency
        requested = power * self.hours / max(efficiency, 1e-12)  # the battery gives more than the building gets
        soc = energy_init / max(self.capacity_kwh, 1e-12)
        max_output = max(self.nominal_power_kw * self.capacity_power(soc), 0.0) * self.hours
        floor = self.min_soc * self.capacity_kwh
        limited = min(requested, max_output)
        battery_efficiency = 1.0
        for _ in range(2):
            battery_efficiency = self.power_efficiency(self._normalised(limited))
            reserve = max(energy_init - floor, 0.0) * math.sqrt(battery_efficiency)
            limited = min(requested, max_output, reserve)
        stored = max(floor, energy_init - limited / max(math.sqrt(battery_efficiency), 1e-12))
        balance = (stored - energy_init) * math.sqrt(battery_efficiency)
        return stored, balance * efficiency

    def _normalised(self, kwh: float) -> float:
        return min(max(kwh / self.hours / max(self.nominal_power_kw, 1e-12), 0.0), 1.0)

    def carried_over(self, stored: float) -> float:
        """The energy a step starts with, from what the previous one stored (standby loss, floor)."""
        soc = min(max(stored / self.capacity_kwh * (1.0 - self.loss_per_step), self.min_soc), 1.0)
        return soc * self.capacity_kwh

    def reachable(self, stored: float, steps: int) -> float:
        """Stored kWh after ``steps`` more steps at full power, from ``stored`` at the end of this one."""
        energy = stored
        for _ in range(min(steps, MAX_STEPS_AHEAD)):
            before, energy = energy, self.stored_after(self.carried_over(energy), 1.0)
            if energy <= before:  # full, or as full as the losses allow: more steps add nothing
                break
        return energy

    def after_step_then_full(self, energy_init: float, action: float, later_steps: int) -> float:
        return self.reachable(self.stored_after(energy_init, action), later_steps)


def minimum_action(path: ChargingPath, energy_init: float, goal_kwh: float, steps_left: int, action: float) -> float:
    """The least action >= ``action`` (in [-1, 1]) after which the car can still hold ``goal_kwh`` at departure.

    ``steps_left``: the steps after this one before the car leaves (CityLearn's ``departure_time``). A
    discharge (V2G) is kept where full power afterwards still serves the car, else lessened or turned into
    charging. Where even full power from now on cannot serve it, full power (the least shortfall).
    """
    action = min(max(float(action), -1.0), 1.0)
    if action >= 1.0 or path.after_step_then_full(energy_init, action, steps_left) >= goal_kwh:
        return action
    if path.after_step_then_full(energy_init, 1.0, steps_left) < goal_kwh:
        return 1.0
    low, high = action, 1.0
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if path.after_step_then_full(energy_init, mid, steps_left) >= goal_kwh:
            high = mid
        else:
            low = mid
    return high


def most_kept_kwh(path: ChargingPath, goal_kwh: float, steps_left: int) -> float:
    """The most a car should hold after this step: its goal, and on a charger that can discharge it (V2G) the goal plus
    what full discharge could still give the site over the ``steps_left`` steps after this one (each a step's
    discharge from a car holding its goal). What it holds beyond that leaves with it: imported for nothing."""
    if path.max_discharge_kw <= 0.0 or steps_left <= 0:
        return goal_kwh
    return goal_kwh + steps_left * max(goal_kwh - path.stored_after(goal_kwh, -1.0), 0.0)


def maximum_action(path: ChargingPath, energy_init: float, most_kwh: float, action: float) -> float:
    """The greatest action <= ``action`` after which the car holds no more than ``most_kwh`` (:func:`most_kept_kwh`):
    a car stops charging once it holds what it can still use, and a V2G car holding more is discharged.

    ``action`` itself where its step stays within ``most_kwh`` (or, on a charger that cannot discharge, is no charge);
    there, 0 where the car already holds more; on a V2G charger, full discharge where even that leaves it above.
    """
    action = min(max(float(action), -1.0), 1.0)
    v2g = path.max_discharge_kw > 0.0
    if (action <= 0.0 and not v2g) or path.stored_after(energy_init, action) <= most_kwh:
        return action
    if not v2g and energy_init >= most_kwh:
        return 0.0
    low, high = (-1.0 if v2g else 0.0), action
    if path.stored_after(energy_init, low) > most_kwh:
        return low
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if path.stored_after(energy_init, mid) <= most_kwh:
            low = mid
        else:
            high = mid
    return low


def guarded_action(path: ChargingPath, energy_init: float, goal_kwh: float, steps_left: int, wanted: float,
                   stop_at_target: bool) -> tuple[float, int]:
    """The guard on one connected car: (the action, +1 where it raised ``wanted``, -1 where it lowered it, else 0).

    Raised to the least that still serves the car by departure (:func:`minimum_action`); with ``stop_at_target``,
    lowered to the most after which it holds no more than it can use (:func:`most_kept_kwh`, :func:`maximum_action`):
    its goal on a charger that cannot discharge it; on a V2G charger its goal plus what it can still discharge into
    the site before it leaves. A change smaller than GUARD_RAISE is bisection noise, not a change.
    """
    needed = minimum_action(path, energy_init, goal_kwh, steps_left, wanted)
    if needed > wanted + GUARD_RAISE:
        return needed, 1
    if stop_at_target:
        most = maximum_action(path, energy_init, most_kept_kwh(path, goal_kwh, steps_left), wanted)
        if most < wanted - GUARD_RAISE:  # and never below what still serves the car
            return minimum_action(path, energy_init, goal_kwh, steps_left, most), -1
    return wanted, 0


# ---------------------------------------------------------------------------------------------- observations


class HourlyForecast:
    """What the next hours will hold, learnt from the hours seen so far: each building's net load (its other loads
    less its PV, kWh) and the grid's carbon intensity, as their mean by hour of the day weighted to the recent days
    (``decay`` an hour: its half-life ~3 days), plus this hour's deviation from that mean fading at the lag-one
    persistence measured on those same hours. It never reads an hour after the present.

    The product's day-ahead planner plans on it, and on a dataset of one period the agents read its means over the
    hours ahead (``observations.forecast``): an exported controller keeps learning it from the readings it acts on,
    starting from what the night had learnt by the start of the period it was proven on (spec.json's ``forecast``).
    """

    def __init__(self, buildings: int, decay: float = FORECAST_DECAY) -> None:
        self.decay = decay
        self.fixed_sum, self.carbon_sum = np.zeros((buildings, 24)), np.zeros(24)
        self.weight = np.zeros(24)
        self.previous: np.ndarray | None = None  # the last hour's deviations (buildings..., carbon)
        self.lag = np.zeros(2)  # sums of d[t] d[t-1] and of d[t-1]^2: fixed, carbon
        self.power = np.zeros(2)

    def mean(self, slots: np.ndarray, fixed_now: np.ndarray, carbon_now: float) -> tuple[np.ndarray, np.ndarray]:
        """The profile at each slot (hour of the day); an hour not seen yet takes what is seen now."""
        seen = self.weight[slots] > 0
        weight = np.maximum(self.weight[slots], 1e-12)
        fixed = np.where(seen, self.fixed_sum[:, slots] / weight, np.asarray(fixed_now).reshape(-1, 1))
        carbon = np.where(seen, self.carbon_sum[slots] / weight, carbon_now)
        return fixed, carbon

    def observe(self, slot: int, fixed_now: np.ndarray, carbon_now: float) -> None:
        """Learn this hour (``slot``: its hour of the day, 0-23)."""
        mean_fixed, mean_carbon = self.mean(np.asarray([slot]), fixed_now, carbon_now)
        deviation = np.append(fixed_now - mean_fixed[:, 0], carbon_now - mean_carbon[0])
        if self.previous is not None:
            self.lag += [float(deviation[:-1] @ self.previous[:-1]), deviation[-1] * self.previous[-1]]
            self.power += [float(self.previous[:-1] @ self.previous[:-1]), self.previous[-1] ** 2]
        self.previous = deviation
        for table in (self.fixed_sum, self.carbon_sum, self.weight):
            table *= self.decay
        self.fixed_sum[:, slot] += fixed_now
        self.carbon_sum[slot] += carbon_now
        self.weight[slot] += 1.0

    def learn(self, slots: np.ndarray, fixed_net_kwh: np.ndarray, carbon: np.ndarray) -> None:
        """Learn another period's hours first, in order (``slots``: their hours of the day): the forecast then starts
        from what the site was, not from nothing. The periods need not join: no deviation carries over."""
        fixed = np.atleast_2d(np.asarray(fixed_net_kwh, dtype=float))
        for t in range(min(len(slots), fixed.shape[1], len(carbon))):
            self.observe(int(slots[t]), fixed[:, t], float(carbon[t]))
        self.previous = None

    def ahead(self, slots: np.ndarray, fixed_now: np.ndarray, carbon_now: float) -> tuple[np.ndarray, np.ndarray]:
        """The forecast at ``slots`` (the hours of the day from now on, the first this one's), nothing learnt."""
        fixed_now = np.asarray(fixed_now, dtype=float)
        mean_fixed, mean_carbon = self.mean(slots, fixed_now, carbon_now)
        persistence = np.clip(self.lag / np.where(self.power > 0, self.power, 1.0), 0.0, 1.0)
        fade = np.arange(mean_fixed.shape[1])
        fixed = mean_fixed + (fixed_now - mean_fixed[:, 0]).reshape(-1, 1) * persistence[0] ** fade
        carbon = mean_carbon + (carbon_now - mean_carbon[0]) * persistence[1] ** fade
        return fixed, carbon

    def windows(self, slot: int, fixed_now: np.ndarray, carbon_now: float) -> np.ndarray:
        """This hour's readings -> the forecast's means over FORECAST_WINDOWS (each building's net load, then the
        carbon intensity), then this hour learnt: what a policy that reads the forecast reads now."""
        fixed, carbon = self.ahead((slot + np.arange(FORECAST_WINDOWS[-1][1] + 1)) % 24, fixed_now, carbon_now)
        out = [fixed[:, first:last + 1].mean(axis=1) for first, last in FORECAST_WINDOWS]
        out = np.stack(out, axis=1).reshape(-1).tolist() + [float(carbon[first:last + 1].mean())
                                                            for first, last in FORECAST_WINDOWS]
        self.observe(slot, fixed_now, carbon_now)
        return np.asarray(out)

    def state(self) -> dict[str, Any]:
        """What it has learnt, as JSON (spec.json's ``forecast.state``)."""
        return {"decay": self.decay, "fixed_sum": self.fixed_sum.tolist(), "carbon_sum": self.carbon_sum.tolist(),
                "weight": self.weight.tolist(), "lag": self.lag.tolist(), "power": self.power.tolist(),
                "previous": None if self.previous is None else self.previous.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> HourlyForecast:
        fixed_sum = np.asarray(state["fixed_sum"], dtype=float)
        forecast = cls(fixed_sum.shape[0], float(state["decay"]))
        forecast.fixed_sum, forecast.carbon_sum = fixed_sum, np.asarray(state["carbon_sum"], dtype=float)
        forecast.weight = np.asarray(state["weight"], dtype=float)
        forecast.lag, forecast.power = np.asarray(state["lag"], dtype=float), np.asarray(state["power"], dtype=float)
        forecast.previous = None if state["previous"] is None else np.asarray(state["previous"], dtype=float)
        if forecast.fixed_sum.shape != (forecast.fixed_sum.shape[0], 24) or forecast.weight.shape != (24,):
            raise ValueError("a forecast's tables are 24 hours of the day")
        return forecast


def hour_slots(hours: Any) -> np.ndarray:
    """CityLearn's hours (1-24; a missing one as 0) -> the forecast's hours of the day (0-23)."""
    return np.nan_to_num(np.asarray(hours, dtype=float), nan=0.0).astype(int) % 24


def forecast_names(buildings: list[str]) -> list[str]:
    """The raw observations a policy reads of the forecast (``observations.forecast``), in the raw vector's order:
    each building's net load forecast over each window, then the carbon intensity's."""
    windows = [f"{first}_{last}h" for first, last in FORECAST_WINDOWS]
    prefix = [f"{b}." if len(buildings) > 1 else "" for b in buildings]
    return ([f"{p}net_load_forecast_{w}" for p in prefix for w in windows]
            + [f"carbon_intensity_forecast_{w}" for w in windows])


class Normaliser:
    """Raw observations (a vector, or a batch of them) -> the policy's input features.

    Each feature reads one raw value: periodic ones (hour, day type, month) as the cosine or sine of
    2 pi value / period, then every feature min-max scaled to its training range (a zero-width range
    gives 0), some clipped to [0, 1]. The arithmetic is CityLearn's ``NormalizedObservationWrapper``'s.
    """

    def __init__(self, source: list[int], transform: list[str], period: list[float], low: list[float],
                 high: list[float], clip: list[bool]):
        self.source = np.asarray(source, dtype=int)
        self.is_cos = np.asarray([t == "cos" for t in transform], dtype=bool)
        self.is_sin = np.asarray([t == "sin" for t in transform], dtype=bool)
        period_arr = np.asarray(period, dtype=float)
        self.angle_scale = np.where(period_arr > 0, 2 * np.pi / np.where(period_arr > 0, period_arr, 1), 0.0)
        self.low = np.asarray(low, dtype=float)
        span = np.asarray(high, dtype=float) - self.low
        self.flat = span == 0  # CityLearn's Normalize maps a zero-width range to 0
        self.inv_span = np.where(self.flat, 0.0, 1.0 / np.where(self.flat, 1.0, span))
        self.clip = np.asarray(clip, dtype=bool)

    @classmethod
    def from_features(cls, features: list[dict[str, Any]], names: list[str]) -> Normaliser:
        position = {name: i for i, name in enumerate(names)}
        return cls([position[f["observation"]] for f in features], [f["transform"] for f in features],
                   [f.get("period", 0) for f in features], [f["low"] for f in features],
                   [f["high"] for f in features], [f.get("clip", False) for f in features])

    def __call__(self, raw: Any) -> np.ndarray:
        values = np.asarray(raw, dtype=float)[..., self.source]
        angle = values * self.angle_scale
        values = np.where(self.is_cos, np.cos(angle), np.where(self.is_sin, np.sin(angle), values))
        scaled = np.where(self.flat, 0.0, (values - self.low) * self.inv_span)
        return np.where(self.clip, np.clip(scaled, 0.0, 1.0), scaled).astype(np.float32)


def _policy_file(policy: dict[str, Any], folder: Path) -> Path:
    """The policy file ``spec.json`` names: a file of the export folder itself, whose digest matches the spec's."""
    import hashlib  # lazy: only a controller that loads a policy needs it

    name = policy["file"]
    if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
        raise InputError(f"{folder / SPEC_FILE} names the policy file {name!r}: expected a file of the export folder "
                         "itself; export the run again")
    path = folder / name
    expected = policy.get("sha256")
    if expected is not None and path.is_file():
        if hashlib.sha256(path.read_bytes()).hexdigest() != expected:
            raise InputError(f"{path} is not the policy {SPEC_FILE} was written with (its SHA-256 differs): "
                             "export the run again, or copy the export folder whole")
    return path


# How ONNX names a tensor's weights kept in another file: an external_data entry whose key is "location"
# (protobuf: field 1, 8 bytes, "location"). An export writes none; onnxruntime before 1.24 would read any path it
# names, the folder's outside included, so a policy file that names one is refused whatever the runtime.
_EXTERNAL_DATA_KEY = b"\n\x08location"


def _names_external_data(path: Path) -> bool:
    try:
        return _EXTERNAL_DATA_KEY in path.read_bytes()
    except OSError:
        return False  # onnxruntime names what it cannot read


def _number(name: str, value: Any, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"observation {name!r} is {value!r}: expected a number ({unit})")
    number = float(value)
    if not math.isfinite(number):
        raise InputError(f"observation {name!r} is {value}: expected a finite number ({unit}); "
                         "a missing reading must be filled before the controller acts")
    return number


def _program() -> Any:
    """The site's linear program: the product's module inside the product, else program.py beside this file (a
    planner's export ships it); scipy solves it."""
    if __package__:
        module = importlib.import_module(".program", __package__)
    else:
        module = sys.modules.get("pvbess_program")
        if module is None:
            path = Path(__file__).resolve().with_name(PROGRAM_FILE)
            if not path.is_file():
                raise InputError(f"{path} not found: a planner's export ships it beside controller.py; export the "
                                 "run again")
            spec = importlib.util.spec_from_file_location("pvbess_program", path)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules["pvbess_program"] = module  # registered first: its dataclasses look their module up
            spec.loader.exec_module(module)  # type: ignore[union-attr]
    try:
        import scipy.optimize  # noqa: F401 - the program's solver (HiGHS)
    except ImportError:
        raise InputError("the planner needs scipy to solve its program: pip install scipy numpy") from None
    return module


# ------------------------------------------------------------------------------------------------ the controller


@dataclass(frozen=True)
class GuardedCharger:
    """One charger the guard watches: where its car's readings are, where its action goes, its physics."""

    action: int
    connected: str
    soc: str
    capacity: str
    required_soc: str
    departure_time: str
    charger: dict[str, Any]
    building: int = 0  # the site's building it is in (exports before the planner was one did not say)
    charger_id: str = ""  # CityLearn's name of it (the planner's stays are by it; exports before it did not say)


class Controller:
    """The exported policy with everything it needs to act: ``Controller.load(folder).act(observations)``."""

    def __init__(self, spec: dict[str, Any], folder: Path):
        if spec.get("format") != FORMAT or spec.get("version") != VERSION:
            raise InputError(f"{folder / SPEC_FILE} is {spec.get('format')!r} version {spec.get('version')!r}: "
                             f"expected {FORMAT!r} version {VERSION} (export the run again with this version)")
        self.spec = spec
        self.folder = folder
        self.observations: list[dict[str, Any]] = spec["observations"]  # what the site gives, each step
        self.site_names = [o["name"] for o in self.observations]
        # The day-ahead planner (policy.kind "planner"): the program it solves and the forecast it plans on.
        self.planner: dict[str, Any] | None = spec["planner"] if spec["policy"].get("kind") == PLANNER else None
        self.idle_steps = 0  # the planner's hours without a feasible plan (devices idle, the guard serves cars)
        self._planning: tuple[Any, list[tuple[dict[str, Any], Any]]] | None = None  # program, each battery's model
        # The planner's car at each charger (program.Stay, read every hour) and each charger's stays (program.Stays,
        # None: the planner knows a car only once its departure reads), made with the program.
        self._stay: list[Any] = []
        self._stays: list[Any] = []
        # The forecast of the hours ahead the policy reads (observations.forecast), or the planner plans on: the
        # controller learns it from the readings it acts on, from where the night had learnt it by the period it was
        # proven on.
        forecast = self.planner["forecast"] if self.planner is not None else spec.get("forecast")
        self.forecast = None if forecast is None else HourlyForecast.from_state(forecast["state"])
        self.forecast_spec: dict[str, Any] = forecast or {}
        self.names = self.site_names + list(self.forecast_spec.get("names", []))  # the raw vector's order
        self.normalise = None if self.planner is not None else Normaliser.from_features(spec["features"], self.names)
        self.actions: list[dict[str, Any]] = spec["actions"]
        self.native_low = np.asarray([a["low"] for a in self.actions], dtype=float)
        self.native_high = np.asarray([a["high"] for a in self.actions], dtype=float)
        if not (np.all(np.isfinite(self.native_low)) and np.all(np.isfinite(self.native_high))
                and np.all(self.native_low <= self.native_high)):
            raise InputError(f"{folder / SPEC_FILE}: an action's range is not two finite numbers, low to high: "
                             "export the run again")
        self.policy_file = None if self.planner is not None else _policy_file(spec["policy"], folder)
        guard = spec["ev_guard"]
        self.guard_on = bool(guard["enabled"])
        self.margin_soc = float(guard["margin_soc"])
        self.stop_at_target = bool(guard.get("stop_at_target", False))  # exports before it was a rule did not stop
        self.hours = float(guard["hours"])
        self.batteries: list[dict[str, Any]] = guard["ev_batteries"]
        self.chargers = [GuardedCharger(**c) for c in guard["chargers"]]
        self._paths: dict[tuple[int, float], ChargingPath] = {}
        self._session = None
        # Readings beyond what the policy trained on but within what is plausible: acted on, and counted here.
        self.trained = [obs.get("trained", obs["valid"]) for obs in self.observations]
        self.beyond_training: dict[str, int] = {}

    @classmethod
    def load(cls, folder: str | Path = ".") -> Controller:
        folder = Path(folder)
        path = folder / SPEC_FILE
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"{path} not found: pass the export folder that `trainer export` wrote") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{path} could not be read ({exc}): export the run again") from None
        try:
            return cls(spec, folder)
        except (KeyError, TypeError, AttributeError) as exc:  # an edited or truncated spec
            raise InputError(f"{path} is not a whole export (no {exc}): export the run again") from None

    # -- inputs

    def raw_vector(self, observations: dict[str, Any]) -> np.ndarray:
        """One step's raw observations by name -> the vector in the export's order; refuses what it cannot use."""
        if not isinstance(observations, dict):
            raise InputError(f"observations are a {type(observations).__name__}: expected an object of "
                             "{name: number} (python controller.py example prints one)")
        extra = sorted(set(observations) - set(self.names))
        given_forecast = [name in observations for name in self.names[len(self.site_names):]]
        if any(given_forecast) and not all(given_forecast) and not extra:
            raise InputError(f"{sum(given_forecast)} of the forecast's {len(given_forecast)} readings given: the "
                             "controller forecasts the hours ahead itself; give none of them (or all, as check.csv "
                             "does for steps hours apart)")
        if extra:
            raise InputError(f"unknown observation {extra[0]!r}"
                             f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}: expected only the "
                             f"export's {len(self.site_names)} observations (python controller.py example lists them)")
        values = np.empty(len(self.names))
        for i, obs in enumerate(self.observations):  # the site's readings; the forecast's are the controller's
            name, unit = obs["name"], obs["unit"]
            if name not in observations:
                raise InputError(f"missing observation {name!r} ({unit}): the export needs all "
                                 f"{len(self.site_names)} (python controller.py example lists them)")
            value = _number(name, observations[name], unit)
            low, high = obs["valid"]
            if not low <= value <= high:
                raise InputError(f"observation {name!r} is {value:g}, outside {low:g}..{high:g} ({unit}): "
                                 "check the reading and its unit")
            if not self.trained[i][0] <= value <= self.trained[i][1]:
                self.beyond_training[name] = self.beyond_training.get(name, 0) + 1
            values[i] = value
        if len(self.names) > len(self.site_names) and all(given_forecast):
            # A row that carries the forecast the product read (check.csv's sampled steps, hours apart): as given.
            values[len(self.site_names):] = [_number(n, observations[n], "kWh or kg/kWh")
                                             for n in self.names[len(self.site_names):]]
            return values
        return self.with_forecast(values[:len(self.site_names)])

    def forecast_state(self) -> dict[str, Any] | None:
        """What the controller's forecast has learnt so far, as JSON (None: the policy reads no forecast): keep it
        between calls and give it back to :meth:`resume_forecast`, or a controller loaded again starts from the
        export's state, the start of the period it was proven on."""
        if self.forecast is None:
            return None
        state = self.forecast.state()
        if self.planner is not None and self._stay:  # the planner's cars too: how long each has been connected
            state["cars"] = [stay.state() for stay in self._stay]
        return state

    def resume_forecast(self, state: dict[str, Any], source: str = "the forecast's state") -> None:
        """Go on from a :meth:`forecast_state` kept earlier (``source`` names it in an error); nothing where the
        policy reads no forecast."""
        if self.forecast is None:
            return
        try:
            resumed = HourlyForecast.from_state(state)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{source} is damaged ({type(exc).__name__}: {exc}): delete it to start again from "
                             "the export's forecast") from None
        buildings = self.forecast.fixed_sum.shape[0]
        if resumed.fixed_sum.shape[0] != buildings:
            raise InputError(f"{source} forecasts {resumed.fixed_sum.shape[0]} building(s), this export "
                             f"{buildings}: it is another export's; pass this export's, or delete it to start again")
        cars = state.get("cars") if self.planner is not None else None
        if cars is not None:  # a state kept before the planner kept its cars has none: they are read from now on
            program = self._planning_parts()[0]
            try:
                stays = [program.Stay.from_state(car) for car in cars]
            except (TypeError, ValueError) as exc:
                raise InputError(f"{source} is damaged ({type(exc).__name__}: {exc}): delete it to start again from "
                                 "the export's forecast") from None
            if len(stays) != len(self.chargers):
                raise InputError(f"{source} holds {len(stays)} charger(s)' cars, this export {len(self.chargers)}: "
                                 "it is another export's; pass this export's, or delete it to start again")
            self._stay = stays
        self.forecast = resumed

    def with_forecast(self, site_values: np.ndarray) -> np.ndarray:
        """The site's readings of this step, in ``observations``' order -> the raw vector, the forecast of the hours
        ahead appended (and this hour learnt: steps must come in order, an hour apart)."""
        if self.forecast is None or self.planner is not None:  # the planner reads its forecast as it plans
            return np.asarray(site_values, dtype=float)
        slot, fixed, carbon = self._now(dict(zip(self.site_names, np.asarray(site_values, dtype=float).tolist())))
        return np.concatenate([site_values, self.forecast.windows(slot, fixed, carbon)])

    def _now(self, value: dict[str, float]) -> tuple[int, np.ndarray, float]:
        """What the forecast learns of this hour (``value``: the site's readings by name): its hour of the day, each
        building's net load (its other loads less its PV), the grid's carbon intensity."""
        reads = self.forecast_spec
        fixed = np.asarray([value[load] - (value[solar] if solar else 0.0)
                            for load, solar in zip(reads["loads"], reads["solar"])])
        return int(value[reads["hour"]]) % 24, fixed, float(value[reads["carbon"]])

    # -- acting

    def policy_actions(self, features: np.ndarray) -> np.ndarray:
        """The policy's deterministic actions in [-1, 1] for a batch of normalised observations."""
        if self._session is None:
            try:
                import onnxruntime  # lazy: `example` and input errors need no runtime
            except ImportError:
                raise InputError("the controller needs onnxruntime: pip install onnxruntime numpy") from None
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = 1  # one step of a small network: threads cost more than they give
            path = self.policy_file
            if _names_external_data(path):
                raise InputError(f"{path} keeps its weights in other files (ONNX external data), which the "
                                 "controller does not read: an export holds its whole network in one file; export "
                                 "the run again")
            try:
                self._session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own classes for a missing or bad file
                raise InputError(f"{path} could not be loaded ({type(exc).__name__}): export the run again") from None
        try:
            (out,) = self._session.run([self.spec["policy"]["output"]], {self.spec["policy"]["input"]: features})
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own classes: a network of another size or names
            raise InputError(f"{self.policy_file} does not take {features.shape[-1]} features as {SPEC_FILE} says "
                             f"({type(exc).__name__}): export the run again") from None
        out = np.asarray(out, dtype=float)
        if out.shape != (len(features), len(self.actions)) or not np.all(np.isfinite(out)):
            what = "a non-finite action" if out.shape[-1:] == (len(self.actions),) else f"actions of shape {out.shape}"
            raise InputError(f"{self.policy_file} gave {what} for these readings: nothing is sent to the site; "
                             "export the run again")
        return np.clip(out, -1.0, 1.0)

    def native(self, raw: np.ndarray, period_left: int | None = None) -> tuple[np.ndarray, list[int]]:
        """CityLearn's actions (each in its own range) for one raw vector, with the guard applied. ``period_left``:
        for a planner replaying the period it was proven on, the steps left of it, this one included (its last day's
        plans return the battery to where the period began, as the product's did); None at a site, which runs on."""
        if self.planner is not None:
            native = self.planned(raw, period_left)
        else:
            action = self.policy_actions(self.normalise(raw)[None, :])[0]  # type: ignore[misc]
            native = self.native_low + (action + 1.0) / 2.0 * (self.native_high - self.native_low)
        native, changed = self.guarded(raw, native)
        if not np.all(np.isfinite(native)):  # every action leaves finite and in its range, or the step is refused
            raise InputError("an action came out non-finite for these readings: nothing is sent to the site")
        return np.clip(native, self.native_low, self.native_high), changed

    def planned(self, raw: np.ndarray, period_left: int | None = None) -> np.ndarray:
        """The day-ahead planner's actions for one raw vector (the product's planner, trainer.references.planner):
        the next :data:`program.HORIZON_STEPS` hours forecast from the hours seen so far, this one learnt, the
        plan of least CO2 over them solved and its first hour applied (before the guard)."""
        planner = self.planner
        assert planner is not None  # a planner's export
        program, models = self._planning_parts()
        value = dict(zip(self.names, raw.tolist()))
        slot, fixed_now, carbon_now = self._now(value)
        horizon = int(planner["horizon_steps"])
        steps = horizon if period_left is None else max(1, min(horizon, period_left))
        fixed, carbon = self.forecast.ahead((slot + np.arange(steps)) % 24, fixed_now, carbon_now)  # type: ignore
        self.forecast.observe(slot, fixed_now, carbon_now)  # type: ignore[union-attr]
        ending = period_left is not None and steps >= period_left
        batteries = []
        for entry, model in models:
            energy = max(value[entry["soc"]] * model.capacity_kwh, model.min_kwh)  # CityLearn floors it there
            batteries.append(program.window_battery(model, energy, steps, model.initial_kwh if ending else None))
        cars = []
        for index, c in enumerate(self.chargers):
            capacity, required, left = value[c.capacity], value[c.required_soc], value[c.departure_time]
            connected = value[c.connected] == 1
            self._stay[index].read(slot, connected, left)
            # -1: its departure not known yet (the guard owes it nothing; the planner estimates it from the stays)
            due = program.car_due(required, left, self._stay[index], self._stays[index]) if connected else None
            if due is None or capacity <= 0:
                continue
            path = self._path(index, capacity)
            cars.append(program.CarNow(c.building, str(index), path, max(value[c.soc], path.min_soc) * capacity,
                                       due[0] * capacity, int(min(due[1], MAX_STEPS_AHEAD))))
        native = np.zeros(len(self.actions))
        try:
            battery, car = program.decide(fixed, carbon, self.hours, batteries, cars, self.margin_soc)
        except program.OptimumUnavailable:  # no plan the window can reach: idle, the guard serves the cars
            self.idle_steps += 1
            return native
        for entry, model in models:
            native[int(entry["action"])] = battery.get(model.building, 0.0)
        for index, c in enumerate(self.chargers):
            native[c.action] = car.get(str(index), 0.0)
        return native

    def _planning_parts(self) -> tuple[Any, list[tuple[dict[str, Any], Any]]]:
        """The program's module, each battery's constants in it (with its spec entry) and each charger's stays, read
        once: the hours after the first only fill in what each battery and car holds."""
        if self._planning is None:
            program = _program()
            models = [(entry, program.BatteryModel(
                building=int(entry["building"]), capacity_kwh=float(entry["capacity_kwh"]),
                max_kwh_per_step=float(entry["max_kwh_per_step"]), efficiency=float(entry["efficiency"]),
                loss_per_step=float(entry["loss_per_step"]), min_kwh=float(entry["min_kwh"]),
                initial_kwh=float(entry["period_start_kwh"]), nominal_power_kw=float(entry["nominal_power_kw"]),
                power_lines=tuple((float(a), float(b)) for a, b in entry["power_lines"])))
                for entry in self.planner["batteries"]]  # type: ignore[index]
            stays = self.planner.get("stays", {})  # type: ignore[union-attr]
            try:
                self._stays = [program.Stays.from_json(stays[c.charger_id]) if c.charger_id in stays else None
                               for c in self.chargers]
            except (KeyError, TypeError, ValueError) as exc:
                raise InputError(f"{self.folder / SPEC_FILE}: the planner's stays are damaged ({exc}): export the "
                                 "run again") from None
            if not self._stay:
                self._stay = [program.Stay() for _ in self.chargers]
            self._planning = program, models
        return self._planning

    def guarded(self, raw: np.ndarray, native: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """``native`` with the product's EV guard applied from the readings: each connected car's action raised to
        the least that still serves it by departure and, where the export stops cars at their goal, lowered to the
        most that does not fill a car past it; and, per action, +1 where it raised it, -1 where it lowered it."""
        native = np.array(native, dtype=float, copy=True)
        changed = [0] * len(native)
        if not self.guard_on:
            return native, changed
        value = dict(zip(self.names, raw.tolist()))
        for index, c in enumerate(self.chargers):
            capacity, required, left = value[c.capacity], value[c.required_soc], value[c.departure_time]
            if value[c.connected] != 1 or required <= 0 or capacity <= 0 or left < 0:  # -1: departure not known yet
                continue
            path = self._path(index, capacity)
            energy = max(value[c.soc], path.min_soc) * capacity  # CityLearn floors what a car holds there
            goal = (required + self.margin_soc) * capacity
            native[c.action], changed[c.action] = guarded_action(path, energy, goal, int(min(left, MAX_STEPS_AHEAD)),
                                                                 float(native[c.action]), self.stop_at_target)
        return native, changed

    def _path(self, charger: int, capacity: float) -> ChargingPath:
        """The charger with the car whose capacity the readings give (the site's first of that capacity)."""
        key = (charger, capacity)
        if key not in self._paths:
            battery = min(self.batteries, key=lambda b: abs(b["capacity_kwh"] - capacity))
            path = ChargingPath.from_parts(self.chargers[charger].charger, battery, self.hours)
            self._paths[key] = path.with_capacity(capacity)
        return self._paths[key]

    def act(self, observations: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """One step: raw observations by name -> each action in CityLearn's units and in kW, guard applied."""
        native, changed = self.native(self.raw_vector(observations))
        out = {}
        for spec, value, change in zip(self.actions, native.tolist(), changed):
            kw = spec.get("kw_per_unit")
            if spec.get("kw_per_unit_discharging") is not None and value < 0:
                kw = spec["kw_per_unit_discharging"]
            out[spec["name"]] = {"value": value, "kw": None if kw is None else value * kw,
                                 "guard_raised": change > 0, "guard_lowered": change < 0}
        return out


# --------------------------------------------------------------------------------------------------- the CLI


def _cell(text: str | None) -> Any:
    """A CSV cell as a number where it is one; anything else is left for the controller to refuse by name."""
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return text


def _read_steps(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """(steps, as_csv): a JSON object of one step, a JSON list of steps, or a CSV with a header of names."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    if path.suffix.lower() == ".csv":
        rows = _rows(csv.DictReader(text.splitlines()), path)
        if not rows:
            raise InputError(f"{path} has no rows: expected a header of observation names and one row a step")
        return [{k: _cell(v) for k, v in row.items() if not k.startswith(EXPECTED_PREFIX)} for row in rows], True
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{path} is not JSON ({exc}): expected {{name: number}} (python controller.py example)") \
            from None
    return (data if isinstance(data, list) else [data]), False


def _rows(reader: csv.DictReader, path: Path) -> list[dict[str, Any]]:
    """A CSV's rows, each with as many cells as its header has names."""
    rows = []
    try:
        for row in reader:
            if None in row or None in row.values():
                raise InputError(f"{path}, row {reader.line_num}: {'more' if None in row else 'fewer'} cells than "
                                 "the header has names")
            rows.append(row)
    except csv.Error as exc:
        raise InputError(f"{path}, row {reader.line_num}: not CSV ({exc})") from None
    return rows


def _sample(path: Path) -> list[dict[str, str]]:
    """check.csv's rows: the evaluation's raw observations and, under ``expected:``, the product's actions."""
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = _rows(csv.DictReader(handle), path)
    except OSError as exc:
        raise InputError(f"cannot read {path} ({exc.strerror}): export the run again, it writes one") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    if not rows:
        raise InputError(f"{path} has no rows: export the run again")
    return rows


def _check(controller: Controller, sample: Path) -> int:
    """Act on every row of ``sample`` (check.csv, or a CSV of another period's readings); where it holds the
    product's actions (``expected:`` columns), compare. Exit 0 when every row was acted on and every action matched."""
    names = [a["name"] for a in controller.actions]
    rows = _sample(sample)
    worst, at, refused, first_refusal = 0.0, None, 0, ""
    compared = all(EXPECTED_PREFIX + n in rows[0] for n in names)
    # A planner's check.csv is the whole period it was proven on, every hour in order: its last day plans to the
    # period's end, as the product's did. Another period's readings (--obs) are planned as a site runs on.
    planner = controller.planner
    whole = planner is not None and sample.name == CHECK_FILE and len(rows) == int(planner.get("proven_steps", -1))
    for i, row in enumerate(rows):
        try:
            raw = controller.raw_vector({k: _cell(v) for k, v in row.items() if not k.startswith(EXPECTED_PREFIX)})
        except InputError as exc:
            refused += 1
            first_refusal = first_refusal or f"row {i + 1}: {exc}"
            continue
        native = controller.native(raw, len(rows) - i if whole else None)[0]
        if compared:
            expected = [_cell(row[EXPECTED_PREFIX + n]) for n in names]
            if not all(isinstance(e, float) and math.isfinite(e) for e in expected):
                raise InputError(f"{sample}, row {i + 1}: an '{EXPECTED_PREFIX}' column is not a finite number")
            diff = float(np.max(np.abs(native - np.asarray(expected))))
            if diff > worst:
                worst, at = diff, i
    ok = worst <= CHECK_TOLERANCE and refused == 0
    where = f" (row {at + 1})" if at is not None else ""
    what = "steps of the evaluation" if sample.name == CHECK_FILE else f"steps of {sample}"
    verdict = "ok" if ok else "MISMATCH" if refused == 0 else "REFUSED"
    line = f"{verdict}: acted on {len(rows) - refused} of {len(rows)} {what}"
    if compared:
        line += f", largest difference from the product's actions {worst:.2e}{where}, tolerance {CHECK_TOLERANCE:g}"
    print(line)
    beyond = controller.beyond_training
    if beyond:
        counted = ", ".join(f"{name} {count}" for name, count in sorted(beyond.items(), key=lambda kv: -kv[1]))
        learnt = "of the part of the data the run learnt from" if controller.planner else "the policy trained on"
        print(f"readings beyond the range {learnt} (acted on, as a deployed controller would): {counted}")
    if refused:
        print(f"refused {refused} step(s) with a reading outside what is plausible; first: {first_refusal}")
    if controller.idle_steps:
        print(f"the planner found no feasible plan in {controller.idle_steps} hour(s): the battery and chargers were "
              "left idle there, the EV guard serving the cars")
    return 0 if ok else 1


def _resume(controller: Controller, path: Path) -> None:
    """The forecast's state kept at ``path`` by an earlier ``act --state``, where there is one."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return  # the first call: the export's state
    except OSError as exc:
        raise InputError(f"--state {path} could not be read ({exc}): check the path") from None
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise InputError(f"--state {path} is not JSON ({exc}): delete it to start again from the export's "
                         "forecast") from None
    controller.resume_forecast(state, f"--state {path}")


def _keep(controller: Controller, path: Path) -> None:
    """Write the forecast's state to ``path`` whole or not at all (beside it, then renamed over it): a call killed
    while writing leaves the last state, never half of one."""
    state = controller.forecast_state()
    if state is None:
        return
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        aside.write_text(json.dumps(state), encoding="utf-8")
        os.replace(aside, path)
    except OSError as exc:
        aside.unlink(missing_ok=True)
        raise InputError(f"--state {path} could not be written ({exc}): the actions above stand, the next call "
                         "starts from the state kept before; free the disk or pass a writable path") from None


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(prog="controller.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, default=here, help="the export folder (default: this file's)")
    sub = parser.add_subparsers(dest="command", required=True)
    act = sub.add_parser("act", help="print the actions for raw observations (JSON of one step, or a CSV of steps)")
    act.add_argument("--obs", type=Path, required=True, help="a .json of {name: value} or a .csv with a header")
    act.add_argument("--state", type=Path, default=None,
                     help="a .json the forecast of the hours ahead is kept in between calls: read where it exists, "
                          "written after acting (a site that calls act each hour keeps learning it); without it each "
                          "call starts from the export's forecast. Nothing where the policy reads no forecast")
    check = sub.add_parser("check", help="replay the export's sample of the evaluation (or --obs: another period's "
                                         "readings); exit 0 when every step is acted on and every action matches")
    check.add_argument("--obs", type=Path, default=None, help="a .csv of raw observations with a header (optionally "
                                                              f"'{EXPECTED_PREFIX}ACTION' columns to compare)")
    sub.add_parser("example", help="print one step of the sample as the JSON `act` reads")
    args = parser.parse_args(argv)
    try:
        controller = Controller.load(args.export)
        sample = args.export / CHECK_FILE
        if args.command == "check":
            return _check(controller, args.obs or sample)
        if args.command == "example":
            row = _sample(sample)[0]
            step = {n: _cell(row[n]) for n in controller.site_names}
            print(json.dumps(step, indent=2))
            return 0
        steps, as_csv = _read_steps(args.obs)
        if args.state is not None:
            _resume(controller, args.state)
        results = []
        for i, step in enumerate(steps):
            try:
                results.append(controller.act(step))
            except InputError as exc:
                where = f"{args.obs}, step {i + 1}" if len(steps) > 1 else str(args.obs)
                raise InputError(f"{where}: {exc}") from None
        if as_csv:
            names = [a["name"] for a in controller.actions]
            writer = csv.writer(sys.stdout)
            writer.writerow([f"{n}_kw" for n in names] + [f"{n}_guard_raised" for n in names]
                            + [f"{n}_guard_lowered" for n in names])
            for r in results:
                writer.writerow([r[n]["kw"] for n in names] + [int(r[n]["guard_raised"]) for n in names]
                                + [int(r[n]["guard_lowered"]) for n in names])
        else:
            print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
        if args.state is not None:  # after the actions: a site gets them even where the state cannot be kept
            _keep(controller, args.state)
        return 0
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError) as exc:
        # Anything else a damaged file or reading gets to: one line and exit 2, never a traceback at a site.
        print(f"error: the export folder or the readings are damaged ({type(exc).__name__}: {str(exc)[:200]}): "
              "export the run again, and check the readings' file", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `act ... | head`: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit; let it flush here
        return 0


if __name__ == "__main__":
    sys.exit(main())
