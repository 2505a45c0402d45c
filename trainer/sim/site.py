"""A CityLearn site as arrays, stepped in N environments at once (the physics of the training simulator).

What does not depend on the actions is read from CityLearn once (:class:`SiteTables`): every raw
observation of a zero-action pass over the whole period (weather, prices, carbon, loads, PV, the
chargers' sessions and CityLearn's predictions, exactly as it gives them) and each building's net
consumption with its battery idle and its chargers off. What does depend on them is simulated as
CityLearn 3.0.2 simulates it (:class:`VectorSite`): each building's battery and each car's battery
(trainer.sim.battery), the chargers (power deadbands, efficiencies, V2G discharge), the cars' state
of charge at arrival, and the net consumption they make. CityLearn stays the judge: tests/test_sim.py
and ``trainer sim check`` drive both with the same actions and compare every step.

Timing, as CityLearn has it: the observation at step t shows the state of charge and net consumption
*after* step t - 1 (its ``endogenous_t``); step t first carries every battery over from t - 1
(standby loss), then plugs in the cars that arrive, then applies the actions. An episode of L steps
takes L - 1 actions, and the observation after the last one repeats the one before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.references.optimum_model import EV_ACTION_PREFIX
from trainer.sim.battery import BatteryBank, BatterySpec

CONNECTED, INCOMING = 1, 2
BATTERY_ACTION = "electrical_storage"


class Unsupported(Exception):
    """The dataset holds something the training simulator does not model (the message says what)."""


def unsupported_reason(env: Any) -> str | None:
    """Why this CityLearnEnv cannot be simulated as arrays, or None when it can."""
    for building in env.buildings:
        kind = type(building).__name__
        if kind != "Building":
            return f"{building.name} is a {kind} (a thermal dynamics model: its temperatures depend on the actions)"
        extra = [a for a in building.active_actions if a != BATTERY_ACTION and not a.startswith(EV_ACTION_PREFIX)]
        if extra:
            return f"{building.name} has actions the simulator does not model: {', '.join(extra)}"
        for name in ("deferrable_appliances", "escalators"):
            if getattr(building, name, None):
                return f"{building.name} has {name.replace('_', ' ')}"
        if getattr(building, "simulate_power_outage", False):
            return f"{building.name} simulates power outages"
        for device in [building.electrical_storage, *(ev.battery for ev in env.electric_vehicles or [])]:
            ratio = getattr(device, "time_step_ratio", None)
            if ratio not in (None, 0, 1, 1.0):
                return f"{building.name}: a storage time_step_ratio of {ratio} (only the dataset's step is modelled)"
    return None


def _valid_soc(value: Any) -> float:
    """A state of charge CityLearn accepts (a finite number in [0, 1]), else NaN."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value if 0.0 <= value <= 1.0 else math.nan


def _valid_id(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() not in ("", "nan") else None


@dataclass(frozen=True)
class ChargerSpec:
    building: np.ndarray
    action: np.ndarray  # index in the central agent's action vector
    max_charge_kw: np.ndarray
    min_charge_kw: np.ndarray
    max_discharge_kw: np.ndarray
    min_discharge_kw: np.ndarray
    efficiency: np.ndarray
    charge_curves: tuple[np.ndarray | None, ...]
    discharge_curves: tuple[np.ndarray | None, ...]

    @classmethod
    def of(cls, chargers: list[tuple[int, int, Any]]) -> ChargerSpec:
        def column(name: str) -> np.ndarray:
            return np.asarray([float(getattr(c, name) or 0.0) for _, _, c in chargers], dtype=float)

        def curve(c: Any, name: str) -> np.ndarray | None:
            value = getattr(c, name)
            return None if value is None else np.asarray(value, dtype=float)

        return cls(
            building=np.asarray([b for b, _, _ in chargers], dtype=int),
            action=np.asarray([a for _, a, _ in chargers], dtype=int),
            max_charge_kw=column("max_charging_power"), min_charge_kw=column("min_charging_power"),
            max_discharge_kw=column("max_discharging_power"), min_discharge_kw=column("min_discharging_power"),
            efficiency=column("efficiency"),
            charge_curves=tuple(curve(c, "charge_efficiency_curve") for _, _, c in chargers),
            discharge_curves=tuple(curve(c, "discharge_efficiency_curve") for _, _, c in chargers),
        )

    def efficiency_at(self, normalised: np.ndarray, charging: np.ndarray) -> np.ndarray:
        """``Charger.get_efficiency``: np.interp on the curve of the direction, else the charger's efficiency."""
        out = np.broadcast_to(self.efficiency, normalised.shape).copy()
        if charging.shape != normalised.shape:
            charging = np.broadcast_to(charging, normalised.shape)
        for c, (up, down) in enumerate(zip(self.charge_curves, self.discharge_curves)):
            column = out[..., c]  # a view: (N,) or, for the guard's search, (points, N)
            for curve, direction in ((up, charging[..., c]), (down, ~charging[..., c])):
                if curve is not None and direction.any():
                    column[direction] = np.interp(normalised[..., c][direction], curve[0], curve[1])
        return out

    def power_kw(self, action: np.ndarray) -> np.ndarray:
        """Signed power after each direction's deadband (``Charger._signed_power_from_action``)."""
        action = np.nan_to_num(np.clip(action, -1.0, 1.0), nan=0.0)

        def deadband(max_kw: np.ndarray, min_kw: np.ndarray) -> np.ndarray:
            max_kw = np.maximum(max_kw, 0.0)
            min_kw = np.clip(min_kw, 0.0, max_kw)
            requested = np.abs(action) * max_kw
            return np.where((max_kw <= 0.0) | (requested < min_kw), 0.0, np.minimum(requested, max_kw))

        return np.where(action > 0, deadband(self.max_charge_kw, self.min_charge_kw),
                        np.where(action < 0, -deadband(self.max_discharge_kw, self.min_discharge_kw), 0.0))


@dataclass(frozen=True)
class SiteTables:
    """Everything about the site that the actions cannot change, read once from a CityLearnEnv of the whole period."""

    steps: int  # CityLearn's time_steps: an episode of the whole period takes steps - 1 actions
    hours: float
    raw: np.ndarray  # (steps, K) raw observations (the central agent's list) of a zero-action pass
    fixed_net: np.ndarray  # (steps, B) net consumption with batteries idle and chargers off
    batteries: BatterySpec
    battery_building: np.ndarray  # (Mb,)
    battery_action: np.ndarray  # (Mb,)
    chargers: ChargerSpec
    cars: BatterySpec
    connected: np.ndarray  # (steps, C) index of the car at each charger, -1 for none
    arrival_soc: np.ndarray  # (steps, C) soc a car is given when it plugs in at t mid-episode (NaN: keeps its own)
    first_soc: np.ndarray  # (steps, C) soc a car plugged in when an episode starts at t is given (NaN: initial)
    incoming_soc: np.ndarray  # (steps, E) soc a car is given at the end of step t, as it is about to plug in
    required_soc: np.ndarray  # (steps, C) the connected car's required soc at departure (CityLearn's, NaN: none)
    departure: np.ndarray  # (steps, C) steps after t before it leaves (NaN: none)
    carbon: np.ndarray  # (steps, B) kg CO2 per kWh
    price: np.ndarray  # (steps, B) per kWh
    soc_column: np.ndarray  # (Mb,) position of each battery's soc in the raw observations, -1 if unobserved
    net_column: np.ndarray  # (B,)
    car_soc_column: np.ndarray  # (C,)
    n_actions: int

    @property
    def n_buildings(self) -> int:
        return self.fixed_net.shape[1]

    def copies(self, n_envs: int) -> VectorSite:
        """``n_envs`` copies of the site, stepped as one (trainer.sim.simulators.SiteModel)."""
        return VectorSite(self, n_envs)

    @classmethod
    def read(cls, env: Any, steps: int | None = None) -> SiteTables:
        """From a CityLearnEnv whose episode is the whole period (trainer.env.citylearn's evaluation environment):
        all of it, or its first ``steps`` (a validation window from the period's start: a year's pass for a 48-step
        window took 20 s of a tune trial's 30)."""
        if reason := unsupported_reason(env):
            raise Unsupported(reason)
        steps = env.time_steps if steps is None else min(steps, env.time_steps)
        raw, fixed = _zero_action_pass(env, steps)
        columns = _observation_columns(env)
        batteries, chargers, offset = [], [], 0
        for b, building in enumerate(env.buildings):
            for k, name in enumerate(building.active_actions):
                if name == BATTERY_ACTION:
                    batteries.append((b, offset + k, building.electrical_storage))
                else:
                    charger_id = name[len(EV_ACTION_PREFIX):]
                    charger = next(c for c in building.electric_vehicle_chargers if c.charger_id == charger_id)
                    chargers.append((b, offset + k, charger))
            offset += len(building.active_actions)
        cars = list(env.electric_vehicles or [])
        car_index = {car.name: i for i, car in enumerate(cars)}
        sessions = _sessions([c for _, _, c in chargers], car_index, steps)
        return cls(
            steps=steps, hours=env.seconds_per_time_step / 3600.0, raw=raw, fixed_net=fixed,
            batteries=BatterySpec.of([s for _, _, s in batteries], env.seconds_per_time_step),
            battery_building=np.asarray([b for b, _, _ in batteries], dtype=int),
            battery_action=np.asarray([a for _, a, _ in batteries], dtype=int),
            chargers=ChargerSpec.of(chargers),
            cars=BatterySpec.of([car.battery for car in cars], env.seconds_per_time_step),
            **sessions,
            soc_column=np.asarray([columns.get((b, "electrical_storage_soc"), -1) for b, _, _ in batteries], dtype=int),
            net_column=np.asarray([columns.get((b, "net_electricity_consumption"), -1)
                                   for b in range(len(env.buildings))], dtype=int),
            car_soc_column=np.asarray([columns.get((b, f"connected_electric_vehicle_at_charger_{c.charger_id}_soc"), -1)
                                       for b, _, c in chargers], dtype=int),
            n_actions=offset,
            carbon=np.stack([np.asarray(b.carbon_intensity.carbon_intensity, dtype=float)[:steps]
                             for b in env.buildings], axis=1),
            price=np.stack([np.asarray(b.pricing.electricity_pricing, dtype=float)[:steps] for b in env.buildings],
                           axis=1),
        )


def _zero_action_pass(env: Any, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw observations and net consumption of the period's first ``steps`` with every action 0: those of the whole
    period's pass, cut (a step further where there is one, which settles the last step's consumption)."""
    observations, _ = env.reset()
    zero = [np.zeros(env.action_space[0].shape[0])]
    rows = [np.asarray(observations[0], dtype=float)]
    for _ in range(min(steps, env.time_steps - 1)):
        observations, _, _, _, _ = env.step(zero)
        rows.append(np.asarray(observations[0], dtype=float))
    rows = rows[:steps]
    fixed = np.stack([np.asarray(b.net_electricity_consumption, dtype=np.float32)[:steps] for b in env.buildings],
                     axis=1)
    env.reset()
    return np.stack(rows), fixed


def _observation_columns(env: Any) -> dict[tuple[int, str], int]:
    """(building, observation name) -> position in the central agent's raw list (shared ones once, first building)."""
    shared, seen, out, position = set(env.shared_observations), set(), {}, 0
    for b, building in enumerate(env.buildings):
        for key in building.observations(normalize=False, periodic_normalization=False):
            if b > 0 and key in shared and key in seen:
                continue
            seen.add(key)
            out[(b, key)] = position
            position += 1
    return out


def _sessions(chargers: list[Any], car_index: dict[str, int], steps: int) -> dict[str, np.ndarray]:
    """Which car is at which charger at each step, and the states of charge CityLearn gives cars as they arrive
    (``associate_chargers_to_electric_vehicles`` and ``simulate_unconnected_ev_soc`` of CityLearn 3.0.2)."""
    n = len(chargers)
    connected = np.full((steps, n), -1, dtype=int)
    arrival = np.full((steps, n), np.nan)
    first = np.full((steps, n), np.nan)
    incoming = np.full((steps, len(car_index)), np.nan)
    for c, charger in enumerate(chargers):
        sim = charger.charger_simulation
        state = np.asarray(sim.electric_vehicle_charger_state, dtype=float)[:steps]
        ids = [_valid_id(v) for v in list(sim.electric_vehicle_id)[:steps]]
        left = np.asarray(sim.electric_vehicle_departure_time, dtype=float)[:steps]
        estimated = [_valid_soc(v) for v in list(sim.electric_vehicle_estimated_soc_arrival)[:steps]]
        current = getattr(sim, "electric_vehicle_current_soc", None)
        current = [math.nan] * steps if current is None else [_valid_soc(v) for v in list(current)[:steps]]
        for t in range(steps):
            car = car_index.get(ids[t]) if ids[t] else None
            if state[t] == CONNECTED and car is not None:
                connected[t, c] = car
                # An episode that starts here plugs the car in with no step before it.
                first[t, c] = current[t] if not math.isnan(current[t]) else estimated[t]
                back_to_back = (t > 0 and np.isfinite(left[t - 1]) and np.isfinite(left[t])
                                and left[t - 1] <= 1 and left[t] > left[t - 1])
                if t > 0 and (connected[t - 1, c] != car or back_to_back):
                    before = t - 1 if state[t - 1] in (2, 3) else t
                    arrival[t, c] = current[t] if not math.isnan(current[t]) else estimated[before]
            # A car about to plug in at t + 1 is given its arrival soc at t.
            if t + 1 < steps and state[t] != CONNECTED and state[t + 1] == CONNECTED and ids[t + 1] in car_index:
                index = t if (ids[t] == ids[t + 1] and state[t] == INCOMING) else t + 1
                if not math.isnan(estimated[index]) and math.isnan(incoming[t, car_index[ids[t + 1]]]):
                    incoming[t, car_index[ids[t + 1]]] = estimated[index]
    required = np.stack([np.asarray(c.charger_simulation.electric_vehicle_required_soc_departure, dtype=float)[:steps]
                         for c in chargers], axis=1) if n else np.zeros((steps, 0))
    departure = np.stack([np.asarray(c.charger_simulation.electric_vehicle_departure_time, dtype=float)[:steps]
                          for c in chargers], axis=1) if n else np.zeros((steps, 0))
    return {"connected": connected, "arrival_soc": arrival, "first_soc": first, "incoming_soc": incoming,
            "required_soc": required, "departure": departure}


class VectorSite:
    """N copies of the site, each in its own episode window, stepped together."""

    def __init__(self, tables: SiteTables, n_envs: int) -> None:
        self.tables = tables
        self.n = n_envs
        self.batteries = BatteryBank(tables.batteries, n_envs)
        self.cars = BatteryBank(tables.cars, n_envs)
        self.t = np.zeros(n_envs, dtype=int)  # absolute step of the period
        self.start = np.zeros(n_envs, dtype=int)
        self.end = np.zeros(n_envs, dtype=int)  # the episode's last step: its observation repeats the one before
        self.net = np.zeros((n_envs, tables.n_buildings), dtype=np.float32)  # net consumption of the last step
        self._rows = np.arange(n_envs)
        self.observations = np.zeros((n_envs, tables.raw.shape[1]))

    def reset(self, envs: np.ndarray, starts: np.ndarray, lengths: np.ndarray | None = None) -> None:
        """Start an episode of ``lengths[i]`` steps (default: to the period's end) at absolute step ``starts[i]``
        in each environment where ``envs`` is true."""
        self.t[envs] = starts[envs]
        self.start[envs] = starts[envs]
        ends = np.full(self.n, self.tables.steps) if lengths is None else starts + lengths
        self.end[envs] = ends[envs] - 1
        self.batteries.reset(envs)
        self.cars.reset(envs)
        self.net[envs] = self.tables.fixed_net[starts[envs]]  # CityLearn's reset computes step 0's, idle
        # Cars already plugged in as the episode starts get their arrival soc where the data gives one.
        tab = self.tables
        for i in np.flatnonzero(envs):
            cars, socs = tab.connected[self.t[i]], tab.first_soc[self.t[i]]
            plugged = (cars >= 0) & np.isfinite(socs)
            self.cars.soc[i, cars[plugged]] = socs[plugged].astype(np.float32)
        self.observations[envs] = self._observe()[envs]

    def observe(self) -> np.ndarray:
        """The raw observation list of each environment, (N, K), as CityLearn gives it."""
        return self.observations

    def _observe(self) -> np.ndarray:
        tab = self.tables
        raw = tab.raw[self.t].copy()
        for m, column in enumerate(tab.soc_column):
            if column >= 0:
                raw[:, column] = self.batteries.soc[:, m]
        for b, column in enumerate(tab.net_column):
            if column >= 0:
                raw[:, column] = self.net[:, b]
        cars = tab.connected[self.t]
        for c, column in enumerate(tab.car_soc_column):
            here = cars[:, c] >= 0
            if column >= 0 and here.any():
                raw[here, column] = self.cars.soc[self._rows[here], cars[here, c]]
        return raw

    def step(self, actions: np.ndarray) -> np.ndarray:
        """Apply native actions (N, n_actions) at each environment's step; returns the net consumption (N, B)."""
        self.begin()
        return self.apply(actions)

    def begin(self) -> None:
        """The start of each environment's step: batteries carried over from the last one, arriving cars plugged in
        (what CityLearn does as it advances time, so that a guard can look at the state the actions meet)."""
        tab = self.tables
        t = self.t
        first = t == self.start
        self.batteries.carry_over(~first[:, None])
        self.cars.carry_over(~first[:, None])
        cars = tab.connected[t]  # (N, C)
        arrival = tab.arrival_soc[t]
        plug = (cars >= 0) & np.isfinite(arrival) & ~first[:, None]
        rows, cols = np.nonzero(plug)
        self.cars.soc[rows, cars[rows, cols]] = arrival[rows, cols].astype(np.float32)

    def apply(self, actions: np.ndarray) -> np.ndarray:
        """Apply native actions (N, n_actions) after :meth:`begin`; returns the net consumption (N, B)."""
        tab = self.tables
        t = self.t
        cars = tab.connected[t]
        battery_energy = np.clip(actions[:, tab.battery_action], -1.0, 1.0) * tab.batteries.nominal_power * tab.hours
        battery_balance = self.batteries.charge(battery_energy)

        chargers = tab.chargers
        power = chargers.power_kw(actions[:, chargers.action])
        charging = power >= 0
        max_kw = np.where(charging, chargers.max_charge_kw, chargers.max_discharge_kw)
        normalised = np.abs(power) / np.maximum(max_kw, 1e-8)
        efficiency = chargers.efficiency_at(normalised, charging)
        commanded = np.sign(power) * normalised * max_kw * tab.hours
        to_battery = np.where(charging, commanded * efficiency, commanded / np.maximum(efficiency, 1e-8))
        here = cars >= 0
        car_energy = np.zeros((self.n, tab.cars.size))
        car_mask = np.zeros((self.n, tab.cars.size), dtype=bool)
        rows, cols = np.nonzero(here)
        car_energy[rows, cars[rows, cols]] = to_battery[rows, cols]
        car_mask[rows, cars[rows, cols]] = True
        car_balance = self.cars.charge(car_energy, car_mask).astype(float)
        charger_balance = np.zeros_like(power)
        charger_balance[rows, cols] = car_balance[rows, cars[rows, cols]]
        consumption = np.where(charger_balance >= 0, charger_balance / np.maximum(efficiency, 1e-8),
                               charger_balance * efficiency)
        consumption = np.where(here & (power != 0), consumption, 0.0).astype(np.float32)

        net = tab.fixed_net[t].astype(float)
        np.add.at(net.T, tab.battery_building, battery_balance.T.astype(float))
        np.add.at(net.T, chargers.building, consumption.T.astype(float))
        self.net = net.astype(np.float32)

        incoming = tab.incoming_soc[t]  # cars about to plug in at t + 1
        given = np.isfinite(incoming)
        self.cars.soc[given] = incoming[given].astype(np.float32)
        self.t = t + 1
        last = self.t >= self.end
        self.observations = np.where(last[:, None], self.observations, self._observe())
        return self.net
